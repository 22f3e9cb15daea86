"""``bspec serve`` against the mocked upstream: the official openai SDK gets
the same answers through the proxy as from the upstream directly (chat and
completions, streaming or not), pass-through with its reason, metrics,
backpressure, client disconnects, and a loopback load test."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from blackbox_spec import SpecClient
from blackbox_spec.bench.load import run_load
from blackbox_spec.proxy import Proxy, passthrough_reason, running
from blackbox_spec.sdk import async_http_client
from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, chat_of, in_flight, over_http, turn_requests

UPSTREAM = "http://upstream.test/v1"


@pytest.fixture
def upstream() -> FakeTarget:
    return FakeTarget(latency=0.002, decode_s=0.001)


@pytest.fixture(params=["proxy", "sdk-client"])
async def sdks(upstream, request):
    """(through the proxy, directly): two openai SDK clients, in process.
    The first reaches the proxy as ``bspec serve`` runs it, or as
    ``blackbox_spec.sdk`` wraps it in the SDK's own http_client (issue 45:
    every test here holds for both)."""
    transport = httpx.MockTransport(upstream.handle_async)
    if request.param == "proxy":
        proxy = Proxy(UPSTREAM, None, transport=transport, client_options={"drafter": "suffix"})
        http = httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()))
        via = openai.AsyncOpenAI(base_url="http://localhost/v1", api_key="unused", http_client=http)
    else:
        http = async_http_client(UPSTREAM, None, transport=transport, client_options={"drafter": "suffix"})
        proxy = http._transport.proxy
        via = openai.AsyncOpenAI(base_url=UPSTREAM, api_key="unused", http_client=http)
    direct = openai.AsyncOpenAI(base_url=UPSTREAM, api_key="unused", http_client=httpx.AsyncClient(transport=httpx.MockTransport(upstream.handle_async)))
    via.proxy = proxy  # type: ignore[attr-defined]
    yield via, direct
    await via.close()
    await direct.close()
    await proxy.aclose()


def _same_answer(a, b, kind: str) -> None:
    """What must match: text, finish reason, model, token counts (ids and timestamps differ)."""
    first, second = a.choices[0], b.choices[0]
    if kind == "chat":
        assert (second.message.content, second.message.role) == (first.message.content, first.message.role)
    else:
        assert second.text == first.text
    assert second.finish_reason == first.finish_reason
    assert b.model == a.model
    assert (b.usage.prompt_tokens, b.usage.completion_tokens) == (a.usage.prompt_tokens, a.usage.completion_tokens)


@pytest.mark.parametrize("name", sorted(PROMPTS))
async def test_chat_through_the_proxy_equals_the_upstream(sdks, name):
    via, direct = sdks
    for options in ({"max_tokens": 70}, {"max_tokens": 70, "stop": ["\n\n", "value"]}, {"max_completion_tokens": 9}):
        request = {"model": "fake-model", "messages": chat_of(PROMPTS[name]), "temperature": 0, **options}
        raw = await via.chat.completions.with_raw_response.create(**request)
        _same_answer(await direct.chat.completions.create(**request), raw.parse(), "chat")
        assert raw.headers["x-bspec"].startswith("speculative")


@pytest.mark.parametrize("name", ["code", "cjk", "emoji"])
async def test_completions_through_the_proxy_equal_the_upstream(sdks, name):
    via, direct = sdks
    request = {"model": "fake-model", "prompt": PROMPTS[name], "temperature": 0, "max_tokens": 60}
    _same_answer(await direct.completions.create(**request), await via.completions.create(**request), "completions")


async def _streamed(stream, kind: str) -> tuple[str, str | None, object]:
    text, finish, usage, chunks = "", None, None, 0
    async for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if kind == "chat" else choice.text
            finish = choice.finish_reason or finish
    assert chunks >= 2
    return text, finish, usage and (usage.prompt_tokens, usage.completion_tokens)


@pytest.mark.parametrize("kind", ["chat", "completions"])
async def test_streams_through_the_proxy_equal_the_upstream(sdks, kind):
    via, direct = sdks
    for name in ("code", "mixed", "prose"):
        if kind == "chat":
            request = {"model": "fake-model", "messages": chat_of(PROMPTS[name]), "temperature": 0, "max_tokens": 60,
                       "stream": True, "stream_options": {"include_usage": True}}
            pair = [await _streamed(await sdk.chat.completions.create(**request), kind) for sdk in (direct, via)]
        else:
            request = {"model": "fake-model", "prompt": PROMPTS[name], "temperature": 0, "max_tokens": 60,
                       "stream": True, "stream_options": {"include_usage": True}}
            pair = [await _streamed(await sdk.completions.create(**request), kind) for sdk in (direct, via)]
        assert pair[0] == pair[1] and pair[0][0]


@pytest.mark.parametrize("extra, reason", [
    ({"temperature": 0.8}, "temperature is not 0"),
    ({"temperature": None}, "temperature not given"),
    ({"n": 2}, "n > 1"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]}, "tools"),
    ({"logprobs": True, "top_logprobs": 2}, "field logprobs"),
    ({"prediction": {"type": "content", "content": "def add"}, "temperature": 0.5}, "temperature is not 0"),
    ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "a prediction that is not text"),
    ({"max_tokens": None}, "max_tokens not given"),
    ({"frequency_penalty": 0.5}, "field frequency_penalty"),
    ({"messages": chat_of(PROMPTS["code"]) + [{"role": "assistant", "content": "def"}]}, "ends with an assistant message"),
])
async def test_what_cannot_be_speculated_is_passed_through_unchanged(sdks, upstream, extra, reason):
    via, direct = sdks
    request = {"model": "fake-model", "messages": chat_of(PROMPTS["code"]), "temperature": 0, "max_tokens": 30, **extra}
    request = {k: v for k, v in request.items() if v is not None}
    before = len(upstream.requests)
    raw = await via.chat.completions.with_raw_response.create(**request)
    forwarded = upstream.requests[before:]
    assert len(forwarded) == 1 and {k: v for k, v in forwarded[0].items() if not k.startswith("_")} == request
    assert raw.headers["x-bspec"] == f'passthrough; reason="{passthrough_reason("chat", request)}"' and reason in raw.headers["x-bspec"]
    if "n" not in extra and "tools" not in extra:
        assert raw.parse().choices[0].message.content == (await direct.chat.completions.create(**request)).choices[0].message.content
    assert via.proxy.metrics.passed_through == {passthrough_reason("chat", request): 1}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_greedy_request_with_a_prediction_is_drafted_from_it(sdks, upstream, stream):
    """The unchanged openai SDK call with ``prediction``: the proxy drafts the
    prediction itself (the upstream never sees it), the text is the
    upstream's own, and usage says how much of the prediction was kept."""
    via, direct = sdks
    messages = chat_of(PROMPTS["code"] * 2)
    truth = (await direct.chat.completions.create(model="fake-model", messages=messages, temperature=0, max_tokens=80)).choices[0].message.content
    for content in (truth, [{"type": "text", "text": truth[:40]}, {"type": "text", "text": truth[40:]}]):
        before = len(upstream.requests)
        request = {"model": "fake-model", "messages": messages, "temperature": 0, "max_tokens": 80,
                   "prediction": {"type": "content", "content": content}}
        if stream:
            text, finish, usage = await _streamed(await via.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}), "chat")
            assert text == truth
        else:
            raw = await via.chat.completions.with_raw_response.create(**request)
            answer = raw.parse()
            assert raw.headers["x-bspec"].startswith("speculative") and answer.choices[0].message.content == truth
            details = answer.usage.completion_tokens_details
            assert details.accepted_prediction_tokens >= 70 and details.rejected_prediction_tokens <= 10
        assert not any("prediction" in r for r in turn_requests(upstream)[before:])


