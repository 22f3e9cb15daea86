"""How long ``/health`` of ``bspec serve`` takes to answer while a large
prompt is being handled (issue 19 asks < 100 ms for a 5 MB prompt).

    python bench/proxy_large_prompt.py

A 5,000,000-character prompt (beyond the speculation limit: passed through,
refused by the fake upstream's 200k-token context) and a 300,000-character one
(speculated on: its drafter index is built in a thread).  /health is polled
every 20 ms meanwhile; median and max latency are printed.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time

import httpx

from blackbox_spec.proxy import Proxy, running
from blackbox_spec.testing import FakeTarget


def main() -> None:
    for chars in (5_000_000, 300_000):
        prompt = ("def f(x):\n    return x + 1\n" * (chars // 28 + 1))[:chars]
        httpd = FakeTarget(latency=0.01, decode_s=0.002, context_window=200_000).serve()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        try:
            with running(Proxy(url, None, client_options={"drafter": "suffix"})) as base:
                request = {"model": "fake-model", "prompt": prompt, "temperature": 0, "max_tokens": 16}
                with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client() as http:
                    started = time.perf_counter()
                    sending = pool.submit(lambda: httpx.post(base + "/completions", json=request, timeout=120))
                    latencies = []
                    while not sending.done():
                        t = time.perf_counter()
                        http.get(base.removesuffix("/v1") + "/health")
                        latencies.append(time.perf_counter() - t)
                        time.sleep(0.02)
                    answer = sending.result()
        finally:
            httpd.shutdown()
        print(f"{chars:>9} chars: {answer.status_code} {answer.headers['x-bspec']}; request {time.perf_counter() - started:.2f} s; "
              f"/health n={len(latencies)} median {statistics.median(latencies) * 1000:.1f} ms max {max(latencies) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
