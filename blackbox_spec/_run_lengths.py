"""How drafts hold: run lengths (draft tokens accepted before the first
miss) per kind of draft, and what kind of draft a match gives."""

from __future__ import annotations

from dataclasses import dataclass

from ._tuning import TUNING, Tuning


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


def starting_runs(tuning: Tuning, remembered: dict[str, RunLengths] | None) -> dict[str, RunLengths]:
    """Each kind's run lengths at a generation's start: the priors
    (``Tuning.prior_runs``), or what drafts did in this client's earlier
    generations (``Policy.remember``) at half weight, so that a proxy's or
    an agent's next request starts from it instead of proving its drafts
    again before echo is tried."""
    weights = dict(tuning.prior_weights)
    runs = {kind: RunLengths(prior, prior_weight=weights.get(kind, 1.0)) for kind, prior in tuning.prior_runs}
    if remembered:
        runs.update({k: RunLengths(v.prior_run, v.accepted / 2, v.misses / 2, v.prior_weight) for k, v in remembered.items()})
    return runs
