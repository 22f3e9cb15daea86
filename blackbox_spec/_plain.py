"""Plain decoding, and the ways a speculative generation falls back to it.

Speculation rests on three things the server tells us: its token strings
(where tokens end, ``_tokens``), its tokenizer (that text sent back
tokenizes as written, ``_canon``), and its determinism (the same request,
the same text).  When one of them can't be trusted, the generation goes on
as a plain call would, never fails where a plain call succeeds, and never
splices two different answers:

* token strings that don't fit the text (:func:`decode_without_token_strings`):
  the rest is decoded plainly, without logprobs, from the text confirmed so
  far;
* text that does not tokenize as written, or a tokenizer that fails
  (:func:`go_plain`): nothing may be sent back, so the plain call from the
  prompt;
* a plain call made again from the prompt checks that it writes again
  exactly what was already emitted (:func:`decode_plainly`'s ``emitted``),
  else :class:`NondeterministicTargetError`, carrying the text so far.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any, AsyncIterator

from ._canon import Canon
from ._exceptions import (AuthenticationError, ModelNotFoundError, NondeterministicTargetError, TargetError, TargetHTTPError,
                          TokenizerError)
from ._output import Output
from ._retry import is_retryable
from ._stats import GenerationStats
from ._target import StreamEnd, TargetAPI
from ._tokens import OPAQUE, AlignmentError


def recoverable(exc: TargetError, speculative: bool) -> bool:
    """Worth another round?  Transient failures always; a refusal (400, 413,
    422...) only of a speculative call, which the draft may have caused; a
    bad key or unknown model never; nor what another round can't mend: token
    strings that don't fit the text, a tokenizer that keeps failing, an
    answer that differs from the one already emitted (each has its own way
    out, above)."""
    if isinstance(exc, (AuthenticationError, ModelNotFoundError, TokenizerError, NondeterministicTargetError)):
        return False
    if isinstance(exc, TargetHTTPError):
        return speculative or is_retryable(exc)
    return not isinstance(exc, AlignmentError)  # a broken connection, a timeout, a garbled answer


async def decode_plainly(api: TargetAPI, out: Output, stats: GenerationStats, *, emitted: str = "") -> AsyncIterator[str]:
    """Plain decoding: one streamed call for the whole remaining budget.
    ``emitted``: text the caller has already been given, which this call
    (a restart from the prompt) writes again: it must come back the same."""
    started = time.perf_counter()
    end = StreamEnd(None)
    # llama.cpp says, with each piece, how many tokens it has generated
    # (asked for once it is known: ``TargetAPI._count_each_token``): how many
    # there were when text last showed tells whether max_tokens cut a character.
    counting, shown_at = getattr(api, "server_kind", None) == "llama.cpp", 0
    stream = api.stream(out.context, max_tokens=out.remaining, stop=out.stop)
    rendered = ""  # text ending in U+FFFD, held until the next item says whether it ended the stream
    try:
        async for item in stream:
            if isinstance(item, StreamEnd):
                end = item
                break
            if rendered:
                out.add_text(rendered, trusted=True)
            # The server applied the stops.  A last piece that ends in U+FFFD
            # at a length end is its rendering of a character max_tokens
            # cut, which no server searches for stop strings.
            rendered = item.text if item.text.endswith(OPAQUE) else ""
            if not rendered:
                out.add_text(item.text, trusted=True)
            if item.text:
                counting, shown_at = counting and item.generated is not None, item.generated or 0
            _check_head(out.text, emitted, final=False)
            for piece in out.flush():
                yield piece
    finally:
        await stream.aclose()
    if rendered:
        out.add_text(rendered, trusted=True, rendering=end.finish_reason == "length")
    _check_head(out.text, emitted, final=True)
    out.count(end.usage.completion_tokens)
    stats.observe_round("plain-stream", calls=1, cancelled=0, seconds=time.perf_counter() - started)
    stats.output_tokens += end.usage.completion_tokens
    if end.finish_reason == "length" and out.finish_reason is None and getattr(api, "server_kind", None) == "llama.cpp":
        await _show_cut_character(api, out, stats, end.usage.completion_tokens - shown_at if counting else None)
    if out.finish_reason is None:
        out.finish_reason = end.finish_reason or "length"
    for piece in out.flush(final=True):
        yield piece
    stats.finish_reason = out.finish_reason


async def _show_cut_character(api: TargetAPI, out: Output, stats: GenerationStats, held: int | None) -> None:
    """llama.cpp's stream ended by max_tokens: if that was inside a
    character, its last ``held`` tokens showed nothing, where its
    non-streamed answer (the reference) shows their bytes as U+FFFD.  That
    rendering comes from a plain call of those tokens from the text, once
    the text is known to tokenize as written; else (or where ``held`` is
    unknown: the stream was sent before the server was known, without its
    timings) from a whole plain call from the prompt, if the server's count
    of the text says tokens are missing from it.  A server that answers
    that one with other text keeps the stream's."""
    if held is not None and held <= 0:
        return
    counter = getattr(api, "count_tokens", None)
    written = await counter(out.prompt, out.text) if counter is not None else None
    if written is None or written >= out.tokens:
        return
    if held is not None and written == out.tokens - held:
        c = await api.complete(out.context, max_tokens=held, stop=out.stop)
        rest = c.text
    else:
        c = await api.complete(out.prompt, max_tokens=out.max_tokens, stop=out.stop)
        rest = c.text[len(out.text):] if c.text.startswith(out.text) else ""
    stats.target_calls += 1
    if rest.endswith(OPAQUE) and c.finish_reason == "length":  # (held tokens may hold whole characters before the cut one)
        out.add_text(rest, rendering=True)


