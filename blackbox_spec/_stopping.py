"""Stop sequences, as the OpenAI API (and vLLM) apply them.

After each token the server looks for each stop string, in the order given,
in the part of the generated text that the new characters could have
completed; the first hit truncates the text at the start of the stop string,
which is not returned.  Stop strings are looked for in the generated text
only, never in the prompt.

We accept text in bigger pieces than one token, so :class:`StopScanner`
replays that rule piece by piece, where each piece is one target token (or
one run of tokens that together make whole characters).  This matters when a
stop string lies inside accepted draft text: plain decoding would have
stopped there, so we must too.
"""

from __future__ import annotations


def find_stop(text: str, new_chars: int, stop: list[str]) -> int | None:
    """Index where ``text`` must be cut, given that its last ``new_chars``
    characters just arrived; None when no stop string completed."""
    for s in stop:
        if s:
            index = text.find(s, max(0, len(text) - new_chars - len(s) + 1))
            if index != -1:
                return index
    return None


class StopScanner:
    """Tracks generated text and finds where a stop string ends it.

    It also says how much text is safe to show a reader: a tail that could
    still grow into a stop string is held back until it can't.
    """

    def __init__(self, stop: list[str] | None) -> None:
        self.stop = [s for s in (stop or []) if s]
        self.text = ""
        self.stopped = False
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def feed(self, piece: str) -> bool:
        """Append one token's text; True if a stop string ended the text."""
        if self.stopped:
            return True
        self.text += piece
        cut = find_stop(self.text, len(piece), self.stop)
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
        return self.stopped

    def safe_length(self, final: bool = False) -> int:
        """How many characters may be shown now without ever retracting."""
        if final or self.stopped or not self.stop:
            return len(self.text)
        end = len(self.text)
        for k in range(min(self._hold, end), 0, -1):
            tail = self.text[end - k :]
            if any(s.startswith(tail) for s in self.stop):
                return end - k
        return end
