"""How the fake server is reached: an httpx handler (for respx /
``MockTransport``), sync or async with simulated costs, and a real HTTP
server in a thread (for subprocess tests and demos) that can inject faults.

A mixin of :class:`.fake_target.FakeTarget`; it answers every request with
the target's ``_dispatch`` (:mod:`.fake_routes`) and reads its ``latency``,
``decode_s``, ``prefill_s`` and ``requests``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from .faults import Faults


class _PacedStream(httpx.AsyncByteStream):
    """Server-sent events one chunk at a time, ``step`` seconds apart."""

    def __init__(self, chunks: list[dict], step: float) -> None:
        self.chunks, self.step = chunks, step

    async def __aiter__(self):
        for chunk in self.chunks:
            await asyncio.sleep(self.step)
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"


class Serving:
    """The target as an httpx handler and as an HTTP server."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        status, payload, stream_chunks = self._dispatch(request.method, request.url.path, request.headers, request.content)
        if stream_chunks is not None:
            body = "".join(f"data: {json.dumps(c)}\n\n" for c in stream_chunks) + "data: [DONE]\n\n"
            return httpx.Response(status, content=body.encode(), headers={"content-type": "text/event-stream"})
        return httpx.Response(status, json=payload)

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        """As :meth:`handle`, taking the simulated time; a stream comes chunk
        by chunk (``decode_s`` apart, or at least yielding to the event loop),
        so concurrent streams interleave as a real server's do."""
        status, payload, stream_chunks = self._dispatch(request.method, request.url.path, request.headers, request.content)
        record = self.requests[-1] if self.requests else None
        if stream_chunks is None:
            delay = self._simulated_seconds(record)
            if delay:
                await asyncio.sleep(delay)
            return httpx.Response(status, json=payload)
        first = self.latency + self.prefill_s * (record or {}).get("_prefilled", 0)
        if first:
            await asyncio.sleep(first)
        return httpx.Response(status, stream=_PacedStream(stream_chunks, self.decode_s), headers={"content-type": "text/event-stream"})

    def _simulated_seconds(self, record: dict[str, Any] | None) -> float:
        if record is None:
            return self.latency
        return self.latency + self.decode_s * record.get("_generated", 0) + self.prefill_s * record.get("_prefilled", 0)

    def serve(self, host: str = "127.0.0.1", port: int = 0, *, faults: Faults | None = None, hang_s: float = 5.0) -> ThreadingHTTPServer:
        """Start serving in a daemon thread; returns the server (``server_address`` has the port).

        Streams go out one chunk at a time, ``decode_s`` apart, so a client
        can close one part-way (the server then stops writing, as vLLM
        aborts the request).  ``faults`` are injected as a remote API shows
        them (see :mod:`.faults`); a "timeout" holds the request ``hang_s``
        seconds before closing it unanswered.  ``GET /fake/stats`` reports
        requests in flight (and the most at once), served, and faults injected.
        """
        server = _FakeServer((host, port), self, faults, hang_s)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


class _FakeServer(ThreadingHTTPServer):
    """The HTTP server: the fake it answers with, the faults it injects, and
    its counts of requests (one lock for both, so a request's record is its own)."""

    request_queue_size = 256  # every request is a new connection (HTTP/1.0): take bursts
    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: Serving, faults: Faults | None, hang_s: float) -> None:
        self.fake, self.faults, self.hang_s = fake, faults, hang_s
        self.lock = threading.Lock()
        self.counts = {"in_flight": 0, "peak_in_flight": 0, "served": 0}
        super().__init__(address, _FakeHandler)


class _FakeHandler(BaseHTTPRequestHandler):
    """One request to a :class:`_FakeServer`."""

    server: _FakeServer

    def _run(self) -> None:
        lock, counts = self.server.lock, self.server.counts
        with lock:
            counts["in_flight"] += 1
            if not self.path.endswith("/fake/stats"):
                counts["peak_in_flight"] = max(counts["peak_in_flight"], counts["in_flight"])
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client closed the request (fan-out and branches do): fine
        finally:
            with lock:
                counts["in_flight"] -= 1
                counts["served"] += 1

    do_GET = do_POST = _run

    def _serve(self) -> None:
        fake, faults = self.server.fake, self.server.faults
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        if self.path.endswith("/fake/stats"):
            with self.server.lock:
                stats = dict(self.server.counts, in_flight=self.server.counts["in_flight"] - 1, faults=faults.summary() if faults else None)
            return self._send(200, json.dumps(stats).encode(), "application/json")
        fault = self._draw_fault(body)
        if fault in ("429", "500", "timeout"):
            return self._inject(fault)
        with self.server.lock:  # so the record we cost is this request's own
            before = len(fake.requests)
            status, payload, chunks = fake._dispatch(self.command, self.path, self.headers, body)
            record = fake.requests[before] if len(fake.requests) > before else None
        if chunks is None:
            if record is not None:  # a completion: simulate its cost, concurrently
                time.sleep(fake._simulated_seconds(record))
            if fault == "reset":
                return self._reset()
            return self._send(status, json.dumps(payload).encode(), "application/json")
        self._stream(status, chunks, cut=len(chunks) // 2 if fault == "reset" else None)

    def _draw_fault(self, body: bytes) -> str | None:
        """The fault this request meets (drawn for POSTs only, by prompt where it has one)."""
        faults = self.server.faults
        if faults is None or self.command != "POST":
            return None
        try:
            return faults.draw(json.loads(body or b"{}").get("prompt"))
        except (ValueError, AttributeError):
            return faults.draw()

    def _inject(self, fault: str) -> None:
        """A fault that comes instead of any answer."""
        if fault == "429":
            return self._send(429, b'{"error": {"message": "rate limited (injected)"}}', "application/json", {"retry-after": "0"})
        if fault == "500":
            return self._send(500, b'{"error": {"message": "internal error (injected)"}}', "application/json")
        time.sleep(self.server.hang_s)  # "timeout"
        return self._reset()

    def _stream(self, status: int, chunks: list[dict], cut: int | None) -> None:
        """Server-sent events, ``decode_s`` apart; reset at chunk ``cut`` (a fault)."""
        fake = self.server.fake
        time.sleep(fake.latency)
        self.send_response(status)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()  # no length: the stream ends when the connection closes
        for k, chunk in enumerate(chunks):
            if k == cut:
                return self._reset()
            time.sleep(fake.decode_s)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, status: int, data: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _reset(self) -> None:
        """Close the connection with a TCP reset, mid-answer or before it."""
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass
