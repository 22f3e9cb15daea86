"""Where the target's tokens lie in the text: the token-boundary rule.

The server re-tokenizes every string we send.  A context that ends inside one
of the target's tokens ("…wor" where the target wrote " world") puts the model
in a state it never reaches by itself, and it then predicts something else.
So the rule of this library is:

    **Accepted text always ends on a safe cut**: the end of a token that the
    target itself produced (or confirmed, in echo mode), as reported by the
    token strings in the server's logprobs, and never inside a character.

We learn token boundaries only from logprobs token strings, and those are
lossy where a byte-level tokenizer splits a character over several tokens.
Each server shows such a token its own way:

* older vLLM and HF ``decode([id])``: the token decoded alone, its broken
  bytes shown as ``"\\ufffd"`` (one per byte, or one per broken sequence),
  whole characters next to them kept (``"\\ufffd文本"``);
* current vLLM (``_correct_decoded_token``): ``""`` for a token that ends
  inside a character, and the completing token shows the text of the
  pieces before it too (``["", "中文"]``), or still starts with
  ``"\\ufffd"`` when those began inside a character;
* OpenAI: ``"bytes:\\\\xe4\\\\xb8"``; llama.cpp: ``"byte: \\\\xe4"`` (exact bytes);
* llama.cpp's server leaves out the tokens that left the text unfinished,
  and the next one shows the whole character (see ``_target``'s counts);
* vLLM with ``--return-tokens-as-token-ids``: ``"token_id:N"`` (no text at
  all; ``TargetAPI`` looks them up with ``/detokenize`` where it can).

So ``text_offset`` is never trusted and token strings are not simply
concatenated.  :func:`align_tokens` places the tokens over the text's UTF-8
*bytes*: a readable token matches its bytes exactly, a lossy one any byte
span that it could be the rendering of.  Where that leaves several
placements, only the cuts that **every** placement agrees on are used, so
an ambiguity costs a bigger unit (speed), never a wrong cut (exactness).
Cuts inside a character are never safe, which is "never split a character".

Special tokens that are not in the text (``<|im_end|>``, ``<s>``) are
zero-width.  A trailing one after the text is how vLLM's echo shows the
end-of-text token; callers treat it as "the target ended here".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ._exceptions import TargetResponseError

OPAQUE = "\ufffd"
_SPECIAL = re.compile(r"^<[|｜]?[\w\-▁./: ]{1,40}[|｜]?>$|^\[[A-Z_]{2,20}\]$")
_BYTE_FORM = re.compile(r"^(?:bytes:|byte: )((?:\\x[0-9a-fA-F]{2})+)$")
_TOKEN_ID = re.compile(r"^token_id:-?\d+$")
_OPAQUE_RUN = re.compile("\ufffd+")
# A token that ends inside a character holds at most this many bytes (a
# vocabulary's longest such pieces are a few characters and a lead byte:
# Qwen2.5's is 14 bytes, four katakana and a lead byte).  A longer one
# makes the strings not fit, which costs speculation, never exactness.
_MAX_HIDDEN_BYTES = 32
_PENDING = -1  # a token whose bytes run past the text a stream has shown so far


class AlignmentError(TargetResponseError):
    """The server's token strings do not fit the text they claim to cover."""


