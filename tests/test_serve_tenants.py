"""``bspec serve`` for many callers: what one caller's requests teach stays
that caller's, one draft model serves every key, every route is admitted,
and a caller that leaves at any moment (queued, before the first byte,
mid-stream, before a passed-through answer) frees its slot and its upstream
work, under ASGI 2.3 and 2.4 servers alike."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from blackbox_spec import drafters
from blackbox_spec.drafters.llama import GGUF_MAGIC
from blackbox_spec.proxy import Proxy, running
from blackbox_spec.chat_probe import _PROBE_MESSAGES as PROBE_MESSAGES
from blackbox_spec.server_probe import PROBE_PROMPTS
from blackbox_spec.testing import FakeTarget
from blackbox_spec.testing.fake_target import FakeModel

from .conftest import PROMPTS, chat_of, in_flight, needs_llama, over_http

UPSTREAM = "http://upstream.test/v1"
KEYS = ["tenant-a-key-000", "tenant-b-key-000", "tenant-c-key-000"]


def as_caller(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _ask(http: httpx.AsyncClient, key: str, body: dict) -> tuple[str, int, int]:
    """One greedy request as the caller ``key``: (text, accepted draft tokens, upstream calls)."""
    response = await http.post("/v1/completions", json=body, headers=as_caller(key))
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"], int(response.headers["x-bspec-accepted-tokens"]), int(response.headers["x-bspec-rounds"])


@pytest.mark.parametrize("share", [False, True])
async def test_one_callers_history_does_not_change_another_callers_speculation(share):
    """Caller A asks for an answer no prompt lookup could draft; then B asks
    the same.  With sessions per caller, B's rounds and accepted drafts are
    exactly what they are on a fresh server; shared (a single-user
    deployment's ``--share-sessions``), B drafts A's answer: the control
    that shows the history would be visible."""
    body = {"model": "fake-model", "prompt": PROMPTS["prose"], "temperature": 0, "max_tokens": 60}

    async def serve(*callers: str) -> list[tuple[str, int, int]]:
        upstream = FakeTarget(model=FakeModel(deviate_every=3))  # (its text is its own, not the prompt's)
        proxy = Proxy(UPSTREAM, None, transport=httpx.MockTransport(upstream.handle_async), client_keys=KEYS, max_speculative=4,
                      client_options={"drafter": "suffix"}, share_sessions=share)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost") as http:
                return [await _ask(http, key, body) for key in callers]
        finally:
            await proxy.aclose()

    alone = (await serve(KEYS[1]))[0]
    first, after = await serve(KEYS[0], KEYS[1])
    again = (await serve(KEYS[1], KEYS[1]))[1]  # (B's own history does help B)
    assert first[0] == after[0] == alone[0]
    assert again[1] > alone[1]
    if share:
        assert after[1] > alone[1]
    else:
        assert after == alone


def _fake_gguf(tmp_path) -> str:
    path = tmp_path / "draft.gguf"
    path.write_bytes(GGUF_MAGIC + b"\0" * 64)
    return str(path)


@needs_llama  # the factory checks that llama-cpp-python is there before anything loads
async def test_one_draft_model_whatever_the_number_of_callers(tmp_path, monkeypatch):
    loads: list[str] = []

    class Loaded:  # stands for llama-cpp-python's model: only how often it loads is counted
        def __init__(self, path: str) -> None:
            loads.append(path)

    monkeypatch.setattr("blackbox_spec.drafters.llama.LlamaCppModel", Loaded)
    monkeypatch.setattr(drafters, "vocabulary_of", lambda model: None)
    proxy = Proxy(UPSTREAM, None, client_keys=KEYS, client_options={"drafter": "llama", "draft_model": _fake_gguf(tmp_path)})
    clients = [proxy.client_for("fake-model", None, True, tenant) for tenant in ("a", "b", "c")]
    for client in clients:
        client._new_drafter.load()
    assert len({id(c) for c in clients}) == 3 and len(loads) == 1
    assert len({id(c.session_index) for c in clients}) == 3  # (nothing learned is shared)
    # Each caller's index holds a share of one budget: memory is bounded whatever the number of keys.
    assert all(c.session_index.max_chars * proxy.max_clients <= 4_000_000 for c in clients)
    assert len({id(c._new_drafter._model) for c in clients}) == 1
    await proxy.aclose()


async def test_passed_through_requests_take_a_slot_and_wait_in_the_queue():
    """A sampled request (passed through) holds the only slot: a greedy one
    waits behind it, and with no room in the queue a third is refused."""
    upstream = FakeTarget(latency=0.3)
    proxy = Proxy(UPSTREAM, None, transport=httpx.MockTransport(upstream.handle_async), max_concurrency=1, max_queue=1)
    sampled = {"model": "fake-model", "prompt": PROMPTS["prose"], "temperature": 0.7, "max_tokens": 5}
    greedy = dict(sampled, temperature=0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(proxy.app()), base_url="http://localhost") as http:
        first = asyncio.ensure_future(http.post("/v1/completions", json=sampled))
        await asyncio.sleep(0.1)
        assert proxy.metrics.passing_through == 1
        second = asyncio.ensure_future(http.post("/v1/completions", json=greedy))
        await asyncio.sleep(0.05)
        assert proxy.metrics.queued == 1
        models = await http.get("/v1/models")  # (a pass-through too: no room left in the queue)
        done = await asyncio.gather(first, second)
        metrics = (await http.get("/metrics")).json()
    assert models.status_code == 503 and models.headers["retry-after"] == "1"
    assert [r.status_code for r in done] == [200, 200] and done[0].headers["x-bspec"].startswith("passthrough")
    assert metrics["limits"] == {"max_concurrency": 1, "max_queue": 1, "max_speculative": 1, "max_clients": 16, "sessions": "per caller key"}
    assert metrics["passing_through"] == metrics["in_progress"] == metrics["queued"] == 0 and metrics["rejected_busy"] == 1
    await proxy.aclose()


class _AsgiVersion:
    """The proxy's app as a server of ASGI ``version`` would call it."""

    def __init__(self, app, version: str) -> None:
        self.app, self.version = app, version

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope = {**scope, "asgi": {**scope.get("asgi", {}), "spec_version": self.version}}
        await self.app(scope, receive, send)


def _metrics(base: str) -> dict:
    return httpx.get(base.removesuffix("/v1") + "/metrics").json()


def _freed_within(base: str, seconds: float) -> float | None:
    """Seconds until the proxy holds no slot (None: not within ``seconds``)."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        m = _metrics(base)
        if m["in_progress"] == 0 and m["passing_through"] == 0 and m["queued"] == 0:
            return time.monotonic() - started
        time.sleep(0.02)
    return None


@pytest.mark.parametrize("version", ["2.3", "2.4"])
@pytest.mark.parametrize("how", ["stream", "whole", "passthrough"])
def test_a_caller_that_leaves_before_the_first_byte_frees_its_slot_at_once(version, how):
    """The upstream takes 1.5 s to its first byte; the caller leaves after
    0.3 s.  Its slot is free well before that byte (the first piece, or a
    passed-through answer's headers, is raced with the disconnect), and no
    upstream request is left running or started after.  The server is new
    to the proxy, so a greedy caller leaves during the client's probe of it."""
    with over_http(FakeTarget(latency=1.5, decode_s=0.01)) as (fake, url):
        proxy = Proxy(url, None, client_options={"drafter": "ngram"})
        body = {"model": "fake-model", "messages": chat_of(PROMPTS["prose"]), "max_tokens": 400, "stream": how != "whole",
                "temperature": 0.7 if how == "passthrough" else 0}
        with running(proxy, app=_AsgiVersion(proxy.app(), version)) as base:
            with httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=0.3)) as http:
                with pytest.raises(httpx.ReadTimeout):
                    with http.stream("POST", "/chat/completions", json=body) as response:
                        response.read()
            freed = _freed_within(base, 1.0)
            deadline = time.monotonic() + 5
            while in_flight(url) and time.monotonic() < deadline:
                time.sleep(0.05)
            requests_then = len(fake.requests)
            time.sleep(0.3)
            metrics, idle = _metrics(base), in_flight(url) == 0
    assert freed is not None and freed < 1.0, freed
    assert idle and len(fake.requests) == requests_then
    probed = any(r.get("prompt") in PROBE_PROMPTS or r.get("messages") == PROBE_MESSAGES for r in fake.requests)
    assert probed == (how != "passthrough")  # (it left during the probe: nothing else was sent before)
    assert metrics["disconnected"] == 1 and metrics["failed"] == 0


