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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping

from ._exceptions import TargetHTTPError
from ._stats import GenerationStats
from ._stopping import StopScanner
from ._target import StreamEnd, TargetAPI
from ._tokens import Unit, align_tokens, count_tokens
from .drafters.base import Drafter
from .policy import Policy, draft_kind
from .verifiers.base import Verifier
from .verifiers.echo import EchoUnsupported


@dataclass
class Output:
    """The continuation so far, bounded by ``max_tokens`` and stop strings."""

    prompt: str
    max_tokens: int
    stop: list[str] | None
    tokens: int = 0
    shown: int = 0
    finish_reason: str | None = None
    scanner: StopScanner = field(init=False)

    def __post_init__(self) -> None:
        self.scanner = StopScanner(self.stop)

    @property
    def text(self) -> str:
        return self.scanner.text

    @property
    def context(self) -> str:
        return self.prompt + self.scanner.text

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.tokens

    def take(self, units: list[Unit]) -> tuple[int, bool]:
        """Append units while the budget allows; returns (units taken, whether
        the budget ran out inside a multi-token unit)."""
        for k, unit in enumerate(units):
            if self.finish_reason:
                return k, False
            if unit.tokens > self.remaining:
                return k, True
            self.tokens += unit.tokens
            if self.scanner.feed(unit.text):
                self.finish_reason = "stop"
            elif self.remaining == 0:
                self.finish_reason = "length"
        return len(units), False

    def add_text(self, piece: str) -> None:
        """Append streamed text whose token count the server keeps."""
        if not self.finish_reason and self.scanner.feed(piece):
            self.finish_reason = "stop"

    def flush(self, final: bool = False) -> str:
        """New text that is safe to show (never retracted later)."""
        end = self.scanner.safe_length(final or self.finish_reason is not None)
        piece = self.text[self.shown : end]
        self.shown = max(self.shown, end)
        return piece


async def speculate(
    api: TargetAPI,
    drafter: Drafter,
    policy: Policy,
    verifiers: Mapping[str, Verifier],
    out: Output,
    stats: GenerationStats,
) -> AsyncIterator[str]:
    """Generate ``out``'s continuation speculatively; yields text as it is accepted."""
    drafter.start(out.prompt)
    plain_next = False
    while out.finish_reason is None:
        # 1. Draft locally.
        started = time.perf_counter()
        draft = drafter.propose(policy.max_draft_chars)
        match = getattr(drafter, "last_match", 0)
        stats.draft_s += time.perf_counter() - started

        # 2. Plan from what has been measured: check the draft, and how, or not.
        plan = policy.plan(draft, match, plain_next=plain_next, remaining=out.remaining)
        plain_next = False
        if plan.strategy == "plain":
            # Nothing worth checking: the target streams plainly until a
            # draft shows up that would pay (or the text ends).
            async for piece in _stream_plainly(api, drafter, policy, out, stats):
                yield piece
            continue
        draft = draft[: plan.draft_chars]

        # 3. Verify the draft with the target.
        try:
            verdict = await verifiers[plan.strategy].verify(out.context, draft, plan)
        except (EchoUnsupported, TargetHTTPError) as exc:
            if plan.strategy != "echo" or isinstance(exc, TargetHTTPError) and exc.status_code not in (400, 422, 501):
                raise
            policy.drop("echo")  # refused mid-run: fall back, lose nothing
            stats.note(f"echo verification refused by the server ({exc}); continuing without it")
            continue

        # 4. Accept the confirmed prefix, within max_tokens and stop strings.
        taken, split = out.take(verdict.units)
        ended = verdict.eos and taken == len(verdict.units) and out.finish_reason is None
        if ended:
            out.finish_reason = "stop"
        if split:
            # The budget ends inside a character the target spread over several
            # tokens: only the server can render that cut, as plain decoding does.
            await _finish_plainly(api, out, stats)
        accepted = verdict.units[:taken]
        accepted_draft = accepted[: verdict.draft_units]
        draft_chars = sum(len(u.text) for u in accepted_draft)
        stats.observe_round(plan.strategy, calls=verdict.calls, cancelled=verdict.cancelled, seconds=verdict.seconds)
        stats.observe_draft(
            drafted_tokens=verdict.proposed_units, accepted_tokens=sum(u.tokens for u in accepted_draft),
            # The end-of-text token counts as an output token, as servers bill it.
            drafted_chars=len(draft), accepted_chars=draft_chars, output_tokens=sum(u.tokens for u in accepted) + int(ended),
            usage=verdict.usage,
        )
        stats.trace.append([plan.strategy, len(draft), sum(u.tokens for u in accepted_draft), sum(u.tokens for u in accepted), round(verdict.seconds, 3)])

        # 5. Emit what can no longer be retracted.
        piece = out.flush()
        if piece:
            yield piece

        # 6. Learn: the drafter sees the new text, the policy the costs.
        drafter.update("".join(u.text for u in accepted), draft, draft_chars)
        policy.observe(plan, verdict, draft_kind(match), verdict.usage.prompt_tokens, _missed(draft, draft_chars, accepted[verdict.draft_units :]), draft_chars / max(1, len(draft)))
        plain_next = verdict.plain_next
        if not verdict.units and not verdict.eos:
            plain_next = True
    piece = out.flush(final=True)
    if piece:
        yield piece
    stats.finish_reason = out.finish_reason


