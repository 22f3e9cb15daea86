"""Cancelling a generation: a cancelled task, or Ctrl-C in the CLI, closes
every request in flight at once and leaves a consistent partial result.

Against the fake target served over real HTTP on loopback, streaming one
token every few milliseconds, so requests are really in flight."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from blackbox_spec import GenerationResult, GenerationStats, SpecClient
from blackbox_spec.client import GenerationStream
from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, in_flight, over_http
from blackbox_spec.client import PROBE_PROMPTS


class CountingTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, counting the requests whose response is not closed yet."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.open = 0
        self.peak = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self.open -= 1
            raise
        response.stream = _Counted(response.stream, self)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Counted(httpx.AsyncByteStream):
    def __init__(self, stream, owner: CountingTransport) -> None:
        self.stream, self.owner, self.closed = stream, owner, False

    async def __aiter__(self):
        async for chunk in self.stream:
            yield chunk

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.open -= 1
        await self.stream.aclose()


@pytest.fixture(scope="module")
def slow_server():
    with over_http(FakeTarget(decode_s=0.01, latency=0.01)) as pair:
        yield pair


@pytest.mark.parametrize("strategy", ["auto", "echo", "fanout", "plain"])
async def test_cancelling_the_task_closes_every_request(slow_server, strategy):
    fake, url = slow_server
    prompt = PROMPTS["code"] * 3
    transport = CountingTransport()
    async with SpecClient(url, None, "fake-model", strategy=strategy, transport=transport) as client:
        stream = client.stream(prompt, max_tokens=400)
        shown: list[str] = []

        async def read() -> None:
            async for piece in stream:
                shown.append(piece)

        task = asyncio.create_task(read())
        # Cancel mid-request: between rounds (drafting, or fan-out calls all
        # just answered) nothing is open, so wait for text *and* a live request.
        deadline = time.perf_counter() + 20
        while not (len("".join(shown)) >= 30 and transport.open >= 1):
            assert not task.done() and time.perf_counter() < deadline, "no request in flight to cancel"
            await asyncio.sleep(0.001)
        asked = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.perf_counter() - asked
        assert transport.open == 0, "a request was left open"
        assert took < 0.5
    result = stream.result
    assert result.stats.interrupted and result.finish_reason is None
    assert result.text == "".join(shown)  # what was shown is what the result holds
    assert fake.generate(prompt, 400)[0].startswith(result.text)
    deadline = time.time() + 3
    while in_flight(url) and time.time() < deadline:
        await asyncio.sleep(0.02)
    assert in_flight(url) == 0  # the server noticed and stopped writing


async def test_a_piece_made_as_the_reader_is_cancelled_is_still_handed_over():
    """The step had made its piece (and ``result`` holds it) when the cancel
    came: the reader gets it, and the cancel lands at its next await, so what
    was shown stays what the result holds."""
    result = GenerationResult("", GenerationStats())

    async def pieces():
        for piece in ("first", "second"):
            result.text += piece
            yield piece
        await asyncio.sleep(10)

    stream = GenerationStream(pieces(), result)
    shown: list[str] = []

    async def read() -> None:
        async for piece in stream:
            shown.append(piece)

    reader = asyncio.create_task(read())
    while len(shown) < 1 or stream._step is None or not stream._step.done() or stream._step.result() != "second":
        await asyncio.sleep(0)
    reader.cancel()  # "second" is made, the reader has not resumed yet
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert shown == ["first", "second"] and result.text == "firstsecond"
    await stream.aclose()

    # And under asyncio.timeout the same cancel is still a TimeoutError.
    result = GenerationResult("", GenerationStats())
    stream = GenerationStream(pieces(), result)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            async for piece in stream:
                pass
    await stream.aclose()


async def test_closing_the_stream_early_is_an_interruption_too(slow_server):
    fake, url = slow_server
    transport = CountingTransport()
    async with SpecClient(url, None, "fake-model", transport=transport) as client:
        stream = client.stream(PROMPTS["prose"], max_tokens=300)
        async for piece in stream:
            if len(stream.result.text) > 20:
                break
        await stream.aclose()
        assert transport.open == 0
    assert stream.result.stats.interrupted


def _bspec(url: str, prompt_path: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return subprocess.Popen(
        [sys.executable, "-m", "blackbox_spec.cli", "run", prompt_path, "--base-url", url, "--model", "fake-model", "--max-tokens", "2000", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        # A shell's background job (`.ci/run &`) starts with SIGINT ignored,
        # and Python then never raises KeyboardInterrupt: give the child the
        # terminal's default, which is what a user pressing Ctrl-C has.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.parametrize("as_json", [True, False])
def test_ctrl_c_in_the_cli_reports_the_partial_text(slow_server, tmp_path, as_json):
    fake, url = slow_server
    prompt = PROMPTS["code"] * 3
    path = tmp_path / "prompt.txt"
    path.write_text(prompt)
    before = len(fake.requests)
    process = _bspec(url, str(path), *(["--json"] if as_json else []))
    deadline = time.time() + 60
    def generating() -> bool:  # past the probe (prompt "Hello"), with a request open
        return sum(r.get("prompt") not in PROBE_PROMPTS for r in fake.requests[before:]) >= 2 and in_flight(url) >= 1

    while not generating() and time.time() < deadline:
        time.sleep(0.02)
    shown = b""
    if not as_json:  # interrupt once text is on the screen (a loaded machine may take a while)
        os.set_blocking(process.stdout.fileno(), False)
        while not shown and time.time() < deadline:
            shown = process.stdout.read() or b""
            time.sleep(0.02)
    # With --json nothing shows before the end: give the first accepted text
    # time to arrive (0.3 s was too short once on a loaded machine).
    time.sleep(1.0 if as_json else 0.3)
    process.send_signal(signal.SIGINT)
    asked = time.time()
    if not as_json:
        os.set_blocking(process.stdout.fileno(), True)
    stdout, stderr = process.communicate(timeout=30)
    stdout = shown + stdout
    took = time.time() - asked
    assert process.returncode == 130, stderr.decode()
    assert took < 3.0
    err = stderr.decode()
    assert "Traceback" not in err and "bspec: interrupted after" in err
    truth = fake.generate(prompt, 2000)[0]
    if as_json:
        data = json.loads(stdout)
        assert data["interrupted"] is True and data["stats"]["interrupted"] is True and data["error"] == "interrupted"
        assert data["text"] and truth.startswith(data["text"]) and data["finish_reason"] is None
    else:
        text = stdout.decode()  # streamed as it came; the line break went to stderr
        assert text and truth.startswith(text)


def test_ctrl_c_in_a_batch_prints_what_was_under_way(slow_server, tmp_path):
    fake, url = slow_server
    prompts = [PROMPTS["code"] * 3 + str(k) for k in range(4)]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"prompt": p, "id": k}) + "\n" for k, p in enumerate(prompts)))
    before = len(fake.requests)
    process = _bspec(url, str(batch), "--concurrency", "2", "--quiet")
    deadline = time.time() + 60
    while len(fake.requests) < before + 4 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr.decode()
    lines = [json.loads(x) for x in stdout.decode().splitlines()]
    assert 1 <= len(lines) <= 2 and all(line["interrupted"] for line in lines)  # two were under way, none finished
    for line in lines:
        assert fake.generate(prompts[line["id"]], 2000)[0].startswith(line["text"])
    assert "Traceback" not in stderr.decode()
