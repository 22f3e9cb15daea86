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
from contextlib import aclosing
from dataclasses import dataclass
from typing import AsyncIterator, Mapping

from ._branched_stream import BranchedStream
from ._canon import Canon
from ._drafting import propose, tell_outcome
from ._exceptions import TargetError, TargetHTTPError, TokenizerError
from ._output import Output, pieces_between
from ._plain import decode_plainly, decode_plainly_from_start, decode_without_token_strings, go_plain, recoverable, render_plainly, settle
from ._stats import GenerationStats
from ._target import TargetAPI
from ._tokens import OPAQUE, AlignmentError, Unit, count_tokens
from .drafters.base import Drafter
from .policy import Policy
from .verifiers.base import Plan, Verdict, Verifier
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
        draft = (propose(drafter, policy, stats) or "") if policy.speculating else ""
        match = getattr(drafter, "last_match", 0)
        kind = policy.kind(match)

        # 2. Plan from what has been measured: check the draft, and how, or
        #    not (a caller's prediction once it has predicted a first token).
        plan = _plan(policy, out, draft, match, kind, plain_next)
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
            async with aclosing(_stream_plainly(api, drafter, policy, out, stats, canon, recovery)) as pieces:
                async for piece in pieces:
                    yield piece
            continue
        draft = draft[: plan.draft_chars]

        # 3. Verify the draft with the target.
        verdict = await _verify(verifiers[plan.strategy], out, draft, plan, policy, stats, recovery)
        if verdict is None:
            continue

        # 4. Accept the confirmed prefix, within max_tokens and stop strings,
        #    once the text it was sent after, and it too, tokenize as written
        #    (``_sent_as_written``).
        if not await _sent_as_written(canon, out, plan.strategy, verdict):
            async with aclosing(go_plain(api, policy, out, stats, canon.note)) as pieces:
                async for piece in pieces:
                    yield piece
            break
        accepted, ended = await _take(api, out, stats, recovery, verdict)
        draft_chars = sum(len(u.text) for u in accepted[: verdict.draft_units])
        _observe_round(stats, plan, verdict, draft, accepted, draft_chars, ended)

        # 5. Emit what can no longer be retracted.
        for piece in out.flush():
            yield piece

        # 6. Learn: the drafter sees the new text, the policy the costs.
        plain_next = _learn(drafter, policy, plan, verdict, kind, draft, accepted, draft_chars)


def _plan(policy: Policy, out: Output, draft: str, match: int, kind: str, plain_next: bool) -> Plan:
    """Step 2: check ``draft`` (and how) or stream plainly (``Policy.plan``).
    A caller's prediction must first predict the answer's first token, as
    it must before a group (``open_at_start``): on a GPU-like server where
    an echo round is cheap, an unrelated one was bet on at once and made
    the answer 12% slower."""
    unproven = not out.text and kind == "prediction"
    return policy.plan(draft, match, plain_next=plain_next or unproven, remaining=out.remaining)


async def _stream_plainly(
    api: TargetAPI, drafter: Drafter, policy: Policy, out: Output, stats: GenerationStats, canon: Canon, recovery: Recovery
) -> AsyncIterator[str]:
    """Step 2's plain plan: the target streams plainly (side branches may
    jump it ahead: ``BranchedStream``); a failure is survived as a plain
    call's (``Recovery``)."""
    try:
        async with aclosing(BranchedStream(api, drafter, policy, out, stats, canon).run()) as pieces:
            async for piece in pieces:
                yield piece
    except TargetError as exc:
        recovery.survive(exc, speculative=False)


async def _verify(
    verifier: Verifier, out: Output, draft: str, plan: Plan, policy: Policy, stats: GenerationStats, recovery: Recovery
) -> Verdict | None:
    """Step 3: the target's verdict on ``draft``; None where the round
    failed (survived: ``Recovery``) or the server refused echo rounds."""
    try:
        return await verifier.verify(out.context, draft, plan)
    except TargetError as exc:
        if plan.strategy == "echo" and (isinstance(exc, EchoUnsupported) or isinstance(exc, TargetHTTPError) and exc.status_code in (400, 422, 501)):
            policy.drop("echo")  # refused mid-run: fall back, lose nothing
            stats.note(f"echo verification refused by the server ({exc}); continuing without it")
        else:
            recovery.survive(exc, speculative=True)
        return None


async def _sent_as_written(canon: Canon, out: Output, strategy: str, verdict: Verdict) -> bool:
    """Step 4's check: did the text the round was sent after tokenize as
    written (an echo round's own tokens answer; else the tokenizer is
    asked), and will the accepted text too?  The calls past the first sent
    draft text right after the context.  An echo round leaves the latter to
    the next round's echo, or to step 2 before any other call."""
    new_text, new_tokens = "".join(u.text for u in verdict.units), count_tokens(verdict.units)
    exact = out.exact and all(u.exact for u in verdict.units)
    written = out.tokens if out.exact else None
    if strategy != "echo":
        return await canon.holds(out.text + new_text, None if not exact or written is None else written + new_tokens)
    held = canon.confirm(out.text, written, verdict.context_units)
    return held if held is not None else await canon.holds(out.text, written)


async def _take(api: TargetAPI, out: Output, stats: GenerationStats, recovery: Recovery, verdict: Verdict) -> tuple[list[Unit], bool]:
    """Step 4: the verdict's units that fit within max_tokens and stop
    strings, taken into ``out`` (a unit max_tokens splits is the server's
    to render); and whether the target ended the text there."""
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
    return verdict.units[:taken], ended


def _observe_round(stats: GenerationStats, plan: Plan, verdict: Verdict, draft: str, accepted: list[Unit], draft_chars: int, ended: bool) -> None:
    """Step 4's record: the round, and what its draft delivered."""
    accepted_draft = accepted[: verdict.draft_units]
    stats.observe_round(plan.strategy, calls=verdict.calls, cancelled=verdict.cancelled, seconds=verdict.seconds)
    stats.observe_draft(
        drafted_tokens=verdict.proposed_units, accepted_tokens=sum(u.tokens for u in accepted_draft),
        # The end-of-text token counts as an output token, as servers bill it.
        drafted_chars=len(draft), accepted_chars=draft_chars, output_tokens=sum(u.tokens for u in accepted) + int(ended),
    )
    stats.trace.append([plan.strategy, len(draft), sum(u.tokens for u in accepted_draft), sum(u.tokens for u in accepted), round(verdict.seconds, 3)])


def _learn(drafter: Drafter, policy: Policy, plan: Plan, verdict: Verdict, kind: str, draft: str, accepted: list[Unit], draft_chars: int) -> bool:
    """Step 6: the drafter sees the new text, the policy the costs.  True:
    stream plainly next (the verdict says so, or it had nothing to take)."""
    drafter.update("".join(u.text for u in accepted), draft, draft_chars)
    tell_outcome(drafter, draft, draft_chars)
    policy.observe(plan, verdict, kind, verdict.usage.prompt_tokens, _missed(draft, draft_chars, accepted[verdict.draft_units :]))
    if not verdict.units and not verdict.eos:
        return True
    return verdict.plain_next


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
