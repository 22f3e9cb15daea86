"""Draft from a prediction: the text the caller expects (OpenAI's Predicted
Outputs), usually the file being edited.

The draft follows the prediction from where the output has got to in it.
Where the target departs from it (an inserted, deleted or replaced span), the
output's latest characters are looked for in the prediction, nearest to
where it was left first (a replaced or inserted span resumes just after it;
a deleted block further on), and the copy resumes after them.  Until they
are found, and where the prediction has run out, the wrapped drafter
proposes.  Nothing here can change the output: the target checks every
character, as with any drafter.
"""

from __future__ import annotations

import re

from ..policy import PREDICTION_MATCH
from .base import Drafter
from .ngram import follow_copy

_WORD = re.compile(r"\w+")

# Re-aligning needs this many of the output's last characters found in the
# prediction: shorter ones ("    ", ") {") occur everywhere in code.
MIN_REALIGN = 8
MAX_REALIGN = 48


def realign(prediction: str, written: str, near: int, *, min_chars: int = MIN_REALIGN, max_chars: int = MAX_REALIGN) -> int | None:
    """Where in ``prediction`` the copy resumes once the output ends with
    ``written``, having left the prediction at ``near``: just after the
    longest end of ``written`` found in it, the occurrence nearest ``near``
    (at or after it first: text the output skipped or replaced lies ahead).
    None if no end of ``min_chars`` or more is found.

    >>> p = "alpha = 1\\nbeta = 2\\ngamma = 3\\n"
    >>> p[realign(p, "alpha = 1\\nBETA = 2\\ngamma", near=10):]        # replaced
    ' = 3\\n'
    >>> p[realign(p, "alpha = 1\\ngamma = 3", near=10):]               # deleted a line
    '\\n'
    >>> realign(p, "alpha = 1\\nnew line", near=10) is None            # still inserting
    True
    """
    for length in range(min(max_chars, len(written)), min_chars - 1, -1):
        end = written[-length:]
        ahead = prediction.find(end, max(0, near - length))
        if ahead != -1:
            return ahead + length
        behind = prediction.rfind(end, 0, max(0, near - length) + length - 1)
        if behind != -1:
            return behind + length
    return None


class PredictionDrafter:
    """``prediction`` as the first draft source, ``fallback`` (any drafter,
    or None) where it has nothing to offer.

    ``kept_chars``: characters of the prediction the output copied (what
    OpenAI calls accepted prediction, in characters).
    """

    name = "prediction"

    def __init__(self, prediction: str, fallback: Drafter | None = None) -> None:
        self.prediction = prediction
        self.fallback = fallback
        self.start("")

    @property
    def last_match(self) -> int:
        # The policy's measure of a draft's strength: a copy of the
        # prediction is its own kind (it is what the caller says the output
        # will be), re-aligned by a match of the output's last characters
        # too; the copy resumed after a skipped word is a guess until the
        # target follows it.  Otherwise the fallback's own.
        if self.from_prediction:
            return PREDICTION_MATCH if self.pos is not None and not self._guessed else -1
        return getattr(self.fallback, "last_match", 0)

    def start(self, prompt: str) -> None:
        self.written = ""
        self.pos: int | None = 0
        self.left_at = 0  # where the output last left the prediction
        self.kept_chars = 0
        self.from_prediction = False
        self._guessed = False  # the copy resumed after a skipped word, not yet followed
        self._looked_at = -1  # len(written) when a re-alignment last failed
        self._skipped = True  # whether the word the output left the prediction in may no longer be skipped
        self._followed = 0  # characters the output followed since the copy last resumed
        self.realigned = False  # the copy just resumed where the output's last characters were found
        if self.fallback is not None:
            self.fallback.start(prompt)

    def propose(self, max_chars: int) -> str:
        pos = self._position()
        if pos is not None and pos < len(self.prediction) and max_chars > 0:
            self.from_prediction = True
            return self.prediction[pos : pos + max_chars]
        self.from_prediction = False
        return self.fallback.propose(max_chars) if self.fallback is not None else ""

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        if self.fallback is not None:
            self.fallback.update(accepted, draft, accepted_draft_chars)
        self.written += accepted
        if self.pos is None:
            return
        k = follow_copy(self.prediction, self.pos, accepted)
        self.realigned = self.realigned and not accepted
        self.kept_chars += k
        self.pos += k
        self._followed += k
        if k < len(accepted):
            # A departure after a real copy: its word may be skipped once (not
            # after a failed guess, nor from an unrelated prediction's start).
            self._skipped = self._followed < MIN_REALIGN
            self._followed = 0
            self.left_at, self.pos, self._guessed = self.pos, None, False
        elif k:
            self._guessed = False

    def outcome(self, draft: str, accepted_chars: int) -> None:
        if self.fallback is not None and not self.from_prediction:
            self.fallback.outcome(draft, accepted_chars)

    def finish(self) -> None:
        if self.fallback is not None:
            self.fallback.finish()

    def _position(self) -> int | None:
        if self.pos is None and len(self.written) != self._looked_at:
            found = realign(self.prediction, self.written, self.left_at)
            if found is None and not self._skipped and self.written[-1:].isalnum():
                # Left inside a word, and written another one: most edits
                # rename or replace a word, and the text goes on as before
                # after it.  Tried once per departure.
                word = _WORD.match(self.prediction, self.left_at)
                # Left just after a whole word ("parseQuery|(url)" written as
                # "parseQueryString"): the rename grew it, and the copy
                # resumes where it was left.
                found = word.end() if word else self.left_at
                self._skipped = self._guessed = True
            if found is None:
                self._looked_at = len(self.written)
            else:
                self.pos, self._followed = found, MIN_REALIGN if not self._skipped else 0
                self.realigned = not self._guessed
        return self.pos
