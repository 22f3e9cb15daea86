"""Measures the openai SDK three ways on the same server: plain, through
``bspec serve``'s request handling, and with ``blackbox_spec.sdk``'s
in-process http_client: medians, speed-ups, and whether every text equals
plain (issue 45).

    python benchmarks/sdk_bench.py --sim gpu            # a simulated server, real recorded text
    python benchmarks/sdk_bench.py --base-url http://127.0.0.1:8000/v1 --model qwen

Each prompt's runs are interleaved (plain, proxy, sdk, repeated), after one
untimed warm-up of each (the probe a first call makes).  Chat, not streamed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
import openai

from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.proxy import Proxy
from blackbox_spec.sdk import async_http_client

WAYS = ("plain", "proxy", "sdk")


def clients(url: str, transport: httpx.AsyncBaseTransport | None, drafter: str) -> tuple[dict[str, openai.AsyncOpenAI], Proxy]:
    """One SDK client per way; the proxy's is reached in-process too, so
    that the two speculative ways differ only in how the SDK gets there."""
    proxy = Proxy(url, None, transport=transport, client_options={"drafter": drafter})
    by_proxy = httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), timeout=900)
    direct = httpx.AsyncClient(transport=transport or httpx.AsyncHTTPTransport(), timeout=900)
    return {
        "plain": openai.AsyncOpenAI(base_url=url, api_key="none", http_client=direct, max_retries=0),
        "proxy": openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="none", http_client=by_proxy, max_retries=0),
        "sdk": openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0,
                                  http_client=async_http_client(url, transport=transport, client_options={"drafter": drafter})),
    }, proxy


async def timed(client: openai.AsyncOpenAI, body: dict) -> tuple[float, str]:
    started = time.perf_counter()
    answer = await client.chat.completions.create(**body)
    return time.perf_counter() - started, answer.choices[0].message.content


async def bench(url: str, model: str, transport, prompts, repeats: int, drafter: str) -> list[dict]:
    sdks, proxy = clients(url, transport, drafter)
    rows = []
    for prompt in prompts:
        body = {"model": model, "messages": prompt.messages, "temperature": 0, "max_tokens": prompt.max_tokens}
        for way in WAYS:
            await timed(sdks[way], body)  # warm-up: the first call's probe
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        texts: dict[str, set[str]] = {way: set() for way in WAYS}
        for repeat in range(repeats):
            for way in WAYS[repeat % 3:] + WAYS[:repeat % 3]:
                wall, text = await timed(sdks[way], body)
                seconds[way].append(wall)
                texts[way].add(text)
        medians = {way: statistics.median(seconds[way]) for way in WAYS}
        same = texts["proxy"] == texts["sdk"] == texts["plain"] and len(texts["plain"]) == 1
        rows.append({"prompt": prompt.name, **{f"{w}_s": round(medians[w], 3) for w in WAYS},
                     "proxy_x": round(medians["plain"] / medians["proxy"], 2), "sdk_x": round(medians["plain"] / medians["sdk"], 2), "same_text": same})
        print(json.dumps(rows[-1]), flush=True)
    await proxy.aclose()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sim", help="a simulated server preset (blackbox_spec.testing.sim: gpu, hosted, cpu, one-slot)")
    where.add_argument("--base-url", help="a running server")
    parser.add_argument("--model", default="sim", help="the server's model (--base-url)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=len(REAL_PROMPTS), help="the first N real prompts (edits first)")
    parser.add_argument("--drafter", default="suffix")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.sim:
        from blackbox_spec.testing.sim import SimulatedTarget

        sim = SimulatedTarget.preset(args.sim, replay=True, model_name="sim")
        url, transport = f"http://sim-{args.sim}/v1", sim.transport()
    else:
        url, transport = args.base_url, None
    rows = asyncio.run(bench(url, args.model, transport, REAL_PROMPTS[:args.prompts], args.repeats, args.drafter))
    total = {way: sum(r[f"{way}_s"] for r in rows) for way in WAYS}
    print(f"total: plain {total['plain']:.1f} s, proxy {total['plain'] / total['proxy']:.2f}x, sdk {total['plain'] / total['sdk']:.2f}x; "
          f"texts equal to plain: {sum(r['same_text'] for r in rows)}/{len(rows)}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "total": total}, indent=1))
    return 0 if all(r["same_text"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
