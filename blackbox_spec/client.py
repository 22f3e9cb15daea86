"""The async client: the library's front door.

    async with SpecClient(base_url="http://127.0.0.1:8000/v1", model="qwen") as client:
        result = await client.generate(prompt, max_tokens=256)
        print(result.text, result.stats.mean_accepted_per_round)

``drafter=None`` is plain decoding through the same client (the baseline of
every benchmark).  Settings not given are read like the openai SDK reads
them: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.

This module is the client's shell (construction, generate and stream,
close); what it learns about the server is ``_client_probing``'s, and the
path each generation takes ``_client_routing``'s.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from typing import AsyncIterator, Callable, Sequence

import httpx

from ._bill import Price, context_counting
from ._budget import check_max_cost, default_max_cost
from ._cancel import cancel_once, in_own_task
from ._client_routing import GenerationRouting
from ._exceptions import BlackboxSpecError, ConfigurationError, PromptError
from ._stats import GenerationResult, GenerationStats
from ._retry import RetryPolicy
from ._stopping import RULES
from ._target import TargetAPI, message_chars, resolve_settings
from .chat import ChatTurn, check_messages
from .drafters import Drafter, DrafterFactory, SessionIndex, drafter_factory
from ._output import Output
from .server_probe import BATCH_PROBE_WIDTH, PROBE_PROMPTS, REFUSALS, Capabilities, probe_server  # noqa: F401 (tests and callers import them here)
from .profile import PROFILE_MODES

STRATEGIES = ("auto", "echo", "fanout", "plain")


class GenerationStream:
    """``async for piece in client.stream(...)``; ``.result`` fills as it goes.

    Each step of the generation, and its closing, runs in a task of its own.
    A web framework that cancels the reader's task over and over (anyio's
    cancel scopes in starlette/FastAPI, when the caller goes away) would
    otherwise cancel the cleanup too: the upstream requests stayed open, one
    checked out of the connection pool, the server still generating.  In its
    own task the cleanup finishes; where the reader may wait, it does.
    """

    def __init__(self, pieces: AsyncIterator[str], result: GenerationResult) -> None:
        self._pieces = pieces
        self.result = result
        # Each step runs in its own task, in this context: every request it
        # makes (and its side branches' tasks) goes on the generation's bill.
        self._context = context_counting(result.stats.bill)
        self._step: asyncio.Future | None = None
        self._closing: asyncio.Future | None = None

    def __aiter__(self) -> "GenerationStream":
        return self

    async def __anext__(self) -> str:
        step = self._step = self._context.run(in_own_task, self._next())
        step.add_done_callback(_retrieve)  # read below, or by nobody once the reader left
        try:
            # Not ``await step``: every cancellation of a task awaiting a task
            # is passed on to it, so repeated ones would break its cleanup.
            await asyncio.wait({step})
        except asyncio.CancelledError:
            cancel_once(step)  # once: the step closes the generation's requests ...
            await _finish(step)  # ... and the reader waits for that, where it may
            if step.cancelled() or step.exception() is not None:
                raise
            # The piece was made before the cancel reached the step, and it is
            # in ``result`` already: hand it over too (nothing generated is
            # lost), and let the cancel land at the reader's next await.
            reader = asyncio.current_task()
            if reader is not None:
                reader.uncancel()  # one cancel pending, as before (asyncio.timeout counts them)
                reader.cancel()
        return step.result()

    async def _next(self) -> str:
        return await self._pieces.__anext__()

    async def aclose(self) -> None:
        if self._closing is None:
            self._closing = in_own_task(self._close())
        await _finish(self._closing)
        self._closing.result()

    async def _close(self) -> None:
        step = self._step
        if step is not None:  # a reader that left mid-step
            cancel_once(step)
            await _finish(step)
        await self._pieces.aclose()  # type: ignore[attr-defined]


async def _finish(task: asyncio.Future) -> None:
    """Wait for ``task`` to end, which it does even if this wait is cancelled."""
    if not task.done():
        await asyncio.wait({task})


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved; the reader re-raises it where it still waits


PREDICTION_MODES = ("auto", "local", "server")


class SpecClient(GenerationRouting):
    """Exact greedy speculative decoding against an OpenAI-compatible server."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        drafter: Drafter | str | None = "ngram",
        draft_model: str | None = None,
        draft_device: str = "cpu",
        strategy: str = "auto",
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 600.0,
        fanout_width: int = 16,
        max_draft_chars: int = 4096,
        retries: RetryPolicy | None = None,
        max_in_flight: int | None = 64,
        stop_rule: str | None = None,
        profile: str = "auto",
        prediction_mode: str = "auto",
        price: Price | str | None = None,
        max_cost: float | str | None = "auto",
    ) -> None:
        _check_settings(prediction_mode, stop_rule, profile, strategy, fanout_width, max_draft_chars, max_in_flight)
        # What the server charges, per million tokens (``Price``, or
        # "in=2.5,cached=1.25,out=10"): each generation's bill gets a cost
        # beside plain's.  None: taken from the profile, if one was given before.
        self.price = Price.parse(price) if isinstance(price, str) else price
        self._price_given = price is not None
        url, key = resolve_settings(base_url, api_key)
        self.max_cost = _bill_limit(url, max_cost)
        # Checked now; one drafter is built per generation (a draft model and
        # the suffix drafter's session index are shared between them).
        self._new_drafter = drafter_factory(drafter, draft_model=draft_model, draft_device=draft_device)
        self.strategy = strategy
        self.prediction_mode = prediction_mode
        self.fanout_width = fanout_width
        self.max_draft_chars = max_draft_chars
        self.api = TargetAPI(url, key, model, http_client=http_client, transport=transport, timeout=timeout, retries=retries, max_in_flight=max_in_flight)
        self._start_knowing(stop_rule, profile)  # what the probes and the profile will say (``_client_probing``)

    def __repr__(self) -> str:
        return f"SpecClient(base_url={self.api.base_url!r}, model={self.api.model!r}, strategy={self.strategy!r})"

    @property
    def session_index(self) -> SessionIndex | None:
        """What the suffix drafter remembers of this client's earlier outputs."""
        return self._new_drafter.session if isinstance(self._new_drafter, DrafterFactory) else None

    @session_index.setter
    def session_index(self, index: SessionIndex) -> None:
        if isinstance(self._new_drafter, DrafterFactory):
            self._new_drafter.session = index

    @property
    def model(self) -> str | None:
        return self.api.model

    async def __aenter__(self) -> "SpecClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._keep_profile()  # what the last generations measured
        await self.api.aclose()
    # -- generation ---------------------------------------------------------------

    async def generate(self, prompt: str, *, max_tokens: int = 256, stop: str | Sequence[str] | None = None, prediction: str | None = None) -> GenerationResult:
        """Generate the continuation of ``prompt``; exactly what a plain
        temperature-0 call to the same server returns.  ``prediction``: the
        text the output is expected to be much like (the file being edited),
        drafted from first (see :class:`~blackbox_spec.drafters.prediction.PredictionDrafter`)."""
        stream = self.stream(prompt, max_tokens=max_tokens, stop=stop, prediction=prediction)
        async for _ in stream:
            pass
        return stream.result

    async def generate_many(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int = 256,
        stop: str | Sequence[str] | None = None,
        concurrency: int = 8,
        on_done: Callable[[int, GenerationResult | BlackboxSpecError], None] | None = None,
    ) -> list[GenerationResult | BlackboxSpecError]:
        """Generate many continuations, ``concurrency`` at a time, in order.

        A generation that fails does not stop the others: its slot holds the
        error, whose ``partial`` keeps the text it had.  ``on_done(index,
        outcome)`` hears of each one as it ends (for progress).  Requests in
        flight stay within the client's ``max_in_flight`` in all.
        Cancelling the call cancels every generation; each stream's partial
        text is then lost with it, so use :meth:`stream` per prompt to keep it.
        """
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be a positive integer, not {concurrency!r}")
        for prompt in prompts:
            _check_arguments(prompt, max_tokens, stop)
        gate = asyncio.Semaphore(concurrency)
        outcomes: list[GenerationResult | BlackboxSpecError | None] = [None] * len(prompts)

        async def one(index: int, prompt: str) -> None:
            async with gate:
                try:
                    outcome: GenerationResult | BlackboxSpecError = await self.generate(prompt, max_tokens=max_tokens, stop=stop)
                except BlackboxSpecError as exc:
                    outcome = exc
            outcomes[index] = outcome
            if on_done is not None:
                on_done(index, outcome)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return outcomes  # type: ignore[return-value]

    def stream(self, prompt: str, *, max_tokens: int = 256, stop: str | Sequence[str] | None = None, prediction: str | None = None) -> GenerationStream:
        """Like :meth:`generate`, yielding text as soon as the target confirms it.

        If the task reading it is cancelled, or it is closed early, every
        request in flight is closed and ``.result`` keeps the text so far,
        with ``stats.interrupted`` set."""
        stops = _check_arguments(prompt, max_tokens, stop)
        _check_prediction(prediction)
        result = GenerationResult("", GenerationStats())
        out = Output(prompt, max_tokens, stops, prediction=prediction or None, prompt_size=("completions", len(prompt)))
        return GenerationStream(self._run(out, self._pieces(out, result.stats), result), result)

    async def chat(
        self, messages: list[dict], *, max_tokens: int = 256, stop: str | Sequence[str] | None = None, prediction: str | None = None,
        continue_final: bool = False,
    ) -> GenerationResult:
        """The assistant's reply to ``messages`` over ``/chat/completions``;
        exactly what a plain temperature-0 chat call with these messages to
        the same server returns.  A conversation that ends with an assistant
        message is sent as it is (servers differ: vLLM and OpenAI start a new
        turn, llama.cpp continues it) and decoded plainly;
        ``continue_final=True`` continues that message instead, with
        speculation, where the server can (``probe_chat``).
        ``prediction``: the text the reply is expected to be much like (the
        file being edited).  With ``prediction_mode`` "local" it is drafted
        from first, here; with "server" it is sent as OpenAI's Predicted
        Outputs ``prediction`` and the turn is decoded plainly (the server
        speculates on it); "auto" (the default) drafts here where this chat
        endpoint can verify drafts (``probe_chat``), and sends it otherwise.
        ``stats.accepted_prediction_tokens`` / ``rejected_prediction_tokens``
        report how much of it the reply kept (here: estimated from the
        characters copied, at the reply's characters per token)."""
        stream = self.stream_chat(messages, max_tokens=max_tokens, stop=stop, prediction=prediction, continue_final=continue_final)
        async for _ in stream:
            pass
        return stream.result

    def stream_chat(
        self, messages: list[dict], *, max_tokens: int = 256, stop: str | Sequence[str] | None = None, prediction: str | None = None,
        continue_final: bool = False,
    ) -> GenerationStream:
        """Like :meth:`chat`, yielding text as soon as the target confirms it."""
        messages = check_messages(messages)
        stops = _check_arguments("chat", max_tokens, stop)
        _check_prediction(prediction)
        turn = ChatTurn(self.api, messages, continue_final=continue_final)
        result = GenerationResult("", GenerationStats())
        out = Output(turn.prompt, max_tokens, stops, prediction=prediction or None, prompt_size=("chat", message_chars(messages)))
        turn.output = out
        return GenerationStream(self._run(out, self._chat_pieces(turn, out, result.stats, prediction), result), result)
    async def _run(self, out: Output, source: AsyncIterator[str], result: GenerationResult) -> AsyncIterator[str]:
        stats = result.stats
        started, retried = time.perf_counter(), self.api.retried
        try:
            await self.ensure_model()
            # aclosing: an early close reaches the innermost stream at once.
            async with aclosing(source) as pieces:
                async for piece in pieces:
                    if piece and stats.first_text_s is None:
                        stats.first_text_s = time.perf_counter() - started
                    result.text += piece
                    yield piece
        except BlackboxSpecError as exc:
            exc.partial = result  # what the target already confirmed is kept
            raise
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled (or the caller stopped reading) before the end: the
            # verifiers' and streams' own cleanup has closed every request;
            # ``result`` keeps the text so far.
            stats.interrupted = out.finish_reason is None
            raise
        finally:
            stats.wall_s = time.perf_counter() - started
            stats.finish_reason = out.finish_reason
            stats.retries = self.api.retried - retried
            stats.bill.settle(self.api.prompt_sizes)
            stats.prompt_tokens = self.api.prompt_sizes.estimate(*out.prompt_size, stats.bill.reported)
            stats.price = self.price


