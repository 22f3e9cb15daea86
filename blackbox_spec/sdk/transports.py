"""The transports handed to the openai SDK: a POST to the upstream's
``/chat/completions`` or ``/completions`` goes to ``bspec serve``'s app in
this process (which speculates where it may and passes the rest on, as the
proxy does); every other request goes to the upstream untouched.

The sync transport runs the app on an event loop of its own, in a daemon
thread, so a ``openai.OpenAI`` client works from any thread, with or without
a running loop of its own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, Iterator, TypeVar

import httpx

from ..proxy import Proxy
from .asgi import StreamingASGITransport

SPECULABLE_PATHS = ("/chat/completions", "/completions")
# The proxy app is reached in-process: this is the Host it is given (the
# proxy refuses foreign hosts, a guard for sockets that has no use here).
IN_PROCESS_HOST = "127.0.0.1"
T = TypeVar("T")


def proxy_path(method: str, url: httpx.URL, upstream: httpx.URL) -> str | None:
    """The proxy's route for a request (``/v1/chat/completions`` or
    ``/v1/completions``), or None for one that goes to the upstream as it is.

    >>> upstream = httpx.URL("https://api.example.com/openai/v1")
    >>> proxy_path("POST", httpx.URL("https://api.example.com/openai/v1/chat/completions"), upstream)
    '/v1/chat/completions'
    >>> proxy_path("POST", httpx.URL("https://api.example.com/openai/v1/embeddings"), upstream) is None
    True
    >>> proxy_path("GET", httpx.URL("https://api.example.com/openai/v1/completions"), upstream) is None
    True
    """
    if method != "POST" or (url.scheme, url.host, url.port) != (upstream.scheme, upstream.host, upstream.port):
        return None
    prefix = upstream.path.rstrip("/")
    rest = url.path[len(prefix):] if url.path.startswith(prefix + "/") else ""
    return "/v1" + rest if rest in SPECULABLE_PATHS else None


def to_proxy(request: httpx.Request, path: str, body: bytes) -> httpx.Request:
    """``request`` re-addressed to the in-process proxy app."""
    headers = httpx.Headers(request.headers)
    headers["host"] = IN_PROCESS_HOST
    url = httpx.URL(scheme="http", host=IN_PROCESS_HOST, path=path, query=request.url.query)
    return httpx.Request(request.method, url, headers=headers, content=body, extensions=request.extensions)


class _ToProxy:
    """What both transports share: the proxy, its app, and which requests go there."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.upstream = httpx.URL(proxy.base_url)
        self.app = StreamingASGITransport(proxy.app())

    def path_of(self, request: httpx.Request) -> str | None:
        return proxy_path(request.method, request.url, self.upstream)


class SpeculativeTransport(_ToProxy, httpx.AsyncBaseTransport):
    """For ``httpx.AsyncClient``: speculable requests to ``proxy``'s app,
    the rest to ``pass_through`` (the upstream)."""

    def __init__(self, proxy: Proxy, pass_through: httpx.AsyncBaseTransport) -> None:
        super().__init__(proxy)
        self.pass_through = pass_through

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = self.path_of(request)
        if path is None:
            return await self.pass_through.handle_async_request(request)
        return await self.app.handle_async_request(to_proxy(request, path, await request.aread()))

    async def aclose(self) -> None:
        await self.proxy.aclose()
        await self.pass_through.aclose()


class _LoopThread:
    """An event loop running in a daemon thread; ``run`` waits for a
    coroutine on it from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bspec-sdk", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


async def _next_piece(pieces: Any) -> bytes | None:
    """The next piece of an async body, None at its end."""
    try:
        return await pieces.__anext__()
    except StopAsyncIteration:
        return None


class _SyncBody(httpx.SyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, loop: _LoopThread) -> None:
        self.stream, self.loop = stream, loop

    def __iter__(self) -> Iterator[bytes]:
        pieces = self.stream.__aiter__()
        while (piece := self.loop.run(_next_piece(pieces))) is not None:
            yield piece

    def close(self) -> None:
        self.loop.run(self.stream.aclose())


class SyncSpeculativeTransport(_ToProxy, httpx.BaseTransport):
    """For ``httpx.Client``: as :class:`SpeculativeTransport`, with the
    proxy's app on a loop thread of its own."""

    def __init__(self, proxy: Proxy, pass_through: httpx.BaseTransport) -> None:
        super().__init__(proxy)
        self.pass_through = pass_through
        self.loop = _LoopThread()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = self.path_of(request)
        if path is None:
            return self.pass_through.handle_request(request)
        answer = self.loop.run(self.app.handle_async_request(to_proxy(request, path, request.read())))
        return httpx.Response(answer.status_code, headers=answer.headers, stream=_SyncBody(answer.stream, self.loop), request=request)

    def close(self) -> None:
        try:
            self.loop.run(self.proxy.aclose())
        finally:
            self.loop.close()
            self.pass_through.close()
