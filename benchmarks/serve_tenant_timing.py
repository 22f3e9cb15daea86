"""Does one caller's history change another caller's answer time on ``bspec serve``?

A fake upstream with a GPU-like cost (20 ms a request, 5 ms a token) whose
answers no prompt lookup can draft.  Per repeat, on fresh proxies: caller B
asks a request alone; caller A asks it three times, then B asks it.  With
sessions per caller key (the default) B's time should not move; with
``--share-sessions`` B drafts A's answer (the control).  Medians of
``--repeats``, B's upstream calls and accepted draft tokens beside them.

    python benchmarks/serve_tenant_timing.py --repeats 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx

from blackbox_spec.proxy import Proxy
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.fake_target import FakeModel

KEYS = ["tenant-a-key-000", "tenant-b-key-000"]
BODY = {"model": "fake-model", "prompt": "The model reads the text. The model reads the text and the model writes the",
        "temperature": 0, "max_tokens": 120}


async def b_after(history: int, share: bool) -> tuple[float, int, int]:
    """B's seconds, rounds and accepted tokens after A asked ``history`` times."""
    upstream = FakeTarget(model=FakeModel(deviate_every=3), latency=0.02, decode_s=0.005)
    proxy = Proxy("http://upstream.test/v1", None, transport=httpx.MockTransport(upstream.handle_async), client_keys=KEYS,
                  max_speculative=4, client_options={"drafter": "suffix"}, share_sessions=share)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost", timeout=60) as http:
            for _ in range(history):
                await http.post("/v1/completions", json=BODY, headers={"authorization": f"Bearer {KEYS[0]}"})
            started = time.perf_counter()
            answer = await http.post("/v1/completions", json=BODY, headers={"authorization": f"Bearer {KEYS[1]}"})
            seconds = time.perf_counter() - started
        return seconds, int(answer.headers["x-bspec-rounds"]), int(answer.headers["x-bspec-accepted-tokens"])
    finally:
        await proxy.aclose()


async def main(repeats: int) -> dict:
    report = {}
    for share in (False, True):
        rows: dict[str, list[tuple[float, int, int]]] = {"alone": [], "after A": []}
        for _ in range(repeats):  # (interleaved: load drifts alike for both)
            rows["alone"].append(await b_after(0, share))
            rows["after A"].append(await b_after(3, share))
        report["shared sessions" if share else "sessions per key (default)"] = {
            case: {"median_s": round(statistics.median(r[0] for r in got), 4), "rounds": sorted({r[1] for r in got}),
                   "accepted_tokens": sorted({r[2] for r in got})}
            for case, got in rows.items()
        }
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.repeats)), indent=1))
