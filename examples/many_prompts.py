"""Many prompts at once through one client, within one limit on requests.

    python examples/many_prompts.py --base-url http://127.0.0.1:8000/v1 --concurrency 8 --max-in-flight 16

``generate_many`` runs ``concurrency`` generations at a time and returns
results in order; ``max_in_flight`` bounds the HTTP requests of all of them
together (side branches and fan-outs included), so a batch never floods the
server.  A prompt that fails holds its error, with the text it had.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from blackbox_spec import BlackboxSpecError, SpecClient

FUNCTIONS = ["add", "sub", "mul", "div", "mod", "pow", "min", "max"]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="default: the first model the server lists")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args()
    prompts = [f"# Python: a documented function `{name}(a, b)` and its tests\n\ndef {name}(a, b):\n" for name in FUNCTIONS]
    started = time.perf_counter()

    def done(index: int, outcome) -> None:
        what = f"error: {outcome}" if isinstance(outcome, BlackboxSpecError) else f"{outcome.stats.output_tokens} tokens"
        print(f"[{time.perf_counter() - started:5.1f}s] {FUNCTIONS[index]}: {what}", flush=True)

    async with SpecClient(args.base_url, model=args.model, max_in_flight=args.max_in_flight) as client:
        outcomes = await client.generate_many(prompts, max_tokens=args.max_tokens, concurrency=args.concurrency, on_done=done)
        peak = client.api.peak_in_flight
    failed = sum(isinstance(o, BlackboxSpecError) for o in outcomes)
    print(f"{len(prompts) - failed} of {len(prompts)} done in {time.perf_counter() - started:.1f}s; "
          f"at most {peak} requests were in flight (limit {args.max_in_flight})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