@pytest.mark.parametrize("version", ["2.3", "2.4"])
def test_a_caller_that_leaves_mid_stream_frees_its_slot_and_upstream_work(version):
    with over_http(FakeTarget(latency=0.01, decode_s=0.01)) as (fake, url):
        proxy = Proxy(url, None, client_options={"drafter": "ngram"})
        body = {"model": "fake-model", "messages": chat_of(PROMPTS["prose"]), "temperature": 0, "max_tokens": 2000, "stream": True}
        with running(proxy, app=_AsgiVersion(proxy.app(), version)) as base:
            with httpx.Client(base_url=base, timeout=30) as http:
                with http.stream("POST", "/chat/completions", json=body) as response:
                    for k, _ in enumerate(response.iter_lines()):
                        if k > 20:
                            break
            freed = _freed_within(base, 2.0)
            deadline = time.monotonic() + 3
            while in_flight(url) and time.monotonic() < deadline:
                time.sleep(0.02)
            metrics, idle = _metrics(base), in_flight(url) == 0
    assert freed is not None and idle
    assert metrics["disconnected"] == 1 and metrics["speculated"] == 1


async def test_a_caller_that_leaves_while_sending_its_body_is_no_error():
    """Seen in the soak: a caller gone halfway through its body raised out of
    the route (a 500 and a traceback in the log).  Now it is a disconnect."""
    proxy = Proxy(UPSTREAM, None)
    app = proxy.app()
    messages = [{"type": "http.request", "body": b'{"model": "fake-', "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
    await app(scope, receive, send)
    assert sent[0]["status"] == 499 and proxy.metrics.disconnected == 1 and proxy.metrics.refused == 0
    await proxy.aclose()
