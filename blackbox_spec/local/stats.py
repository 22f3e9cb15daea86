"""What local rounds did (chain and tree alike): :class:`LocalStats`, the
part of a generation's report that only local mode can measure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LocalStats:
    """What the local rounds did, beyond :class:`GenerationStats`: enough
    for the paper's α (mean β over examined positions) and c."""

    gamma: int = 0  # with --gamma auto: the γ most rounds used (auto says more)
    engine: str = ""  # "static", "static+compiled" or "eager (why)": see language_model()
    draft_forwards: int = 0
    target_forwards: int = 0
    examined_positions: int = 0  # draft positions the rule looked at
    rejections: int = 0
    beta_sum: float = 0.0  # Σ β = Σ_x min(p, q) over examined positions
    round_tokens: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)  # tree rounds: how often depth d's node was accepted
    auto: dict[str, Any] = field(default_factory=dict)  # --gamma auto: what was chosen, from which costs, and why

    @property
    def alpha(self) -> float:
        """The paper's α, estimated as the mean of β = Σ min(p, q)."""
        return self.beta_sum / self.examined_positions if self.examined_positions else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        return sum(self.round_tokens) / self.target_forwards if self.target_forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "gamma": self.gamma, "engine": self.engine, "alpha": round(self.alpha, 4), "draft_forwards": self.draft_forwards,
            "target_forwards": self.target_forwards, "tokens_per_target_forward": round(self.tokens_per_target_forward, 3),
            "examined_positions": self.examined_positions, "rejections": self.rejections,
        } | ({"accepted_per_depth": self.accepted_per_depth} if self.accepted_per_depth else {}) | ({"auto": self.auto} if self.auto else {})