async def test_an_upstream_with_predicted_outputs_gets_the_prediction(sdks, upstream):
    """Where the upstream's usage shows it speculates on predictions itself
    (OpenAI's), the proxy sends the prediction on and reports its counts."""
    via, direct = sdks
    upstream.predicted_outputs = True
    messages = chat_of(PROMPTS["code"] * 2)
    truth = (await direct.chat.completions.create(model="fake-model", messages=messages, temperature=0, max_tokens=80)).choices[0].message.content
    before = len(turn_requests(upstream))
    answer = await via.chat.completions.create(model="fake-model", messages=messages, temperature=0, max_tokens=80,
                                               prediction={"type": "content", "content": truth})
    assert answer.choices[0].message.content == truth
    assert [r["prediction"]["content"] for r in turn_requests(upstream)[before:] if "prediction" in r] == [truth]
    assert answer.usage.completion_tokens_details.accepted_prediction_tokens == len(upstream.tokenizer.encode(truth))


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize("stream", [False, True])
async def test_a_passed_through_answer_never_shows_the_proxys_key(stream):
    """An upstream that echoes the Authorization header: the key is cut out,
    also where it is split across chunks, and the rest arrives unchanged."""
    key = "sk-proxy-secret-0123456789"
    seen: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        echoed = f'{{"error": {{"message": "bad key {request.headers["authorization"]} for {key}"}}}}'.encode()
        if stream:
            events = b"data: {\"x\": 1}\n\n" + echoed + b"\n\n"
            cuts = [0, 5, events.index(b"sk-") + 3, events.index(b"sk-") + 10, events.rindex(b"sk-") + 1, len(events)]
            return httpx.Response(401, stream=_Chunks([events[a:b] for a, b in zip(cuts, cuts[1:])]), headers={"content-type": "text/event-stream"})
        return httpx.Response(401, content=echoed, headers={"content-type": "application/json"})

    proxy = Proxy(UPSTREAM, key, transport=httpx.MockTransport(upstream))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost") as http:
        body = {"model": "fake-model", "messages": chat_of("hi"), "temperature": 0.7, "stream": stream}
        response = await http.post("/v1/chat/completions", json=body)
    await proxy.aclose()
    assert seen == [f"Bearer {key}"]  # the upstream did get the key
    assert response.status_code == 401 and "passthrough" in response.headers["x-bspec"]
    assert key not in response.text and response.text.count("***") == 2
    assert "bad key Bearer *** for ***" in response.text
    if stream:
        assert response.text.startswith('data: {"x": 1}\n\n')


