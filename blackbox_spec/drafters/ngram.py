"""Prompt lookup: draft by copying what followed an earlier occurrence of
the text's current ending.  No model, and exact string matching, so it works
for any target tokenizer.  Edits, rewrites and agents that repeat themselves
copy long stretches of their context; this finds them.

Edits add one twist: right after the target changes something ("parseQuery"
became "parseQueryString"), the text's ending occurs nowhere earlier, so a
plain lookup has nothing to say exactly where the rest of the copy is
obvious.  The drafter therefore remembers *where in the source* it was
copying (``pos``) and, after a change, re-aligns there (:func:`resync`).
"""

from __future__ import annotations

import re

SPECIAL_START = "<|"  # chat-template control tokens (<|im_end|>): never drafted
FAR_MATCH_CHARS = 12  # a match in the prompt this long beats re-aligning the local copy
_WORD = re.compile(r"\w+(?:\.\w+)*")  # a source word a replacement may write over (``1.4.2``, ``print``; not a full stop after it)


def match_length_and_start(text: str, *, min_match: int, max_match: int) -> tuple[int, int]:
    """(length, start of what followed) of the longest suffix of ``text``
    that occurs earlier, most recent occurrence first; (0, -1) if none.

    >>> match_length_and_start("xab1 ab", min_match=2, max_match=8)
    (2, 3)
    """
    n = len(text)
    if n <= min_match:
        return 0, -1
    found, best = -1, 0
    # Binary search on the match length: a longer match implies a shorter one.
    lo, hi = min_match, min(max_match, n - 1)
    while lo <= hi:
        mid = (lo + hi) // 2
        at = text.rfind(text[n - mid :], 0, n - 1)
        if at != -1:
            found, best, lo = at, mid, mid + 1
        else:
            hi = mid - 1
    return (best, found + best) if found != -1 else (0, -1)


def not_before_control(text: str, length: int, start: int) -> int:
    """``start`` (what followed the latest occurrence of the ``length``-long
    suffix of ``text``), or, where a control token follows it there (a
    draft would be empty), what followed the latest earlier occurrence that
    is not.  An answer opening with a code fence matched the prompt's
    closing one ("```<|im_end|>") and drafted nothing where the opening
    fence (```` ```go\\npackage ... ````) held the whole copy.

    >>> text = "x\\n```go\\nf()\\n```<|im_end|>\\n```"
    >>> length, start = match_length_and_start(text, min_match=2, max_match=8)
    >>> text[start:start + 3], text[not_before_control(text, length, start):][:6]
    ('<|i', 'go\\nf()')
    """
    if not text.startswith(SPECIAL_START, start):
        return start
    suffix = text[len(text) - length :]
    at = text.rfind(suffix, 0, start - 1)
    while at != -1:
        if not text.startswith(SPECIAL_START, at + length):
            return at + length
        at = text.rfind(suffix, 0, at + length - 1)
    return start


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
    if max_chars <= 0:
        return ""
    length, start = match_length_and_start(text, min_match=min_match, max_match=max_match)
    return text[start : start + max_chars] if length else ""


