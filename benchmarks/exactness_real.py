"""Exactness on a real server: bspec against one plain non-streamed call.

Runs the bench workloads' prompts and the Unicode / stop-string cases of
``blackbox_spec.bench.exactness`` (emoji, CJK, combining marks, ZWJ, CRLF,
tabs, several and overlapping stop strings, max_tokens cutting a character)
through one SpecClient per strategy, and compares each text and finish
reason with a plain temperature-0 call's.  Prints a table and writes JSON.

    bspec server start vllm --dtype float32 --port 8123 &
    python benchmarks/exactness_real.py --base-url http://127.0.0.1:8123/v1 --out benchmarks/results/exactness-vllm-0.5b-fp32.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from blackbox_spec import SpecClient
from blackbox_spec.bench.exactness import CASES, bench_cases, compare


def save(args: argparse.Namespace, outcomes: list) -> None:
    if args.out:
        same = sum(o.identical for _, o in outcomes)
        with open(args.out, "w") as f:
            json.dump({"base_url": args.base_url, "when": time.strftime("%Y-%m-%d %H:%M"), "strategies": args.strategies,
                       "identical": same, "runs": len(outcomes),
                       "outcomes": [dict(o.to_dict(), strategy=s) for s, o in outcomes]}, f, indent=1, ensure_ascii=False)


async def run(args: argparse.Namespace) -> int:
    cases = CASES + bench_cases(args.max_tokens)
    if args.only:
        cases = [c for c in cases if c.name in args.only]
    outcomes: list = []
    for strategy in args.strategies:
        async with SpecClient(args.base_url, model=args.model, strategy=strategy) as client:
            for case in cases:
                if strategy != "auto" and args.forced_on_cases_only and case not in CASES:
                    continue
                outcome = await compare(client, case)
                outcomes.append((strategy, outcome))
                save(args, outcomes)
                mark = "same" if outcome.identical else "DIFFERENT"
                print(f"{strategy:7} {case.name:28} {'unicode' if outcome.unicode else '       '} stops={outcome.stops} "
                      f"{mark:9} plain {outcome.plain_s:6.2f}s  bspec {outcome.spec_s:6.2f}s", flush=True)
                if not outcome.identical:
                    print(f"    plain: {outcome.plain!r} ({outcome.plain_finish})\n    bspec: {outcome.spec!r} ({outcome.spec_finish})", flush=True)
    same = sum(o.identical for _, o in outcomes)
    special = sum(o.identical for _, o in outcomes if o.unicode or o.stops)
    print(f"\n{same}/{len(outcomes)} identical; of them {special} with non-ASCII text or stop strings "
          f"({sum(1 for _, o in outcomes if o.unicode or o.stops)} such runs)")
    save(args, outcomes)
    return 0 if same == len(outcomes) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--strategies", nargs="+", default=["auto"], choices=["auto", "echo", "fanout"])
    parser.add_argument("--max-tokens", type=int, default=128, help="cap on the bench workloads' budgets (the Unicode cases keep theirs)")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--forced-on-cases-only", action="store_true", help="run echo and fanout on the Unicode / stop cases only (auto runs all)")
    parser.add_argument("--out", help="write the outcomes as JSON here")
    sys.exit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