async def test_models_are_listed_from_the_upstream(sdks):
    via, _ = sdks
    assert [m.id for m in (await via.models.list()).data] == ["fake-model"]


async def test_metrics_count_speculation(sdks):
    via, _ = sdks
    request = {"model": "fake-model", "messages": chat_of(PROMPTS["code"] * 3), "temperature": 0, "max_tokens": 100}
    for _ in range(3):
        await via.chat.completions.create(**request)
    if via.base_url.host == "localhost":  # bspec serve: its /metrics route
        metrics = (await via._client.get("http://localhost/metrics")).json()
    else:  # in the SDK (no route of its own): the same counts
        metrics = via.proxy.metrics.to_dict()
    assert metrics["requests"] == metrics["speculated"] == 3 and metrics["in_progress"] == 0
    assert metrics["output_tokens"] == 300 and metrics["accepted_tokens"] > 0
    assert metrics["decode_steps_saved"] == metrics["accepted_tokens"] and 0 < metrics["acceptance_rate"] <= 1
    assert metrics["target_calls"] >= 3 and metrics["speedup_estimate"] is not None
    # The bill of those answers upstream, every request counted, against
    # three plain calls of 100 tokens each.
    assert metrics["bill"]["requests"] >= metrics["target_calls"] and metrics["bill"]["output_tokens"] >= 300
    assert metrics["plain_bill"]["requests"] == 3 and metrics["plain_bill"]["output_tokens"] == 300
    assert metrics["bill"]["prompt_tokens"] >= metrics["plain_bill"]["prompt_tokens"] > 0 and metrics["bill_vs_plain"] > 0
    assert metrics["cost"] is None  # (no --price given)


