"""The drafter protocol.

A drafter proposes how the text might go on, and learns from how much of it
the target accepted.  It works on strings, never on token ids, so its
tokenizer (if it has one) need not match the target's.  An empty proposal is
a normal answer ("no idea"), never an error: the loop then simply asks the
target for its next tokens.
"""

from __future__ import annotations

from typing import Protocol


class Drafter(Protocol):
    name: str

    def start(self, prompt: str) -> None:
        """A new generation begins with ``prompt``."""

    def propose(self, max_chars: int) -> str:
        """Up to ``max_chars`` of text likely to follow the context so far."""

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        """``accepted`` was appended to the context; it began with the first
        ``accepted_draft_chars`` characters of ``draft``."""
