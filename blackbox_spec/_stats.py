"""Stats for one generation, kept as a dataclass (display lives elsewhere)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ._bill import RELATIVE, RELATIVE_PRICE, Bill, Price, plain_bill


@dataclass
class GenerationStats:
    """What one generation cost and how well the drafts did.

    Token counts are the *target's* tokens, as its logprobs reported them.
    ``mean_accepted_per_round`` counts the target's own token too (as
    vLLM's mean acceptance length does), so plain decoding in one call
    scores the whole output in one round.
    """

    rounds: int = 0
    target_calls: int = 0
    cancelled_calls: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_chars: int = 0
    accepted_chars: int = 0
    output_tokens: int = 0
    jumps: int = 0  # times the text jumped ahead onto a side branch
    # Calls retried after a 429, 408, 409, 5xx, timeout or reset (counted on
    # the client, so generations running at once on one client share it).
    retries: int = 0
    # Rounds that failed after their retries (the next round resumed from
    # the same text), and why speculation was given up, if it was.
    failed_rounds: int = 0
    fallback: str | None = None
    # Why the server's token strings were given up on in this generation
    # (they did not fit its text): the rest was decoded plainly, without
    # logprobs.  None while they were trusted.
    token_strings_failed: str | None = None
    # What the server billed for this generation (every request, cancelled
    # streams estimated; ``_bill``), and the prompt's own tokens, for what
    # one plain call would bill.  ``price``: to put a cost on them.
    bill: Bill = field(default_factory=Bill)
    prompt_tokens: int | None = None
    price: Price | None = None
    wall_s: float = 0.0
    # Seconds from the call to the first text (time to first token); None
    # where no text came.
    first_text_s: float | None = None
    # What plain decoding of this output would take on this server, from the
    # decode rate measured in this run (None where it was not measured).
    plain_estimate_s: float | None = None
    draft_s: float = 0.0
    verify_s: float = 0.0
    strategy_rounds: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    # The server's stop rule the stop strings were replayed with, when
    # there were several (``_stopping.RULES``).
    stop_rule: str | None = None
    # Where what the client knew of the server came from: "stored" (a saved
    # profile, no probe), "probed" (measured by this client), None (plain).
    server_profile: str | None = None
    # The generation was cancelled (a cancelled task, Ctrl-C) before its end;
    # its text is what the target had confirmed by then.
    interrupted: bool = False
    # Predicted Outputs: what the server reported using of the prediction
    # (None when no prediction was sent or the server said nothing).
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    notes: list[str] = field(default_factory=list)
    # One entry per round: [strategy, drafted chars, accepted draft tokens,
    # tokens gained, seconds]; what the policy saw, for benchmarks and plots.
    trace: list[list] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_per_round(self) -> float:
        return self.output_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def speedup_estimate(self) -> float | None:
        """``plain_estimate_s / wall_s``: an estimate, not a measurement (``bspec
        bench`` measures plain decoding in the same run)."""
        if self.plain_estimate_s is None or self.wall_s <= 0:
            return None
        return self.plain_estimate_s / self.wall_s

    def observe_round(self, strategy: str, *, calls: int, cancelled: int, seconds: float) -> None:
        self.rounds += 1
        self.target_calls += calls
        self.cancelled_calls += cancelled
        self.verify_s += seconds
        self.strategy_rounds[strategy] = self.strategy_rounds.get(strategy, 0) + 1

    def observe_draft(self, *, drafted_tokens: int, accepted_tokens: int, drafted_chars: int, accepted_chars: int, output_tokens: int) -> None:
        self.drafted_tokens += drafted_tokens
        self.accepted_tokens += accepted_tokens
        self.drafted_chars += drafted_chars
        self.accepted_chars += accepted_chars
        self.output_tokens += output_tokens

    @property
    def plain_bill(self) -> Bill | None:
        """What one plain call for this output would bill (None: the prompt's tokens are unknown)."""
        return None if self.prompt_tokens is None else plain_bill(self.prompt_tokens, self.output_tokens)

    @property
    def bill_ratio(self) -> float | None:
        """This bill against plain's, at ``price`` (or relative prices: in 1, cached 0.25, out 4)."""
        plain = self.plain_bill
        price = self.price or RELATIVE_PRICE
        if plain is None or not price.cost(plain):
            return None
        return price.cost(self.bill) / price.cost(plain)

    def bill_summary(self) -> str:
        """One phrase: what the server billed, against one plain call."""
        b = self.bill
        line = (f"bill: {b.requests} requests, {b.prompt_tokens:,} prompt tokens ({b.cached_tokens:,} cached), "
                f"{b.output_tokens:,} output" + (f" (~{b.estimated_tokens:,} estimated)" if b.estimated_tokens else ""))
        ratio, plain = self.bill_ratio, self.plain_bill
        if self.price is not None and plain is not None:
            line += f", {_money(self.price.cost(b))} vs {_money(self.price.cost(plain))} plain"
        if ratio is not None:
            line += f" ({ratio:.1f}x plain's" + ("" if self.price is not None else f" at relative prices {RELATIVE}") + ")"
        return line

    def observe_predictions(self, usages: list) -> None:
        """Sum Predicted Outputs' counts over the calls that reported them."""
        for name in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
            counts = [getattr(u, name) for u in usages if getattr(u, name) is not None]
            if counts:
                setattr(self, name, sum(counts))

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance_rate"] = round(self.acceptance_rate, 4)
        data["mean_accepted_per_round"] = round(self.mean_accepted_per_round, 3)
        data["tokens_per_second"] = round(self.tokens_per_second, 2)
        estimate = self.speedup_estimate
        data["speedup_estimate"] = None if estimate is None else round(estimate, 2)
        if self.plain_estimate_s is not None:
            data["plain_estimate_s"] = round(self.plain_estimate_s, 4)
        if self.first_text_s is not None:
            data["first_text_s"] = round(self.first_text_s, 4)
        for key in ("wall_s", "draft_s", "verify_s"):
            data[key] = round(data[key], 4)
        data["bill"] = self.bill.to_dict()
        plain = self.plain_bill
        data["plain_bill"] = None if plain is None else plain.to_dict()
        ratio = self.bill_ratio
        data["bill_vs_plain"] = None if ratio is None else round(ratio, 3)
        data["price"] = None if self.price is None else self.price.to_dict()
        if self.price is not None:
            data["cost"] = round(self.price.cost(self.bill), 8)
            data["plain_cost"] = None if plain is None else round(self.price.cost(plain), 8)
        return data


def _money(amount: float) -> str:
    return f"${amount:.4f}" if amount >= 0.01 else f"${amount:.6f}"


class Piece(str):
    """A piece of streamed text: a ``str``, plus whether it came in through an
    accepted draft (``drafted``) or the target wrote it on its own.  The text
    is the target's either way; the flag is for showing where speed came from."""

    drafted: bool

    def __new__(cls, text: str, drafted: bool = False) -> "Piece":
        piece = super().__new__(cls, text)
        piece.drafted = drafted
        return piece


@dataclass
class GenerationResult:
    """The generated continuation (prompt not included) and its stats."""

    text: str
    stats: GenerationStats

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason
