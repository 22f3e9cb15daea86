"""Cancelling requests without leaking their connections.

The client cancels requests all the time (side branches that left the
draft, fan-out requests past a broken chain, Ctrl-C).  A request task
cancelled while its response is being *closed* interrupts that close, and
httpcore (1.0.9) then never hands the connection back to its pool
(encode/httpcore#1093 and relatives, open upstream).  Found by the soak
test: after ~100 generations every pooled connection was stuck and each
new request timed out waiting for one.  So closes run shielded, and a task
is cancelled at most once.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import AsyncIterator, Awaitable, Callable

import httpx

_cancelled: "weakref.WeakSet[asyncio.Future]" = weakref.WeakSet()
_closing: set[asyncio.Future] = set()  # tasks of in_own_task still running: kept alive


def cancel_once(task: asyncio.Future) -> None:
    """Cancel ``task`` unless that was done already (a second cancel would
    interrupt its cleanup)."""
    if not task.done() and task not in _cancelled:
        _cancelled.add(task)
        task.cancel()


def in_own_task(work: Awaitable) -> asyncio.Future:
    """``work`` as a task of its own, kept alive until it ends (the event
    loop holds tasks weakly, and its caller may be gone by then)."""
    task = asyncio.ensure_future(work)
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    return task


async def close_shielded(close: Callable[[], Awaitable[None]]) -> None:
    """Run ``close()`` to its end even if the caller is cancelled meanwhile
    (the caller still sees the cancellation at once)."""
    await asyncio.shield(in_own_task(close()))


class _ShieldedStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        await close_shielded(self._stream.aclose)


class ShieldedCloseTransport(httpx.AsyncBaseTransport):
    """Wraps a transport so that closing any of its responses runs shielded."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._transport.handle_async_request(request)
        response.stream = _ShieldedStream(response.stream)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()