def _missed(draft: str, accepted_chars: int, after: list[Unit]) -> bool:
    """Did the target leave the draft before its end?  A draft cut inside
    the target's next token (which it then wrote in full) was not missed."""
    rest = draft[accepted_chars:]
    return bool(rest) and bool(after) and not after[0].text.startswith(rest)


async def _stream_plainly(api: TargetAPI, drafter: Drafter, policy: Policy, out: Output, stats: GenerationStats) -> AsyncIterator[str]:
    """One plain streamed continuation of the context, cut off as soon as the
    policy says checking a draft would be faster.

    Streamed tokens are the target's own, so they are accepted as they
    arrive, up to the last complete unit (``align_tokens(partial=True)``).
    If the stream runs to its end, whatever the server sent is taken as is:
    it *is* a plain call from this context.
    """
    started = time.perf_counter()
    stream = api.stream(out.context, max_tokens=out.remaining, logprobs=1)
    text, tokens = "", []
    used_chars = used_tokens = 0
    first_at: float | None = None
    end: StreamEnd | None = None
    interrupted = split = opaque_tail = False
    try:
        async for item in stream:
            if isinstance(item, StreamEnd):
                end = item
                break
            first_at = first_at or time.perf_counter()
            text += item.text
            if item.tokens is None:
                # Text without token strings (a server that streams no
                # logprobs, or a final flush): no safe cut is known after
                # it, so the stream now runs to its end.
                opaque_tail = True
                continue
            if opaque_tail:
                continue
            tokens += item.tokens
            units = align_tokens(text[used_chars:], tokens[used_tokens:], partial=True)
            if not units:
                continue
            taken, split = out.take(units)
            new = units[:taken]
            new_text = "".join(u.text for u in new)
            used_chars += len(new_text)
            used_tokens += count_tokens(new)
            drafter.update(new_text, "", 0)
            policy.observe_text(len(new_text), count_tokens(new))
            piece = out.flush()
            if piece:
                yield piece
            if out.finish_reason or split:
                break
            if used_tokens >= 4:
                policy.costs.live_per_token = (time.perf_counter() - first_at) / (used_tokens - 1)
                if policy.interrupt(drafter.propose(policy.max_draft_chars), getattr(drafter, "last_match", 0)):
                    interrupted = True
                    break
    finally:
        await stream.aclose()
        policy.costs.live_per_token = None
    if split:
        await _finish_plainly(api, out, stats)
    elif end is not None and out.finish_reason is None:
        # The stream ran to its end: the rest of its text is the server's own
        # rendering of a plain call (a cut inside a character included).
        rest = text[used_chars:]
        billed = end.usage.completion_tokens
        extra = max(0, (billed or len(tokens)) - used_tokens)
        out.tokens += extra
        used_tokens += extra
        out.add_text(rest)
        drafter.update(rest, "", 0)
        if out.finish_reason is None:
            out.finish_reason = end.finish_reason or "length"
        piece = out.flush()
        if piece:
            yield piece
    seconds = time.perf_counter() - started
    stats.observe_round("plain", calls=1, cancelled=int(interrupted), seconds=seconds)
    stats.output_tokens += used_tokens
    if end is not None:
        stats.prompt_tokens_billed += end.usage.prompt_tokens
        stats.completion_tokens_billed += end.usage.completion_tokens
    else:
        stats.completion_tokens_billed += used_tokens  # cut off: billed what was generated (about)
    stats.trace.append(["stream", 0, 0, used_tokens, round(seconds, 3)])
    policy.observe_stream(used_tokens, seconds)


async def decode_plainly(api: TargetAPI, out: Output, stats: GenerationStats) -> AsyncIterator[str]:
    """Plain decoding: one streamed call for the whole remaining budget."""
    started = time.perf_counter()
    end = StreamEnd(None)
    stream = api.stream(out.context, max_tokens=out.remaining, stop=out.stop)
    try:
        async for item in stream:
            if isinstance(item, StreamEnd):
                end = item
                break
            out.add_text(item.text)
            piece = out.flush()
            if piece:
                yield piece
            if out.finish_reason:
                break  # a stop string straddled what we had: stop the stream
    finally:
        await stream.aclose()
    if out.finish_reason is None:
        out.finish_reason = end.finish_reason or "length"
    out.tokens += end.usage.completion_tokens
    stats.observe_round("plain-stream", calls=1, cancelled=0, seconds=time.perf_counter() - started)
    stats.output_tokens += end.usage.completion_tokens
    stats.prompt_tokens_billed += end.usage.prompt_tokens
    stats.completion_tokens_billed += end.usage.completion_tokens
    piece = out.flush(final=True)
    if piece:
        yield piece
    stats.finish_reason = out.finish_reason


async def _finish_plainly(api: TargetAPI, out: Output, stats: GenerationStats) -> None:
    c = await api.complete(out.context, max_tokens=out.remaining)
    stats.target_calls += 1
    stats.prompt_tokens_billed += c.usage.prompt_tokens
    stats.completion_tokens_billed += c.usage.completion_tokens
    stats.output_tokens += c.usage.completion_tokens or out.remaining
    out.tokens = out.max_tokens
    out.add_text(c.text)
    if out.finish_reason is None:
        out.finish_reason = c.finish_reason or "length"