@dataclass(frozen=True)
class Unit:
    """The smallest piece of text we may accept or reject as a whole.

    A readable token is one unit (``tokens == 1``).  Tokens that split
    characters between them form one unit covering whole characters
    (``tokens`` == how many).  ``steps``: the text the server showed after
    each of its tokens ("" for one held back inside a character), and
    ``sizes``: each token's length in bytes, when certain (the stop rules
    replay the server token by token with them).
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
    sizes: tuple[int, ...] | None = None
    steps: tuple[str, ...] | None = None
    # False where ``tokens`` is only a lower bound: llama.cpp's server lists
    # only the tokens that leave the text whole (``mark_inexact``).
    exact: bool = True
    # Where the split is unknown, the last token's own bytes, if the server
    # says (what llama.cpp's stop window counts).
    last_bytes: int | None = None
    # How many listed token strings it spans, where that is not ``tokens``
    # (llama.cpp lists one per token that finishes a character).
    listed: int | None = None

    @property
    def most_tokens(self) -> int:
        """An upper bound on ``tokens`` (every token holds a byte at least)."""
        return self.tokens if self.exact else max(self.tokens, len(self.text.encode("utf-8", "surrogatepass")))

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def is_opaque(token: str) -> bool:
    """Does this token string hide some of its bytes (see the module docstring)?"""
    return token == "" or OPAQUE in token or token.startswith(("bytes:", "byte: ", "token_id:"))


def looks_special(token: str) -> bool:
    return bool(_SPECIAL.match(token))


def exact_bytes(token: str) -> bytes | None:
    """The bytes of a ``"bytes:\\\\xe4\\\\xb8"`` (OpenAI) or ``"byte: \\\\xe4"``
    (llama.cpp) token string; None for other strings.

    >>> exact_bytes("bytes:\\\\xe4\\\\xb8"), exact_bytes("byte: \\\\xad"), exact_bytes("ab")
    (b'\\xe4\\xb8', b'\\xad', None)
    """
    m = _BYTE_FORM.match(token)
    return bytes.fromhex(m.group(1).replace("\\x", "")) if m else None


def is_token_id(token: str) -> bool:
    return bool(_TOKEN_ID.match(token))


def top_choice(top: dict[str, float] | None) -> tuple[str, float] | None:
    """The highest-logprob entry of one position's ``top_logprobs``."""
    if not top:
        return None
    token = max(top, key=top.__getitem__)
    return token, top[token]


def position_matches(token: str, logprob: float | None, top: dict[str, float] | None) -> bool:
    """Is ``token`` the target's own greedy choice at this position?

    Both the string and the logprob must agree with the top entry, and no
    other entry may tie with it: which of two equal logits a server's argmax
    picks is its own business, so a tie confirms nothing.  The string alone
    is not enough for opaque tokens (every piece of every emoji reads
    "\\ufffd", and colliding keys overwrite each other in the dict), so
    opaque positions never match here: see the module docstring.
    """
    best = top_choice(top)
    if best is None or logprob is None or is_opaque(token):
        return False
    if best[0] != token or logprob < best[1]:
        return False
    return not any(other != token and value >= logprob for other, value in top.items())  # type: ignore[union-attr]


