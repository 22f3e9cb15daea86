"""The continuation so far: text, token count, stop strings, what was shown.

:class:`Output` is what every decoding path appends to (speculative rounds,
the plain stream, the plain fallbacks of ``_plain``): it applies
``max_tokens`` per target token and stop strings in the server's own order
(``_stopping``), and hands out only text that can no longer be retracted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._stats import Piece
from ._stopping import StopScanner
from ._tokens import Unit


@dataclass
class Output:
    """The continuation so far, bounded by ``max_tokens`` and stop strings."""

    prompt: str
    max_tokens: int
    stop: list[str] | None
    stop_rule: str = "earliest-end"  # which stop wins when several complete at once (``_stopping``)
    tokens: int = 0
    # An upper bound on ``tokens``, above it while some count is only a lower
    # bound (``Unit.exact``: llama.cpp leaves pieces of characters unlisted);
    # ``settle`` makes them equal again.
    most_tokens: int = 0
    shown: int = 0
    finish_reason: str | None = None
    scanner: StopScanner = field(init=False)
    # Where the text came in through an accepted draft: [start, end) spans,
    # for display only (the CLI colours them); the text is the target's either way.
    drafted: list[tuple[int, int]] = field(default_factory=list)
    # The caller's expected text (Predicted Outputs), drafted from first.
    prediction: str | None = None
    # ``tokens`` as the server itself counted them (a plain stream from the
    # prompt that ran to its end, usage included); None: counted by us.
    server_counted: int | None = None
    # The endpoint and characters of the request plain decoding would send
    # (what its bill is estimated from: ``_bill.PromptSizes``).
    prompt_size: tuple[str, int] = ("completions", 0)
    # Where the target's tokens are known to end in ``text``, with the exact
    # count up to there: (characters, tokens), ascending.  A chat template
    # that trims a continued message's trailing whitespace is sent the text
    # only up to one of these (``ChatTurn.carried``).
    ends: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scanner = StopScanner(self.stop, self.stop_rule)

    def reset(self) -> None:
        """Back to no text (what was shown stays shown: the same text comes again)."""
        self.tokens = self.most_tokens = 0
        self.finish_reason = None
        self.server_counted = None
        self.ends = []
        self.scanner = StopScanner(self.stop, self.stop_rule)

    def use_stop_rule(self, rule: str) -> None:
        """The server's stop rule, once learned (before any text)."""
        assert not self.text, "the stop rule is set before generating"
        self.stop_rule = rule
        self.scanner = StopScanner(self.stop, rule)

    @property
    def text(self) -> str:
        return self.scanner.text

    @property
    def context(self) -> str:
        return self.prompt + self.scanner.text

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.tokens

    @property
    def exact(self) -> bool:
        """Is ``tokens`` the target's own count (not a lower bound)?"""
        return self.most_tokens == self.tokens

    def take(self, units: list[Unit], drafted: int = 0, *, bounded: bool = False) -> tuple[int, bool]:
        """Append units while the budget allows; returns (units taken, whether
        the next unit needs the server to render it: the budget ends inside
        it, or a stop string lies inside tokens whose split is unknown).  The
        first ``drafted`` units came in through an accepted draft.
        ``bounded``: they come from a call the server itself holds to the
        budget (one opened with ``remaining`` while the count was exact), so
        a lower-bound count cannot overrun it."""
        for k, unit in enumerate(units):
            if self.finish_reason:
                return k, False
            if (self.tokens + unit.tokens if bounded else self.most_tokens + unit.most_tokens) > self.max_tokens:
                return k, True
            if unit.steps is None and unit.tokens > 1 and self.scanner.split_matters(unit.text):
                return k, True
            self.tokens += unit.tokens
            self.most_tokens += unit.most_tokens
            if k < drafted:
                self._mark_drafted(len(self.text), len(self.text) + len(unit.text))
            if self._feed(unit):
                self.finish_reason = "stop"
            elif self.remaining <= 0:
                self.finish_reason = "length"
            self._mark_end()
        return len(units), False

    def count(self, tokens: int) -> None:
        """``tokens`` more, counted by the server (exact)."""
        self.tokens += tokens
        self.most_tokens += tokens
        self._mark_end()

    def recount(self, tokens: int) -> None:
        """The exact count of the text so far."""
        self.tokens = self.most_tokens = tokens
        self._mark_end()

    def _mark_end(self) -> None:
        """A token ends at the text's end (see ``ends``), if counted exactly."""
        if self.exact and (not self.ends or self.ends[-1] != (len(self.text), self.tokens)):
            self.ends.append((len(self.text), self.tokens))

    def _feed(self, unit: Unit) -> bool:
        """The unit's text to the stop scanner as the server showed it, token by token."""
        if unit.steps is None:
            return self.scanner.feed(unit.text, unit.last_bytes)
        sizes = unit.sizes or (None,) * len(unit.steps)
        return any(self.scanner.feed(step, size) for step, size in zip(unit.steps, sizes))

    def add_text(self, piece: str, *, trusted: bool = False, rendering: bool = False) -> None:
        """Append text whose token count the server keeps.  ``trusted``: the
        server applied the stop strings to it itself (a plain call with
        ``stop``); only a stop string that began in the text before it is
        still ours to find.  ``rendering``: the end of the call that wrote
        the text before it, where max_tokens cut a character: the held
        bytes rendered (U+FFFD), which no server searches for stop strings,
        so a plain call would not find one ending there either."""
        if self.finish_reason:
            return
        if rendering:
            self.scanner.text += piece
        elif trusted and not self.scanner.straddles(piece):
            self.scanner.text += piece
        elif self.scanner.feed(piece):
            self.finish_reason = "stop"

    def _mark_drafted(self, start: int, end: int) -> None:
        if self.drafted and self.drafted[-1][1] == start:
            start = self.drafted.pop()[0]
        self.drafted.append((start, end))

    def flush(self, final: bool = False) -> list[Piece]:
        """New text that is safe to show (never retracted later), cut where
        it changes between drafted and written by the target."""
        end = self.scanner.safe_length(final or self.finish_reason is not None)
        start, self.shown = self.shown, max(self.shown, end)
        return pieces_between(self.text, self.drafted, start, end)


def pieces_between(text: str, drafted: list[tuple[int, int]], start: int, end: int) -> list[Piece]:
    """``text[start:end]`` as pieces, each one drafted or not.

    >>> [(p, p.drafted) for p in pieces_between("abcdef", [(1, 3)], 0, 5)]
    [('a', False), ('bc', True), ('de', False)]
    """
    pieces: list[Piece] = []
    pos = start
    for a, b in drafted:
        if b <= pos or a >= end:
            continue
        if a > pos:
            pieces.append(Piece(text[pos:a]))
        pieces.append(Piece(text[max(a, pos) : min(b, end)], drafted=True))
        pos = min(b, end)
    if pos < end:
        pieces.append(Piece(text[pos:end]))
    return pieces

