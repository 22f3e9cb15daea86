"""How ``bspec serve`` answers: a whole JSON answer, a stream of events, or
an error (the upstream's own answer passed through is ``passthrough``'s).

Every way out gives the caller's slot back and closes the upstream work,
whenever the caller leaves: while queued (:func:`admitted`), before the
first piece, mid-stream, or before a passed-through body is read.  Streams are
sent by :class:`EventStream`, which watches for the disconnect itself
instead of leaning on the server's ASGI version (starlette's streaming
response skips its background task under ASGI 2.4 when a send fails, and
notices a caller gone only at its next send).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing, suppress
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Protocol

from .._exceptions import BlackboxSpecError, TargetHTTPError
from .._stats import GenerationResult, GenerationStats
from .admission import Admission, Busy, Lease, disconnected

if TYPE_CHECKING:
    from ..client import GenerationStream, SpecClient
    from .metrics import ProxyMetrics


class Answerer(Protocol):
    """What answering a generation needs of the server (``Proxy``): typed
    here so that this module never imports the proxy that imports it."""

    metrics: "ProxyMetrics"

    async def prompt_tokens(self, client: "SpecClient", kind: str, body: dict[str, Any], key: str | None) -> int: ...

    def redact(self, text: str, key: str | None) -> str: ...

BUSY = 'plain; reason="max_speculative generations are speculating"'


class Feed:
    """A generation running in a task of its own, read piece by piece.

    The queue is short, so a client that reads slowly pauses the generation
    (and with it the upstream stream) instead of piling text up here; and the
    generation lives in one task from start to end, whichever task reads it,
    so cancelling that task is what a disconnect does."""

    def __init__(self, stream: "GenerationStream", on_done: Callable[[], None], depth: int = 32) -> None:
        self._stream = stream
        self._on_done = on_done
        self._queue: asyncio.Queue[str | BlackboxSpecError | None] = asyncio.Queue(depth)
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        # The generation is opened, read and closed in this task only, and it
        # reads ahead of the response by up to ``depth`` pieces.
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


class EventStream:
    """An ASGI response that sends ``body`` while watching for the caller's
    disconnect, and runs ``cleanup`` exactly once however it ends."""

    def __init__(self, body: AsyncIterator[bytes], *, status: int = 200, headers: dict[str, str] | None = None,
                 media_type: str = "text/event-stream", cleanup: Callable[[], Awaitable[None]] | None = None) -> None:
        self.body, self.status, self.cleanup = body, status, cleanup
        self.headers = {"content-type": media_type, **(headers or {})}

    async def __call__(self, scope, receive, send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watching = asyncio.ensure_future(self._caller_gone(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
            if sending.done() and not sending.cancelled():
                with suppress(OSError):  # (a send into a closed connection: the caller left)
                    sending.result()
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
            close = getattr(self.body, "aclose", None)
            if close is not None:
                with suppress(BaseException):
                    await close()
            if self.cleanup is not None:
                await self.cleanup()

    async def _send_all(self, send) -> None:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        async for chunk in self.body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _caller_gone(receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass


async def whole_response(proxy: Answerer, request, client: "SpecClient", kind: str, body: dict[str, Any], lease: Lease, key: str | None):
    """The generation run to its end, raced with the caller's disconnect."""
    from starlette.responses import JSONResponse

    stream = lease.stream
    assert stream is not None

    async def generate() -> tuple[GenerationResult, int]:
        counting = asyncio.ensure_future(proxy.prompt_tokens(client, kind, body, key))
        try:
            async with aclosing(stream):
                async for _ in stream:
                    pass
            return stream.result, await counting
        finally:
            counting.cancel()

    work = asyncio.ensure_future(generate())
    try:
        if not await first_of(work, request):
            proxy.metrics.disconnected += 1
            return JSONResponse({}, status_code=499)
        try:
            result, prompt_tokens = work.result()
        except BlackboxSpecError as exc:
            proxy.metrics.failed += 1
            return error(exc.status_code if isinstance(exc, TargetHTTPError) else 502, proxy.redact(str(exc), key))
    finally:
        await stop(work)  # (cancelled here itself, as the server shuts down: the generation goes too)
    answer = whole_answer(kind, client.model or "", result, prompt_tokens)
    return JSONResponse(answer, headers=spec_headers(result) if lease.speculating else {"x-bspec": BUSY})


