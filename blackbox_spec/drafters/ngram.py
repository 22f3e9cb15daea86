"""Prompt lookup: draft by copying what followed an earlier occurrence of
the text's current ending.  No model, and exact string matching, so it works
for any target tokenizer.  Edits, rewrites and agents that repeat themselves
copy long stretches of their context; this finds them.
"""

from __future__ import annotations


def lookup_continuation(text: str, *, min_match: int = 3, max_match: int = 64, max_chars: int = 256) -> str:
    """What followed the most recent earlier occurrence of the longest
    suffix of ``text`` (between ``min_match`` and ``max_match`` characters).

    >>> lookup_continuation("def f(x):\\n    return x\\n\\ndef g(x):\\n    re", max_chars=9)
    'turn x\\n\\nd'
    >>> lookup_continuation("abc", min_match=3)
    ''

    Longer matches are tried first because they predict better; among
    occurrences of the same suffix the most recent wins, as in vLLM's
    n-gram proposer.
    """
    n = len(text)
    if n <= min_match or max_chars <= 0:
        return ""
    length = min(max_match, n - 1)
    found = -1
    best = 0
    # Halve the suffix length until one occurs earlier, then grow back
    # (binary search on the match length: a longer match implies a shorter one).
    lo, hi = min_match, length
    while lo <= hi:
        mid = (lo + hi) // 2
        at = text.rfind(text[n - mid :], 0, n - 1)
        if at != -1:
            found, best, lo = at, mid, mid + 1
        else:
            hi = mid - 1
    if found == -1:
        return ""
    start = found + best
    return text[start : start + max_chars]


class NGramDrafter:
    """Prompt lookup over the prompt plus everything generated so far."""

    name = "ngram"

    def __init__(self, *, min_match: int = 3, max_match: int = 64) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        self.min_match = min_match
        self.max_match = max_match
        self.text = ""

    def start(self, prompt: str) -> None:
        self.text = prompt

    def propose(self, max_chars: int) -> str:
        return lookup_continuation(self.text, min_match=self.min_match, max_match=self.max_match, max_chars=max_chars)

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        self.text += accepted