def _check_head(text: str, emitted: str, *, final: bool) -> None:
    """Raise if ``text`` (regenerated from the prompt) leaves ``emitted``, or
    ends (``final``) before it is written again in full."""
    n = min(len(text), len(emitted))
    if text[:n] == emitted[:n] and not (final and len(text) < len(emitted)):
        return
    at = next((k for k in range(n) if text[k] != emitted[k]), n)
    raise NondeterministicTargetError(
        f"the server answered the same plain request with other text (at character {at} of the {len(emitted)} already "
        "emitted): it does not decode temperature 0 reproducibly, so the text so far is kept and nothing is spliced onto it"
    )


async def decode_plainly_from_start(api: TargetAPI, out: Output, stats: GenerationStats, attempts: int = 3) -> AsyncIterator[str]:
    """Plain decoding from the prompt, started again where a stream breaks
    (a broken stream cannot resume from its text: that would send it back,
    and it may not tokenize as written).  What was shown is not shown twice,
    and must come back the same (:func:`decode_plainly`'s ``emitted``)."""
    emitted = out.text[: out.shown]
    for attempt in range(attempts):
        if len(out.text) >= out.shown:  # (after a broken restart, what it wrote was checked against ``emitted``)
            emitted = out.text[: out.shown]
        stats.output_tokens -= out.tokens  # counted again by the plain call
        out.reset()
        try:
            async with aclosing(decode_plainly(api, out, stats, emitted=emitted)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        except TargetError as exc:
            if attempt == attempts - 1 or not recoverable(exc, speculative=False):
                raise
            stats.failed_rounds += 1


async def go_plain(api: TargetAPI, policy: Any, out: Output, stats: GenerationStats, why: str) -> AsyncIterator[str]:
    """Text that may not be sent back (it does not tokenize as written, or
    the tokenizer that would say so fails): the generation becomes the plain
    call from the prompt, for the whole budget; the text it writes again
    (what was already accepted, its own) is not shown twice."""
    policy.stop_speculating()
    stats.note(why)
    async with aclosing(decode_plainly_from_start(api, out, stats)) as pieces:
        async for piece in pieces:
            yield piece


async def decode_without_token_strings(
    api: TargetAPI, policy: Any, out: Output, stats: GenerationStats, canon: Canon, error: Exception
) -> AsyncIterator[str]:
    """The server's token strings did not fit its text (an ``AlignmentError``:
    a convention ``_tokens`` does not know, or a garbled answer).  Nothing
    that reads them is trusted for the rest of this generation: the target
    decodes the rest plainly, without logprobs, from the text confirmed so
    far (it ends on a cut found before the failure, and goes back only once
    it is checked to tokenize as written; else the plain call from the
    prompt).  Counted in the stats, never raised."""
    policy.stop_speculating()
    stats.token_strings_failed = str(error)
    stats.fallback = stats.fallback or "plain decoding without logprobs (the server's token strings did not fit its text)"
    stats.note(f"the server's token strings did not fit its text ({error}): the rest was decoded plainly, without logprobs")
    try:
        if not out.exact and out.finish_reason is None:
            await settle(api, out, stats)
        resumable = out.finish_reason is not None or await canon.holds(out.text, out.tokens if out.exact else None)
    except TokenizerError as exc:
        canon.broken = canon.failed = str(exc)
        resumable = False
    if out.finish_reason is not None:
        return
    if resumable:
        try:
            async with aclosing(decode_plainly(api, out, stats)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        except TargetError as exc:
            if not recoverable(exc, speculative=False):
                raise
            stats.failed_rounds += 1  # the stream broke part-way: its text can't be resumed from
    else:
        stats.note(canon.note)
    async with aclosing(decode_plainly_from_start(api, out, stats)) as pieces:
        async for piece in pieces:
            yield piece


async def cut_tail(target: Any, out: Output, extra: int) -> int:
    """How many of a stream's last ``extra`` tokens (generated, not shown as
    units) hold a character that max_tokens cut.  All of them, where the
    server lists every token; where it leaves pieces out (llama.cpp), some
    may be pieces of shown characters: its own count of the shown text
    tells (and becomes ``out``'s count)."""
    if not getattr(target, "omits_pieces", False):
        return extra
    counter = getattr(target, "count_tokens", None)
    shown = await counter(out.prompt, out.text) if counter is not None else None
    total = out.tokens + extra
    if shown is None or shown >= total:
        return 0
    out.recount(shown)
    return total - shown


async def settle(target: Any, out: Output, stats: GenerationStats) -> None:
    """Make ``out.tokens`` exact again after units whose counts were lower
    bounds (``Unit.exact``), from the server's own tokenization of the text
    (``count_tokens``).  Where it can't tokenize, the lower bound stands,
    and the stats say so; where its tokenizer fails, ``TokenizerError``."""
    counter = getattr(target, "count_tokens", None)
    tokens = await counter(out.prompt, out.text) if counter is not None else None
    if tokens is None or tokens < out.tokens:
        if not any(n.startswith("token counts") for n in stats.notes):
            stats.note("token counts around split characters are lower bounds here (the server lists only tokens that finish a "
                       "character, and counts no text): the output may run a few tokens past max_tokens")
        tokens = out.tokens
    out.recount(tokens)
    if out.remaining <= 0 and out.finish_reason is None:
        out.finish_reason = "length"


async def render_plainly(api: TargetAPI, out: Output, stats: GenerationStats, tokens: int, *, rendering: bool = False) -> None:
    """The next ``tokens`` tokens from a plain call, for text only the server
    can render: a budget that ends inside a character it spread over several
    tokens (it shows the cut as plain decoding does), or a stop string inside
    tokens whose split is unknown.  The server applies the stop strings to its
    own text, token by token; one that began in the text before it is only
    ours to see, so that text goes through the scanner too.  ``rendering``:
    the tokens are a stream's last ones, which showed nothing (max_tokens cut
    a character): their text is the held bytes rendered, which no server
    searches for stop strings (``Output.add_text``)."""
    tokens = max(1, min(tokens, out.remaining))
    c = await api.complete(out.context, max_tokens=tokens, stop=out.stop)
    used = c.usage.completion_tokens or tokens
    stats.target_calls += 1
    stats.output_tokens += used
    out.count(used)
    out.add_text(c.text, trusted=True, rendering=rendering and c.finish_reason == "length")
    if out.finish_reason is None and (c.finish_reason == "stop" or out.remaining <= 0):
        out.finish_reason = "stop" if c.finish_reason == "stop" else "length"
