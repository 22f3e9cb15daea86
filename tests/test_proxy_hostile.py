"""``bspec serve`` against hostile and careless callers (issue 19): every
case found by probing the proxy as an attacker would is reproduced here,
then fuzzed.  After each request: no 500, every slot back, no upstream
response left open, and memory bounded.

In process (ASGI) over the fake upstream, whose responses are counted as
they open and close; the cases that need real sockets (timing of /health,
disconnects while queued) run the proxy with uvicorn in a thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blackbox_spec.proxy import Proxy, running
from blackbox_spec.testing import FakeTarget

from .conftest import PROMPTS, chat_of, over_http

UPSTREAM = "http://upstream.test/v1"
JSON = {"content-type": "application/json"}


class Tracked(httpx.AsyncBaseTransport):
    """An upstream transport that counts the responses it opened and that
    were closed since: ``open`` is what a leak would leave behind."""

    def __init__(self, handler) -> None:
        self._inner = httpx.MockTransport(handler)
        self.opened = self.closed = 0
        self.seen: list[httpx.Request] = []

    @property
    def open(self) -> int:
        return self.opened - self.closed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        response = await self._inner.handle_async_request(request)
        self.opened += 1
        # (A response made from bytes counts as read and closed already: it
        # gets a stream that must be read and closed like a network one.)
        inner = httpx.ByteStream(response.content) if response.is_closed else response.stream
        return httpx.Response(response.status_code, headers=response.headers, stream=_Closing(inner, self), request=request)


class _Closing(httpx.AsyncByteStream):
    def __init__(self, inner, owner: Tracked) -> None:
        self.inner, self.owner, self.done = inner, owner, False

    async def __aiter__(self):
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        if not self.done:
            self.done = True
            self.owner.closed += 1
        await self.inner.aclose()


def proxy_over(fake: FakeTarget, **options) -> tuple[Proxy, Tracked]:
    tracked = Tracked(fake.handle_async)
    options.setdefault("client_options", {"drafter": "suffix"})
    return Proxy(UPSTREAM, options.pop("api_key", None), transport=tracked, **options), tracked


def caller(proxy: Proxy, **headers) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost", headers=headers, timeout=30)


def greedy(**extra) -> dict:
    return {"model": "fake-model", "messages": chat_of(PROMPTS["code"]), "temperature": 0, "max_tokens": 24, **extra}


async def settled(proxy: Proxy, tracked: Tracked) -> None:
    """Nothing held: slots, queue, speculation counters, upstream responses."""
    for _ in range(100):  # a streamed answer's feed and background close finish a moment later
        if tracked.open == 0 and proxy.metrics.in_progress == 0:
            break
        await asyncio.sleep(0.01)
    m = proxy.metrics
    assert (m.in_progress, m.queued, m.speculating, tracked.open) == (0, 0, 0, 0)
    assert not proxy._slots.locked()


@pytest.fixture
def fake() -> FakeTarget:
    return FakeTarget(latency=0.001, decode_s=0.0005)


# -- 1. slots ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("stream_options", "x"), ("stream_options", [1]), ("stream_options", 1), ("stream_options", {"include_usage": "yes"}),
    ("model", ["fake-model"]), ("model", {"a": 1}), ("model", ""), ("stream", "true"),
])
async def test_a_badly_typed_field_is_a_400_and_takes_no_slot(fake, field, value):
    proxy, tracked = proxy_over(fake, max_concurrency=2)
    async with caller(proxy) as http:
        for _ in range(20):  # more than the slots: one leak each would wedge the proxy
            response = await http.post("/v1/chat/completions", json=greedy(**{field: value}))
            assert response.status_code == 400 and field.split(".")[0] in response.json()["error"]["message"]
        await settled(proxy, tracked)
        after = await http.post("/v1/chat/completions", json=greedy())
    assert after.status_code == 200 and after.headers["x-bspec"] == "speculative"  # speculation still on
    await proxy.aclose()


# -- 2. upstream connections -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["字段", "🙂", "a\r\nb", "a\x00b", 'a"b', "x" * 100_000])
async def test_a_field_name_no_header_can_hold_is_passed_through_and_its_response_closed(fake, name):
    proxy, tracked = proxy_over(fake)
    async with caller(proxy) as http:
        for _ in range(3):
            response = await http.post("/v1/chat/completions", json=greedy(**{name: 1}))
            assert response.status_code == 200  # the fake ignores unknown fields, as vLLM does
            assert response.headers["x-bspec"] == 'passthrough; reason="an unknown field"'
        await settled(proxy, tracked)
        metrics = (await http.get("/metrics")).json()
    assert metrics["passed_through"] == {"an unknown field": 3}
    await proxy.aclose()


async def test_metrics_labels_stay_a_fixed_set_whatever_fields_callers_send(fake):
    proxy, tracked = proxy_over(fake)
    async with caller(proxy) as http:
        for i in range(200):
            await http.post("/v1/chat/completions", json=greedy(**{f"{i}" + "k" * 10_000: 1}))
        size = len((await http.get("/metrics")).content)
    assert size < 2_000 and proxy.metrics.passed_through == {"an unknown field": 200}
    await settled(proxy, tracked)
    await proxy.aclose()


# -- 3. large bodies and prompts ----------------------------------------------------------------


async def test_a_body_over_the_limit_is_a_413_before_anything_is_taken(fake):
    proxy, tracked = proxy_over(fake, max_body_bytes=1 << 20)
    body = json.dumps(greedy(messages=chat_of("x" * (2 << 20)))).encode()
    async with caller(proxy) as http:
        declared = await http.post("/v1/chat/completions", content=body, headers=JSON)

        async def chunks():  # no content-length: counted as it comes
            for i in range(0, len(body), 65536):
                yield body[i : i + 65536]
        chunked = await http.post("/v1/chat/completions", content=chunks(), headers=JSON)
    assert declared.status_code == chunked.status_code == 413 and "1 MB" in chunked.json()["error"]["message"]
    assert tracked.seen == []
    await proxy.aclose()


def _health_while(base: str, post) -> tuple[list[float], object]:
    """/health's latencies (s) polled while ``post`` runs in a thread."""
    root = base.removesuffix("/v1")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        sending = pool.submit(post)
        latencies = []
        with httpx.Client() as http:
            while not sending.done():
                started = time.perf_counter()
                assert http.get(root + "/health").status_code == 200
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)
        return latencies, sending.result()


