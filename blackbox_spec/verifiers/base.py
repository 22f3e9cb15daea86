"""What every verifier returns, and the protocol it implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .._target import Usage
from .._tokens import OPAQUE, Unit


@dataclass
class Plan:
    """How to verify one round; chosen by the policy from measurements."""

    strategy: str  # "echo" | "fanout" | "branches" | "plain"
    draft_chars: int = 0
    extra_tokens: int = 1  # echo: tokens to generate after the draft
    width: int = 1  # fanout: parallel requests
    tokens_per_request: int = 8  # fanout / plain: max_tokens of each request
    segment_chars: int = 0  # fanout: draft characters between offsets (0: len(draft) // width)


@dataclass
class Verdict:
    """The target text one round confirmed.

    ``units`` end on a safe cut (see ``_tokens``); the first
    ``draft_units`` of them came from the draft, the rest the target wrote.
    ``eos``: the target ended its text right after ``units``.
    ``plain_next``: the target's next token could not be read (an opaque
    or special-looking token); the next round must ask it plainly.
    """

    units: list[Unit]
    draft_units: int = 0
    proposed_units: int = 0
    eos: bool = False
    plain_next: bool = False
    off_path: bool = False
    # An echo round's tokens for the context it was sent (``Canon.confirm``);
    # None where it did not say.
    context_units: list[Unit] | None = None
    calls: int = 0
    cancelled: int = 0
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0


class Verifier(Protocol):
    """Checks a draft against the target, continuing ``context``."""

    name: str

    async def verify(self, context: str, draft: str, plan: Plan) -> Verdict: ...


def complete_units(units: list[Unit]) -> list[Unit]:
    """Drop a trailing unit that ends inside a character (max_tokens cut it)."""
    if units and OPAQUE in units[-1].text:
        return units[:-1]
    return units


def add_usage(total: Usage, more: Usage) -> None:
    total.prompt_tokens += more.prompt_tokens
    total.completion_tokens += more.completion_tokens
