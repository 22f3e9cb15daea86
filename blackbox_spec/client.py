"""The async client: the library's front door.

    async with SpecClient(base_url="http://127.0.0.1:8000/v1", model="qwen") as client:
        result = await client.generate(prompt, max_tokens=256)
        print(result.text, result.stats.mean_accepted_per_round)

``drafter=None`` is plain decoding through the same client (the baseline of
every benchmark).  Settings not given are read like the openai SDK reads
them: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import asdict
from typing import AsyncIterator, Callable, Sequence

import httpx

from ._bill import RELATIVE_PRICE, Price, context_counting
from ._budget import PLAIN_BELOW, Budget, check_max_cost, default_max_cost
from ._cancel import cancel_once, in_own_task
from ._exceptions import BlackboxSpecError, ConfigurationError, PromptError, TargetError, TargetHTTPError
from ._stats import GenerationResult, GenerationStats
from ._retry import RetryPolicy
from ._stopping import DEFAULT_RULE, RULES, single_stop_rule
from ._target import TargetAPI, message_chars, resolve_settings
from ._tokens import AlignmentError
from ._scoring import SCORING_FORMS
from .chat import ChatSupport, ChatTurn, ContinueCheck, check_messages, probe_chat, probe_predictions
from .drafters import Drafter, DrafterFactory, SessionIndex, drafter_factory
from .drafters.prediction import PredictionDrafter
from ._output import Output
from ._plain import decode_plainly_from_start
from .orchestrator import speculate
from .policy import Policy, ServerCosts
from .server_probe import BATCH_PROBE_WIDTH, PROBE_PROMPTS, REFUSALS, Capabilities, probe_server  # noqa: F401 (tests and callers import them here)
from .probe import STOP_PROBE_PROMPT, probe_stop_rule
from .profile import LOADED_WEIGHT, PROFILE_MODES, ProfileStore
from .verifiers import EchoVerifier, FanoutVerifier

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


class SpecClient:
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
        # What the server charges, per million tokens (``Price``, or
        # "in=2.5,cached=1.25,out=10"): each generation's bill gets a cost
        # beside plain's.  None: taken from the profile, if one was given before.
        self.price = Price.parse(price) if isinstance(price, str) else price
        self._price_given = price is not None
        url, key = resolve_settings(base_url, api_key)
        # The bill's limit, as times plain's (``_budget``): "auto" is none
        # for loopback and private networks, 2 for any other host.
        try:
            self.max_cost = default_max_cost(url) if max_cost == "auto" else check_max_cost(max_cost)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        # Checked now; one drafter is built per generation (a draft model and
        # the suffix drafter's session index are shared between them).
        self._new_drafter = drafter_factory(drafter, draft_model=draft_model, draft_device=draft_device)
        self.strategy = strategy
        self.prediction_mode = prediction_mode
        self.fanout_width = fanout_width
        self.max_draft_chars = max_draft_chars
        self.api = TargetAPI(url, key, model, http_client=http_client, transport=transport, timeout=timeout, retries=retries, max_in_flight=max_in_flight)
        self._probing = asyncio.Lock()  # generations started together probe once
        self.capabilities: Capabilities | None = None
        self.costs: ServerCosts | None = None  # measured server costs, kept across generations
        self.chat_support: ChatSupport | None = None  # the same, for /chat/completions
        self.predicted_outputs: bool | None = None  # does the server speculate on `prediction` itself?
        self.chat_costs: ServerCosts | None = None
        # Which stop string wins when several complete in one token: given,
        # or learned once from the server (``probe.probe_stop_rule``) the
        # first time a generation has two or more.
        self.stop_rule = stop_rule
        self.stop_rule_learned = stop_rule is not None
        # What was learned about this server, kept on disk between processes
        # (``profile``): a fresh client starts from it instead of probing.
        self.profiles = ProfileStore(profile)
        self._identified = False

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

    async def load_drafter(self) -> None:
        """Load the draft model now, off the event loop (it takes seconds);
        otherwise the first generation does it.  A no-op for other drafters."""
        factory = self._new_drafter
        if isinstance(factory, DrafterFactory) and factory.kind in ("llama", "hf") and factory._model is None:
            await asyncio.to_thread(factory.load)  # (a thread costs ~0.1-0.3 s to start: only when there is a model)

    # -- probing -----------------------------------------------------------------

    async def ensure_model(self) -> str:
        async with self._probing:
            if self.api.model is None:
                models = await self.api.list_models()
                if not models:
                    raise ConfigurationError(f"no model given and {self.api.base_url}/models lists none; pass --model")
                self.api.model = models[0]
        return self.api.model

    async def probe(self) -> Capabilities:
        """Learn once whether the server returns logprobs and honours echo."""
        await self.ensure_model()
        async with self._probing:
            self._open_profile()
            if self.capabilities is None:
                self.capabilities, self.costs = await probe_server(self.api)
                if self.profiles.profile is not None:
                    self.profiles.profile.probed_at = time.time()
                self._keep_profile()
                self._identified = True  # (the probe's answers said what kind of server this is)
        return self.capabilities

    async def _identify(self) -> None:
        """With a stored profile and stop strings, one small call goes first:
        what kind of server answers decides where its stop strings end the
        text, and another server may now answer at this URL.  (Without stop
        strings the first stream says it soon enough: llama.cpp's chunks carry
        its build as ``system_fingerprint``, and its counts are then read as
        lower bounds.)  A refusal sends the client back to a full probe."""
        try:
            await self.api.complete("Hello", max_tokens=1, logprobs=1 if self.capabilities and self.capabilities.logprobs else None)
        except AlignmentError:
            pass  # (the answer said who answers before its token strings were read; a generation copes with them)
        except TargetHTTPError as exc:
            if exc.status_code not in REFUSALS:
                raise
            self.capabilities = self.costs = None
            self.profiles.loaded = False

    def _open_profile(self) -> None:
        """Start from what an earlier process measured about this server, if
        anything (``profile``: its costs and capabilities, nothing exactness
        rests on); called once the model is known."""
        if self.profiles.profile is not None:
            return
        stored = self.profiles.open(self.api.base_url, self.api.model or "")
        if self.price is None and stored is not None and stored.price:
            self.price = Price.from_dict(stored.price)
        if stored is None:
            return
        try:
            if stored.capabilities and stored.costs:
                self.capabilities = Capabilities(**stored.capabilities)
                self.costs = ServerCosts.from_dict(stored.costs, LOADED_WEIGHT)
                if self.capabilities.scoring in SCORING_FORMS:
                    self.api.scoring = self.capabilities.scoring
        except (TypeError, KeyError, ValueError):  # a profile from other code: start afresh
            self.capabilities = self.costs = None
        try:
            if stored.chat_costs and self.chat_costs is None:
                self.chat_costs = ServerCosts.from_dict(stored.chat_costs, LOADED_WEIGHT)
        except (TypeError, KeyError, ValueError, AttributeError):
            self.chat_costs = None
        self.profiles.loaded = self.capabilities is not None
        self.profiles.chat_loaded = self.chat_costs is not None

    def _keep_profile(self, *, force: bool = True) -> None:
        """Write what this client knows now into its profile (not the key);
        unless ``force``, only if it was not written in the last seconds."""
        profile = self.profiles.profile
        if profile is None or self.profiles.mode == "off":
            return
        measured = False
        if self._price_given and self.price is not None and profile.price != self.price.to_dict():
            profile.price = self.price.to_dict()
            measured = True
        if self.capabilities is not None and self.costs is not None:
            profile.capabilities, profile.costs = asdict(self.capabilities), self.costs.to_dict()
            measured = True
        if self.chat_costs is not None:
            profile.chat_costs = self.chat_costs.to_dict()
            if not profile.probed_at:  # (a chat-only profile ages from its first measurement)
                profile.probed_at = time.time()
            measured = True
        if measured:
            self.profiles.save(force=force)

    async def probe_chat(self) -> ChatSupport:
        """Learn once per process how the chat endpoint can be verified (see
        :mod:`.chat`); exactness rests on it, so only the continuation it saw
        work is kept in the profile, to be checked again, never trusted."""
        await self.ensure_model()
        async with self._probing:
            if self.chat_support is None:
                self._open_profile()
                self.chat_support = await probe_chat(self.api, self._stored_check())
                profile = self.profiles.profile
                if profile is not None and self.chat_support.check is not None:
                    profile.chat_check = asdict(self.chat_support.check)
                if self.chat_costs is None:
                    self.chat_costs = ServerCosts(self.chat_support.round_trip_s)
        return self.chat_support

    async def probe_predictions(self) -> bool:
        """Whether the server speculates on a Predicted Outputs ``prediction``
        itself (its usage reports what it accepted of one): learned once per
        server and kept in the profile, so only a first-ever process pays
        the call.  (No lock: it runs beside the chat probe, and a second
        probe would only repeat a small call.)"""
        await self.ensure_model()
        if self.predicted_outputs is None:
            self._open_profile()
            profile = self.profiles.profile
            stored = profile.predicted_outputs if profile is not None else None
            self.predicted_outputs = stored if isinstance(stored, bool) else await probe_predictions(self.api)
            if profile is not None and profile.predicted_outputs != self.predicted_outputs:
                profile.predicted_outputs = self.predicted_outputs
                self._keep_profile()
        return self.predicted_outputs

    async def _prediction_goes_to_server(self) -> bool:
        """``prediction_mode`` auto: the server's own Predicted Outputs only
        where the probe shows it honours them; else drafted here.  (Where
        the chat endpoint is unprobed too, both probes run at once.)"""
        if self.prediction_mode != "auto":
            return self.prediction_mode == "server"
        if self.strategy == "plain":
            return True  # nothing is drafted here: whatever the server makes of it
        if self.chat_support is None and self.predicted_outputs is None and not await self._chat_profiled():
            honoured, _ = await asyncio.gather(self.probe_predictions(), self.probe_chat())
            return honoured
        return await self.probe_predictions()

    def _stored_check(self) -> ContinueCheck | None:
        """The chat probe's continuation from the profile, if one is kept."""
        profile = self.profiles.profile
        stored = profile.chat_check if profile is not None and self.profiles.chat_loaded else None
        try:
            return ContinueCheck(**stored) if isinstance(stored, dict) else None
        except TypeError:  # another version's: the full probe runs
            return None

    def _stored_support(self) -> ChatSupport | None:
        """How the stored check's continuation worked, for side branches
        sent before the probe repeats it (None: a profile without it)."""
        check = self._stored_check()
        if check is None or check.prefill is None:
            return None
        return ChatSupport(True, dict(check.prefill), False, 0.0, repeats_prefill=check.repeats_prefill, check=check,
                           prefill_message=dict(check.prefill_message or {}), trims_trailing=check.trims_trailing)

    async def _chat_profiled(self) -> bool:
        """A stored profile holds this server's chat costs (an earlier process
        speculated on its chat endpoint)."""
        await self.ensure_model()
        self._open_profile()
        return self.profiles.chat_loaded

    async def learn_stop_rule(self, *, chat: bool = False) -> str:
        """The server's stop rule (``_stopping.RULES``), learned once (two
        small calls, over the chat endpoint with ``chat``); where the probe
        can't tell, ``earliest-start``."""
        await self.ensure_model()
        async with self._probing:
            if not self.stop_rule_learned:
                try:
                    if chat:
                        turn = ChatTurn(self.api, [{"role": "user", "content": "Repeat exactly, nothing else: " + STOP_PROBE_PROMPT}])
                        rule = await probe_stop_rule(turn, turn.prompt)
                    else:
                        rule = await probe_stop_rule(self.api)
                except TargetError:
                    rule = None
                self.stop_rule, self.stop_rule_learned = rule or DEFAULT_RULE, True
        return self.stop_rule  # type: ignore[return-value]

    async def _use_stop_rule(self, out: Output, stats: GenerationStats, *, chat: bool = False) -> None:
        """Several stop strings: which one wins at a token depends on the
        server, so learn its rule before replaying them.  One: only
        llama.cpp's search window differs (``_stopping``)."""
        if out.stop and len(out.stop) > 1:
            out.use_stop_rule(await self.learn_stop_rule(chat=chat))
            stats.stop_rule = out.stop_rule
        elif out.stop:
            out.use_stop_rule(self.stop_rule if self.stop_rule_learned else single_stop_rule(self.api.server_kind))

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

    def _no_room(self) -> bool:
        """A bill limited to little more than plain's leaves no room for a probe and a draft's request."""
        return self.max_cost is not None and self.max_cost < PLAIN_BELOW

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

    async def _pieces(self, out: Output, stats: GenerationStats) -> AsyncIterator[str]:
        if (self._new_drafter is None and out.prediction is None) or self.strategy == "plain" or self._no_room():
            if self._no_room() and self.strategy != "plain":
                stats.note(f"the bill may not pass {self.max_cost:g}x plain's (max_cost): no room for a probe and a speculative request, decoded plainly")
            async with aclosing(decode_plainly_from_start(self.api, out, stats)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        caps = await self.probe()
        if out.stop and not self._identified:
            async with self._probing:
                if not self._identified:
                    await self._identify()
                    self._identified = True
            caps = await self.probe()  # (measured afresh where the stored capabilities were refused)
        readable = caps.logprobs and caps.token_strings_fit
        available = (["echo"] if caps.echo and readable else []) + (["fanout", "branches"] if readable else [])
        forced = None if self.strategy == "auto" else self.strategy
        # (Strings that don't fit are the server's doing, found at run time:
        # decoded plainly, as a generation that finds them later would be.)
        if forced and forced not in available and (readable or not caps.logprobs):
            raise ConfigurationError(
                f"strategy {forced!r} is not available on {self.api.base_url} "
                f"(echo: {'yes' if caps.echo else 'refused'}, logprobs: {_logprobs_word(caps)}); "
                "use --strategy auto"
            )
        if not readable:
            if caps.logprobs:
                stats.token_strings_failed = "they did not fit the text of the probe's answer"
                stats.fallback = "plain decoding without logprobs (the server's token strings did not fit its text)"
            stats.note("the server returns no logprobs, so token boundaries are unknown: decoding plainly" if not caps.logprobs else
                       "the server's token strings did not fit the text of the probe's answer, so token boundaries are unknown: decoding plainly")
            async with aclosing(decode_plainly_from_start(self.api, out, stats)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        await self._use_stop_rule(out, stats)
        async with aclosing(self._speculate(self.api, available, self.costs, forced, out, stats)) as pieces:
            async for piece in pieces:
                yield piece

    async def _chat_pieces(self, turn: ChatTurn, out: Output, stats: GenerationStats, prediction: str | None) -> AsyncIterator[str]:
        reason = unsupported = None
        if turn.prompt != turn.head:
            # The conversation ends with an assistant message to continue:
            # even plain decoding needs to know how this server does that.
            turn.support = await self.probe_chat()
        if prediction is not None and await self._prediction_goes_to_server():
            out.prediction = None
            turn.extra["prediction"] = {"type": "content", "content": prediction}
        elif prediction is not None and self.prediction_mode == "auto":
            stats.note("a prediction was given: drafted from here (the server does not speculate on one itself)")
        if prediction is not None and out.prediction is None:
            reason = "a prediction was given: the server speculates on it (Predicted Outputs), so the turn is decoded plainly here"
        elif turn.ends_with_assistant and turn.prompt == turn.head:
            reason = ("the conversation ends with an assistant message, which servers treat differently (a new turn, or that message "
                      "continued), so it is sent as it is and decoded plainly; continue_final=True continues it with speculation")
        elif (self._new_drafter is None and out.prediction is None) or self.strategy == "plain":
            reason = "plain decoding was asked for"
        elif self._no_room():
            reason = f"the bill may not pass {self.max_cost:g}x plain's (max_cost), which leaves no room for a speculative request"
        elif self.chat_support is None and self.strategy == "auto" and turn.prompt == turn.head and await self._chat_profiled():
            # The turn's first request continues nothing, so it needs no probe:
            # the probe runs beside it, and nothing that continues the message
            # is planned before it answers.  A fresh process against a hosted
            # API would otherwise spend ~3 round trips before its first token.
            # (Only where an earlier process speculated on this chat endpoint:
            # the first request asks for logprobs, which the probe is for.)
            turn.pending = asyncio.ensure_future(self.probe_chat())
            turn.provisional = self._stored_support()
        else:
            turn.support = await self.probe_chat()
            unsupported = turn.support.reason
            reason = unsupported and f"{unsupported}: decoding the chat turn plainly"
        if reason is None and turn.support is not None and turn.support.trims_trailing and turn.prompt[-1:].isspace() and turn.prompt != turn.head:
            # (A plain call continues the message trimmed; sent back with
            # text after it, the whitespace would count.)
            reason = "the assistant message to continue ends in whitespace, which this server's chat template trims: decoding the turn plainly"
        if self.strategy not in ("auto", "plain") and turn.support is not None and not turn.support.speculative:
            raise ConfigurationError(f"strategy {self.strategy!r} is not available on {self.api.base_url}'s chat endpoint: {turn.support.reason}")
        if reason is None:
            # (While the probe runs, nothing that continues the message but
            # side branches sent under the stored form, whose text is taken
            # only once the probe sees it work: ``ChatTurn.side_confirmed``.
            # The rest the probe's answer allows, ``_chat_probed``.)
            echo = turn.support is not None and turn.support.prompt_logprobs
            if turn.pending is not None:
                available = ["branches"] if turn.provisional is not None else []
            else:
                available = (["echo"] if echo else []) + ["fanout", "branches"]
            forced = None if self.strategy == "auto" else self.strategy
            if forced and forced not in available:
                raise ConfigurationError(f"strategy {forced!r} is not available on {self.api.base_url}'s chat endpoint (no prompt_logprobs); use --strategy auto")
            await self._use_stop_rule(out, stats, chat=True)
            source = self._speculate(turn, available, self.chat_costs, forced, out, stats, probing=turn.pending)
        else:
            stats.note(reason)
            if unsupported:
                stats.fallback = "plain chat"
            source = decode_plainly_from_start(turn, out, stats)
        try:
            try:
                async with aclosing(source) as pieces:
                    async for piece in pieces:
                        yield piece
            except TargetHTTPError as exc:
                # A first request refused before any text, with the probe still
                # out: the stored profile is stale (logprobs no longer offered?).
                if turn.pending is None or out.text or out.tokens or exc.status_code not in REFUSALS:
                    raise
                support = await turn.pending
                stats.note(f"the chat endpoint refused the first request ({exc}); {support.reason or 'retrying'}: decoding the chat turn plainly")
                stats.fallback = "plain chat"
                async with aclosing(decode_plainly_from_start(turn, out, stats)) as pieces:
                    async for piece in pieces:
                        yield piece
        finally:
            if turn.pending is not None and not turn.pending.done():
                turn.pending.cancel()  # the turn ended first; the next one probes again
            stats.observe_predictions(turn.usage_seen)

    async def _speculate(
        self, target, available: list[str], costs, forced: str | None, out: Output, stats: GenerationStats,
        probing: asyncio.Future[ChatSupport] | None = None,
    ) -> AsyncIterator[str]:
        """Speculative decoding against ``target`` (the completions API or a
        chat turn; ``probing``: the chat probe still running beside it)."""
        loaded = self.profiles.chat_loaded if target is not self.api else self.profiles.loaded
        stats.server_profile = "stored" if loaded else "probed"
        await self.load_drafter()
        drafter = self._new_drafter() if self._new_drafter is not None else None
        if out.prediction:
            drafter = PredictionDrafter(out.prediction, drafter)
        policy = Policy(available, costs, forced=forced, fanout_width=self.fanout_width, max_draft_chars=self.max_draft_chars)
        if probing is not None:
            probing.add_done_callback(lambda task: _chat_probed(task, policy, stats))
        policy.context_tokens = len(out.prompt) / policy.chars_per_token
        if self.max_cost is not None:
            policy.budget = Budget(self.max_cost, self.price or RELATIVE_PRICE, stats.bill, self.api.prompt_sizes, out.prompt_size, out)
        verifiers = {"echo": EchoVerifier(target), "fanout": FanoutVerifier(target)}
        learning = asyncio.ensure_future(self.api.learn_tokenize())
        try:
            async with aclosing(speculate(target, drafter, policy, verifiers, out, stats)) as pieces:
                async for piece in pieces:
                    yield piece
            costs = policy.costs
            if 1 in costs.step or costs.stream.observed:
                stats.plain_estimate_s = costs.single_seconds(stats.output_tokens)
        finally:
            learning.cancel()
            policy.remember()
            if self.profiles.profile is not None:
                self.profiles.profile.generations += 1
            self._keep_profile(force=False)
            if isinstance(drafter, PredictionDrafter):
                _count_prediction(drafter, out, stats)
            finish = getattr(drafter, "finish", None)
            if finish is not None:
                finish()  # the suffix drafter remembers this output for the session


def _logprobs_word(caps: Capabilities) -> str:
    return "no" if not caps.logprobs else "yes" if caps.token_strings_fit else "yes, but their token strings do not fit the text"


def _chat_probed(task: asyncio.Future[ChatSupport], policy: Policy, stats: GenerationStats) -> None:
    """The chat probe that ran beside a turn's first request has answered:
    what it found decides what the rest of the turn may use."""
    if task.cancelled():
        return
    error = task.exception()
    support = None if error is not None else task.result()
    if support is None or not support.speculative:
        policy.stop_speculating()
        why = support.reason if support is not None else f"the chat probe failed ({error})"
        stats.note(f"{why}: decoding the chat turn plainly")
        stats.fallback = "plain chat"
    else:
        policy.allow("branches")
        if support.prompt_logprobs:
            policy.allow("echo")


PREDICTION_MODES = ("auto", "local", "server")


def _check_prediction(prediction: object) -> None:
    if prediction is not None and not isinstance(prediction, str):
        raise ConfigurationError(f"prediction must be a string, not {type(prediction).__name__}")


def _count_prediction(drafter: PredictionDrafter, out: Output, stats: GenerationStats) -> None:
    """OpenAI's counts for a prediction drafted from here: its tokens the
    reply kept, and the rest.  Estimated from characters at the reply's own
    characters per token (the prediction is never tokenized by the server)."""
    per_char = stats.output_tokens / len(out.text) if out.text else 0.0
    accepted = round(drafter.kept_chars * per_char)
    stats.accepted_prediction_tokens = accepted
    stats.rejected_prediction_tokens = max(0, round(len(drafter.prediction) * per_char) - accepted) if per_char else 0


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
