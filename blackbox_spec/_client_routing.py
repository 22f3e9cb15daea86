"""Which way a generation goes: plainly or speculatively, over
``/completions`` (``_pieces``) or a chat turn (``_chat_pieces``), with what
the probes found deciding which strategies the policy may use."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import AsyncIterator, Callable

from ._bill import RELATIVE_PRICE
from ._budget import PLAIN_BELOW, Budget
from ._exceptions import ConfigurationError, TargetHTTPError
from ._output import Output
from ._plain import decode_plainly_from_start
from ._stats import GenerationStats
from ._client_probing import ServerKnowledge
from .chat import ChatSupport, ChatTurn
from .drafters import Drafter, DrafterFactory
from .drafters.prediction import PredictionDrafter
from .orchestrator import speculate
from .policy import Policy
from .server_probe import REFUSALS, Capabilities
from .verifiers import EchoVerifier, FanoutVerifier


class GenerationRouting(ServerKnowledge):
    """The routing half of the client: each generation's path, and the
    speculation it runs.  (The settings below are the client's own.)"""

    strategy: str
    prediction_mode: str
    fanout_width: int
    max_draft_chars: int
    max_cost: float | None
    _new_drafter: Callable[[], Drafter] | None

    async def load_drafter(self) -> None:
        """Load the draft model now, off the event loop (it takes seconds);
        otherwise the first generation does it.  A no-op for other drafters."""
        factory = self._new_drafter
        if isinstance(factory, DrafterFactory) and factory.kind in ("llama", "hf") and factory._model is None:
            await asyncio.to_thread(factory.load)  # (a thread costs ~0.1-0.3 s to start: only when there is a model)

    def _no_room(self) -> bool:
        """A bill limited to little more than plain's leaves no room for a probe and a draft's request."""
        return self.max_cost is not None and self.max_cost < PLAIN_BELOW

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

    async def _pieces(self, out: Output, stats: GenerationStats) -> AsyncIterator[str]:
        """A completion's text: speculated with what the probe found the
        server offers, else plainly (the reason noted in ``stats``)."""
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
        """One chat turn's text: speculated where this chat endpoint can be
        verified, else plainly (the reason noted in ``stats``)."""
        if turn.prompt != turn.head:
            # The conversation ends with an assistant message to continue:
            # even plain decoding needs to know how this server does that.
            turn.support = await self.probe_chat()
        await self._route_prediction(turn, out, stats, prediction)
        reason, unsupported = await self._why_chat_is_plain(turn, out, prediction)
        if self.strategy not in ("auto", "plain") and turn.support is not None and not turn.support.speculative:
            raise ConfigurationError(f"strategy {self.strategy!r} is not available on {self.api.base_url}'s chat endpoint: {turn.support.reason}")
        source = await self._chat_source(turn, out, stats, reason, unsupported)
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

    async def _route_prediction(self, turn: ChatTurn, out: Output, stats: GenerationStats, prediction: str | None) -> None:
        """A given ``prediction`` goes to the server as Predicted Outputs, or
        stays in ``out`` to be drafted from here (``prediction_mode``)."""
        if prediction is not None and await self._prediction_goes_to_server():
            out.prediction = None
            turn.extra["prediction"] = {"type": "content", "content": prediction}
        elif prediction is not None and self.prediction_mode == "auto":
            stats.note("a prediction was given: drafted from here (the server does not speculate on one itself)")

    async def _why_chat_is_plain(self, turn: ChatTurn, out: Output, prediction: str | None) -> tuple[str | None, str | None]:
        """Why the turn is decoded plainly (None: it is speculated on), and,
        where the chat probe said so, what the endpoint does not support.
        Starts the chat probe (beside the turn, where a profile allows)."""
        reason = unsupported = None
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
        return reason, unsupported

    async def _chat_source(self, turn: ChatTurn, out: Output, stats: GenerationStats, reason: str | None,
                           unsupported: str | None) -> AsyncIterator[str]:
        """The turn's pieces: speculated, with the strategies the chat probe
        allows, or plainly for ``reason``."""
        if reason is not None:
            stats.note(reason)
            if unsupported:
                stats.fallback = "plain chat"
            return decode_plainly_from_start(turn, out, stats)
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
        return self._speculate(turn, available, self.chat_costs, forced, out, stats, probing=turn.pending)

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


def _count_prediction(drafter: PredictionDrafter, out: Output, stats: GenerationStats) -> None:
    """OpenAI's counts for a prediction drafted from here: its tokens the
    reply kept, and the rest.  Estimated from characters at the reply's own
    characters per token (the prediction is never tokenized by the server)."""
    per_char = stats.output_tokens / len(out.text) if out.text else 0.0
    accepted = round(drafter.kept_chars * per_char)
    stats.accepted_prediction_tokens = accepted
    stats.rejected_prediction_tokens = max(0, round(len(drafter.prediction) * per_char) - accepted) if per_char else 0

