"""Plain vs speculative on one server, in one run, interleaved.

    python examples/compare.py examples/prompts/edit.txt --base-url http://127.0.0.1:8000/v1 --model qwen

Both runs go through the same client; ``drafter=None`` is the plain
baseline.  The texts must be identical, and the report gives medians over
repeats and their ratio (the machine is noisy: never a single timing).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

from blackbox_spec import BlackboxSpecError, SpecClient


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt_file")
    parser.add_argument("--base-url")
    parser.add_argument("--api-key")
    parser.add_argument("--model")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategy", default="auto")
    args = parser.parse_args()
    prompt = Path(args.prompt_file).read_text(encoding="utf-8")
    times: dict[str, list[float]] = {"plain": [], "speculative": []}
    texts: dict[str, str] = {}
    last = None
    async with SpecClient(args.base_url, args.api_key, args.model, drafter=None) as plain, \
            SpecClient(args.base_url, args.api_key, args.model, strategy=args.strategy) as spec:
        for _ in range(args.repeats):
            for name, client in (("plain", plain), ("speculative", spec)):
                result = await client.generate(prompt, max_tokens=args.max_tokens)
                times[name].append(result.stats.wall_s)
                texts.setdefault(name, result.text)
                if result.text != texts[name]:
                    print(f"warning: {name} output changed between repeats (server not deterministic?)", file=sys.stderr)
                if name == "speculative":
                    last = result.stats
    same = texts["plain"] == texts["speculative"]
    p, s = statistics.median(times["plain"]), statistics.median(times["speculative"])
    print(f"model: {spec.model}   prompt: {args.prompt_file}   max_tokens: {args.max_tokens}   repeats: {args.repeats}")
    print(f"plain        median {p:7.3f} s")
    print(f"speculative  median {s:7.3f} s   ({last.rounds} rounds, {last.target_calls} calls, "
          f"acceptance {last.acceptance_rate:.0%}, {last.mean_accepted_per_round:.1f} tokens/round, "
          f"strategies {last.strategy_rounds})")
    print(f"speedup      {p / s:7.2f}x   identical text: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except BlackboxSpecError as exc:
        sys.exit(f"compare: error: {exc}")
