"""Issue 38's figures: held-out byte-level exactness in six server conventions,
random corruptions of token strings, and what alignment costs.

    python bench/untrusted_tokens.py exactness --out docs/results/untrusted-tokens-38/exactness.json
    python bench/untrusted_tokens.py corruption --cases 200 --out .../corruption.json
    python bench/untrusted_tokens.py timing --out .../timing.json

The cases are held out: drawn with their own seed from fragments the test
suite does not use (Hangul, kana, Devanagari, Arabic, skin-tone and flag
emoji, combining marks beside the suite's CJK and emoji), against the fake
target's byte-level tokenizer in each convention (``testing/forms.py``).
Each case is one fresh client, as ``bspec run`` is; the reference is the
fake's plain non-streamed answer.  Run it against another checkout of the
client (``--client DIR``: its ``blackbox_spec`` is imported, with this
checkout's fake target) to compare before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

FRAGMENTS = [
    "한국어 문장입니다", "カタカナとひらがな", "हिन्दी पाठ", "نص عربي", "👍🏽👋🏿", "🇯🇵🇧🇷", "ñandú café", "o\u0303o\u0308",
    "😀🚀", "中文本字节测试", " 🙂 ", "\r\n", "\t", "def g(y):\n    return y\n", "the then there ", "a", "。、", "é",
]
STOPS = ["😀", "文", "\r\n", "the", "e", "。", " ", "\u0303", "です", "👍🏽", "ab"]
CONVENTIONS = ["vllm-legacy", "vllm", "vllm-0.10", "openai", "token-id", "llama"]


def _cases(rng: random.Random, count: int) -> list[dict]:
    cases = []
    for _ in range(count):
        prompt = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 6)))
        copying = rng.random() < 0.5
        cases.append({
            "prompt": prompt * 3 if copying else prompt, "copying": copying, "max_tokens": rng.randint(1, 80),
            "stop": rng.sample(STOPS, rng.randint(1, 3)) if rng.random() < 0.4 else None,
            "strategy": rng.choice(["auto", "echo", "fanout"]),
        })
    return cases


def _fake(convention: str, copying: bool):
    from blackbox_spec.testing import FakeModel, FakeTarget, FakeTokenizer

    model = FakeModel(FakeTokenizer(byte_level=True), **({"deviate_every": 1000, "eos_every": 10000} if copying else {"deviate_every": 7}))
    llama = convention == "llama"
    return FakeTarget(model=model, token_form=convention, stop_rule="earliest-start" if llama else "earliest-end", echo="refuse" if llama else "yes")


async def _one(fake, case: dict, drafter: str, handler=None):
    import respx

    from blackbox_spec import SpecClient

    base = "http://held.out/v1"
    strategy = "auto" if case["strategy"] == "echo" and fake.token_form == "llama" else case["strategy"]
    with respx.mock(base_url=base, assert_all_called=False) as router:
        router.post("/completions").mock(side_effect=handler or fake.handle_async)
        for path in ("/tokenize", "/detokenize"):
            router.post("http://held.out" + path).mock(side_effect=fake.handle_async)
        async with SpecClient(base, "sk-held-out", "fake-model", strategy=strategy, drafter=drafter) as client:
            return await client.generate(case["prompt"], max_tokens=case["max_tokens"], stop=case["stop"])


def _run(convention: str, drafter: str, cases: list[dict], corrupt_seed: int | None = None) -> dict:
    outcome: Counter = Counter()
    errors: Counter = Counter()
    for k, case in enumerate(cases):
        fake = _fake(convention, case["copying"])
        expected = fake.generate(case["prompt"], case["max_tokens"], case["stop"])[:2]
        handler = None
        if corrupt_seed is not None:
            from blackbox_spec.testing.corrupt import corrupting

            handler = corrupting(fake.handle_async, random.Random(corrupt_seed + k), 0.3)
        try:
            result = asyncio.run(_one(fake, case, drafter, handler))
            outcome["exact" if (result.text, result.finish_reason) == expected else "wrong text"] += 1
        except Exception as exc:  # noqa: BLE001 - counted, that is the point
            outcome["error"] += 1
            errors[f"{type(exc).__name__}: {str(exc)[:70]}"] += 1
    return {"convention": convention, "drafter": drafter, "cases": len(cases), **outcome, "errors": errors.most_common(5)}


def exactness(args) -> list[dict]:
    cases = _cases(random.Random(args.seed), args.cases)
    rows = []
    for convention in CONVENTIONS:
        for drafter in ("ngram", "suffix"):
            started = time.perf_counter()
            row = _run(convention, drafter, cases)
            row["seconds"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def corruption(args) -> list[dict]:
    cases = _cases(random.Random(args.seed + 1), args.cases)
    rows = []
    for convention in CONVENTIONS:
        row = _run(convention, "ngram", cases, corrupt_seed=args.seed * 1000)
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return rows


def _best(work, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def timing(args) -> list[dict]:
    from blackbox_spec._tokens import align_tokens
    from blackbox_spec.testing import FakeTokenizer, forms

    rows = []
    for n in (25, 50, 100, 200):
        text, tokens = "🙂" * n, ["", "", "", "🙂"] * n
        legacy = ["\ufffd"] * (4 * n)
        row = {"emoji": n, "empty_form_ms": round(1000 * _best(lambda: align_tokens(text, tokens)), 2)}
        row["legacy_form_ms"] = round(1000 * _best(lambda: align_tokens(text, legacy), 1), 2)
        try:
            from blackbox_spec.verifiers.branches import LiveText
            from blackbox_spec._target import StreamPiece

            raws = [bytes([b]) for b in text.encode()]
            steps, strings = forms.visible_steps(raws), [forms.token_string("vllm-legacy", raws, k, 0) for k in range(len(raws))]

            def stream():
                live = LiveText()
                for step, string in zip(steps, strings):
                    live.consume(live.feed(StreamPiece(step, [string])))

            row["legacy_stream_ms"] = round(1000 * _best(stream, 1), 1) if n <= 100 else None
        except Exception as exc:  # noqa: BLE001
            row["legacy_stream_ms"] = f"{type(exc).__name__}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    tok = FakeTokenizer(byte_level=True)
    context = "".join(f"line {k}: the value is {k * 7} 中文 😀\n" for k in range(400))
    rounds = []
    earlier = None
    for r in range(6):
        text = context + f"draft {r} 😀 中文\n"
        ids = tok.encode(text)
        raws = [tok.token_bytes(i) for i in ids]
        strings = [forms.token_string("vllm", raws, k, i) for k, i in enumerate(ids)]
        none = [None] * len(strings)
        whole = _best(lambda: align_tokens(text, strings, none, none, prompt=True), 1)
        try:
            from blackbox_spec._resume_align import align_prompt

            picked_s = _best(lambda: align_prompt(text, strings, none, none, earlier, len(context)), 1)
            earlier = align_prompt(text, strings, none, none, earlier, len(context))
        except (ImportError, TypeError):  # (a client from before _resume_align)
            picked_s = None
        rounds.append({"round": r, "tokens": len(ids), "whole_ms": round(1000 * whole, 1), "picked_up_ms": None if picked_s is None else round(1000 * picked_s, 1)})
        context = text
    print(json.dumps(rounds), flush=True)
    return rows + rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["exactness", "corruption", "timing"])
    parser.add_argument("--cases", type=int, default=96, help="cases per convention and drafter")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--client", default=None, help="import blackbox_spec from this checkout instead (its fake target is replaced by this one's)")
    parser.add_argument("--out", default=None, help="write the rows here as JSON")
    args = parser.parse_args()
    if args.client:
        sys.path.insert(0, os.path.abspath(args.client))
    import blackbox_spec

    print(f"client: {Path(blackbox_spec.__file__).parent}", flush=True)
    rows = {"exactness": exactness, "corruption": corruption, "timing": timing}[args.what](args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"what": args.what, "cases": args.cases, "seed": args.seed, "rows": rows}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
