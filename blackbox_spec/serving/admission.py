"""One gate for every upstream request ``bspec serve`` makes for a caller.

Speculated generations, plain ones and passed-through requests alike take
one of ``max_concurrency`` slots; up to ``max_queue`` more wait for one,
and beyond that the caller gets a 503 at once.  A caller that goes away
while it waits takes nothing.  Each admitted request holds a
:class:`Lease`, which gives its slot back exactly once, whatever way the
request ends.  (The client's probe of a new upstream runs inside the
generation that needed it, so inside that generation's slot.)
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import TYPE_CHECKING

from .metrics import ProxyMetrics

if TYPE_CHECKING:
    from .._stats import GenerationResult
    from ..client import GenerationStream


class Busy(Exception):
    """More requests are waiting than ``max_queue`` allows."""


class Admission:
    """The slots and the queue, and their counts in ``metrics``."""

    def __init__(self, max_concurrency: int, max_queue: int, metrics: ProxyMetrics) -> None:
        self.slots = asyncio.Semaphore(max_concurrency)
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.metrics = metrics

    async def admit(self, request, kind: str = "generation") -> "Lease | None":
        """A slot for ``kind`` ("generation" or "passthrough"); waits while
        all are taken, and raises :class:`Busy` when too many already wait.
        None: the caller went away while it waited."""
        if self.slots.locked():
            if self.metrics.queued >= self.max_queue:
                raise Busy()
            self.metrics.queued += 1
            acquiring = asyncio.ensure_future(self.slots.acquire())
            gone = asyncio.ensure_future(disconnected(request))
            try:
                await asyncio.wait({acquiring, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.metrics.queued -= 1
                gone.cancel()
                if not acquiring.done():
                    acquiring.cancel()
                    with suppress(asyncio.CancelledError):
                        await acquiring
            got = acquiring.done() and not acquiring.cancelled()
            if gone.done() and not gone.cancelled():
                if got:
                    self.slots.release()
                return None
            if not got:
                return None
        else:
            await self.slots.acquire()
        if kind == "passthrough":
            self.metrics.passing_through += 1
        else:
            self.metrics.in_progress += 1
        return Lease(self, kind)

    def leave(self, lease: "Lease") -> None:
        self.slots.release()
        if lease.kind == "passthrough":
            self.metrics.passing_through -= 1
            return
        self.metrics.in_progress -= 1
        if lease.speculating:
            self.metrics.speculating -= 1
            result = lease.stream.result if lease.stream is not None else None
            if result is not None:
                self.metrics.observe(result.stats)

    @property
    def busy(self) -> int:
        """Requests holding a slot now (generations and passed-through)."""
        return self.metrics.in_progress + self.metrics.passing_through


class Lease:
    """One request's slot (and a generation's stream), given back exactly once."""

    def __init__(self, admission: Admission, kind: str = "generation") -> None:
        self.admission, self.kind = admission, kind
        self.stream: GenerationStream | None = None
        self.speculating = False
        self.released = self.handed_over = False

    def attach(self, stream: "GenerationStream", speculating: bool) -> None:
        self.stream, self.speculating = stream, speculating
        metrics = self.admission.metrics
        if speculating:
            metrics.speculated += 1
            metrics.speculating += 1
            metrics.peak_speculating = max(metrics.peak_speculating, metrics.speculating)
        else:
            metrics.plain_when_busy += 1

    async def release(self) -> None:
        """Close the stream (every upstream request it had open) and give the slot back."""
        if not self.released and self.stream is not None:
            with suppress(Exception):
                await self.stream.aclose()
        self.give_back()

    def give_back(self) -> None:
        if not self.released:
            self.released = True
            self.admission.leave(self)

    @property
    def result(self) -> "GenerationResult | None":
        return self.stream.result if self.stream is not None else None


async def disconnected(request) -> None:
    """Returns when the caller has gone away (its body has been read, so
    the next message is the disconnect: under ASGI 2.3 and 2.4 alike)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