async def stream_response(proxy: Answerer, request, client: "SpecClient", kind: str, body: dict[str, Any], lease: Lease, key: str | None):
    """The generation as server-sent events.  Its first piece is awaited
    before the answer starts (an error before any text is an HTTP error,
    as upstream's), raced with the caller's disconnect."""
    stream = lease.stream
    assert stream is not None
    feed = Feed(stream, lease.give_back)
    lease.handed_over = True  # the feed gives the slot back when its generation ends
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    counting = asyncio.ensure_future(proxy.prompt_tokens(client, kind, body, key)) if with_usage else None
    first_piece = asyncio.ensure_future(feed.get())
    try:
        if not await first_of(first_piece, request):
            proxy.metrics.disconnected += 1
            raise _Gone()
        first = first_piece.result()
    except BaseException as exc:
        feed.cancel()
        await stop(first_piece)
        if counting is not None:
            counting.cancel()
        if isinstance(exc, _Gone):
            from starlette.responses import JSONResponse

            return JSONResponse({}, status_code=499)
        raise
    if isinstance(first, BlackboxSpecError):
        proxy.metrics.failed += 1
        if counting is not None:
            counting.cancel()
        return error(first.status_code if isinstance(first, TargetHTTPError) else 502, proxy.redact(str(first), key))
    events = _events(proxy, kind, client.model or body.get("model") or "", first, feed, stream, counting, key)

    async def cleanup() -> None:
        feed.cancel()
        if counting is not None:
            counting.cancel()

    how = "speculative" if lease.speculating else BUSY
    return EventStream(events, headers={"x-bspec": how, "cache-control": "no-cache"}, cleanup=cleanup)


async def _events(proxy: Answerer, kind: str, model: str, first: str | BlackboxSpecError | None, feed: Feed,
                  stream: "GenerationStream", counting: asyncio.Future | None, key: str | None) -> AsyncIterator[bytes]:
    ident, created = _ident(kind), int(time.time())
    item = first
    try:
        if kind == "chat":
            yield event(chunk(kind, ident, created, model, {"role": "assistant", "content": ""}, None))
        while isinstance(item, str):
            yield event(chunk(kind, ident, created, model, item, None))
            item = await feed.get()
        if isinstance(item, BlackboxSpecError):
            proxy.metrics.failed += 1
            yield event({"error": {"message": proxy.redact(str(item), key), "type": type(item).__name__}})
            return
        result = stream.result
        yield event(chunk(kind, ident, created, model, None, result.finish_reason or "length"))
        if counting is not None:
            yield event({"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [],
                         "usage": usage(await counting, result.stats)})
        yield b"data: [DONE]\n\n"
    except (asyncio.CancelledError, GeneratorExit):
        proxy.metrics.disconnected += 1
        raise


class _Gone(Exception):
    """The caller left before the first piece."""


async def first_of(work: asyncio.Future, request) -> bool:
    """Wait for ``work`` or the caller's disconnect: True if ``work`` ended first."""
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    return work.done()


async def stop(work: asyncio.Future) -> None:
    """Cancel ``work`` if it still runs, and wait until it has (its upstream requests closed)."""
    if not work.done():
        work.cancel()
    with suppress(BaseException):
        await asyncio.wait({work})
    if work.done() and not work.cancelled():
        work.exception()  # (retrieved: an error of work nobody waits for is not logged as lost)


async def admitted(admission: Admission, request, kind: str = "generation"):
    """A lease on a slot, or the answer that says why there is none."""
    try:
        lease = await admission.admit(request, kind)
    except Busy:
        admission.metrics.rejected_busy += 1
        return error(503, f"bspec serve is busy: {admission.max_queue} requests are already waiting", headers={"retry-after": "1"})
    if lease is None:  # the caller left while queued: nothing was started
        admission.metrics.disconnected += 1
        return error(499, "the client went away")
    return lease


def error(status: int, message: str, headers: dict[str, str] | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "bspec_error", "code": status}}, status_code=status, headers=headers)


def _ident(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _object(kind: str, chunk: bool) -> str:
    if kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def usage(prompt_tokens: int, stats: GenerationStats) -> dict[str, Any]:
    completion_tokens = stats.output_tokens
    counts: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if stats.accepted_prediction_tokens is not None:
        counts["completion_tokens_details"] = {"accepted_prediction_tokens": stats.accepted_prediction_tokens,
                                               "rejected_prediction_tokens": stats.rejected_prediction_tokens or 0}
    return counts


def whole_answer(kind: str, model: str, result: GenerationResult, prompt_tokens: int) -> dict[str, Any]:
    finish = result.finish_reason or "length"
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {"id": _ident(kind), "object": _object(kind, False), "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, result.stats)}


def chunk(kind: str, ident: str, created: int, model: str, content: str | dict | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat":
        delta = content if isinstance(content, dict) else ({"content": content} if content is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
    return {"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [choice]}


def event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def spec_headers(result: GenerationResult) -> dict[str, str]:
    stats = result.stats
    headers = {"x-bspec": "speculative", "x-bspec-accepted-tokens": str(stats.accepted_tokens), "x-bspec-rounds": str(stats.rounds)}
    if stats.fallback:
        # A header is Latin-1 on the wire, and the reason may quote the
        # server's text (token strings, error messages): kept to printable ASCII.
        reason = stats.fallback.encode("ascii", "backslashreplace").decode().replace('"', "'")
        headers["x-bspec"] = f'speculative; fallback="{"".join(c if c.isprintable() else " " for c in reason)}"'
    return headers
