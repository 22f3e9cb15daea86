"""Faults to inject into the fake target: what remote APIs really do.

``Faults(rate=0.2)`` makes a fifth of the requests fail, each with one of:

* ``429``: rate limited, with ``Retry-After: 0``;
* ``500``: an internal error;
* ``timeout``: no answer within the client's timeout;
* ``reset``: the connection is reset; a stream is cut off part-way, after
  some of its tokens, so the client must resume exactly.

The same draw serves the fake in-process through respx (:func:`faulty_handler`),
the fake as a real HTTP server (``FakeTarget.serve``), and real servers,
through a transport that injects them on the way (:class:`FaultyTransport`).
A seed makes a run repeatable; ``injected`` counts what was injected.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import httpx

KINDS = ("429", "500", "timeout", "reset")


@dataclass
class Faults:
    rate: float = 0.0
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    # Requests whose prompt is this are spared (the client's capability
    # probe), so that a run measures faults in generation, not in setup.
    spare_prompt: str | None = "Hello"
    injected: Counter = field(default_factory=Counter)
    requests: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not 0 <= self.rate <= 1:
            raise ValueError(f"fault kinds must be among {KINDS} and the rate in [0, 1]; got {sorted(unknown)}, {self.rate}")
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def draw(self, prompt: object = None) -> str | None:
        """The fault for the next request, or None (it is served)."""
        with self._lock:
            self.requests += 1
            if prompt is not None and prompt == self.spare_prompt:
                return None
            if self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            return kind

    def summary(self) -> dict:
        return {"requests": self.requests, "injected": sum(self.injected.values()), "by_kind": dict(self.injected)}


class _CutOff(httpx.AsyncByteStream):
    """A body that stops part-way with a reset, as a dropped connection does."""

    def __init__(self, body: bytes, keep: int) -> None:
        self.body, self.keep = body, keep

    async def __aiter__(self):
        yield self.body[: self.keep]
        raise httpx.ReadError("connection reset by peer (injected)")


def cut_off(response: httpx.Response, share: float = 0.5) -> httpx.Response:
    """``response`` (read in full) again, but its body reset after ``share`` of it."""
    return httpx.Response(response.status_code, stream=_CutOff(response.content, int(len(response.content) * share)), headers=response.headers)


class _CutAfter(httpx.AsyncByteStream):
    """A live body cut off with a reset after ``chunks`` of its chunks."""

    def __init__(self, stream: httpx.AsyncByteStream, chunks: int) -> None:
        self.stream, self.chunks = stream, chunks

    async def __aiter__(self):
        n = 0
        async for chunk in self.stream:
            yield chunk
            n += 1
            if n >= self.chunks:
                raise httpx.ReadError("connection reset by peer (injected)")

    async def aclose(self) -> None:
        await self.stream.aclose()


def _prompt_of(request: httpx.Request) -> object:
    try:
        return json.loads(request.content or b"{}").get("prompt")
    except (ValueError, AttributeError):
        return None


def _answer_instead(kind: str | None, request: httpx.Request) -> httpx.Response | None:
    """The injected answer for a fault that never reaches the server, if any."""
    if kind == "429":
        return httpx.Response(429, headers={"retry-after": "0"}, json={"error": {"message": "rate limited (injected)"}})
    if kind == "500":
        return httpx.Response(500, json={"error": {"message": "internal error (injected)"}})
    if kind == "timeout":
        raise httpx.ReadTimeout("timed out (injected)", request=request)
    return None


def _is_stream(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def faulty_handler(handle: Callable[[httpx.Request], httpx.Response], faults: Faults) -> Callable[[httpx.Request], httpx.Response]:
    """``handle`` (e.g. ``FakeTarget.handle``) with ``faults`` injected, for respx."""

    def handler(request: httpx.Request) -> httpx.Response:
        kind = faults.draw(_prompt_of(request))
        injected = _answer_instead(kind, request)
        if injected is not None:
            return injected
        response = handle(request)
        if kind == "reset":
            if _is_stream(response):
                return cut_off(response)
            raise httpx.ReadError("connection reset by peer (injected)", request=request)
        return response

    return handler


class FaultyTransport(httpx.AsyncBaseTransport):
    """A real transport (a real server behind it) with ``faults`` injected on
    the way: 429s, 500s and timeouts instead of the server's answer, resets
    of its answer (a stream after a few chunks)."""

    def __init__(self, faults: Faults, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.faults = faults
        self._transport = transport or httpx.AsyncHTTPTransport()
        self._rng = random.Random(faults.seed + 1)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        kind = self.faults.draw(_prompt_of(request)) if request.method == "POST" else None
        injected = _answer_instead(kind, request)
        if injected is not None:
            return injected
        response = await self._transport.handle_async_request(request)
        if kind == "reset":
            if _is_stream(response):
                response.stream = _CutAfter(response.stream, self._rng.randint(1, 12))  # type: ignore[arg-type]
                return response
            await response.aclose()
            raise httpx.ReadError("connection reset by peer (injected)", request=request)
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()
