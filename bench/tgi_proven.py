"""How much of a real model's own greedy answers TGI-style scoring proves.

For each recorded 1.5B answer to the real edits, vLLM's completions echo of
prompt + answer gives, at every answer position, the token's own logprob and
the model's top choice.  vLLM's echo confirms a position where the top is
the token; TGI's prefill (each token's own logprob only) where that logprob
is above log 0.51.  With a perfect drafter an echo round takes the draft up
to the first unconfirmed position, so rounds = unconfirmed positions + 1.
"""
import json, math, sys
from importlib import resources
import httpx

LIMIT = math.log(0.51)
url, model = sys.argv[1], sys.argv[2]
data = json.loads(resources.files("blackbox_spec.testing").joinpath("data/replay-qwen2.5-coder-1.5b.json").read_text())
tot = [0, 0, 0]
for r in data["recordings"][:14]:
    answer = b"".join(t.encode("latin-1") for t in r["tokens"]).decode("utf-8", "replace")
    body = {"model": model, "prompt": r["prompt"] + answer, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    lp = httpx.post(url + "/completions", json=body, timeout=600).json()["choices"][0]["logprobs"]
    start = len(r["prompt"])
    pos = [k for k, off in enumerate(lp["text_offset"]) if off >= start][:-1]  # (the last: the generated token)
    top1 = tgi = 0
    for k in pos:
        own, tops = lp["token_logprobs"][k], lp["top_logprobs"][k] or {}
        best = max(tops.values()) if tops else None
        top1 += int(best is not None and own is not None and own >= best and sum(1 for v in tops.values() if v >= own) == 1)
        tgi += int(own is not None and own > LIMIT)
    n = len(pos)
    tot = [tot[0] + n, tot[1] + top1, tot[2] + tgi]
    print(f"{r['name']:16s} tokens {n:4d}  top-1 {top1 / n:6.1%}  p>0.51 {tgi / n:6.1%}  rounds with a perfect drafter: vLLM echo {n - top1 + 1:3d}  TGI {n - tgi + 1:3d}", flush=True)
n, top1, tgi = tot
print(f"{'all':16s} tokens {n:4d}  top-1 {top1 / n:6.1%}  p>0.51 {tgi / n:6.1%}  unproven by TGI among top-1: {(top1 - tgi) / max(1, top1):.1%}")