def copy_from(text: str, start: int, max_chars: int, *, match: int = 0) -> str:
    """Up to ``max_chars`` copied from ``text[start:]``, overlapping as LZ77
    copies do: where the copy reaches the current end, it goes on copying
    what it has just written, so a repeating pattern drafts past one period.
    It overlaps only where the text has shown the period itself (a ``match``
    at least one period long ends the text): one space after another is no
    promise of a hundred more.

    >>> copy_from("ab-x-x-", 5, 9, match=4)   # "x-" repeats: period 7 - 5
    'x-x-x-x-x'
    >>> copy_from("ab-x-x-", 5, 9, match=1)   # too short to show the period
    'x-'
    >>> copy_from("abcabc", 1, 4)
    'bcab'
    """
    period = len(text) - start
    if period <= 0 or max_chars <= 0:
        return ""
    if max_chars <= period or match < period:
        return text[start : start + max_chars]
    cycle = text[start:]
    return (cycle * (max_chars // period + 1))[:max_chars]


def resync(text: str, pos: int, *, window: int = 48, max_suffix: int = 24) -> int:
    return resync_match(text, pos, window=window, max_suffix=max_suffix)[0]


def resync_match(text: str, pos: int, *, window: int = 48, max_suffix: int = 24) -> tuple[int, int]:
    """Where to resume copying ``text[pos:]`` after the target wrote something
    new at the end of ``text``.

    The longest suffix of ``text`` (at least 2 characters) found in the
    source just around ``pos`` says the change replaced or skipped source
    text: resume after it.  Otherwise, where a word was written over a word
    of the source, assume it replaced that word (``var`` became ``const``,
    ``replicas: 2`` became ``replicas: 3``, ``print`` became
    ``logging.info``): resume after the source's word; else assume an
    insertion: resume at ``pos``.  (On the real 1.5B edits, resuming at
    ``pos`` after such replacements missed 2-3 times in a row, every time;
    a renamed identifier that grew a prefix, ``Total`` to ``OrderTotal``,
    is the case this guesses wrong, once.)  Of several occurrences the one
    ending nearest ``pos`` wins: a short suffix (``":\\n"``, ``'"\\n'``) recurs every line or two, and the one
    furthest on skipped whole lines of the copy (on real 1.5B type-hint and
    import edits, drafts resumed a line or two late and missed at once).
    Suffixes and occurrences cut inside a word do not count
    (:func:`starts_word_part`).

    >>> src = "Tomas will freeze the branch. "
    >>> text = src + "Tomasz"                      # target inserted "z"
    >>> src[resync(text, len("Tomas")):][:12]
    ' will freeze'
    >>> text = src + "Tomas wil"                    # no change: keep going
    >>> src[resync(text, len("Tomas wil")):][:7]
    'l freez'
    >>> text = "planed for the end. planned"       # replaced " planed"
    >>> text[resync(text, 0):][:8]
    ' for the'
    >>> src = "var a = 1;\\nvar b = 2;\\n"
    >>> text = src + "const"                        # replaced "var"
    >>> src[resync(text, 0):][:6]
    ' a = 1'
    >>> src = "def f(path):\\n    with open(path) as f:\\n        return f\\n"
    >>> text = src + "def f(path: str) -> str:\\n"  # hints added: ":\\n" recurs
    >>> src[resync(text, len("def f(path")):][:9]
    '    with '
    """
    lo = max(0, pos - window)
    for length in range(min(max_suffix, len(text) - 1), 1, -1):
        if not starts_word_part(text, len(text) - length):
            continue  # "fo" of "info" is no evidence of "for"
        # Occurrences must end before the text does (not be the suffix itself).
        suffix, hi = text[-length:], min(pos + window + length, len(text) - 1)
        best, at = -1, text.find(suffix, lo, hi)
        while at != -1:
            if starts_word_part(text, at) and (best == -1 or abs(at + length - pos) < abs(best - pos)):
                best = at + length
            at = text.find(suffix, at + 1, hi)
        if best != -1:
            return best, length
    word = _WORD.match(text, pos)
    return (word.end() if word and text[-1:].isalnum() else pos), 0


def starts_word_part(text: str, i: int) -> bool:
    """Whether ``text[i:]`` does not begin inside a word: it begins with a
    non-word character, or a word part (after a non-letter, or a capital
    after a small letter: ``Total`` in ``OrderTotal``, ``total`` in
    ``order_total``).  A short suffix cut from inside a word matched the
    inside of another one (the ``"ng"`` of ``logging`` in ``stopping``, the
    ``"fo"`` of ``info`` in ``for``) and re-aligned lines away on the real
    1.5B edits.

    >>> [starts_word_part("logging.info", i) for i in (0, 2, 7, 8)]
    [True, False, True, True]
    >>> [starts_word_part("OrderTotal", i) for i in (1, 5)]
    [False, True]
    """
    if i <= 0 or not text[i].isalnum():
        return True
    before = text[i - 1]
    return not before.isalnum() or (before.islower() and text[i].isupper())


_FENCE = re.compile(r"^```", re.MULTILINE)
_USER_TURN = re.compile(r"user(?:<\|end_header_id\|>|:)?\n")  # ChatML, Gemma, Llama 3, ``conversation_text``


def answer_opening(prompt: str) -> int:
    """Where an answer that rewrites the prompt's text likely starts copying
    it, or -1: the first paragraph after the instruction in the last user
    turn (the pasted file or its opening fence), else the opening fence of
    the prompt's last fenced block.

    At the answer's start the text's ending (``"assistant\\n"``) says
    nothing: on the real 1.5B edits the n-gram matched the prompt's closing
    fence or a stray "t\\n" and drafted nothing useful, and the first round
    of 5 of 14 edits went by (the oracle copies the whole file in it).

    >>> p = "<|im_start|>user\\nRename.\\n\\n```go\\nfunc a() {}\\n```<|im_end|>\\n<|im_start|>assistant\\n"
    >>> p[answer_opening(p):][:8]
    '```go\\nfu'
    >>> p = "user:\\nFix the typos.\\n\\n# quickcache\\n\\n```py\\nc = Cahce()\\n```\\n\\nassistant:\\n"
    >>> p[answer_opening(p):][:12]
    '# quickcache'
    >>> p = "Rename.\\n```go\\nfunc a() {}\\n```\\n"
    >>> p[answer_opening(p):][:5]
    '```go'
    >>> answer_opening("user:\\nWrite a story about a fox.\\n\\nassistant:\\n")
    -1
    """
    turns = list(_USER_TURN.finditer(prompt))
    if turns:
        blank = prompt.find("\n\n", turns[-1].end())
        at = blank + 2
        # A paragraph of the user's own text follows, not the turn's end.
        if blank != -1 and prompt[at : at + 1].strip() and not prompt.startswith(("assistant", "<"), at):
            return at
    fences = [m.start() for m in _FENCE.finditer(prompt)]
    return fences[-2] if len(fences) >= 2 and len(fences) % 2 == 0 else -1


_ANSWER_HEADER = re.compile(r"\n*(?:assistant:|<start_of_turn>model)\n$")  # ``conversation_text``, Gemma


def turn_end(prompt: str) -> int:
    """Where the prompt's last turn ends and the answer's header begins, in
    a chat's text (``conversation_text``'s ``"assistant:"``, Gemma's
    ``<start_of_turn>model``); 0 for a raw prompt, which the answer
    continues as it stands.  (ChatML's and Llama 3's headers open with
    ``SPECIAL_START``, which no draft crosses.)

    >>> p = "user:\\nFix it.\\n\\nx = 1\\n\\nassistant:\\n"
    >>> p[:turn_end(p)][-5:], turn_end("def f(x):\\n    re")
    ('x = 1', 0)
    """
    header = _ANSWER_HEADER.search(prompt)
    return header.start() if header else 0


def follow_copy(source: str, pos: int, accepted: str) -> int:
    """How many characters of ``accepted`` agree with ``source`` from ``pos``.

    >>> follow_copy("abcdef", 2, "cdX")
    2
    """
    k, n = 0, min(len(accepted), len(source) - pos)
    while k < n and source[pos + k] == accepted[k]:
        k += 1
    return k


class NGramDrafter:
    """Prompt lookup over the prompt plus everything generated so far.

    ``last_match`` tells the policy how strong the last proposal was: the
    number of characters of the context that matched its source, or -1 for
    a re-aligned copy after an edit.
    """

    name = "ngram"

    def __init__(self, *, min_match: int = 3, max_match: int = 256, strong_match: int = 32) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        self.min_match = min_match
        self.max_match = max_match
        self.strong_match = strong_match
        self.text = ""
        self.pos: int | None = None  # where in ``text`` the current copy reads from
        self.pos_valid = False  # that copy was confirmed (long match, or long acceptance)
        self.last_match = 0
        self.prompt_chars = 0
        self.opening = -1
        self.turn_end = 0

    def start(self, prompt: str) -> None:
        self.text = prompt
        self.prompt_chars = len(prompt)
        self.opening = answer_opening(prompt)  # where an edit's answer likely starts copying
        self.turn_end = turn_end(prompt)
        self.pos = None
        self.pos_valid = False
        self.last_match = 0

    def propose(self, max_chars: int) -> str:
        length, start = match_length_and_start(self.text, min_match=self.min_match, max_match=self.max_match)
        self.last_match = length
        if self._copies_opening(length):
            # The answer so far is the pasted text's start (or nothing yet):
            # a guess, priced as a re-aligned copy, until a long match proves it.
            start = self.opening + len(self.text) - self.prompt_chars
            self.last_match = -1
        elif length < self.strong_match and self.pos is not None and self.pos_valid and (resumed := self._local_resume(length, start)) is not None:
            # A weak global match right after a change: the copy we were
            # following is the better guess.
            start = resumed
            self.last_match = -1
        elif not length:
            return ""
        else:
            start = not_before_control(self.text, length, start)
            self.pos_valid = length >= self.strong_match
        self.pos = start
        if start < self.turn_end:
            # A copy of the conversation ends where its last turn does: what
            # follows is the answer's own opening, which a rewrite does not
            # write twice.  Drafts that ran on into it were a quarter to a
            # half longer than the answer on the real 1.5B edits, and a side
            # branch priced by how far the text would go, far into such a
            # draft, was billed for nothing.
            max_chars = min(max_chars, self.turn_end - start)
        draft = copy_from(self.text, start, max_chars, match=max(0, self.last_match))
        special = draft.find(SPECIAL_START)
        return draft[:special] if special != -1 else draft

    def _local_resume(self, match: int, start: int) -> int | None:
        """Where the copy being followed resumes (:func:`resync_match`), or
        None where the global match (``match`` characters, followed by
        ``start``) says more: a section copied from elsewhere in the prompt
        (not the answer's own earlier lines, which an edit repeats)."""
        resumed, evidence = resync_match(self.text, self.pos or 0)
        far = match >= FAR_MATCH_CHARS and match >= 2 * evidence and start < self.prompt_chars
        return None if far else resumed

    def _copies_opening(self, match: int) -> bool:
        written = len(self.text) - self.prompt_chars
        if self.opening == -1 or match >= self.strong_match or written > self.strong_match:
            return False
        return self.text.startswith(self.text[self.prompt_chars :], self.opening)

    def outcome(self, draft: str, accepted_chars: int) -> None:
        pass  # the copy is followed in ``update``; the policy sizes what is checked

    def finish(self) -> None:
        pass

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        if self.pos is not None:
            # Follow the copy while the accepted text agrees with the source.
            k = follow_copy(self.text, self.pos, accepted)
            self.pos += k
            self.pos_valid = self.pos_valid or k >= 16
        self.text += accepted
