"""Where the target's tokens lie in the text: the token-boundary rule.

The server re-tokenizes every string we send.  A context that ends inside one
of the target's tokens ("…wor" where the target wrote " world") puts the model
in a state it never reaches by itself, and it then predicts something else.
So the rule of this library is:

    **Accepted text always ends on a safe cut**: the end of a token that the
    target itself produced (or confirmed, in echo mode), as reported by the
    token strings in the server's logprobs, and never inside a character.

We learn token boundaries only from logprobs token strings.  Those strings
cannot always be placed in the text: a token that is not valid UTF-8 on its
own (a piece of a CJK character or an emoji) is shown as ``"\\ufffd"`` (vLLM),
``""`` or ``"bytes:\\xe4"``, and ``text_offset`` is then wrong.  So we do not
trust ``text_offset``: :func:`align_tokens` walks the tokens over the text we
know, and groups each run of such *opaque* tokens into one unit whose span is
found from the next readable token.  Cuts inside a run are never safe, which
is exactly "never split a Unicode character".

Special tokens that are not in the text (``<|im_end|>``, ``<s>``) are
zero-width.  A trailing one after the text is how vLLM's echo shows the
end-of-text token; callers treat it as "the target ended here".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._exceptions import TargetResponseError

OPAQUE = "\ufffd"
_SPECIAL = re.compile(r"^<[|｜]?[\w\-▁./: ]{1,40}[|｜]?>$|^\[[A-Z_]{2,20}\]$")


class AlignmentError(TargetResponseError):
    """The server's token strings do not fit the text they claim to cover."""


@dataclass(frozen=True)
class Unit:
    """The smallest piece of text we may accept or reject as a whole.

    A readable token is one unit (``tokens == 1``).  A run of opaque tokens is
    one unit covering whole characters (``tokens`` == the run's length).
    ``matches`` is True when the target's own top choice at every position of
    the unit was the unit's token (echo mode); None when unknown.
    ``correction`` is the target's top token text at the first position
    where it disagreed, when that is readable.
    """

    text: str
    tokens: int
    start: int
    special: bool = False
    matches: bool | None = None
    correction: str | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def is_opaque(token: str) -> bool:
    return token == "" or OPAQUE in token or token.startswith("bytes:")


def looks_special(token: str) -> bool:
    return bool(_SPECIAL.match(token))


def top_choice(top: dict[str, float] | None) -> tuple[str, float] | None:
    """The highest-logprob entry of one position's ``top_logprobs``."""
    if not top:
        return None
    token = max(top, key=top.__getitem__)
    return token, top[token]


def position_matches(token: str, logprob: float | None, top: dict[str, float] | None) -> bool:
    """Is ``token`` the target's own greedy choice at this position?

    Both the string and the logprob must agree with the top entry.  The
    string alone is not enough for opaque tokens (every piece of every emoji
    reads "\\ufffd", and colliding keys overwrite each other in the dict), so
    opaque positions never match here: see the module docstring.
    """
    best = top_choice(top)
    if best is None or logprob is None or is_opaque(token):
        return False
    return best[0] == token and logprob >= best[1]


def align_tokens(
    text: str,
    tokens: list[str],
    logprobs: list[float | None] | None = None,
    tops: list[dict[str, float] | None] | None = None,
    *,
    partial: bool = False,
) -> list[Unit]:
    """Place token strings over ``text`` and group them into :class:`Unit` s.

    ``partial``: the text and tokens are what a stream delivered so far;
    return the units that are certainly complete and stop at the first one
    that is not (a trailing run of opaque tokens, or text held back).

    >>> [u.text for u in align_tokens("a好b", ["a", "\\ufffd", "\\ufffd", "b"])]
    ['a', '好', 'b']
    >>> [u.tokens for u in align_tokens("a好b", ["a", "\\ufffd", "\\ufffd", "b"])]
    [1, 2, 1]
    """
    n = len(tokens)
    logprobs = logprobs if logprobs is not None else [None] * n
    tops = tops if tops is not None else [None] * n
    units: list[Unit] = []
    pos = i = 0
    while i < n:
        token = tokens[i]
        if partial and token and not is_opaque(token) and pos + len(token) > len(text) and token.startswith(text[pos:]):
            break  # the stream's text has not caught up with this token yet
        if token and not is_opaque(token) and text.startswith(token, pos):
            match = position_matches(token, logprobs[i], tops[i])
            correction = None if match else _readable_top(tops[i])
            units.append(Unit(token, 1, pos, matches=match, correction=correction))
            pos += len(token)
            i += 1
            continue
        if token and not is_opaque(token):
            if looks_special(token):
                units.append(Unit("", 1, pos, special=True, matches=position_matches(token, logprobs[i], tops[i])))
                i += 1
                continue
            raise AlignmentError(f"token {token!r} does not match the text at offset {pos}")
        # A run of opaque tokens: find where the next readable token starts.
        j = i
        while j < n and is_opaque(tokens[j]):
            j += 1
        if partial and (j == n or looks_special(tokens[j])):
            break  # the character may not be complete yet
        if j == n or looks_special(tokens[j]) and text.find(tokens[j], pos) == -1:
            end = len(text)
        else:
            end = text.find(tokens[j], pos + 1)
            if end == -1 and partial:
                break
            if end == -1:
                raise AlignmentError(f"cannot place token {tokens[j]!r} after offset {pos}")
        if end <= pos and j == n:
            # Trailing pieces of a character the server did not render at
            # all (llama.cpp drops an incomplete character; vLLM shows
            # "\ufffd"): no text to place, and nothing anyone may accept.
            break
        if end <= pos:
            raise AlignmentError(f"opaque tokens at offset {pos} cover no text")
        # Opaque positions cannot be checked (see position_matches), and the
        # target's choice there is unreadable: no correction either.
        units.append(Unit(text[pos:end], j - i, pos, matches=False))
        pos, i = end, j
    if pos != len(text) and not partial:
        raise AlignmentError(f"tokens cover {pos} of {len(text)} characters")
    return units


def _readable_top(top: dict[str, float] | None) -> str | None:
    best = top_choice(top)
    return best[0] if best is not None and not is_opaque(best[0]) else None


def count_tokens(units: list[Unit]) -> int:
    return sum(u.tokens for u in units)