def _check_settings(prediction_mode: str, stop_rule: str | None, profile: str, strategy: str, fanout_width: int, max_draft_chars: int,
                    max_in_flight: object) -> None:
    """The constructor's choices, each among its known values."""
    if prediction_mode not in PREDICTION_MODES:
        raise ConfigurationError(f"unknown prediction_mode {prediction_mode!r}; choose from: {', '.join(PREDICTION_MODES)}")
    if stop_rule is not None and stop_rule not in RULES:
        raise ConfigurationError(f"unknown stop_rule {stop_rule!r}; choose from: {', '.join(RULES)} (or None to learn it from the server)")
    if profile not in PROFILE_MODES:
        raise ConfigurationError(f"unknown profile mode {profile!r}; choose from: {', '.join(PROFILE_MODES)}")
    if strategy not in STRATEGIES:
        raise ConfigurationError(f"unknown strategy {strategy!r}; choose from: {', '.join(STRATEGIES)}")
    if fanout_width < 1 or max_draft_chars < 1:
        raise ConfigurationError("fanout_width and max_draft_chars must be at least 1")
    if max_in_flight is not None and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1):
        raise ConfigurationError(f"max_in_flight must be a positive integer or None, not {max_in_flight!r}")


def _bill_limit(url: str, max_cost: float | str | None) -> float | None:
    """The bill's limit, as times plain's (``_budget``): "auto" is none
    for loopback and private networks, 2 for any other host."""
    try:
        return default_max_cost(url) if max_cost == "auto" else check_max_cost(max_cost)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def _check_prediction(prediction: object) -> None:
    if prediction is not None and not isinstance(prediction, str):
        raise ConfigurationError(f"prediction must be a string, not {type(prediction).__name__}")



def _check_arguments(prompt: object, max_tokens: object, stop: object) -> list[str] | None:
    if not isinstance(prompt, str):
        raise PromptError(f"prompt must be a string, not {type(prompt).__name__}")
    if not prompt:
        raise PromptError("prompt is empty")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigurationError(f"max_tokens must be a positive integer, not {max_tokens!r}")
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else list(stop)  # type: ignore[arg-type]
    if not all(isinstance(s, str) and s for s in stops):
        raise ConfigurationError("stop sequences must be non-empty strings")
    return stops or None
