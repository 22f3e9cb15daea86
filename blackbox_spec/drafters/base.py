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

    def outcome(self, draft: str, accepted_chars: int) -> None:
        """A draft was checked: the target kept its first ``accepted_chars``
        characters (all of them: the draft held to its end)."""

    def finish(self) -> None:
        """The generation is over (drafters with a memory keep its text)."""


def draft_rest(draft: str, written: str) -> str:
    """What is left of ``draft`` once the text has gone on by ``written``;
    empty if the text left the draft.  Drafters propose it again for free.

    >>> draft_rest("abcdef", "ab"), draft_rest("abcdef", "ax")
    ('cdef', '')
    """
    return draft[len(written) :] if draft.startswith(written) else ""


class DraftLength:
    """How long the next draft may be, learned from the last ones' outcomes.

    A draft that held to its end says the limit was what stopped it: the
    limit doubles.  A draft the target left after ``accepted`` units pulls
    the limit halfway towards twice that, so one early miss in a long copy
    does not cut the next draft short, and a run of them does.

    >>> n = DraftLength(start=8, low=2, high=64)
    >>> n.observe(drafted=8, accepted=8); n.limit
    16
    >>> n.observe(drafted=16, accepted=1); n.limit
    9
    >>> for _ in range(5): n.observe(drafted=9, accepted=0)
    >>> n.limit
    2
    """

    def __init__(self, *, start: int, low: int, high: int) -> None:
        if not 1 <= low <= start <= high:
            raise ValueError("need 1 <= low <= start <= high")
        self.low, self.high, self.limit = low, high, start

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted >= drafted:
            self.limit = min(self.high, max(self.limit, 2 * drafted))
        else:
            self.limit = max(self.low, min(self.high, (self.limit + 2 * accepted) // 2))
