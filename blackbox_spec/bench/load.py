"""Load on an OpenAI-compatible endpoint: N concurrent clients (the official
``openai`` SDK) working through a fixed list of requests.

Used by the proxy's load test and ``benchmarks/proxy_bench.py``: the same
requests go to the upstream directly and through ``bspec serve``, and the
two reports are compared (throughput, latency percentiles, and whether every
answer was the same).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between ranks.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class LoadReport:
    label: str
    clients: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        done = len(self.latencies)
        return {
            "label": self.label, "clients": self.clients, "requests": len(self.texts), "completed": done, "errors": len(self.errors),
            "seconds": round(self.seconds, 3),
            "requests_per_s": round(done / self.seconds, 3) if self.seconds else None,
            "tokens_per_s": round(self.completion_tokens / self.seconds, 2) if self.seconds else None,
            "latency_s": {name: round(percentile(self.latencies, q), 3) for name, q in (("p50", 50), ("p90", 90), ("p99", 99))},
            "latency_mean_s": round(statistics.fmean(self.latencies), 3) if self.latencies else None,
        }


async def run_load(base_url: str, requests: list[dict[str, Any]], *, clients: int = 16, label: str = "", api_key: str = "none", timeout: float = 900.0) -> LoadReport:
    """Send ``requests`` (chat bodies, or completions bodies with ``prompt``)
    from ``clients`` concurrent SDK clients; answers are kept in order."""
    import openai

    report = LoadReport(label, clients, texts=[None] * len(requests), headers=[""] * len(requests))
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=clients * 2), timeout=timeout)
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)

    async def client() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            body = requests[index]
            started = time.perf_counter()
            try:
                if "messages" in body:
                    raw = await sdk.chat.completions.with_raw_response.create(**body)
                    answer = raw.parse()
                    text = answer.choices[0].message.content
                else:
                    raw = await sdk.completions.with_raw_response.create(**body)
                    answer = raw.parse()
                    text = answer.choices[0].text
            except openai.OpenAIError as exc:
                report.errors.append(f"{index}: {type(exc).__name__}: {exc}")
                continue
            report.latencies.append(time.perf_counter() - started)
            report.texts[index] = text
            report.headers[index] = raw.headers.get("x-bspec", "")
            report.completion_tokens += answer.usage.completion_tokens if answer.usage else 0

    started = time.perf_counter()
    try:
        await asyncio.gather(*(client() for _ in range(clients)))
    finally:
        report.seconds = time.perf_counter() - started
        await sdk.close()
    return report
