"""Stop sequences, replayed token by token as the server applies them.

A server looks for stop strings after each token, in the text it has
rendered so far, and only where that token's new characters could have
completed one; the chosen stop truncates the text at its start, and is not
returned.  Stop strings are looked for in the generated text only, never
in the prompt.  Servers differ in which stop wins when several complete in
one token's new text, so the rule is learned per server (``probe``):

* ``"first-listed"``: the first stop string in the request's list that is
  found (vLLM before 0.11);
* ``"earliest-end"``: the one that completes first, ties by list order
  (vLLM 0.32's ``check_stop_strings``);
* ``"earliest-start"``: the one that starts first (llama.cpp's server,
  which also counts its search window in bytes: the stop's length plus the
  last token's own bytes, so a stop inside text it held back can go unseen).

With a single stop string the three agree, but for llama.cpp's window; so
that one is used where the server is llama.cpp, ``"earliest-end"`` elsewhere.

Both servers render text a token at a time and hold back a token that ends
inside a character (vLLM's incremental detokenizer shows nothing until the
decoded text no longer ends in U+FFFD; llama.cpp skips the check while the
text is incomplete): the held text shows, and is searched, with the token
that completes it.  So :class:`StopScanner` is fed what each token made
visible (``Unit.steps``); text whose split into tokens is unknown is fed as
one step, and :meth:`StopScanner.split_matters` says when that could change
the outcome.
"""

from __future__ import annotations

RULES = ("first-listed", "earliest-end", "earliest-start")
DEFAULT_RULE = "earliest-start"  # where the probe could not tell (see probe.probe_stop_rule)


def single_stop_rule(server_kind: str | None) -> str:
    """The rule for one stop string, where only llama.cpp's window differs."""
    return "earliest-start" if server_kind == "llama.cpp" else "earliest-end"


def find_stop(text: str, new_chars: int, stop: list[str], rule: str = "first-listed") -> int | None:
    """Index where ``text`` must be cut, given that its last ``new_chars``
    characters just arrived; None when no stop string completed.

    >>> find_stop("xabc", 3, ["c", "abc", "b"]), find_stop("xabc", 3, ["c", "abc", "b"], "earliest-end")
    (3, 2)
    >>> find_stop("xabc", 3, ["c", "abc", "b"], "earliest-start")
    1
    """
    if new_chars <= 0:
        return None
    best: tuple[int, int] | None = None  # (key, index)
    for s in stop:
        if not s:
            continue
        index = text.find(s, max(0, len(text) - new_chars - len(s) + 1))
        if index == -1:
            continue
        if rule == "first-listed":
            return index
        key = index + len(s) if rule == "earliest-end" else index
        if best is None or key < best[0]:
            best = (key, index)
    return None if best is None else best[1]


class StopScanner:
    """Tracks generated text and finds where a stop string ends it.

    It also says how much text is safe to show a reader: a tail that could
    still grow into a stop string is held back until it can't.
    """

    def __init__(self, stop: list[str] | None, rule: str = "earliest-end") -> None:
        self.stop = [s for s in (stop or []) if s]
        self.rule = rule
        self.text = ""
        self.stopped = False
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        # llama.cpp searches only text it has not sent yet; it holds back
        # (does not send) a tail that could start a stop string.
        self._unsent_from = 0

    def feed(self, piece: str, token_bytes: int | None = None) -> bool:
        """Append what one token made visible ("" when it was held back);
        True if a stop string ended the text.  ``token_bytes``: the token's
        own length in bytes, when known (llama.cpp's search window uses it)."""
        if self.stopped or not piece:
            return self.stopped
        self.text += piece
        if self.rule == "earliest-start":
            cut = self._llama_cut(token_bytes if token_bytes is not None else len(piece.encode("utf-8", "surrogatepass")))
        else:
            cut = find_stop(self.text, len(piece), self.stop, self.rule)
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
        return self.stopped

    def _llama_cut(self, token_bytes: int) -> int | None:
        """llama.cpp's ``find_stopping_strings``: in the unsent text, each stop
        from (length - stop bytes - last token bytes); the earliest wins."""
        unsent = self.text[self._unsent_from :].encode("utf-8", "surrogatepass")
        best = None
        for s in self.stop:
            word = s.encode("utf-8", "surrogatepass")
            pos = unsent.find(word, max(0, len(unsent) - len(word) - token_bytes))
            if pos != -1 and (best is None or pos < best):
                best = pos
        if best is not None:
            return self._unsent_from + len(unsent[:best].decode("utf-8", "surrogatepass"))
        if not any(_partial_stop(unsent, s.encode("utf-8", "surrogatepass")) for s in self.stop):
            self._unsent_from = len(self.text)
        return None

    def straddles(self, text: str) -> bool:
        """Does a stop string begin in the text so far and end in ``text``?"""
        if not self.stop or self.stopped or not self._hold:
            return False
        tail = self.text[-self._hold :]
        joined = tail + text
        return any(0 <= joined.find(s) < len(tail) for s in self.stop)

    def split_matters(self, text: str) -> bool:
        """Could feeding ``text`` (several tokens whose split is unknown) as
        one step end somewhere else than feeding it token by token?  Only if
        a stop string can complete inside it."""
        if not self.stop or self.stopped:
            return False
        window = self.text[-self._hold :] + text if self._hold else text
        return any(s in window for s in self.stop)

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


def _partial_stop(text: bytes, word: bytes) -> bool:
    """Does ``text`` end with a prefix of ``word`` (llama.cpp's partial stop)?"""
    return any(text.endswith(word[:k]) for k in range(min(len(text), len(word)), 0, -1))


def rule_test(steps: list[str]) -> tuple[list[str], int, dict[str, str]] | None:
    """Stop strings that tell the three rules apart on a known plain answer.

    ``steps``: what each token of the answer showed.  Returns the stop list,
    how many tokens to ask for, and the text each rule would return; None
    when no token shows enough (two characters, after text that starts no
    candidate).  The list is [A, W, M]: W starts first (the earliest start
    wins), M ends first (the earliest end wins), A is listed first.

    >>> stops, n, texts = rule_test(["He", "llo", " world"])
    >>> stops, n, texts
    (['o', 'Hello', 'l'], 2, {'first-listed': 'Hell', 'earliest-end': 'He', 'earliest-start': ''})
    """
    before = ""
    for k, step in enumerate(steps):
        if len(step) >= 2:
            parts = sorted({step[i:j] for i in range(len(step)) for j in range(i + 1, min(len(step), i + 4) + 1)}, key=lambda s: (len(s), s))
            for whole in (before + step, before[-2:] + step, before[-1:] + step, step):
                for last in parts:
                    for middle in parts:
                        stops = [last, whole, middle]
                        if len(set(stops)) < 3:
                            continue
                        texts = {rule: _replay(steps[: k + 1], stops, rule) for rule in RULES}
                        if None not in texts.values() and len(set(texts.values())) == 3:
                            return stops, k + 1, texts  # type: ignore[return-value]
        before += step
    return None


def _replay(steps: list[str], stops: list[str], rule: str) -> str | None:
    """The text a server with ``rule`` returns; None if it stops before the last step."""
    scanner = StopScanner(stops, rule)
    for k, step in enumerate(steps):
        if scanner.feed(step) and k < len(steps) - 1:
            return None
    return scanner.text
