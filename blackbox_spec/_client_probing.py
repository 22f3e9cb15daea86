"""What a :class:`~blackbox_spec.client.SpecClient` knows about its server,
and how it learns it: the model's name, the probe's capabilities and costs
(``server_probe``), the chat endpoint's (``chat_probe.probe_chat``), Predicted
Outputs, the stop rule, and the profile that keeps all of it on disk
between processes (``profile``).  Learned once per client, under one lock,
so generations started together probe once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from ._bill import Price
from ._exceptions import ConfigurationError, TargetError, TargetHTTPError
from ._output import Output
from ._scoring import SCORING_FORMS
from ._stats import GenerationStats
from ._stopping import DEFAULT_RULE, single_stop_rule
from ._target import TargetAPI
from ._tokens import AlignmentError
from .chat import ChatSupport, ChatTurn, ContinueCheck
from .chat_probe import probe_chat, probe_predictions
from .policy import ServerCosts
from .probe import STOP_PROBE_PROMPT, probe_stop_rule
from .profile import LOADED_WEIGHT, ProfileStore
from .server_probe import REFUSALS, Capabilities, probe_server, seed_echo_cost


class ServerKnowledge:
    """The probing and profile half of the client: what it learned about
    its server, and the calls that learn it.  (``api``, ``price`` and
    ``_price_given`` are the client's own, set before ``_start_knowing``.)"""

    api: TargetAPI
    price: Price | None
    _price_given: bool

    def _start_knowing(self, stop_rule: str | None, profile: str) -> None:
        """Nothing learned yet: ``stop_rule`` and ``profile`` as the client was given them."""
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
                unmeasured = self.chat_costs is None or self.chat_costs.echo.observed == 0
                self.chat_support = await probe_chat(self.api, self._stored_check(), measure_echo=unmeasured)
                profile = self.profiles.profile
                if profile is not None and self.chat_support.check is not None:
                    profile.chat_check = asdict(self.chat_support.check)
                if self.chat_costs is None:
                    self.chat_costs = ServerCosts(self.chat_support.round_trip_s)
                if unmeasured and len(self.chat_support.echo_sizes) == 2:
                    seed_echo_cost(self.chat_costs, list(self.chat_support.echo_sizes))
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
