"""How ``bspec run`` shows a generation as it streams.

Text the target confirmed through an accepted draft is coloured (green),
text it wrote on its own is left as is, so a user sees where the speed came
from.  A status line on stderr shows the progress of a long generation
when stdout goes elsewhere (a file, a pipe, or ``--json``).  Colour follows
the usual conventions: on for a terminal, off for a file or pipe, off when
``NO_COLOR`` is set, ``--color always|never`` to choose.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

DRAFTED = "\x1b[32m"  # green
RESET = "\x1b[0m"
LEGEND = f"{DRAFTED}green{RESET}: text confirmed from accepted drafts"


def use_color(choice: str, stream: TextIO) -> bool:
    """``--color auto|always|never`` for ``stream`` (auto: a terminal, and no ``NO_COLOR``)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    return not os.environ.get("NO_COLOR") and isatty(stream)


def isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Renderer:
    """Writes pieces to ``out`` (unless ``show_text`` is off) and, with
    ``progress``, a status line on ``err`` at most every ``every_s`` seconds."""

    def __init__(self, *, color: bool, progress: bool, show_text: bool = True, out: TextIO | None = None, err: TextIO | None = None, every_s: float = 0.25) -> None:
        self.color = color
        self.progress = progress
        self.show_text = show_text
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.every_s = every_s
        self.chars = 0
        self.drafted_chars = 0
        self.started = time.perf_counter()
        self._shown_at = 0.0
        self._status_width = 0

    def piece(self, piece: str) -> None:
        drafted = bool(getattr(piece, "drafted", False))
        self.chars += len(piece)
        self.drafted_chars += len(piece) if drafted else 0
        if self.show_text:
            self.out.write(f"{DRAFTED}{piece}{RESET}" if drafted and self.color else piece)
            self.out.flush()
        now = time.perf_counter()
        if self.progress and now - self._shown_at >= self.every_s:
            self._shown_at = now
            self._status(self.status_line(now - self.started))

    def status_line(self, elapsed_s: float) -> str:
        rate = self.chars / elapsed_s if elapsed_s > 0 else 0.0
        share = self.drafted_chars / self.chars if self.chars else 0.0
        return f"[bspec] {self.chars} chars in {elapsed_s:.1f}s ({rate:.0f} chars/s), {share:.0%} through drafts"

    def _status(self, line: str) -> None:
        # One line, rewritten in place; padded over what the last one left.
        self.err.write("\r" + line.ljust(self._status_width))
        self.err.flush()
        self._status_width = len(line)

    def finish(self) -> None:
        """Clear the status line (the summary line takes its place)."""
        if self.progress and self._status_width:
            self.err.write("\r" + " " * self._status_width + "\r")
            self.err.flush()
            self._status_width = 0
