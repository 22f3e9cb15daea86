"""``GET /metrics``: totals since ``bspec serve`` started."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .._bill import RELATIVE_PRICE, Bill
from .._stats import GenerationStats


@dataclass
class ProxyMetrics:
    """Totals since the server started (``GET /metrics``)."""

    requests: int = 0
    speculated: int = 0
    speculating: int = 0  # now
    peak_speculating: int = 0
    plain_when_busy: int = 0  # greedy requests decoded plainly: max_speculative were speculating
    passed_through: dict[str, int] = field(default_factory=dict)
    in_progress: int = 0  # generations holding a slot now
    passing_through: int = 0  # passed-through requests holding a slot now
    queued: int = 0
    refused: int = 0  # answered 4xx here: not allowed, too large, not JSON, bad fields
    rejected_busy: int = 0
    disconnected: int = 0
    failed: int = 0
    output_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    jumps: int = 0  # onto a side branch: each one a round too, as far as tokens per round go
    target_calls: int = 0
    wall_s: float = 0.0
    plain_estimate_s: float = 0.0
    estimated_wall_s: float = 0.0  # wall time of the generations that have a plain estimate
    # What upstream billed for the speculated answers (every request, closed
    # streams estimated), and what one plain call each would have: the
    # proxy's cost of speed (``_bill``).  ``cost`` where a price is known.
    bill: Bill = field(default_factory=Bill)
    plain_bill: Bill = field(default_factory=Bill)
    cost: float | None = None
    plain_cost: float | None = None
    # The admission limits (``--max-concurrency``, ``--max-queue``,
    # ``--max-speculative``) and how callers' learned state is kept.
    limits: dict[str, Any] = field(default_factory=dict)

    def observe(self, stats: GenerationStats) -> None:
        self.bill.add(stats.bill)
        plain = stats.plain_bill
        if plain is not None:
            self.plain_bill.add(plain)
        if stats.price is not None and plain is not None:
            self.cost = (self.cost or 0.0) + stats.price.cost(stats.bill)
            self.plain_cost = (self.plain_cost or 0.0) + stats.price.cost(plain)
        self.output_tokens += stats.output_tokens
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        self.rounds += stats.rounds
        self.jumps += stats.jumps
        self.target_calls += stats.target_calls
        self.wall_s += stats.wall_s
        if stats.plain_estimate_s is not None:
            self.plain_estimate_s += stats.plain_estimate_s
            self.estimated_wall_s += stats.wall_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bill"], data["plain_bill"] = self.bill.to_dict(), self.plain_bill.to_dict()
        relative = RELATIVE_PRICE
        data["bill_vs_plain"] = round(relative.cost(self.bill) / relative.cost(self.plain_bill), 3) if relative.cost(self.plain_bill) else None
        for key in ("cost", "plain_cost"):
            data[key] = None if data[key] is None else round(data[key], 8)
        data["acceptance_rate"] = round(self.accepted_tokens / self.drafted_tokens, 4) if self.drafted_tokens else None
        # Every accepted draft token is one sequential decoding step of the
        # target that was not needed.
        data["decode_steps_saved"] = self.accepted_tokens
        data["speedup_estimate"] = round(self.plain_estimate_s / self.estimated_wall_s, 3) if self.estimated_wall_s else None
        for key in ("wall_s", "plain_estimate_s", "estimated_wall_s"):
            data[key] = round(data[key], 3)
        return data
