"""Asking the drafter for a draft, and telling it how the draft did.

Both the speculative rounds (``orchestrator``) and the plain stream's side
branches (``_branch_group``, ``_branched_stream``) draft this way: every
proposal is timed against the drafting budget (``DraftBudget``), so a
drafter that costs more than its drafts save is paused.
"""

from __future__ import annotations

import time

from ._stats import GenerationStats
from .drafters.base import Drafter
from .policy import Policy


def propose(drafter: Drafter, policy: Policy, stats: GenerationStats, elapsed_s: float = 0.0) -> str | None:
    """The drafter's proposal, timed against the drafting budget; None while
    drafting is paused (it has cost more than it saved)."""
    budget = policy.costs.drafting
    if not budget.may_draft(elapsed_s):
        return None
    asked = time.perf_counter()
    proposal = drafter.propose(policy.max_draft_chars)
    spent = time.perf_counter() - asked
    budget.spend(spent)
    stats.draft_s += spent
    return proposal


def tell_outcome(drafter: Drafter, draft: str, accepted_chars: int) -> None:
    """Tell the drafter how much of ``draft`` the target accepted."""
    # Drafters written before ``outcome`` joined the protocol lack it.
    outcome = getattr(drafter, "outcome", None)
    if outcome is not None and draft:
        outcome(draft, accepted_chars)
