"""Draft length and tree depth chosen from measured costs (``--gamma auto``).

A chain round drafts γ tokens (γ draft steps), runs one target forward over
γ + 1 tokens and emits (1 − α^(γ+1)) / (1 − α) tokens on average (Leviathan
et al., eq. 1).  Against plain decoding, one target forward of one token per
token, its expected speed is

    S(γ) = E(γ) · plain / (γ · draft + verify(γ + 1)),   S(0) = 1,

in seconds measured on this machine: ``plain`` and ``verify(w)`` are whole
target steps (the forward over w tokens and the sampling rule after it) and
``draft`` a whole draft step.  The paper's form is the same with c = draft /
plain and v = verify(γ + 1) / plain, which it takes as 1; on a CPU, or a GPU
where small forwards are launch-bound, v grows with w, and a γ that the
paper's formula favours can run at half the plain speed.  γ = 0 *is* plain
decoding, so the choice can never be worse than plain by the model's own
account.

Trees (Medusa, EAGLE) choose a depth the same way: a tree cut at depth d
costs the proposal and a forward over its N_d + 1 nodes, and emits
1 + Σ_{j ≤ d} reach_j tokens, where reach_j is the chance that the walk
accepts a node at depth j.

The math is pure functions of floats; :class:`GammaChooser` and
:class:`DepthChooser` hold the running estimates of one generation.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

# α before anything is seen, and how many positions' worth it weighs: light,
# so a few rounds decide.  Older rounds fade (DECAY per round) because a text
# changes character (code, then prose).
PRIOR_ALPHA, PRIOR_WEIGHT, DECAY = 0.6, 2.0, 0.9
MAX_GAMMA = 6
# Drafting must be expected to beat plain decoding by this much: the model
# leaves out a few percent (the draft's catch-up after plain steps, the
# rule's bookkeeping), and losing is worse than not winning.  On float32
# here, rounds the model called even ran at 0.96x.
MARGIN = 1.05
# While plain wins, a round at γ = 1 now and then re-measures α (doubling
# the gap each time plain still wins, up to MAX_EXPLORE_GAP rounds).
EXPLORE_GAP, MAX_EXPLORE_GAP = 4, 32
# A look may lose at most this share of the plain steps still to come (a
# look with γ = 5 in float32 here costs ~1.5 steps more than it brings at
# the prior α: 3% of a 48-token answer each time).
EXPLORE_BUDGET = 0.02
DRAFT_WEIGHT = 0.3  # a new proposal's time in the running mean


@dataclass
class Costs:
    """Seconds per step on this machine, for one (target, draft, engine, rows)."""

    verify_s: dict[int, float]  # target step over w tokens (forward + rule), by w; w = 1 is plain decoding's step
    draft_s: float = 0.0  # one draft step (forward + sampling); trees: one proposal
    measured_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.verify_s or 1 not in self.verify_s or any(not s > 0 for s in self.verify_s.values()) or not self.draft_s >= 0:
            raise ValueError(f"costs need positive seconds for width 1 and each width given, and a draft step >= 0: {self.verify_s}, {self.draft_s}")

    @property
    def plain_s(self) -> float:
        return self.verify(1)

    def verify(self, width: int) -> float:
        """Seconds for a target step over ``width`` tokens: measured, or
        linear between the nearest measured widths (beyond them, along the
        last two)."""
        widths = sorted(self.verify_s)
        if width in self.verify_s or len(widths) == 1:
            return self.verify_s.get(width, self.verify_s[widths[0]] * width / widths[0])
        i = min(max(bisect.bisect_left(widths, width), 1), len(widths) - 1)
        lo, hi = widths[i - 1], widths[i]
        slope = (self.verify_s[hi] - self.verify_s[lo]) / (hi - lo)
        return max(self.verify_s[lo] + slope * (width - lo), min(self.verify_s.values()))

    def ratios(self, gamma: int) -> dict[str, float]:
        """The paper's c and v for ``gamma`` (v: verify over γ + 1 tokens, per plain step)."""
        return {"c": self.draft_s / self.plain_s, "v": self.verify(gamma + 1) / self.plain_s}

    def to_dict(self) -> dict:
        return {"verify_s": {str(k): v for k, v in sorted(self.verify_s.items())}, "draft_s": self.draft_s, "measured_at": self.measured_at}

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        return cls({int(k): float(v) for k, v in data["verify_s"].items()}, float(data["draft_s"]), float(data.get("measured_at", 0.0)))


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(γ) = (1 − α^(γ+1)) / (1 − α): tokens a chain round emits on average.

    >>> expected_tokens(0.5, 2), expected_tokens(1.0, 3), expected_tokens(0.0, 4)
    (1.75, 4.0, 1.0)
    """
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def chain_speedup(alpha: float, gamma: int, costs: Costs) -> float:
    """S(γ): expected tokens per second against plain decoding's (γ = 0 is 1).

    >>> costs = Costs({1: 1.0, 3: 1.2, 5: 2.0}, draft_s=0.1)
    >>> round(chain_speedup(0.8, 2, costs), 3), round(chain_speedup(0.8, 4, costs), 3)
    (1.743, 1.401)
    """
    if gamma == 0:
        return 1.0
    return expected_tokens(alpha, gamma) * costs.plain_s / (gamma * costs.draft_s + costs.verify(gamma + 1))


def best_gamma(alpha: float, costs: Costs, max_gamma: int = MAX_GAMMA) -> tuple[int, float]:
    """The γ in 0..max_gamma with the highest S(γ), and S; ties go to the
    smaller γ, and plain (γ = 0) wins unless drafting beats it by MARGIN.

    >>> best_gamma(0.8, Costs({1: 1.0, 3: 1.2, 5: 2.0}, draft_s=0.1))
    (2, 1.743)
    >>> best_gamma(0.5, Costs({1: 1.0, 2: 2.0}, draft_s=0.4))   # a wider step costs double: plain
    (0, 1.0)
    """
    speeds = [chain_speedup(alpha, g, costs) for g in range(max_gamma + 1)]
    gamma = max(range(len(speeds)), key=lambda g: (round(speeds[g], 9), -g))
    return (gamma, round(speeds[gamma], 3)) if speeds[gamma] >= MARGIN else (0, 1.0)


def tree_speedup(reach: Sequence[float], depth: int, nodes: Sequence[int], costs: Costs) -> float:
    """S for a tree cut at ``depth``: (1 + Σ_{j ≤ depth} reach_j) tokens per
    proposal + a forward over ``nodes[depth - 1]`` + 1 tokens; depth 0 is plain.

    >>> costs = Costs({1: 1.0, 8: 1.5}, draft_s=0.2)
    >>> round(tree_speedup([0.7, 0.5, 0.3], 2, [3, 6, 9], costs), 3)
    1.351
    """
    if depth == 0:
        return 1.0
    return (1 + sum(reach[:depth])) * costs.plain_s / (costs.draft_s + costs.verify(nodes[depth - 1] + 1))


def best_depth(reach: Sequence[float], nodes: Sequence[int], costs: Costs) -> tuple[int, float]:
    """The depth in 0..len(nodes) with the highest S, and S (plain unless a
    tree beats it by MARGIN).

    >>> best_depth([0.7, 0.5, 0.3], [3, 6, 9], Costs({1: 1.0, 8: 1.5}, draft_s=0.2))
    (3, 1.357)
    >>> best_depth([0.2, 0.1], [3, 6], Costs({1: 1.0, 8: 1.5}, draft_s=0.2))
    (0, 1.0)
    """
    speeds = [tree_speedup(reach, d, nodes, costs) for d in range(len(nodes) + 1)]
    depth = max(range(len(speeds)), key=lambda d: (round(speeds[d], 9), -d))
    return (depth, round(speeds[depth], 3)) if speeds[depth] >= MARGIN else (0, 1.0)


@dataclass
class Acceptance:
    """A running estimate of one acceptance rate: a decayed mean of
    observations, started from a light prior."""

    prior: float = PRIOR_ALPHA
    weight: float = PRIOR_WEIGHT
    total: float = 0.0
    count: float = 0.0

    @property
    def value(self) -> float:
        return (self.total + self.prior * self.weight) / (self.count + self.weight)

    @property
    def optimistic(self) -> float:
        """One standard error above the estimate (a Beta's, roughly)."""
        value = self.value
        return min(1.0, value + math.sqrt(value * (1 - value) / (self.count + self.weight)))

    def observe(self, total: float, count: float) -> None:
        """Add ``count`` observations summing to ``total`` (older ones fade;
        nothing observed, nothing fades)."""
        if count > 0:
            self.total, self.count = self.total * DECAY + total, self.count * DECAY + count


@dataclass
class RoundTimes:
    """What rounds cost in the run itself, against the measured costs:
    whole rounds carry what scratch steps do not (the draft's catch-up
    step, the rule's bookkeeping), so an estimate fitted to them chooses
    better.  Timings differ from run to run, so a seeded run does not use
    them (its γ choices, and so its text, replay on the same costs)."""

    draft_ratio: Acceptance = field(default_factory=lambda: Acceptance(prior=1.0, weight=1.0))  # seen / measured, per draft step
    verify_ratio: dict[int, Acceptance] = field(default_factory=dict)  # seen / measured, by width

    def observe(self, costs: Costs, gamma: int, draft_s: float, verify_s: float) -> None:
        if gamma and draft_s > 0 and costs.draft_s > 0:  # 0: not a step's time (a catch-up)
            self.draft_ratio.observe(draft_s / gamma / costs.draft_s, 1.0)
        self.verify_ratio.setdefault(gamma + 1, Acceptance(prior=1.0, weight=1.0)).observe(verify_s / costs.verify(gamma + 1), 1.0)

    def fitted(self, costs: Costs) -> Costs:
        """The measured costs scaled by what rounds took: each seen width by
        its own ratio, the others by the nearest seen width's."""
        if not self.verify_ratio:
            return costs
        seen = sorted(self.verify_ratio)
        nearest = lambda w: min(seen, key=lambda s: (abs(s - w), s))  # noqa: E731
        widths = sorted(set(costs.verify_s) | set(seen))
        return Costs({w: costs.verify(w) * self.verify_ratio[nearest(w)].value for w in widths}, costs.draft_s * self.draft_ratio.value, costs.measured_at)


@dataclass
class GammaChooser:
    """γ for each chain round of one generation: the best S(γ) for the
    current α estimate (the mean of β = Σ min(p, q) over examined positions,
    the paper's estimator), with a γ = 1 round now and then while plain wins
    so that α keeps being measured.  With ``times``, the costs are fitted
    to the rounds as they go (:class:`RoundTimes`)."""

    costs: Costs
    max_gamma: int = MAX_GAMMA
    alpha: Acceptance = field(default_factory=Acceptance)
    chosen: list[int] = field(default_factory=list)
    expected: float = 1.0  # S of the last choice
    times: RoundTimes | None = None
    _plain_rounds: int = 0
    _gap: int = EXPLORE_GAP

    @property
    def current_costs(self) -> Costs:
        return self.times.fitted(self.costs) if self.times is not None else self.costs

    def next_gamma(self, most: int | None = None, remaining: int | None = None) -> int:
        """γ for the next round, at most ``most`` (the drafts still wanted);
        ``remaining``: tokens still to come, which a look must be cheap against."""
        costs, most = self.current_costs, self.max_gamma if most is None else min(most, self.max_gamma)
        gamma, self.expected = best_gamma(self.alpha.value, costs, most)
        if gamma == 0:
            self._plain_rounds += 1
            if self._plain_rounds >= self._gap and most > 0:
                # Look again (α may have risen), but only where an optimistic
                # α would win: a look costs the draft's catch-up and a round
                # that is likely to lose, so on a machine where only near-sure
                # drafts could pay (float32 here: α >= 0.97) it is not taken.
                self._plain_rounds, self._gap = 0, min(2 * self._gap, MAX_EXPLORE_GAP)
                gamma, _ = best_gamma(self.alpha.optimistic, costs, most)
                if gamma and remaining is not None and self._look_loss(gamma, costs) > EXPLORE_BUDGET * remaining:
                    gamma = 0
        else:
            self._plain_rounds, self._gap = 0, EXPLORE_GAP
        self.chosen.append(gamma)
        return gamma

    def _look_loss(self, gamma: int, costs: Costs) -> float:
        """Plain steps a round at ``gamma`` costs beyond the tokens it brings at the current α."""
        return (gamma * costs.draft_s + costs.verify(gamma + 1)) / costs.plain_s - expected_tokens(self.alpha.value, gamma)

    def observe(self, beta_sum: float, positions: int, *, gamma: int = 0, draft_s: float = 0.0, verify_s: float = 0.0) -> None:
        """A round's acceptance (Σ β over its examined positions) and, where
        costs are fitted, what its draft and verify phases took."""
        self.alpha.observe(beta_sum, positions)
        if self.times is not None and verify_s > 0:
            self.times.observe(self.costs, gamma, draft_s, verify_s)

    def summary(self) -> dict:
        counts = {g: self.chosen.count(g) for g in sorted(set(self.chosen))}
        gamma = max(counts, key=counts.get) if counts else 0
        costs = self.current_costs
        return {"gamma_rounds": {str(g): n for g, n in counts.items()}, "alpha_estimate": round(self.alpha.value, 3),
                "expected_speedup": round(chain_speedup(self.alpha.value, gamma, costs), 3), **{k: round(v, 3) for k, v in costs.ratios(gamma).items()},
                **({"costs_fitted_to_rounds": True} if self.times is not None else {})}


@dataclass
class DepthChooser:
    """Depth for each tree round: reach_j = Π_{i ≤ j} r_i, where r_i is the
    estimated chance that the walk goes from depth i − 1 to depth i; every
    ``EXPLORE_GAP``-th round (doubling while a cut wins) the whole tree runs,
    so the deeper r_i keep being measured."""

    costs: Costs
    levels: list[Acceptance] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # nodes at depth <= d + 1 in the last whole tree
    chosen: list[int] = field(default_factory=list)
    learn_draft: bool = True  # learn the proposal's time from the rounds (wall clock: not for runs that must replay)
    _since_whole: int = 0
    _gap: int = EXPLORE_GAP

    def next_depth(self, full_depth: int) -> int:
        """The depth to cut the next tree at (``full_depth``: uncut)."""
        self._since_whole += 1
        if not self.nodes or self._since_whole >= self._gap:
            self._since_whole = 0
            self._gap = min(2 * self._gap, MAX_EXPLORE_GAP)
            depth = full_depth
        else:
            depth, _ = best_depth(self.reach()[: len(self.nodes)], self.nodes, self.costs)
            if depth == full_depth:
                self._gap = EXPLORE_GAP
        self.chosen.append(depth)
        return depth

    def reach(self) -> list[float]:
        out, running = [], 1.0
        for level in self.levels:
            running *= level.value
            out.append(running)
        return out

    def observe(self, depth_used: int, accepted: int, nodes_by_depth: Sequence[int] | None = None, *, draft_s: float | None = None) -> None:
        """A round with a tree ``depth_used`` deep accepted ``accepted``
        nodes; an uncut tree also says how many nodes it had down to each
        depth, and a proposal how long it took (a running mean: trees cost
        what the proposer spends, which no scratch step can time)."""
        if nodes_by_depth is not None:
            self.nodes = list(nodes_by_depth)
        if draft_s is not None and self.learn_draft:
            self.costs.draft_s = draft_s if self.costs.draft_s <= 0 else (1 - DRAFT_WEIGHT) * self.costs.draft_s + DRAFT_WEIGHT * draft_s
        while len(self.levels) < depth_used:
            self.levels.append(Acceptance(prior=0.5))
        for i in range(min(accepted + 1, depth_used)):  # depth i + 1 was tried
            self.levels[i].observe(float(i < accepted), 1.0)

    def summary(self) -> dict:
        counts = {d: self.chosen.count(d) for d in sorted(set(self.chosen))}
        depth = max(counts, key=counts.get) if counts else 0
        nodes = self.nodes[depth - 1] if 0 < depth <= len(self.nodes) else 0
        reach = self.reach()
        return {"depth_rounds": {str(d): n for d, n in counts.items()}, "reach_estimate": [round(r, 3) for r in reach],
                "expected_speedup": round(tree_speedup(reach, min(depth, len(self.nodes)), self.nodes, self.costs), 3),
                "c": round(self.costs.draft_s / self.costs.plain_s, 3), "v": round(self.costs.verify(nodes + 1) / self.costs.plain_s, 3)}