def _lossy(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _collapse(text: str) -> str:
    """Runs of U+FFFD as one: servers count broken bytes differently (one per
    byte, or one per broken sequence)."""
    return _OPAQUE_RUN.sub(OPAQUE, text)


class _Spans:
    """Which byte spans a token string can stand for, over one text.

    A span is the token's end ``e``; ``run`` holds the starts of the tokens
    just before it that ended inside a character (current vLLM puts their
    pieces on the token that completes it).  ``_PENDING``: the token runs
    past the text, which holds back an unfinished character (a stream so
    far, or an answer that max_tokens cut).
    """

    def __init__(self, data: bytes, partial: bool, cut_tail: bool, exact: bool, covered: bool = False) -> None:
        self.data = data
        self.size = len(data)
        self.partial = partial
        self.cut_tail = cut_tail
        self.covered = covered  # the tokens end exactly with the text (an echoed prompt)
        # Broken bytes read as one U+FFFD per broken sequence (Python, Rust's
        # from_utf8_lossy: HF tokenizers) when ``exact``; otherwise any run
        # of them as one (servers that count them another way).
        self.render = _lossy if exact else (lambda raw: _collapse(_lossy(raw)))

    def boundary(self, p: int) -> bool:
        return p <= 0 or p >= self.size or self.data[p] & 0xC0 != 0x80

    def ends(self, token: str, b: int, run: tuple[int, ...]) -> list[int]:
        """Possible ends of ``token`` placed at byte ``b``.

        Servers show text only up to the end of a token that ends on a
        character boundary (vLLM's incremental detokenizer, llama.cpp): so
        past the text lie only tokens that end inside a character, and only
        a cut answer's U+FFFD (the held text, rendered) ends inside one.
        """
        data, size = self.data, self.size
        raw = exact_bytes(token)
        if b == _PENDING or b == size:
            found = [_PENDING] if self.ends_inside(token) and not self.covered else []
            if b == size and token == "":
                found.append(b)  # a special token shown empty (the end of text)
            return found
        if raw is not None:
            return [b + len(raw)] if data.startswith(raw, b) else []
        if token == "":
            # Current vLLM: a token that ends inside a character.
            return [e for e in range(b + 1, min(size, b + _MAX_HIDDEN_BYTES) + 1) if not self.boundary(e)]
        if OPAQUE not in token:
            raw = token.encode("utf-8", "surrogatepass")
            found = []
            if data.startswith(raw, b):
                found.append(b + len(raw))
            for r in run:  # current vLLM: the text of the "" pieces before it, and its own
                e = r + len(raw)
                if e > b and e not in found and data.startswith(raw, r) and self.boundary(e):
                    found.append(e)
            if self.partial and b + len(raw) > size and raw.startswith(data[b:]):
                found.append(_PENDING)  # the stream's text has not caught up with it yet
            return found
        render = self.render
        pattern = render(token.encode("utf-8", "surrogatepass"))
        markers = pattern.count(OPAQUE)
        longest = len(pattern.replace(OPAQUE, "").encode("utf-8", "surrogatepass")) + 6 * markers
        found = []
        for r in (b, *run):
            for e in range(b + 1, min(size, r + longest) + 1):
                if e not in found and render(data[r:e]) == pattern:
                    found.append(e)
        if self.cut_tail and pattern.endswith(OPAQUE) and any(render(data[r:] + b"\xf0") == pattern for r in (b, *run)):
            found.append(_PENDING)  # the rest of the text and the character max_tokens cut
        return found

    def hidden_ends(self, b: int, run: tuple[int, ...], follower: str | None, between: int) -> list[tuple[int, tuple[int, ...]]]:
        """Ends, with the run each leaves, of a ``""`` token placed at byte
        ``b`` inside the text (current vLLM: a token that ends inside a
        character), knowing the token that completes the run: ``follower``,
        the next one that is not ``""`` (None: there is none), with
        ``between`` more ``""`` tokens before it.

        Only the placements the follower can finish are kept, which keeps
        runs of split characters linear (every ``""`` may otherwise end at
        any of the next 64 bytes, and their runs multiply):

        * none follows: ``""`` tokens never reach the text's end (a
          character boundary) from inside it, so none;
        * a readable follower starts with a whole character, so it can only
          begin at the run's first byte (the other pieces begin inside a
          character) and carries the pieces' text: the run ends before
          ``start + len(follower)``, with room for the pieces still to come,
          and only its first byte matters.
        """
        if follower is None:
            return []
        start = run[0] if run else b
        limit = min(self.size, b + _MAX_HIDDEN_BYTES)
        new_run = (*run, b)[-4:]
        if follower and not is_opaque(follower) and not looks_special(follower):
            raw = follower.encode("utf-8", "surrogatepass")
            if not self.data.startswith(raw, start):
                return []
            limit = min(limit, start + len(raw) - 1 - between)
            new_run = (start,)
        return [(e, new_run) for e in range(b + 1, limit + 1) if not self.boundary(e)]

    def ends_inside(self, token: str) -> bool:
        """Could this token end inside a character (so show no text yet)?"""
        if token == "" or is_token_id(token):
            return True
        raw = exact_bytes(token)
        if raw is not None:
            return _lossy(raw).endswith(OPAQUE)
        return OPAQUE in token and self.render(token.encode("utf-8", "surrogatepass")).endswith(OPAQUE)


def align_tokens(
    text: str,
    tokens: list[str],
    logprobs: list[float | None] | None = None,
    tops: list[dict[str, float] | None] | None = None,
    *,
    partial: bool = False,
    prompt: bool = False,
    ends: dict[int, tuple[int, bool]] | None = None,
    syncs: list[tuple[int, int, int]] | None = None,
) -> list[Unit]:
    """Place token strings over ``text`` and group them into :class:`Unit` s.

    ``partial``: the text and tokens are what a stream delivered so far (a
    token's bytes may run past the text, which holds back unfinished
    characters); return the units that are certainly complete.  Otherwise
    the tokens must cover the text; a trailing U+FFFD (a character that
    max_tokens cut, as the server rendered it) and the pieces that made it
    are left out of the units.  ``prompt``: the tokens are an echoed
    prompt's, which cover its text exactly (nothing was cut).  ``ends``:
    what a stream's chunks said of where tokens end (``LiveText``): after
    ``k`` tokens the text shown ended at byte ``b``, so the ``k``-th token
    ends there (``(b, True)``: the chunk held that one token) or one of the
    chunk's tokens does and the rest lie beyond (``(b, False)``).
    ``syncs``: filled with the points every placement passes through, for
    picking the alignment up again there (``_resume_align``).

    >>> [u.text for u in align_tokens("a好b", ["a", "\\ufffd", "\\ufffd", "b"])]
    ['a', '好', 'b']
    >>> [u.tokens for u in align_tokens("a好b", ["a", "\\ufffd", "\\ufffd", "b"])]
    [1, 2, 1]
    >>> [(u.text, u.tokens) for u in align_tokens("中文本。", ["\\ufffd", "\\ufffd文本", "。"])]
    [('中文本', 2), ('。', 1)]
    >>> [(u.text, u.tokens) for u in align_tokens("🙂 ab 🙂", ["", "🙂", " ", "a", "b", " ", "", "🙂"])]
    [('🙂', 2), (' ', 1), ('a', 1), ('b', 1), (' ', 1), ('🙂', 2)]
    """
    n = len(tokens)
    logprobs = logprobs if logprobs is not None else [None] * n
    tops = tops if tops is not None else [None] * n
    if any(is_token_id(t) for t in tokens):
        # Ids with no text: the token count is all we know.  The whole answer
        # is one unit (at a stream's end: the caller takes the rest whole).
        return [] if partial or not text else [Unit(text, n, 0, matches=False)]
    found: list[tuple[int, int, int]] = []
    try:
        units = _align(text, tokens, logprobs, tops, partial, prompt, exact=True, anchors=ends or {}, syncs=found)
    except AlignmentError:
        found.clear()
        units = _align(text, tokens, logprobs, tops, partial, prompt, exact=False, anchors=ends or {}, syncs=found)
    if syncs is not None:
        syncs += found
    return units


def _align(text: str, tokens: list[str], logprobs: list, tops: list, partial: bool, prompt: bool, exact: bool,
           anchors: dict[int, tuple[int, bool]], syncs: list[tuple[int, int, int]]) -> list[Unit]:
    n = len(tokens)
    if partial:
        # Special tokens at a stream's end so far may be its end of text:
        # left for the stream's end (its finish reason says).
        while n and looks_special(tokens[n - 1]) and not text.endswith(tokens[n - 1]):
            n -= 1
        tokens = tokens[:n]
    shown = text if partial else text.rstrip(OPAQUE)
    # A server that renders a character cut by max_tokens shows U+FFFD; one
    # that lists only tokens that leave the text whole (llama.cpp) has no
    # token for the text just before it either.
    cut_tail = len(shown) < len(text)
    spans = _Spans(shown.encode("utf-8", "surrogatepass"), partial, cut_tail, exact, covered=prompt)
    layers = _placements(tokens, spans, anchors, syncs)
    live = _live_placements(layers, spans)
    return _units_at_cuts(live, spans, shown, tokens, logprobs, tops)


_State = tuple[int, tuple[int, ...]]  # (byte, run): where the tokens so far end (see ``_Spans``)


def _placements(tokens: list[str], spans: _Spans, anchors: dict[int, tuple[int, bool]], syncs: list[tuple[int, int, int]]) -> list[dict[_State, set]]:
    """1. Every placement, token by token: states (byte, run) after i tokens,
    with the states they came from."""
    size = spans.size
    layers: list[dict[_State, set]] = [{(0, ()): set()}]
    followers = _followers(tokens)
    reach = reads = 0  # the furthest byte any placement reached, and how far a token reads past its start
    for i, token in enumerate(tokens):
        nxt = _next_states(i, tokens, followers, layers[-1], spans)
        if not nxt:
            raise AlignmentError(f"token {i} ({token!r}) does not fit the text after byte {_furthest(layers[-1])}")
        if i + 1 in anchors:
            nxt = _anchored(nxt, *anchors[i + 1])
            if not nxt:
                raise AlignmentError(f"token {i} ({token!r}) does not end where the stream showed a token end (byte {anchors[i + 1][0]})")
        layers.append(nxt)
        reach = max(reach, _furthest(nxt))
        reads = max(reads, len(token.encode("utf-8", "surrogatepass")) + 6 * token.count(OPAQUE) + (_MAX_HIDDEN_BYTES if token == "" else 0) + 4)
        if len(nxt) == 1 and token != "":
            (b, run), = nxt
            if not run and b != _PENDING and b < size and spans.boundary(b):
                # Every placement passes here, and how the tokens so far were
                # placed read no byte from ``reach + reads`` on: a text that
                # begins with the same bytes up to there aligns the same way.
                syncs.append((i + 1, b, reach + reads))
    return layers


def _next_states(i: int, tokens: list[str], followers: list[int | None], states: dict[_State, set], spans: _Spans) -> dict[_State, set]:
    """The states token ``i`` can end in from each of ``states``, each with
    the states it came from."""
    data, size, n, token = spans.data, spans.size, len(tokens), tokens[i]
    nxt: dict[_State, set] = {}
    special = looks_special(token)
    for state in states:
        b, run = state
        if special and not (b != _PENDING and data.startswith(token.encode("utf-8", "surrogatepass"), b)):
            nxt.setdefault(state, set()).add(state)  # zero-width
            continue
        if token == "" and b != _PENDING and b < size and followers[i] is not None:
            j = followers[i]
            for e, new_run in spans.hidden_ends(b, run, tokens[j] if j < n else None, j - i - 1):
                nxt.setdefault((e, new_run), set()).add(state)
            continue
        for e in spans.ends(token, b, run):
            # Current vLLM shows "" for a token that ends inside a
            # character and puts its text on the one that completes it:
            # remember where such tokens began (up to the 4 it looks back).
            hidden = token == "" and e not in (_PENDING, b) and not spans.boundary(e)
            new_run = ((*run, b) if hidden else ())[-4:] if e != b else run
            nxt.setdefault((e, new_run), set()).add(state)
    return nxt


def _live_placements(layers: list[dict[_State, set]], spans: _Spans) -> list[set]:
    """2. The placements that explain the whole text (or, streaming, all of
    what was shown), walked back to keep only the states on them."""
    size, n = spans.size, len(layers) - 1

    def complete(state: _State) -> bool:
        return state[0] in (size, _PENDING) or (spans.cut_tail and state[0] != _PENDING and spans.boundary(state[0]))

    live: list[set] = [set() for _ in layers]
    live[n] = {s for s in layers[n] if complete(s)}
    if not live[n]:
        raise AlignmentError(f"tokens cover {_furthest(layers[n])} of {size} bytes")
    for i in range(n, 0, -1):
        for state in live[i]:
            live[i - 1] |= layers[i][state]
    return live


def _units_at_cuts(live: list[set], spans: _Spans, shown: str, tokens: list[str], logprobs: list, tops: list) -> list[Unit]:
    """3. Cuts that every placement agrees on, at character boundaries: the
    tokens between two cuts are one unit."""
    positions = [{s[0] for s in live[i]} for i in range(len(tokens) + 1)]
    cuts = [i for i in range(len(tokens) + 1) if len(positions[i]) == 1 and _PENDING not in positions[i] and spans.boundary(next(iter(positions[i])))]
    chars = _char_index(shown)
    units: list[Unit] = []
    for i, j in zip(cuts, cuts[1:]):
        b0, b1 = next(iter(positions[i])), next(iter(positions[j]))
        start, piece = chars[b0], shown[chars[b0] : chars[b1]]
        if not piece:
            for k in range(i, j):  # zero-width: special tokens, one unit each
                units.append(Unit("", 1, start, special=True, matches=position_matches(tokens[k], logprobs[k], tops[k])))
            continue
        sizes, steps = _sizes_and_steps(positions, i, j, shown, chars, spans)
        if j == i + 1 and not is_opaque(tokens[i]) and tokens[i] == piece:
            match = position_matches(tokens[i], logprobs[i], tops[i])
            units.append(Unit(piece, 1, start, matches=match, correction=None if match else _readable_top(tops[i]), sizes=sizes, steps=steps))
        else:
            # Opaque positions cannot be checked (see position_matches), and
            # the target's choice there is unreadable: no correction either.
            units.append(Unit(piece, j - i, start, matches=False, sizes=sizes, steps=steps))
    return units


def _sizes_and_steps(positions: list[set], i: int, j: int, shown: str, chars: dict[int, int],
                     spans: _Spans) -> tuple[tuple[int, ...] | None, tuple[str, ...] | None]:
    """Of the unit of tokens ``i`` to ``j``: each token's size in bytes, and
    the text each shows (``""``: held back inside a character), where every
    placement agrees on them (else None)."""
    sizes = steps = None
    if all(len(positions[k]) == 1 for k in range(i, j + 1)):
        ends = [next(iter(positions[k])) for k in range(i, j + 1)]
        sizes = tuple(b - a for a, b in zip(ends, ends[1:]))
    shown_to, steps_list = next(iter(positions[i])), []
    for k in range(i + 1, j + 1):
        at = positions[k]
        if not any(b == _PENDING or spans.boundary(b) for b in at):
            steps_list.append("")  # ends inside a character in every placement: held back
        elif len(at) == 1:
            b = next(iter(at))
            steps_list.append(shown[chars[shown_to] : chars[b]])
            shown_to = b
        else:
            break
    else:
        steps = tuple(steps_list)
    return sizes, steps


def _anchored(states: dict, at: int, alone: bool) -> dict:
    """The states that agree with a stream chunk's end at byte ``at``: the
    chunk's one token ends there (``alone``), or its last ends there or
    beyond (held back, or past the text so far)."""
    if alone:
        return {s: came for s, came in states.items() if s[0] == at}
    return {s: came for s, came in states.items() if s[0] == _PENDING or s[0] >= at}


def _followers(tokens: list[str]) -> list[int | None]:
    """Per ``""`` token, the index of the next token that is not ``""``
    (``len(tokens)`` where none is); None where that one is a special
    token (zero-width, so not what completes the run) or for other tokens."""
    out: list[int | None] = [None] * len(tokens)
    nxt = len(tokens)
    for k in range(len(tokens) - 1, -1, -1):
        if tokens[k] == "":
            out[k] = nxt if nxt == len(tokens) or not looks_special(tokens[nxt]) else None
        else:
            nxt = k
    return out


def _furthest(states: dict) -> int:
    return max((b for b, _ in states if b != _PENDING), default=0)


def _char_index(text: str) -> dict[int, int]:
    """Byte offset -> character index, at every character boundary."""
    index, b = {0: 0}, 0
    for k, ch in enumerate(text):
        b += len(ch.encode("utf-8", "surrogatepass"))
        index[b] = k + 1
    return index


def _readable_top(top: dict[str, float] | None) -> str | None:
    best = top_choice(top)
    return best[0] if best is not None and not is_opaque(best[0]) else None


def risky_boundary(prompt: str, text: str) -> bool:
    """Could the prompt's last characters and the text's first ones become
    one token when sent together (where the server can't be asked)?
    Byte-level BPE splits words from spaces before them, and letters from
    punctuation; other neighbours may merge ("Par" + "is", "'" + "s",
    "=" + "=", "\\n" + "\\n", trailing spaces and the next word).

    >>> risky_boundary("The capital of France is Par", "is"), risky_boundary("Answer:\\n", "Paris")
    (True, False)
    """
    if not prompt or not text:
        return False
    a, b = prompt[-1], text[0]
    if b in " \t" and not a.isspace():
        return False  # a space starts the next word's token
    if a == "\n" and not b.isspace():
        return False
    if a.isalnum() and not (b.isalnum() or b.isspace() or b in "'’_"):
        return False  # letters and punctuation are split apart
    return True


def count_tokens(units: list[Unit]) -> int:
    return sum(u.tokens for u in units)


def with_last_bytes(units: list[Unit], sizes: list[int | None] | None) -> list[Unit]:
    """Each unit with its last listed token's own bytes (``own_bytes``)."""
    if not sizes:
        return units
    out, k = [], 0
    for unit in units:
        k += unit.listed if unit.listed is not None else unit.tokens if unit.exact else 1  # an inexact unit is one listed entry
        out.append(replace(unit, last_bytes=sizes[k - 1]) if 0 < k <= len(sizes) else unit)
    return out


def mark_inexact(units: list[Unit], left_out: int | None = None) -> list[Unit]:
    """Units from a server that leaves out of its logprobs the tokens that
    left the text inside a character (llama.cpp): a unit with a character
    beyond ASCII may stand for more tokens than listed.  ``left_out``: how
    many were left out in all, when known (the answer's usage) and nothing
    was cut at its end; if one unit can hold them, it gets them, exactly.

    >>> [(u.text, u.tokens, u.exact) for u in mark_inexact([Unit("a", 1, 0), Unit("😀", 1, 1)], 1)]
    [('a', 1, True), ('😀', 2, True)]
    """
    suspects = [k for k, u in enumerate(units) if not u.special and any(ord(c) > 0x7F for c in u.text)]
    if left_out == 0 or not suspects:
        return units
    out = list(units)
    if left_out is not None and len(suspects) == 1:
        k = suspects[0]
        out[k] = replace(out[k], tokens=out[k].tokens + left_out, matches=False, steps=None, sizes=None)
        return out
    for k in suspects:
        out[k] = replace(out[k], exact=False, matches=False, steps=None, sizes=None)
    return out
