"""An httpx transport that hands requests to an ASGI app in this process
and streams its answer back as the app writes it.

httpx's own ``ASGITransport`` waits for the whole body before it returns a
response: a streamed completion would arrive all at once.  Here the response
comes back at the app's first ``http.response.start`` and its body is read
piece by piece.  A caller that closes the response early is a client that
hung up: the app's ``receive`` says ``http.disconnect`` and its ``send``
raises (ASGI 2.4), so the proxy gives back its slot and stops its upstream
work, as it does for a socket that closed.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx

# How long a closed response's app may take to notice the caller left
# before it is cancelled (the proxy's own cleanup takes milliseconds).
CLOSE_GRACE_S = 5.0


class CallerLeft(OSError):
    """What ``send`` raises once the response was closed (ASGI 2.4)."""


class _Exchange:
    """One request's ASGI channel: its body in, the answer's pieces out."""

    def __init__(self, body: bytes) -> None:
        self.body: bytes | None = body
        self.started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = asyncio.get_running_loop().create_future()
        self.pieces: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.ended = False

    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.closed.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed.is_set():
            raise CallerLeft("the caller closed the response")
        if message["type"] == "http.response.start":
            self.started.set_result((message["status"], list(message.get("headers", []))))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                self.pieces.put_nowait(message["body"])
            if not message.get("more_body", False):
                self.ended = True
                self.pieces.put_nowait(None)

    def finish(self) -> None:
        """The app returned: whatever it did not end, ends here."""
        if not self.started.done():
            self.fail(RuntimeError("the app ended without an answer"))
        elif not self.ended:
            self.ended = True
            self.pieces.put_nowait(None)

    def fail(self, error: BaseException) -> None:
        """The app ended without a (whole) answer."""
        if not self.started.done():
            self.started.set_exception(error)
        self.pieces.put_nowait(error)


def _read_timeout(request: httpx.Request) -> float | None:
    """The caller's read timeout (the SDK's ``timeout=``), as httpx keeps it."""
    return (request.extensions.get("timeout") or {}).get("read")


class _Body(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange, task: asyncio.Task, request: httpx.Request) -> None:
        self.exchange, self.task, self.request = exchange, task, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                piece = await asyncio.wait_for(self.exchange.pieces.get(), _read_timeout(self.request))
            except asyncio.TimeoutError:
                raise httpx.ReadTimeout("no answer within the read timeout", request=self.request) from None
            if piece is None:
                return
            if isinstance(piece, BaseException):
                raise httpx.ReadError(f"the answer broke off: {piece}", request=self.request) from piece
            yield piece

    async def aclose(self) -> None:
        self.exchange.closed.set()
        if not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), CLOSE_GRACE_S)
            except asyncio.TimeoutError:
                self.task.cancel()
            except Exception:  # the app's own failure after the caller left: nobody to tell
                pass


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Requests to ``app``, answered as it writes (see the module's doc)."""

    def __init__(self, app, client: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.app, self.client = app, client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(await request.aread())
        task = asyncio.ensure_future(self._run(self._scope(request), exchange))
        try:
            status, headers = await asyncio.wait_for(asyncio.shield(exchange.started), _read_timeout(request))
        except asyncio.TimeoutError:
            await _Body(exchange, task, request).aclose()
            raise httpx.ReadTimeout("no answer within the read timeout", request=request) from None
        except BaseException:
            await _Body(exchange, task, request).aclose()
            raise
        return httpx.Response(status, headers=headers, stream=_Body(exchange, task, request), request=request)

    def _scope(self, request: httpx.Request) -> dict[str, Any]:
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": request.method, "scheme": request.url.scheme, "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0], "query_string": request.url.query,
            "root_path": "", "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "server": (request.url.host, request.url.port or 80), "client": self.client,
        }

    async def _run(self, scope: dict[str, Any], exchange: _Exchange) -> None:
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except CallerLeft:
            return
        except Exception as exc:
            exchange.fail(exc)
            return
        exchange.finish()
