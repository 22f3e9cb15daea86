"""Record real greedy answers for the simulated servers' replay mode.

    # live, from a vLLM server (its own token ids, so its own segmentation):
    python benchmarks/record_replay.py --base-url http://127.0.0.1:8123/v1 --name qwen2.5-coder-0.5b
    # the real edits (``blackbox_spec.bench.real_edits``), from the 1.5B:
    bspec server start vllm --model qwen2.5-coder-1.5b --dtype float32 --port 8123 &
    python benchmarks/record_replay.py --base-url http://127.0.0.1:8123/v1 --name qwen2.5-coder-1.5b --set real
    # or from plain texts a bench already recorded, split by the model's tokenizer:
    python benchmarks/record_replay.py --from-texts benchmarks/results/plain-texts-0.5b-fp32.json --name qwen2.5-coder-0.5b

Writes ``blackbox_spec/testing/data/replay-NAME.json``: per bench prompt its
text, the answer's tokens (bytes as latin-1 strings) and whether an
end-of-text token followed them ("stop") or the budget ran out ("length").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.bench.workloads import PROMPTS
from blackbox_spec.servers.vllm import ensure_hf_folder

OUT = Path(__file__).resolve().parents[1] / "blackbox_spec" / "testing" / "data"


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: token characters to bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class Vocabulary:
    def __init__(self, model: str) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(ensure_hf_folder(model) / "tokenizer.json"))
        self.decoder = byte_decoder()

    def bytes_of(self, token_id: int) -> bytes:
        piece = self.tokenizer.id_to_token(token_id)
        return bytes(self.decoder[c] for c in piece)

    def split(self, text: str) -> list[bytes]:
        return [self.bytes_of(i) for i in self.tokenizer.encode(text, add_special_tokens=False).ids]


def from_texts(path: Path, vocab: Vocabulary, prompts) -> list[dict]:
    texts = json.loads(path.read_text())
    out = []
    for prompt in prompts:
        if prompt.name not in texts:
            continue
        tokens = vocab.split(texts[prompt.name])
        assert b"".join(tokens).decode() == texts[prompt.name]
        finish = "length" if len(tokens) >= prompt.max_tokens else "stop"
        out.append(record(prompt.name, prompt.text, tokens[: prompt.max_tokens], finish))
    return out


def live(base_url: str, model: str | None, vocab: Vocabulary, prompts) -> list[dict]:
    out = []
    with httpx.Client(base_url=base_url, timeout=1200) as http:
        model = model or http.get("/models").json()["data"][0]["id"]
        for prompt in prompts:
            body = {"model": model, "prompt": prompt.text, "max_tokens": prompt.max_tokens, "temperature": 0,
                    "logprobs": 0, "return_tokens_as_token_ids": True}
            answer = http.post("/completions", json=body).json()["choices"][0]
            ids = [int(t.split(":", 1)[1]) for t in answer["logprobs"]["tokens"]]
            tokens = [vocab.bytes_of(i) for i in ids]
            finish = answer["finish_reason"]
            if finish == "stop" and vocab.tokenizer.id_to_token(ids[-1]).startswith("<|"):
                tokens = tokens[:-1]  # the end-of-text token itself
            out.append(record(prompt.name, prompt.text, tokens, finish))
            print(f"{prompt.name}: {len(tokens)} tokens, {finish}", file=sys.stderr, flush=True)
    return out


def record(name: str, prompt: str, tokens: list[bytes], finish: str) -> dict:
    return {"name": name, "prompt": prompt, "finish": finish, "tokens": [t.decode("latin-1") for t in tokens]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="qwen2.5-coder-0.5b", help="the recording's name (and the model whose tokenizer is used)")
    parser.add_argument("--model", default=None, help="the served model's name (default: the first listed)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--base-url")
    source.add_argument("--from-texts", type=Path)
    parser.add_argument("--source", default="", help="where the answers came from, for the file's header")
    parser.add_argument("--set", choices=["classic", "real"], default="classic",
                        help="which prompts: the 0.5B set's (workloads.PROMPTS) or the real edits (real_edits.REAL_PROMPTS)")
    args = parser.parse_args()
    vocab = Vocabulary(args.name)
    prompts = REAL_PROMPTS if args.set == "real" else PROMPTS
    recordings = live(args.base_url, args.model, vocab, prompts) if args.base_url else from_texts(args.from_texts, vocab, prompts)
    OUT.mkdir(parents=True, exist_ok=True)
    target = OUT / f"replay-{args.name}.json"
    header = args.source or (f"live from {args.base_url}" if args.base_url else f"texts in {args.from_texts}, split by the model's tokenizer")
    target.write_text(json.dumps({"model": args.name, "source": header, "recordings": recordings}, ensure_ascii=False, indent=0) + "\n")
    print(f"wrote {target} ({len(recordings)} recordings)")


if __name__ == "__main__":
    main()
