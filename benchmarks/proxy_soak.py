"""Soaks ``bspec serve`` with hostile and careless callers and upstream faults: wrong answers, held slots, memory.

Soak ``bspec serve`` with hostile and careless callers (issue 19).

The fake upstream runs in its own process with injected faults (429, 500,
timeouts, streams cut part-way); ``bspec serve`` runs as users start it, in
its own process.  Concurrent callers send a mix of greedy requests (streamed
or not: their text must equal the upstream's own greedy answer), sampled
ones (passed through), malformed ones (a 4xx each, never a 500), and callers
that leave mid-answer or while queued.  At the end the proxy must hold no
slot, the upstream no request, and the proxy's memory must not have grown.

    python benchmarks/proxy_soak.py --requests 2000 --concurrency 32 --fault-rate 0.2 --out benchmarks/results/proxy-soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.fake_target import FakeModel

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 4,
    "The quick brown fox jumps over the lazy dog. " * 12,
    '{"name": "widget", "price": 12, "tags": ["a", "b"]}\n' * 6,
    "Rename every `user` to `account`:\nuser = load(user_id)\nsave(user)\n" * 5,
]

MALFORMED: list[tuple[bytes, dict[str, str]]] = [
    (b"{not json", {}),
    (b'{"model": "fake-model", "prompt": "x", "temperature": 0, "max_tokens": 5, "stream_options": "x"}', {}),
    (b'{"model": ["fake-model"], "prompt": "x", "temperature": 0, "max_tokens": 5}', {}),
    (b'{"model": "fake-model", "prompt": "\\ud800", "temperature": 0, "max_tokens": 5}', {}),
    (b"[" * 100_000 + b"]" * 100_000, {}),
    (b'{"model": "fake-model", "prompt": "x", "temperature": 0, "max_tokens": 5}', {"content-type": "text/plain"}),
    (b'{"model": "fake-model", "prompt": "x", "temperature": 0, "max_tokens": 5}', {"host": "evil.example"}),
    ('{"model": "fake-model", "prompt": "x", "temperature": 0, "max_tokens": 5, "字段": 1}'.encode(), {}),
    (b'{"model": "fake-model", "prompt": "x", "temperature": NaN, "max_tokens": 5}', {}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


class Soak:
    def __init__(self, base: str, upstream: str, seed: int) -> None:
        self.base, self.upstream = base, upstream
        self.rng = random.Random(seed)
        self.expected = FakeTarget(model=FakeModel(deviate_every=9))  # the same model as the served fake: its greedy answers
        self.outcomes: Counter = Counter()
        self.wrong: list[dict] = []
        self.statuses: Counter = Counter()
        self.latency: dict[str, list[float]] = {}

    def expect(self, body: dict) -> str:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        answer = self.expected.handle(httpx.Request("POST", "http://x" + path, json={**body, "stream": False})).json()
        choice = answer["choices"][0]
        return choice["message"]["content"] if "messages" in body else choice["text"]

    def greedy_body(self, i: int) -> dict:
        prompt = self.rng.choice(PROMPTS) + f"\n# request {i % 50}\n"
        body = {"model": "fake-model", "temperature": 0, "max_tokens": self.rng.choice([16, 48, 96])}
        if self.rng.random() < 0.5:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def one(self, http: httpx.AsyncClient, i: int) -> None:
        draw = self.rng.random()
        started = time.perf_counter()
        if draw < 0.45:
            kind = "greedy"
            body = self.greedy_body(i)
            stream = self.rng.random() < 0.5
            text, status, _ = await self._generate(http, body, stream)
            if status == 200:
                if text != self.expect(body):
                    self.wrong.append({"body": body, "stream": stream, "got": text})
                    self.outcomes["wrong"] += 1
                else:
                    self.outcomes["greedy identical"] += 1
            else:
                self.outcomes[f"greedy error {status}"] += 1
        elif draw < 0.65:
            kind = "sampled"
            body = {**self.greedy_body(i), "temperature": 0.7}
            _, status, via = await self._generate(http, body, self.rng.random() < 0.5)
            if status >= 500 and via == "passthrough":
                self.outcomes[f"sampled: the upstream's own {status} passed on"] += 1
                status = f"upstream {status}"
        elif draw < 0.85:
            kind = "malformed"
            raw, headers = self.rng.choice(MALFORMED)
            response = await http.post("/v1/completions", content=raw, headers={"content-type": "application/json", **headers})
            status = response.status_code
            passed = response.headers.get("x-bspec", "").startswith("passthrough")
            self.outcomes["malformed 4xx" if 400 <= status < 500 else f"malformed {status}{' (passed through)' if passed else ''}"] += 1
            if status >= 500 and passed:
                status = f"upstream {status}"  # an injected fault, passed on as the upstream answered
        else:
            kind = "disconnect"
            status = await self._leave(http, self.greedy_body(i))
        self.statuses[str(status)] += 1
        self.latency.setdefault(kind, []).append(time.perf_counter() - started)

    async def _generate(self, http: httpx.AsyncClient, body: dict, stream: bool) -> tuple[str, int, str]:
        """(text, status, how the proxy handled it: the x-bspec header's first word)."""
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        if not stream:
            response = await http.post(path, json=body)
            via = re.split("[;]", response.headers.get("x-bspec", ""))[0]
            if response.status_code != 200:
                return "", response.status_code, via
            choice = response.json()["choices"][0]
            return (choice["message"]["content"] if "messages" in body else choice["text"]), 200, via
        text = ""
        async with http.stream("POST", path, json={**body, "stream": True}) as response:
            via = re.split("[;]", response.headers.get("x-bspec", ""))[0]
            if response.status_code != 200:
                await response.aread()
                return "", response.status_code, via
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return text, 599, via  # an error after text began (the stream says so)
                for choice in event["choices"]:
                    text += (choice["delta"].get("content") or "") if "messages" in body else choice["text"]
        return text, 200, via

    async def _leave(self, http: httpx.AsyncClient, body: dict) -> int:
        """A caller that reads a little (or nothing) and goes away."""
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        body = {**body, "max_tokens": 400}
        try:
            if self.rng.random() < 0.5:
                async with http.stream("POST", path, json={**body, "stream": True}) as response:
                    async for _ in response.aiter_lines():
                        if self.rng.random() < 0.2:
                            break
            else:
                await http.post(path, json=body, timeout=httpx.Timeout(10, read=self.rng.uniform(0.01, 0.3)))
        except httpx.TimeoutException:
            pass
        self.outcomes["left"] += 1
        return 499


async def drive(soak: Soak, requests: int, concurrency: int, on_progress) -> float:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=soak.base, timeout=120, limits=limits) as http:
        done = 0

        async def run(i: int) -> None:
            nonlocal done
            async with gate:
                try:
                    await soak.one(http, i)
                except httpx.HTTPError as exc:
                    soak.outcomes[f"client error {type(exc).__name__}"] += 1
            done += 1
            on_progress(done)

        started = time.perf_counter()
        await asyncio.gather(*(run(i) for i in range(requests)))
        return time.perf_counter() - started


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def wait_until_up(base: str) -> None:
    """Poll ``/health`` of the proxy until it answers (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(base + "/health")
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise SystemExit("bspec serve did not start")
            time.sleep(0.1)


def settled_state(base: str, url: str) -> tuple[dict, int]:
    """Let the proxy's cancelled work finish closing, then look: its metrics
    and the upstream's requests in flight."""
    for _ in range(100):
        metrics = httpx.get(base + "/metrics").json()
        in_flight = httpx.get(url.removesuffix("/v1") + "/fake/stats").json()["in_flight"]
        if metrics["in_progress"] == metrics["queued"] == metrics["speculating"] == 0 and in_flight == 0:
            break
        time.sleep(0.1)
    return metrics, in_flight