async def test_errors_are_the_upstreams_status_and_message(sdks):
    via, _ = sdks
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await via.chat.completions.create(model="no-such-model", messages=chat_of("hi"), temperature=0, max_tokens=5, stream=stream)
    response = await via._client.post(f"{via.base_url}chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]
    assert via.proxy.metrics.in_progress == 0


async def test_beyond_max_speculative_requests_decode_plainly(upstream):
    upstream.decode_s = 0.005
    proxy = Proxy(UPSTREAM, None, transport=httpx.MockTransport(upstream.handle_async), max_speculative=1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost") as http:
        body = {"model": "fake-model", "prompt": PROMPTS["code"], "temperature": 0, "max_tokens": 40}
        answers = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(3)))
    assert sorted(a.headers["x-bspec"].split(";")[0] for a in answers) == ["plain", "plain", "speculative"]
    assert len({a.json()["choices"][0]["text"] for a in answers}) == 1
    assert proxy.metrics.peak_speculating == 1 and proxy.metrics.plain_when_busy == 2
    await proxy.aclose()


async def test_a_full_queue_answers_503_with_retry_after(upstream):
    upstream.decode_s = 0.02
    proxy = Proxy(UPSTREAM, None, transport=httpx.MockTransport(upstream.handle_async), max_concurrency=1, max_queue=0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost") as http:
        body = {"model": "fake-model", "prompt": PROMPTS["prose"], "temperature": 0, "max_tokens": 20}
        first, second = await asyncio.gather(http.post("/v1/completions", json=body), http.post("/v1/completions", json=body))
    codes = sorted([first.status_code, second.status_code])
    assert codes == [200, 503]
    refused = first if first.status_code == 503 else second
    assert refused.headers["retry-after"] == "1" and "busy" in refused.json()["error"]["message"]
    assert proxy.metrics.rejected_busy == 1 and proxy.metrics.in_progress == 0
    await proxy.aclose()


# -- real sockets: disconnects and load ----------------------------------------------


@pytest.fixture
def served_upstream():
    with over_http(FakeTarget(latency=0.01, decode_s=0.01)) as pair:
        yield pair


def _busy(url: str, seconds: float = 3.0) -> bool:
    """The upstream has a request in flight at some moment within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if in_flight(url) >= 1:
            return True
        time.sleep(0.01)
    return False


def _wait_idle(url: str, seconds: float = 5.0) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if in_flight(url) == 0:
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"the upstream still has {in_flight(url)} requests in flight")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_the_upstream_work(served_upstream, stream):
    """2000 tokens at 10 ms each would take the upstream 20 s: after the
    client leaves, its requests close at once and no new ones start."""
    fake, url = served_upstream
    proxy = Proxy(url, None, client_options={"drafter": "ngram"})
    body = {"model": "fake-model", "messages": chat_of(PROMPTS["prose"]), "temperature": 0, "max_tokens": 2000, "stream": stream}
    with running(proxy) as base:
        with httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=1.0)) as http:
            if stream:
                with http.stream("POST", "/chat/completions", json=body) as response:
                    assert response.headers["x-bspec"] == "speculative"
                    # Read while the upstream works (a client that stops
                    # reading pauses the generation: backpressure), then leave
                    # with a request of it in flight.
                    deadline = time.monotonic() + 5
                    for _ in response.iter_lines():
                        if in_flight(url) >= 1 and time.monotonic() > deadline - 4:
                            break
                        assert time.monotonic() < deadline, "the upstream never had a request in flight"
            else:
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    waiting = pool.submit(http.post, "/chat/completions", json=body, timeout=httpx.Timeout(30, read=1.5))
                    assert _busy(url, seconds=1.2)
                    with pytest.raises(httpx.ReadTimeout):
                        waiting.result()
            gone = time.monotonic()
        _wait_idle(url)
        idle_after = time.monotonic() - gone
        requests_then = len(fake.requests)
        time.sleep(0.5)
        metrics = httpx.get(base.removesuffix("/v1") + "/metrics").json()
    assert idle_after < 3.0, idle_after
    assert len(fake.requests) == requests_then  # nothing new was started
    assert metrics["disconnected"] == 1 and metrics["in_progress"] == 0
    assert sum(len(r.get("_rendered", "")) for r in fake.requests) > 0


class _Embedded:
    """A user's own starlette app that streams a ``SpecClient`` generation:
    what FastAPI endpoints do.  Served by ``running`` like the proxy."""

    def __init__(self, url: str, close_in_endpoint: bool) -> None:
        self.url, self.close_in_endpoint, self.client = url, close_in_endpoint, None

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def endpoint(request):
            if self.client is None:  # made in the server's own event loop
                self.client = SpecClient(self.url, None, "fake-model", drafter="ngram")
            stream = self.client.stream(PROMPTS["prose"] * 3, max_tokens=2000)

            async def body():
                try:
                    async for piece in stream:
                        yield piece
                finally:
                    if self.close_in_endpoint:  # runs inside starlette's cancelled scope
                        await stream.aclose()
            return StreamingResponse(body(), media_type="text/plain")

        app = Starlette(routes=[Route("/v1/generate", endpoint, methods=["POST"])])

        async def asgi_2_3(scope, receive, send):
            # ASGI 2.3 (what uvicorn 0.54 says itself; pinned so that this
            # stays the case tested): starlette watches for the disconnect
            # and cancels the response's scope, so cleanup runs under
            # repeated cancellation.  From 2.4 on it stops at a failed send
            # and leaves the iterator to the endpoint's code or the GC.
            if scope["type"] == "http":
                scope = {**scope, "asgi": {**scope.get("asgi", {}), "spec_version": "2.3"}}
            await app(scope, receive, send)
        return asgi_2_3


@pytest.mark.parametrize("close_in_endpoint", [True, False])
def test_a_spec_client_stream_in_a_users_starlette_app_stops_when_its_caller_leaves(served_upstream, close_in_endpoint):
    """The httpcore trap the proxy hit, met by a user's own endpoint: the
    stream's cleanup runs inside starlette's cancelled scope (or is left to
    the garbage collector).  Its upstream requests must still close at once."""
    fake, url = served_upstream
    with running(_Embedded(url, close_in_endpoint)) as base:
        # Generous read timeout and deadline: on a loaded CI machine the first
        # piece (probe and first round) took over a second (stop 58's flake).
        with httpx.Client(base_url=base, timeout=httpx.Timeout(30, read=15.0)) as http:
            with http.stream("POST", "/generate") as response:
                start = time.monotonic()
                for _ in response.iter_bytes():
                    if in_flight(url) >= 1 and time.monotonic() > start + 1:
                        break
                    assert time.monotonic() < start + 20, "the upstream never had a request in flight"
            gone = time.monotonic()
        idle_after = _wait_idle(url) - gone
        requests_then = len(fake.requests)
        time.sleep(0.5)
        assert idle_after < 3.0, idle_after
        assert len(fake.requests) == requests_then  # nothing new was started


@pytest.fixture(scope="module")
def upstream_process():
    """The fake upstream in its own process (its threads don't share our
    GIL), 10 ms per request and per generated token, copying its context
    for 60 tokens at a time: drafts that mostly hold, as in edits."""
    process = subprocess.Popen(
        [sys.executable, "-m", "blackbox_spec.testing", "--port", "0", "--latency-ms", "10", "--decode-ms", "10", "--deviate-every", "60"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        yield re.search(r"http://\S+/v1", process.stdout.readline()).group(0)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_load_16_clients_with_and_without_speculation(upstream_process, capsys):
    """16 concurrent openai SDK clients, 64 chat requests, on loopback: every
    answer through the proxy equals the upstream's.  Throughput and latency
    percentiles of both are printed (BSPEC_LOAD_REPORT=path.json keeps them);
    speed is reported, not asserted: timings belong to benchmarks."""
    url = upstream_process
    prompts = [PROMPTS["code"] * 3, PROMPTS["json"] * 2, PROMPTS["prose"] * 3, PROMPTS["mixed"] * 2]
    requests = [{"model": "fake-model", "messages": chat_of(prompts[i % 4] + f"\n# {i % 8}"), "temperature": 0, "max_tokens": 120} for i in range(64)]
    proxy = Proxy(url, None, client_options={"drafter": "suffix"}, max_concurrency=16, max_speculative=4)
    direct = asyncio.run(run_load(url, requests, clients=16, label="direct"))
    with running(proxy) as base:
        through = asyncio.run(run_load(base, requests, clients=16, label="bspec serve"))
        metrics = httpx.get(base.removesuffix("/v1") + "/metrics").json()
    assert not direct.errors and not through.errors, (direct.errors, through.errors)
    assert through.texts == direct.texts and all(direct.texts)
    # Speculation only while at most 4 generations are under way (the first
    # arrivals, and the tail); the others decode plainly, and say so.
    speculative = sum(h.startswith("speculative") for h in through.headers)
    assert speculative == metrics["speculated"] >= 1 and 1 <= metrics["peak_speculating"] <= 4
    assert all(h.startswith("speculative") or "max_speculative" in h for h in through.headers)
    assert metrics["speculated"] + metrics["plain_when_busy"] == 64 and metrics["in_progress"] == metrics["speculating"] == 0
    assert metrics["accepted_tokens"] > 0
    report = {"direct": direct.to_dict(), "proxy": through.to_dict(), "metrics": metrics}
    with capsys.disabled():
        for side in (report["direct"], report["proxy"]):
            print(f"\n  {side['label']:>12}: {side['requests_per_s']} req/s, {side['tokens_per_s']} tok/s, "
                  f"latency p50 {side['latency_s']['p50']} s p90 {side['latency_s']['p90']} s p99 {side['latency_s']['p99']} s")
    if os.environ.get("BSPEC_LOAD_REPORT"):
        with open(os.environ["BSPEC_LOAD_REPORT"], "w") as f:
            json.dump(report, f, indent=2)


# -- bspec serve as a user starts it ----------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bspec_serve_command(served_upstream):
    fake, url = served_upstream
    port = _free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    process = subprocess.Popen([sys.executable, "-m", "blackbox_spec.cli", "serve", "--base-url", url, "--port", str(port)],
                               stderr=subprocess.PIPE, text=True, env=environment)
    try:
        banner = process.stderr.readline()
        assert f"serving http://127.0.0.1:{port}/v1" in banner and "drafter suffix" in banner
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "bspec serve did not come up"
                time.sleep(0.1)
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        messages = chat_of(PROMPTS["code"])
        answer = sdk.chat.completions.create(model="fake-model", messages=messages, temperature=0, max_tokens=50)
        direct = openai.OpenAI(base_url=url, api_key="none").chat.completions.create(model="fake-model", messages=messages, temperature=0, max_tokens=50)
        assert answer.choices[0].message.content == direct.choices[0].message.content
    finally:
        process.terminate()
        assert process.wait(timeout=15) in (0, -15)


@pytest.mark.parametrize("args, needle", [
    (["--base-url", "ftp://nowhere"], "invalid base URL"),
    (["--base-url", "http://127.0.0.1:9/v1", "--strategy", "magic"], "invalid choice"),
    (["--base-url", "http://127.0.0.1:9/v1", "--port", "0"], "expected a whole number >= 1"),
])
def test_bspec_serve_bad_arguments_are_one_line(args, needle):
    from .test_cli import bspec, one_line_error

    one_line_error(bspec("serve", *args), needle)
