"""Soaks ``bspec serve`` with many callers under three keys, hang-ups and upstream faults: wrong answers, leaks, memory.

A multi-tenant soak of ``bspec serve``: many callers under three keys,
a third of them hanging up at random points, faults injected upstream.

Three processes: the fake upstream (``python -m blackbox_spec.testing``,
with latency, per-token cost and injected 429 / 500 / timeout / reset
faults), ``bspec serve`` with three client keys, and this load generator
with ``--callers`` concurrent callers for ``--minutes``.  Each caller loops:
a greedy completions or chat request (streamed or not) or a sampled one
(passed through), as one of the three keys.  A caller that is to hang up
cancels its request after a random delay (before its first byte or mid-
answer).  Every answer read to its end is checked against the plain
greedy answer (computed here, by the same deterministic fake model).

It reports: answers checked / wrong / lost (an error from bspec serve on a
greedy request), HTTP 500s from bspec serve itself (passed-through
upstream faults carry ``x-bspec: passthrough``), hang-ups, the proxy's RSS
over time, what holds a slot once the load stops (must be nothing), the
upstream's requests still in flight (must be none), and per tenant the
median latency and accepted draft tokens of greedy requests.

    python benchmarks/serve_soak.py --minutes 10 --callers 200 --out benchmarks/results/serve-soak/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import httpx

from blackbox_spec.testing import FakeTarget

KEYS = ["soak-tenant-a-key", "soak-tenant-b-key", "soak-tenant-c-key"]
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The model reads the text. The model reads the text and the model writes the",
    '{"name": "alpha", "items": [1, 2, 3], "name": "beta", "items": [4, 5',
    "SELECT id, name FROM users WHERE id = 1;\nSELECT id, name FROM users WHERE id = 2;\n",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Truth:
    """The plain greedy answer to a body, from the same deterministic fake model."""

    def __init__(self) -> None:
        self.fake = FakeTarget()
        self.cache: dict[str, str] = {}

    def of(self, path: str, body: dict) -> str:
        plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        key = path + json.dumps(plain, sort_keys=True)
        if key not in self.cache:
            data = self.fake.handle(httpx.Request("POST", "http://fake/v1" + path, json=plain)).json()
            choice = data["choices"][0]
            self.cache[key] = choice["message"]["content"] if "message" in choice else choice["text"]
        return self.cache[key]


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.accepted: dict[str, list[int]] = defaultdict(list)
        self.statuses: dict[str, int] = defaultdict(int)
        self.examples: list[str] = []
        self.began = time.monotonic()
        self.per_minute: dict[int, int] = defaultdict(int)  # greedy answers checked, by minute


def make_request(rng: random.Random) -> tuple[str, dict, bool]:
    """(path, body, greedy) of one caller's next request."""
    prompt = rng.choice(PROMPTS) * rng.choice((1, 2))
    greedy = rng.random() < 0.8
    body: dict = {"model": "fake-model", "temperature": 0 if greedy else 0.7, "max_tokens": rng.choice((16, 48, 96)), "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/completions", dict(body, prompt=prompt), greedy
    return "/chat/completions", dict(body, messages=[{"role": "user", "content": prompt}]), greedy


async def read_answer(response: httpx.Response, stream: bool, chat: bool) -> str | None:
    """The text of an answer read to its end; None where it carried an error event."""
    if not stream:
        data = json.loads(await response.aread())
        choice = data["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    text = []
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            return None
        for choice in event.get("choices", []):
            text.append((choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or "")
    return "".join(text)


async def one(http: httpx.AsyncClient, tally: Tally, truth: Truth, rng: random.Random, tenant: int, hangs_up: bool) -> None:
    path, body, greedy = make_request(rng)
    key = KEYS[tenant]
    started = time.perf_counter()

    seen = {"headers": None}

    async def call() -> None:
        async with http.stream("POST", path, json=body, headers={"authorization": f"Bearer {key}"}) as response:
            seen["headers"] = round(time.perf_counter() - started, 1)
            tag = response.headers.get("x-bspec", "")
            tally.statuses[str(response.status_code)] += 1
            if response.status_code >= 500 and not tag.startswith("passthrough"):
                tally.counts["bspec_5xx"] += 1
                if response.status_code == 500:
                    tally.counts["bspec_500"] += 1
                tally.examples.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                if greedy:
                    tally.counts["lost"] += 1
                return
            if response.status_code != 200:
                tally.counts["upstream_errors_passed_on" if tag.startswith("passthrough") else "refused"] += 1
                return
            text = await read_answer(response, body["stream"], path == "/chat/completions")
            if not greedy:
                tally.counts["sampled_ok"] += 1
                return
            if text is None:
                tally.counts["lost"] += 1
                return
            if text != truth.of(path, body):
                tally.counts["wrong"] += 1
                tally.examples.append(f"wrong: {text[:80]!r}")
                return
            tally.counts["checked"] += 1
            tally.per_minute[int((time.monotonic() - tally.began) // 60)] += 1
            tally.latency[key].append(time.perf_counter() - started)
            accepted = response.headers.get("x-bspec-accepted-tokens")
            if accepted is not None:
                tally.accepted[key].append(int(accepted))

    task = asyncio.ensure_future(call())
    if hangs_up:
        await asyncio.wait({task}, timeout=rng.uniform(0.0, 1.5))
        if not task.done():
            task.cancel()
            tally.counts["hung_up"] += 1
    try:
        await task
    except asyncio.CancelledError:
        pass
    except httpx.HTTPError as exc:
        tally.counts["transport_errors"] += 1
        tally.examples.append(f"transport: {type(exc).__name__} after {time.perf_counter() - started:.1f} s (headers at {seen['headers']} s, "
                              f"{'stream' if body['stream'] else 'whole'}, {'greedy' if greedy else 'sampled'}, {path})")


async def caller(index: int, base: str, tally: Tally, truth: Truth, until: float) -> None:
    rng = random.Random(index)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(120, connect=10)) as http:
        while time.monotonic() < until:
            await one(http, tally, truth, rng, index % 3, hangs_up=(index // 3) % 3 == 0)  # (a third of each tenant's callers)


async def load(base: str, callers: int, seconds: float, proxy_pid: int) -> tuple[Tally, list[tuple[float, float]]]:
    tally, truth = Tally(), Truth()
    until = time.monotonic() + seconds
    rss: list[tuple[float, float]] = []

    async def sample() -> None:
        started = time.monotonic()
        while time.monotonic() < until:
            rss.append((round(time.monotonic() - started, 1), round(rss_mb(proxy_pid), 1)))
            await asyncio.sleep(10)

    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(caller(i, base, tally, truth, until) for i in range(callers)))
    sampler.cancel()
    return tally, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=200)
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--out", help="write the report here as JSON")
    args = parser.parse_args()
    fake_port, proxy_port = free_port(), free_port()
    fake = subprocess.Popen([sys.executable, "-m", "blackbox_spec.testing", "--port", str(fake_port), "--latency-ms", "20", "--decode-ms", "2",
                             "--fault-rate", str(args.fault_rate), "--hang-s", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = (args.out or "/tmp/bspec-soak") + ".serve.log"
    env = dict(os.environ, BSPEC_SERVE_KEYS=",".join(KEYS), BSPEC_PROFILES=os.environ.get("BSPEC_PROFILES", "/tmp/bspec-soak-profiles"))
    proxy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "bspec"), "serve", "--base-url", f"http://127.0.0.1:{fake_port}/v1", "--port", str(proxy_port), "--timeout", "30",
                              "--max-speculative", "16"], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        wait_up(f"http://127.0.0.1:{fake_port}/fake/stats")
        wait_up(f"http://127.0.0.1:{proxy_port}/health")
        base = f"http://127.0.0.1:{proxy_port}/v1"
        print(f"[soak] {args.callers} callers, {args.minutes} min, fault rate {args.fault_rate}", flush=True)
        tally, rss = asyncio.run(load(base, args.callers, args.minutes * 60, proxy.pid))
        time.sleep(3)  # (hung-up requests' cleanup, retries' last attempts)
        metrics = httpx.get(f"http://127.0.0.1:{proxy_port}/metrics", headers={"authorization": f"Bearer {KEYS[0]}"}).json()
        upstream = httpx.get(f"http://127.0.0.1:{fake_port}/fake/stats").json()
    finally:
        proxy.terminate()
        fake.terminate()
        proxy.wait(10)
        fake.wait(10)
    report = {
        "callers": args.callers, "minutes": args.minutes, "fault_rate": args.fault_rate, "counts": dict(tally.counts), "statuses": dict(tally.statuses),
        "examples": tally.examples[:40], "rss_mb": rss, "checked_per_minute": dict(sorted(tally.per_minute.items())),
        "after": {k: metrics[k] for k in ("in_progress", "passing_through", "queued", "speculating", "disconnected", "failed", "rejected_busy",
                                          "speculated", "plain_when_busy", "requests")},
        "upstream_after": {k: upstream.get(k) for k in ("in_flight", "peak_in_flight", "served", "faults")},
        "tenants": {key[:13]: {"greedy_answers": len(tally.latency[key]), "median_latency_s": round(statistics.median(tally.latency[key]), 3) if tally.latency[key] else None,
                               "p90_latency_s": round(statistics.quantiles(tally.latency[key], n=10)[-1], 3) if len(tally.latency[key]) > 10 else None,
                               "mean_accepted_tokens": round(statistics.fmean(tally.accepted[key]), 2) if tally.accepted[key] else None}
                    for key in KEYS},
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