@pytest.mark.parametrize("chars, passed", [(5_000_000, True), (300_000, False)])
def test_health_answers_while_a_large_prompt_is_handled(chars, passed):
    """A 5 MB prompt (beyond the speculation limit: passed through, the
    upstream refuses it) and a 300k one (speculated: indexed in a thread).
    Before, the first held the event loop 18 s."""
    prompt = ("def f(x):\n    return x + 1\n" * (chars // 28 + 1))[:chars]
    with over_http(FakeTarget(latency=0.01, decode_s=0.002, context_window=200_000)) as (fake, url):
        proxy = Proxy(url, None, client_options={"drafter": "suffix"})
        with running(proxy) as base:
            request = {"model": "fake-model", "prompt": prompt, "temperature": 0, "max_tokens": 16}
            latencies, answer = _health_while(base, lambda: httpx.post(base + "/completions", json=request, timeout=120))
            metrics = httpx.get(base.removesuffix("/v1") + "/metrics").json()
    assert answer.headers["x-bspec"].startswith("passthrough" if passed else "speculative")
    assert len(latencies) >= 3 and max(latencies) < 1.0, max(latencies)  # issue 19 asks 0.1 s: see benchmarks/proxy_soak.py for the figure
    assert metrics["in_progress"] == 0


async def test_the_prompt_limit_follows_the_context_the_upstream_lists():
    fake = FakeTarget(latency=0.001, context_window=1_000)  # listed as max_model_len: at most 16,000 characters
    proxy, tracked = proxy_over(fake)
    long = {"model": "fake-model", "prompt": "word " * 4_000, "temperature": 0, "max_tokens": 8}
    async with caller(proxy) as http:
        first = await http.post("/v1/completions", json=long)  # the model list is learned beside it
        await asyncio.sleep(0.05)
        second = await http.post("/v1/completions", json=long)
        short = await http.post("/v1/completions", json={**long, "prompt": "word " * 100})
    assert first.status_code == 400 and "x-bspec" not in first.headers  # tried (the limit was not known yet), refused upstream
    assert second.headers["x-bspec"] == 'passthrough; reason="prompt longer than the speculation limit"'
    assert second.status_code == 400 and "context" in second.text  # the upstream's own refusal
    assert short.headers["x-bspec"].startswith("speculative")
    await settled(proxy, tracked)
    await proxy.aclose()


# -- 4. bounded clients --------------------------------------------------------------------------


async def test_models_the_upstream_does_not_list_get_no_client(fake):
    proxy, tracked = proxy_over(fake, max_clients=4)
    async with caller(proxy) as http:
        await http.post("/v1/chat/completions", json=greedy())  # starts learning the model list
        await asyncio.sleep(0.05)
        for i in range(50):
            response = await http.post("/v1/chat/completions", json=greedy(model=f"random-{i}"))
            assert response.status_code == 404 and "passthrough" in response.headers["x-bspec"]
        assert len(proxy._clients) == 1
        await settled(proxy, tracked)
    await proxy.aclose()


async def test_clients_stay_bounded_where_the_upstream_lists_no_models():
    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(404, json={"error": {"message": "no"}})
        return httpx.Response(404, json={"error": {"message": "The model does not exist."}})

    tracked = Tracked(upstream)
    proxy = Proxy(UPSTREAM, None, transport=tracked, client_options={"drafter": "suffix"}, max_clients=4)
    async with caller(proxy) as http:
        for i in range(40):
            assert (await http.post("/v1/chat/completions", json=greedy(model=f"m{i}"))).status_code == 404
    assert len(proxy._clients) <= 4 and proxy.metrics.in_progress == 0
    await proxy.aclose()


# -- 5. who may call ---------------------------------------------------------------------------


async def test_client_keys_are_required_and_never_sent_upstream(fake):
    proxy, tracked = proxy_over(fake, client_keys=["client-key-123"])
    async with caller(proxy) as http:
        missing = await http.post("/v1/chat/completions", json=greedy())
        wrong = await http.post("/v1/chat/completions", json=greedy(), headers={"authorization": "Bearer nope-nope-nope"})
        health = await http.get("/health")
        metrics = await http.get("/metrics")
        right = await http.post("/v1/chat/completions", json=greedy(), headers={"authorization": "Bearer client-key-123"})
        passed = await http.post("/v1/chat/completions", json=greedy(temperature=0.5), headers={"authorization": "Bearer client-key-123"})
    assert (missing.status_code, wrong.status_code, metrics.status_code, health.status_code) == (401, 401, 401, 200)
    assert "client-key-123" not in missing.text
    assert right.status_code == passed.status_code == 200 and right.headers["x-bspec"] == "speculative"
    assert tracked.seen and all("client-key-123" not in str(r.headers) for r in tracked.seen)
    await proxy.aclose()


@pytest.mark.parametrize("headers, status", [
    ({"host": "evil.example"}, 403),  # DNS rebinding: a page's own name, resolved to 127.0.0.1
    ({"origin": "https://evil.example"}, 403),
    ({"origin": "null"}, 403),
    ({"content-type": "text/plain"}, 415),  # a browser's "simple" cross-site request
    ({"content-type": "application/x-www-form-urlencoded"}, 415),
    ({"host": "localhost:8100", "origin": "http://localhost:3000"}, 200),
    ({"host": "[::1]:8100"}, 200),
    ({"host": "bspec.internal"}, 200),  # named with allowed_hosts
])
async def test_browsers_and_other_hosts_are_refused(fake, headers, status):
    proxy, tracked = proxy_over(fake, allowed_hosts=["bspec.internal"])
    body = json.dumps(greedy()).encode()
    async with caller(proxy) as http:
        response = await http.post("/v1/chat/completions", content=body, headers={**JSON, **headers})
    assert response.status_code == status, response.text
    assert (tracked.seen == []) == (status != 200)
    await proxy.aclose()


def test_bspec_serve_refuses_to_listen_beyond_loopback_without_client_keys():
    from .test_cli import bspec, one_line_error

    one_line_error(bspec("serve", "--base-url", "http://127.0.0.1:9/v1", "--host", "0.0.0.0"), "--client-key")


# -- 6. the caller's own key -----------------------------------------------------------------------


async def test_without_an_api_key_the_callers_key_goes_upstream_on_every_path():
    fake = FakeTarget(latency=0.001, api_key="sk-upstream-key-42")
    proxy, tracked = proxy_over(fake)
    async with caller(proxy, authorization="Bearer sk-upstream-key-42") as http:
        speculated = await http.post("/v1/chat/completions", json=greedy())
        streamed = await http.post("/v1/chat/completions", json=greedy(stream=True))
        passed = await http.post("/v1/chat/completions", json=greedy(temperature=0.3))
        models = await http.get("/v1/models")
    assert speculated.status_code == streamed.status_code == passed.status_code == models.status_code == 200
    assert speculated.headers["x-bspec"] == "speculative" and "data: [DONE]" in streamed.text
    async with caller(proxy, authorization="Bearer sk-wrong-key-00") as http:
        refused = await http.post("/v1/chat/completions", json=greedy())
    assert refused.status_code == 401 and "sk-wrong-key-00" not in refused.text
    await settled(proxy, tracked)
    await proxy.aclose()


# -- 7. smaller items --------------------------------------------------------------------------------


async def test_one_failed_tokenize_does_not_zero_prompt_tokens_for_good(fake):
    failures = iter([True])

    async def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize" and next(failures, False):
            return httpx.Response(500, json={"error": {"message": "busy"}})
        return await fake.handle_async(request)

    tracked = Tracked(upstream)
    proxy = Proxy(UPSTREAM, None, transport=tracked, client_options={"drafter": "suffix"})
    async with caller(proxy) as http:
        first = (await http.post("/v1/chat/completions", json=greedy())).json()["usage"]["prompt_tokens"]
        second = (await http.post("/v1/chat/completions", json=greedy())).json()["usage"]["prompt_tokens"]
    assert first == 0 and second > 0
    await proxy.aclose()


async def test_the_plain_busy_path_resumes_a_stream_cut_midway(fake):
    cuts = iter([True])

    async def upstream(request: httpx.Request) -> httpx.Response:
        response = await fake.handle_async(request)
        if request.method == "POST" and b'"stream": true' in request.content.replace(b'"stream":true', b'"stream": true') and next(cuts, False):
            chunks = [chunk async for chunk in response.stream][:4]

            class Cut(httpx.AsyncByteStream):
                async def __aiter__(self):
                    for chunk in chunks:
                        yield chunk
                    raise httpx.ReadError("connection reset by peer")
            return httpx.Response(200, stream=Cut(), headers={"content-type": "text/event-stream"})
        return response

    tracked = Tracked(upstream)
    proxy = Proxy(UPSTREAM, None, transport=tracked, max_speculative=0)
    async with caller(proxy) as http:
        answer = await http.post("/v1/chat/completions", json=greedy(max_tokens=60))
    direct = fake.handle(httpx.Request("POST", UPSTREAM + "/chat/completions", json=greedy(max_tokens=60))).json()
    assert answer.status_code == 200 and answer.headers["x-bspec"].startswith("plain")
    assert answer.json()["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    await settled(proxy, tracked)
    await proxy.aclose()


@pytest.mark.parametrize("raw, needle", [
    (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    (b'{"model": "fake-model", "prompt": "\\ud800", "temperature": 0, "max_tokens": 5}', "lone surrogate"),
    (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "nested too deeply"),
    (b"\xff\xfe", "not JSON"),
])
async def test_bodies_json_cannot_carry_on_are_400s(fake, raw, needle):
    proxy, tracked = proxy_over(fake)
    async with caller(proxy) as http:
        response = await http.post("/v1/completions", content=raw, headers=JSON)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]
    await proxy.aclose()


@pytest.mark.parametrize("kind, extra, reason", [
    ("chat", {"stop": ""}, "an empty stop string"),
    ("chat", {"stop": ["x", ""]}, "an empty stop string"),
    ("completions", {"max_completion_tokens": 5}, "field max_completion_tokens"),
    ("chat", {"temperature": False}, "temperature is not 0"),
    ("chat", {"n": True}, "n > 1"),
])
async def test_requests_the_upstream_may_read_otherwise_get_its_own_answer(fake, kind, extra, reason):
    proxy, tracked = proxy_over(fake)
    body = greedy(**extra) if kind == "chat" else {"model": "fake-model", "prompt": PROMPTS["code"], "temperature": 0, "max_tokens": 20, **extra}
    async with caller(proxy) as http:
        response = await http.post(f"/v1/{'chat/completions' if kind == 'chat' else 'completions'}", json=body)
    assert response.status_code < 500 and response.headers["x-bspec"] == f'passthrough; reason="{reason}"'
    await proxy.aclose()


async def test_keys_in_headers_and_escaped_copies_are_masked():
    key = 'sk-proxy"secret-0123456789'

    def upstream(request: httpx.Request) -> httpx.Response:
        escaped = json.dumps({"error": {"message": f"bad key {key}"}})  # its quote escaped
        every = "".join(f"\\u{ord(c):04x}" for c in key)
        return httpx.Response(401, content=(escaped[:-2] + f" or {every}" + '"}}').encode(), headers={"x-request-id": f"req {key}", "content-type": "application/json"})

    proxy = Proxy(UPSTREAM, key, transport=httpx.MockTransport(upstream))
    async with caller(proxy) as http:
        response = await http.post("/v1/chat/completions", json=greedy(temperature=0.5))
    assert response.status_code == 401
    assert "0123456789" not in response.text and "0123456789" not in response.headers["x-request-id"]
    assert response.text.count("***") == 2
    await proxy.aclose()


async def test_error_messages_do_not_name_the_upstream():
    def upstream(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    proxy = Proxy("http://internal-gpu-7.corp:8000/v1", None, transport=httpx.MockTransport(upstream), client_options={"retries": None})
    async with caller(proxy) as http:
        passed = await http.post("/v1/chat/completions", json=greedy(temperature=0.5))
        speculated = await http.post("/v1/chat/completions", json=greedy())
    for response in (passed, speculated):
        assert response.status_code == 502 and "internal-gpu-7" not in response.text, response.text
    await proxy.aclose()


def test_a_caller_that_leaves_while_queued_starts_nothing():
    with over_http(FakeTarget(latency=0.01, decode_s=0.01)) as (fake, url):
        proxy = Proxy(url, None, client_options={"drafter": "suffix"}, max_concurrency=1)
        with running(proxy) as base:
            long = {"model": "fake-model", "prompt": PROMPTS["prose"], "temperature": 0, "max_tokens": 150}
            queued = {"model": "fake-model", "prompt": "QUEUED " + PROMPTS["code"], "temperature": 0, "max_tokens": 20}
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                first = pool.submit(httpx.post, base + "/completions", json=long, timeout=60)
                time.sleep(0.3)
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(base + "/completions", json=queued, timeout=httpx.Timeout(10, read=0.3))
                assert first.result().status_code == 200
            time.sleep(0.3)
            metrics = httpx.get(base.removesuffix("/v1") + "/metrics").json()
    assert not any("QUEUED" in (r.get("prompt") or "") for r in fake.requests)
    assert metrics["disconnected"] == 1 and metrics["in_progress"] == metrics["queued"] == 0


# -- fuzz --------------------------------------------------------------------------------------------

def _nested(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=30), _nested, max_leaves=12)
_fields = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "n", "stream",
           "stream_options", "stop", "seed", "user", "top_p", "logprobs", "tools"]


class _Fuzz:
    """One proxy and one event loop for every example (as a server lives)."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        # A context window, as every real server has: a fuzzed max_tokens of
        # 2**60 passed through to a fake without one decoded forever.
        self.fake = FakeTarget(latency=0.0, decode_s=0.0, context_window=8192)
        self.proxy, self.tracked = self.runner.run(self._make())
        self.http = caller(self.proxy)
        self.statuses: list[int] = []

    async def _make(self):
        return proxy_over(self.fake, max_concurrency=4, max_clients=4)

    def send(self, kind: str, body: dict, stream_read: bool) -> None:
        async def go():
            path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
            raw = json.dumps(body).encode()  # NaN and Infinity as Python writes them: not JSON
            if stream_read:
                response = await self.http.post(path, content=raw, headers=JSON)
            else:  # a caller that reads the head and leaves
                async with self.http.stream("POST", path, content=raw, headers=JSON) as response:
                    pass
            self.statuses.append(response.status_code)
            assert response.status_code < 500, (body, response.status_code, response.text if stream_read else "")
            await settled(self.proxy, self.tracked)
        self.runner.run(go())

    def close(self) -> None:
        self.runner.run(self.http.aclose())
        self.runner.run(self.proxy.aclose())
        self.runner.close()


@pytest.fixture(scope="module")
def fuzz():
    state = _Fuzz()
    yield state
    state.close()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["chat", "completions"]),
    changes=st.dictionaries(st.sampled_from(_fields) | st.text(max_size=8), _json, max_size=3),
    greedy_base=st.booleans(),
    stream=st.sampled_from([None, True, False]),
    read=st.booleans(),
)
def test_fuzzed_bodies_never_get_a_500_or_leave_anything_held(fuzz, kind, changes, greedy_base, stream, read):
    body = {"model": "fake-model", "temperature": 0 if greedy_base else 0.7, "max_tokens": 12}
    body.update({"messages": chat_of(PROMPTS["code"])} if kind == "chat" else {"prompt": PROMPTS["code"]})
    if stream is not None:
        body["stream"] = stream
    body.update(changes)
    fuzz.send(kind, body, read)


def test_fuzzing_left_memory_bounded_and_speculation_working(fuzz):
    before = _rss_mb()
    for i in range(300):
        fuzz.send("chat", {"model": "fake-model", "messages": chat_of(f"{i} " + PROMPTS["code"]), "temperature": 0, "max_tokens": 12,
                           f"junk{i}": "x" * 1000} if i % 2 else greedy(), True)
    assert _rss_mb() - before < 50
    assert len(fuzz.proxy._clients) <= 4 and fuzz.proxy.metrics.speculated > 0
    assert set(fuzz.statuses) <= {200, 400, 401, 404, 413, 415, 422}, sorted(set(fuzz.statuses))