def main() -> int:
    args = parse_args()
    upstream = subprocess.Popen([sys.executable, "-m", "blackbox_spec.testing", "--port", "0", "--latency-ms", "5", "--decode-ms", "2",
                                 "--fault-rate", str(args.fault_rate), "--fault-seed", str(args.seed), "--hang-s", "1"],
                                stdout=subprocess.PIPE, text=True)
    url = re.search(r"http://\S+/v1", upstream.stdout.readline()).group(0)
    port = free_port()
    env = {**os.environ, "BSPEC_PROFILES": tempfile.mkdtemp(prefix="soak-profiles-")}
    env.pop("OPENAI_API_KEY", None)
    serve = subprocess.Popen([sys.executable, "-m", "blackbox_spec.cli", "serve", "--base-url", url, "--port", str(port), "--max-speculative", "4",
                              "--timeout", "5", "--max-concurrency", "16"], stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base)
        soak = Soak(base, url, args.seed)
        rss: dict[str, float] = {"start": rss_mb(serve.pid)}
        warm = max(1, args.requests // 10)

        def progress(done: int) -> None:
            if done == warm:
                rss["warm"] = rss_mb(serve.pid)
            if done % 200 == 0:
                print(f"  {done}/{args.requests}  rss {rss_mb(serve.pid):.0f} MB  {dict(soak.statuses)}", file=sys.stderr, flush=True)

        wall = asyncio.run(drive(soak, args.requests, args.concurrency, progress))
        metrics, in_flight = settled_state(base, url)
        rss["end"] = rss_mb(serve.pid)
        report = {
            "command": " ".join(["python", "benchmarks/proxy_soak.py", *sys.argv[1:]]),
            "requests": args.requests, "concurrency": args.concurrency, "fault_rate": args.fault_rate, "wall_s": round(wall, 1),
            "outcomes": dict(soak.outcomes), "statuses": dict(sorted(soak.statuses.items())),
            "wrong_answers": len(soak.wrong), "proxy_500s": soak.statuses.get("500", 0),
            "stuck": {"in_progress": metrics["in_progress"], "queued": metrics["queued"], "speculating": metrics["speculating"],
                      "upstream_in_flight": in_flight},
            "rss_mb": {k: round(v, 1) for k, v in rss.items()}, "rss_growth_after_warmup_mb": round(rss["end"] - rss["warm"], 1),
            "latency_s_median": {k: round(statistics.median(v), 3) for k, v in soak.latency.items()},
            "proxy_metrics": metrics,
        }
    finally:
        serve.terminate()
        upstream.terminate()
        serve.wait(timeout=15)
        upstream.wait(timeout=15)
    print(json.dumps({k: v for k, v in report.items() if k != "proxy_metrics"}, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n")
        if soak.wrong:
            (args.out / "wrong.json").write_text(json.dumps(soak.wrong[:20], indent=2) + "\n")
    ok = (not soak.wrong and not soak.statuses.get("500") and not any(report["stuck"].values()) and report["rss_growth_after_warmup_mb"] < 50)
    print("PASS" if ok else "FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
