"""Measures the ceiling of a Predicted-Outputs edit on one server: the speedup an ideal copy drafter could reach.

How fast *any* drafter could make a Predicted-Outputs edit on one server:
an upper bound on the speedup, from the answer itself and the server's own
step costs.

For each prompt, the plain temperature-0 answer is split (on the server's
tokens) into what the prediction holds (matching runs of 2 or more tokens)
and what is new.  An ideal drafter knows exactly the copied runs and
nothing else; verification has no fixed cost.  Then:

- a new token costs one plain decoding step, ``t1`` (no draft holds it);
- a copied run of n tokens costs the cheaper of its best group of side
  branches, ``n * t1 * c(w) / w`` (``c(w)``: a w-wide batch step in single
  steps, measured here), and one echo round over the prompt alone (cheaper
  than any real echo round, whose context is longer);
- the first token costs what it costs plainly.

The bound is the plain time over that sum.  Real runs pay more (group
overheads, drafts that break, re-alignment), so they stay below it.  Needs
vLLM (``/tokenize``, ``prompt_logprobs``).

``--groups`` adds a tighter, measured figure: each copied run is verified
for real by one group of side branches that knows the run exactly (the
streams at offsets 0, s, 2s... of the run, all started at once, each
writing s tokens), the best of widths 2-16 timed from the group's start to
its last token, or plain decoding where that is faster.  So it counts what
the bound leaves out: the round trip, and the server reading every
branch's prompt past its prefix cache.  No drafter that must learn where
runs end does better; it is a measurement, not a proof.

    python benchmarks/prediction_ceiling.py --base-url http://127.0.0.1:8123/v1 --workload code-edit \\
        --out benchmarks/results/prediction-ceiling-vllm-1.5b
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from blackbox_spec.bench.workloads import WORKLOADS, prompts

WIDTHS = (1, 2, 4, 8, 16)
STEP_TOKENS = 48


async def timed_stream(http: httpx.AsyncClient, url: str, body: dict) -> tuple[float, float, str, int]:
    """(first-token seconds, total seconds, text, tokens) of one streamed completion."""
    started = time.perf_counter()
    first, text, tokens = None, "", 0
    async with http.stream("POST", url + "/completions", json=body | {"stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice.get("text"):
                first = first or time.perf_counter() - started
                text += choice["text"]
                tokens += 1
    return first or 0.0, time.perf_counter() - started, text, tokens


async def group_seconds(http: httpx.AsyncClient, url: str, root: str, model: str, context: str, run: list[int], width: int) -> float:
    """Seconds ``width`` streams take to write a copied run of the answer's
    tokens ``run`` after ``context``: stream k starts k·s tokens into it
    (s = the run split ``width`` ways) and writes s tokens; all start at once,
    with ``context`` already in the prefix cache (as the main stream's)."""
    segment = -(-len(run) // width)
    prefixes = [""]
    for k in range(1, width):
        if k * segment >= len(run):
            break
        answer = await http.post(root + "/detokenize", json={"model": model, "tokens": run[: k * segment]})
        answer.raise_for_status()
        prefixes.append(answer.json()["prompt"])
    body = {"model": model, "max_tokens": segment, "temperature": 0, "ignore_eos": True}
    await timed_stream(http, url, body | {"prompt": context, "max_tokens": 1})
    started = time.perf_counter()
    await asyncio.gather(*(timed_stream(http, url, body | {"prompt": context + p}) for p in prefixes))
    return time.perf_counter() - started


async def measured_groups(http: httpx.AsyncClient, url: str, root: str, model: str, prompt: str, answer: list[int],
                          runs: list[tuple[int, int]], t1: float) -> float:
    """Seconds the copied runs cost with the best measured group each (or
    plainly, where no group is faster)."""
    total = 0.0
    for start, n in runs:
        context = prompt
        if start:
            detok = await http.post(root + "/detokenize", json={"model": model, "tokens": answer[:start]})
            detok.raise_for_status()
            context += detok.json()["prompt"]
        best = n * t1
        for width in (w for w in WIDTHS if 1 < w <= max(2, n)):
            best = min(best, await group_seconds(http, url, root, model, context, answer[start : start + n], width))
        total += best
    return total


async def tokenize(http: httpx.AsyncClient, root: str, model: str, text: str) -> list[int]:
    answer = await http.post(root + "/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    answer.raise_for_status()
    return answer.json()["tokens"]


def copied_runs(prediction: list[int], answer: list[int], min_run: int = 2) -> list[tuple[int, int]]:
    """(start in the answer, length) of each run of ``min_run`` or more of
    the answer's tokens found, in order, in the prediction.

    >>> copied_runs([1, 2, 3, 4, 5, 6], [9, 1, 2, 3, 7, 5, 6])
    [(1, 3), (5, 2)]
    """
    matcher = difflib.SequenceMatcher(None, prediction, answer, autojunk=False)
    return [(b.b, b.size) for b in matcher.get_matching_blocks() if b.size >= min_run]


def ceiling(tokens: int, runs: list[tuple[int, int]], *, t1: float, first_s: float, group_rate: float, echo_s: float) -> float:
    """Seconds an ideal drafter needs: new tokens at ``t1`` each, each copied
    run at the cheaper of ``group_rate`` seconds a token and one echo round.

    >>> ceiling(100, [(10, 80)], t1=0.1, first_s=0.5, group_rate=0.04, echo_s=1.0)
    3.5
    """
    copied = sum(n for _, n in runs)
    return first_s + (tokens - copied) * t1 + sum(min(n * group_rate, echo_s) for _, n in runs)


async def step_costs(http: httpx.AsyncClient, url: str, model: str, prompt: str) -> dict[int, float]:
    """Seconds per decoding step of a w-wide batch, w in WIDTHS (best of two)."""
    body = {"model": model, "prompt": prompt, "max_tokens": STEP_TOKENS, "temperature": 0, "ignore_eos": True}
    await timed_stream(http, url, body)  # the prompt in the prefix cache
    costs = {}
    for width in WIDTHS:
        best = float("inf")
        for _ in range(2):
            runs = await asyncio.gather(*(timed_stream(http, url, body) for _ in range(width)))
            first = max(r[0] for r in runs)
            total = max(r[1] for r in runs)
            best = min(best, (total - first) / (STEP_TOKENS - 1))
        costs[width] = best
        print(f"  {width:2d}-wide step: {best * 1000:7.1f} ms ({best / costs[1]:.2f} single steps)", flush=True)
    return costs


async def measure(args: argparse.Namespace) -> dict:
    root = args.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=3600) as http:
        model = (await http.get(args.base_url + "/models")).json()["data"][0]["id"]
        chosen = [p for p in prompts(args.workload, args.prompt) if p.prediction]
        print(f"{model}: step costs", flush=True)
        steps = await step_costs(http, args.base_url, model, chosen[0].text)
        group_rate = min(steps[w] / w for w in WIDTHS)  # seconds a copied token at the best width
        rows = []
        for prompt in chosen:
            first_s, plain_s, text, _ = await timed_stream(http, args.base_url, {"model": model, "prompt": prompt.text, "max_tokens": prompt.max_tokens, "temperature": 0})
            answer = await tokenize(http, root, model, text)
            predicted = await tokenize(http, root, model, prompt.prediction or "")
            started = time.perf_counter()
            echo = await http.post(args.base_url + "/completions", json={"model": model, "prompt": prompt.text, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0})
            echo.raise_for_status()
            echo_s = time.perf_counter() - started
            t1 = (plain_s - first_s) / max(1, len(answer) - 1)
            runs = copied_runs(predicted, answer)
            copied = sum(n for _, n in runs)
            bound_s = ceiling(len(answer), runs, t1=t1, first_s=first_s, group_rate=group_rate, echo_s=echo_s)
            row = {"prompt": prompt.name, "plain_s": round(plain_s, 3), "first_token_s": round(first_s, 3), "tokens": len(answer), "copied_tokens": copied,
                   "new_tokens": len(answer) - copied, "copied_runs": len(runs), "echo_round_s": round(echo_s, 3), "step_s": round(t1, 4),
                   "ideal_s": round(bound_s, 3), "speedup_bound": round(plain_s / bound_s, 3),
                   "copy_free_bound": round(plain_s / (first_s + (len(answer) - copied) * t1), 3)}
            if args.groups:
                groups_s = await measured_groups(http, args.base_url, root, model, prompt.text, answer, runs, t1)
                measured_s = first_s + (len(answer) - copied) * t1 + groups_s
                row |= {"measured_groups_s": round(measured_s, 3), "measured_groups_speedup": round(plain_s / measured_s, 3)}
                print(f"{prompt.name:>18}: with each copied run's best group measured: {measured_s:.1f} s, x{row['measured_groups_speedup']:.2f}", flush=True)
            rows.append(row)
            print(f"{prompt.name:>18}: {len(answer)} tokens, {copied} copied in {len(runs)} runs, {len(answer) - copied} new; plain {plain_s:.1f} s, "
                  f"ideal {bound_s:.1f} s: bound x{row['speedup_bound']:.2f} (copies free: x{row['copy_free_bound']:.2f})", flush=True)
    measured = {"median_measured_groups_speedup": round(statistics.median(r["measured_groups_speedup"] for r in rows), 3)} if args.groups else {}
    return measured | {"upstream": args.base_url, "model": model, "step_seconds": {w: round(s, 4) for w, s in steps.items()},
            "copied_token_seconds": round(group_rate, 4), "prompts": rows,
            "median_speedup_bound": round(statistics.median(r["speedup_bound"] for r in rows), 3),
            "median_copy_free_bound": round(statistics.median(r["copy_free_bound"] for r in rows), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8123/v1", help="a vLLM server (default: bspec server start vllm --port 8123)")
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=["code-edit"])
    parser.add_argument("--prompt", nargs="+", default=None, help="only these prompt names")
    parser.add_argument("--groups", action="store_true", help="also verify each copied run with real groups of side branches, "
                        "each width timed (a few seconds per run and width)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = asyncio.run(measure(args))
    print(json.dumps({k: v for k, v in report.items() if k.startswith("median")}))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prediction_ceiling.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
