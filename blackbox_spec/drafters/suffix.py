"""Suffix decoding: draft from everything the session has written before.

After SuffixDecoding (Oliaro et al., arXiv 2411.04975; ArcticInference has
the reference implementation).  The text is cut into *pieces* (a word with
its leading space, a run of punctuation, a run of whitespace: see
:func:`split_pieces`), which play the role tokens play in the paper, so no
tokenizer is needed and any target works.  Two indexes are kept:

- a **local** one over the current prompt and what has been generated so far;
- a **session** one over earlier outputs, bounded in size, oldest evicted
  first, so that an agent's later turns draft what its earlier turns said.

Both are suffix automata (Blumer et al. 1985): the same complexity as a
suffix tree (linear size, amortised constant-time extension, longest-match
tracking in constant time per symbol) in far less Python.  Each state keeps
how often its strings occurred, so a continuation is scored by frequency:
the draft follows the most frequent next piece while the product of the
choices' frequencies (the path probability) stays above a floor.  Once the
path has met a choice, it runs no longer than ``factor`` times the length of
the match it came from; a path without choices (a copy) runs on to the
draft length learned from earlier outcomes.
"""

from __future__ import annotations

import re
import threading
from collections import deque

from .base import DraftLength, draft_rest
from .ngram import SPECIAL_START, copy_from, follow_copy, resync

# A word with at most one leading space or tab, a run of punctuation likewise,
# a run of newlines, a run of other whitespace.  No look-ahead, so appending
# text can only change the *last* piece of a split (pieces are prefix-stable).
_PIECE = re.compile(r"[ \t]?\w+|[ \t]?[^\w\s]+|\n+|\s+")
# How many suffix links an insertion walks to count an occurrence.  Only
# highly periodic text ("aaaa…") has longer chains; there the counts of its
# shortest strings are left short, which only matters for weak matches.
_MAX_COUNT_CHAIN = 64
# A match this long (in characters) is trusted over resuming an earlier copy.
STRONG_MATCH = 32


def split_pieces(text: str) -> list[str]:
    """The pieces of ``text``, which join back to it exactly.

    >>> split_pieces("def f(x):\\n    return x")
    ['def', ' f', '(', 'x', '):', '\\n', '    ', 'return', ' x']
    """
    return _PIECE.findall(text)


class SuffixAutomaton:
    """The suffix automaton of a sequence of ints, built one symbol at a time.

    State 0 is the root (the empty string).  For each state: ``next`` (its
    transitions), ``link`` (the state of its longest suffix that ends in more
    places), ``length`` (its longest string), ``count`` (how many times its
    strings occur: the size of their end-position set).
    """

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.count: list[int] = [0]
        self.first_end: list[int] = [0]  # symbols up to the end of the first occurrence
        self.sequence: list[int] = []  # the symbols added, in order
        self.last = 0
        self.size = 0  # symbols added

    def extend(self, symbol: int) -> None:
        nxt, link, length, count = self.next, self.link, self.length, self.count
        cur = len(length)
        nxt.append({})
        link.append(0)
        length.append(length[self.last] + 1)
        count.append(0)
        self.first_end.append(self.size + 1)
        p = self.last
        while p != -1 and symbol not in nxt[p]:
            nxt[p][symbol] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][symbol]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                count.append(count[q])
                self.first_end.append(self.first_end[q])
                while p != -1 and nxt[p].get(symbol) == q:
                    nxt[p][symbol] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        self.size += 1
        self.sequence.append(symbol)
        # The new end position belongs to every suffix of the sequence.
        v, steps = cur, 0
        while v > 0 and steps < _MAX_COUNT_CHAIN:
            count[v] += 1
            v = link[v]
            steps += 1

    def walk(self, state: int, matched: int, symbol: int) -> tuple[int, int]:
        """Follow ``symbol`` from a match (state, matched length), shortening
        the match until it can be extended: the matching statistics step."""
        nxt, link, length = self.next, self.link, self.length
        while state > 0 and symbol not in nxt[state]:
            state = link[state]
            matched = length[state]
        if symbol in nxt[state]:
            return nxt[state][symbol], matched + 1
        return 0, 0

    def check_integrity(self) -> None:
        """Raise AssertionError if an invariant of the automaton is broken."""
        for v in range(1, len(self.length)):
            assert 0 <= self.link[v] < len(self.length), f"state {v}: bad link"
            assert self.length[self.link[v]] < self.length[v], f"state {v}: link not shorter"
            assert self.count[v] >= 1, f"state {v}: occurs nowhere"
            assert self.length[v] <= self.first_end[v] <= self.size, f"state {v}: first occurrence out of range"
        for v, edges in enumerate(self.next):
            for w in edges.values():
                assert self.length[w] >= self.length[v] + 1, f"edge {v}->{w}: too short"
        assert self.length[self.last] == self.size


class _Vocabulary:
    """Pieces as small ints (their ids are shared by both indexes).

    A long prompt is indexed in a thread (the orchestrator keeps the event
    loop free), while other generations add pieces on the loop: a new id is
    handed out under a lock, so no two pieces ever share one."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.pieces: list[str] = []
        self.chars = 0
        self._lock = threading.Lock()

    def id(self, piece: str) -> int:
        known = self.ids.get(piece)
        if known is None:
            with self._lock:
                known = self.ids.get(piece)
                if known is None:
                    known = self.ids[piece] = len(self.pieces)
                    self.pieces.append(piece)
                    self.chars += len(piece)
        return known


class SessionIndex:
    """Earlier outputs of a session, at most ``max_pieces`` pieces and
    ``max_chars`` characters of them, oldest evicted first (whole outputs).
    Shared by the drafters of one client (in ``bspec serve``, by every
    request: so it must stay bounded whatever callers send).

    Eviction rebuilds the automaton from the outputs that stay; it happens
    once the index has grown by a quarter past a bound, so its cost per
    piece added stays constant.  The vocabulary also learns every prompt's
    pieces (both indexes share its ids): when it holds far more than the
    outputs need, it is rebuilt too, and drafters still running keep the
    vocabulary and automaton they started with (their ids stay consistent).
    """

    def __init__(self, max_pieces: int = 200_000, max_chars: int = 4_000_000) -> None:
        if max_pieces < 1 or max_chars < 1:
            raise ValueError("max_pieces and max_chars must be positive")
        self.max_pieces = max_pieces
        self.max_chars = max_chars
        self.vocabulary = _Vocabulary()
        self.outputs: deque[list[int]] = deque()
        self.pieces = 0
        self.chars = 0
        self.automaton = SuffixAutomaton()
        self._separator = -1

    def add(self, text: str) -> None:
        symbols = [self.vocabulary.id(p) for p in split_pieces(text)]
        if not symbols:
            return
        self.outputs.append(symbols)
        self.pieces += len(symbols)
        self.chars += len(text)
        vocabulary = self.vocabulary
        if self.pieces > self.max_pieces * 5 // 4 or self.chars > self.max_chars * 5 // 4:
            while (self.pieces > self.max_pieces * 3 // 4 or self.chars > self.max_chars * 3 // 4) and len(self.outputs) > 1:
                dropped = self.outputs.popleft()
                self.pieces -= len(dropped)
                self.chars -= sum(len(vocabulary.pieces[s]) for s in dropped)
            self._rebuild()
        elif len(vocabulary.pieces) > 2 * self.pieces + 50_000 or vocabulary.chars > 2 * self.max_chars:
            self._rebuild()  # mostly prompts' pieces, which no output holds
        else:
            self._insert(symbols)

    def _rebuild(self) -> None:
        old, self.vocabulary = self.vocabulary, _Vocabulary()
        self.outputs = deque([self.vocabulary.id(old.pieces[s]) for s in output] for output in self.outputs)
        self.automaton = SuffixAutomaton()
        for output in self.outputs:
            self._insert(output)

    def _insert(self, symbols: list[int]) -> None:
        for s in symbols:
            self.automaton.extend(s)
        # A separator no piece equals, so no match runs from one output into the next.
        self.automaton.extend(self._separator)
        self._separator -= 1


class SuffixDrafter:
    """Draft the most frequent continuation of the text's longest match,
    in the current text or in the session's earlier outputs.

    ``last_match`` is the match length in characters (the policy's measure of
    a draft's strength).
    """

    name = "suffix"

    def __init__(
        self,
        *,
        session: SessionIndex | None = None,
        factor: float = 2.0,
        offset: int = 2,
        min_probability: float = 0.1,
        min_match: int = 2,
        max_pieces: int = 256,
        reuse: bool = True,
    ) -> None:
        self.session = session if session is not None else SessionIndex()
        self.factor = factor
        self.offset = offset
        self.min_probability = min_probability
        self.min_match = min_match
        self.length = DraftLength(start=max_pieces, low=8, high=max_pieces)
        self.reuse = reuse
        self._fork: tuple | None = None  # the first uncertain choice of the last draft
        self._last_pieces: list[str] = []
        self.start("")

    # -- Drafter protocol ---------------------------------------------------

    def start(self, prompt: str) -> None:
        # Safe in a thread beside other generations on the event loop (a long
        # prompt is indexed there): the prompt goes into the local index only,
        # and the session index is walked at the first draft, on the loop.
        self.vocabulary = self.session.vocabulary
        self._started_with = self.session.automaton
        self._walked = None
        self.global_state = self.global_matched = 0
        self.local = SuffixAutomaton()
        self.char_ends: list[int] = [0]  # character offset after each committed piece
        self.tail = ""  # the last piece, which may still grow
        self.text = ""
        # Where in ``text`` the current copy reads from, as the n-gram drafter
        # keeps it: right after an edit the text's ending occurs nowhere
        # earlier, and the copy is resumed there (``ngram.resync``).
        self.copy_pos: int | None = None
        self.copy_valid = False
        self.last_match = 0
        self.generated = ""
        self._append(prompt, walk=False)
        self.generated = ""  # what this generation added: it joins the session index
        self._draft_at, self._draft = -1, ""

    def propose(self, max_chars: int) -> str:
        # While the text follows the last draft, its rest is still the best
        # guess (the orchestrator asks after every token): no new search.
        if self.reuse and self._draft_at >= 0:
            rest = draft_rest(self._draft, self.generated[self._draft_at :])
            if 2 * len(rest) >= len(self._draft) and rest:
                return rest[:max_chars]
        self._draft_at, self._draft = len(self.generated), self._fresh_draft(max_chars)
        return self._draft

    def _fresh_draft(self, max_chars: int) -> str:
        if self._walked is not self._session_automaton():
            self._rewalk()  # the session index was rebuilt (eviction), or not walked since start
        # In the local index the text itself is the longest match; the
        # longest suffix found *earlier* is its suffix link.
        repeat = self.local.link[self.local.last] if self.local.last else 0
        matches = sorted(
            [(self.local.length[repeat], self.local, repeat), (self.global_matched, self._session_automaton(), self.global_state)],
            key=lambda m: -m[0],
        )
        best: tuple[float, int, list[str]] = (0.0, 0, [])
        fork, best_from = None, None
        for matched, automaton, state in matches:
            if min(self.length.limit, matched * self.factor + self.offset) <= best[0]:
                break  # even a certain draft from this shorter match would score less
            self._fork = None
            found = self._draft_from(automaton, state, matched, max_chars)
            if found[0] > best[0]:
                best, fork, best_from = found, self._fork, automaton
        _, matched, pieces = best
        self._last_pieces, self._fork = pieces, fork
        self.last_match = self.char_ends[-1] - self.char_ends[-1 - matched] if matched else 0
        if self.last_match < STRONG_MATCH and self.copy_pos is not None and self.copy_valid:
            # A weak match right after a change: the copy we were following
            # is the better guess.
            self.copy_pos = resync(self.text, self.copy_pos)
            self.last_match = -1
            self._last_pieces, self._fork = [], None
            draft = self.text[self.copy_pos : self.copy_pos + max_chars]
        else:
            if best[2] and best_from is self.local and self.last_match:
                # Remember where the local match's first occurrence ends: the copy's source.
                source = self.char_ends[self.local.first_end[repeat]]
                if self.text.startswith(self.tail, source):
                    self.copy_pos = source + len(self.tail)
                    self.copy_valid = self.last_match >= STRONG_MATCH
            draft = "".join(pieces)[:max_chars]
            if best_from is self.local and self.copy_pos is not None and 0 < len(self.text) - self.copy_pos <= self.last_match:
                # The copy's source runs into the current end, and the match
                # spans a whole period: the text repeats, so copy on past it
                # (overlapping, as LZ77), up to the learned length.
                longer = copy_from(self.text, self.copy_pos, max_chars, match=self.last_match)
                if longer.startswith(draft):
                    draft = "".join(split_pieces(longer)[: max(len(pieces), self.length.limit)])
        special = draft.find(SPECIAL_START)
        return draft[:special] if special != -1 else draft

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        self._append(accepted)

    def outcome(self, draft: str, accepted_chars: int) -> None:
        self.length.observe(len(split_pieces(draft)), len(split_pieces(draft[:accepted_chars])))
        self._draft_at = -1  # the next draft is sized anew

    def finish(self) -> None:
        """The generation is over: its output joins the session index."""
        if self.generated:
            self.session.add(self.generated)
            self.generated = ""

    # -- internals -------------------------------------------------------------

    def _session_automaton(self) -> SuffixAutomaton:
        """The session's index, unless it was rebuilt with new ids since this
        generation started: then the one it started with (still consistent
        with this drafter's ids; it is freed when the generation ends)."""
        return self.session.automaton if self.session.vocabulary is self.vocabulary else self._started_with

    def _append(self, text: str, walk: bool = True) -> None:
        if not text:
            return
        if self.copy_pos is not None:
            k = follow_copy(self.text, self.copy_pos, text)
            self.copy_pos += k
            self.copy_valid = self.copy_valid or k >= 16
        self.text += text
        self.generated += text
        pieces = split_pieces(self.tail + text)
        self.tail = pieces.pop()
        if walk and self._walked is not self._session_automaton():
            self._rewalk()
        vocabulary, automaton, session = self.vocabulary, self.local, self._session_automaton()
        ends = self.char_ends
        for piece in pieces:
            symbol = vocabulary.id(piece)
            automaton.extend(symbol)  # its ``sequence``: the symbols of all pieces but the last
            ends.append(ends[-1] + len(piece))
            if walk:
                self.global_state, self.global_matched = session.walk(self.global_state, self.global_matched, symbol)

    def _rewalk(self) -> None:
        self._walked = automaton = self._session_automaton()
        state = matched = 0
        for symbol in self.local.sequence[-4 * self.length.high :]:
            state, matched = automaton.walk(state, matched, symbol)
        self.global_state, self.global_matched = state, matched

    def _draft_from(self, automaton: SuffixAutomaton, state: int, matched: int, max_chars: int) -> tuple[float, int, list[str]]:
        """(score, match length in pieces, pieces) of the draft that follows a
        match.  Its score is the expected number of accepted pieces: the sum
        of the path probabilities, each choice weighted by its frequency."""
        nxt, count, link, length = automaton.next, automaton.count, automaton.link, automaton.length
        pieces_of = self.vocabulary.pieces
        tail = self.tail
        # The text's last piece may be unfinished: continue only with pieces
        # that start with it, shortening the match until one does.
        while True:
            if matched < self.min_match:
                return 0.0, 0, []
            options = [(count[w], s) for s, w in nxt[state].items() if s >= 0 and pieces_of[s].startswith(tail)]
            if options:
                break
            state = link[state]
            matched = length[state]
        options.sort(reverse=True)
        (best_count, symbol), total = options[0], sum(c for c, _ in options)
        if len(options) > 1:
            self._fork = (automaton, 0, options[1][1], nxt[state][options[1][1]], options[1][0] / total, tail)
        probability = best_count / total
        if probability < self.min_probability:
            return 0.0, matched, []
        out = [pieces_of[symbol][len(tail) :]]
        cap = min(self.length.limit, int(matched * self.factor) + self.offset)
        score = self._follow(automaton, nxt[state][symbol], probability, out, cap, max_chars)
        return score, matched, out

    def _follow(self, automaton: SuffixAutomaton, state: int, probability: float, out: list[str], cap: int, max_chars: int) -> float:
        """Extend ``out`` along the most frequent path from ``state`` while the
        path probability stays above the floor; return the draft's score.
        ``out`` holds pieces, except that a copy's rest is one string."""
        nxt, count, pieces_of = automaton.next, automaton.count, self.vocabulary.pieces
        score, chars, n = probability, sum(map(len, out)), len(out)
        limit = self.length.limit
        # The cap binds once the path has met a choice: while every step had a
        # single continuation (a copy), the draft runs on to the length limit.
        while chars < max_chars and n < limit and (n < cap or probability == 1.0):
            if count[state] == 1:
                # One occurrence: the rest of the path is the text after it,
                # read off in one slice instead of piece by piece.
                start = automaton.first_end[state]
                rest = automaton.sequence[start : start + (limit - n if probability == 1.0 else cap - n)]
                if min(rest, default=0) < 0:
                    rest = rest[: next(k for k, x in enumerate(rest) if x < 0)]  # an output ends there
                if rest:
                    out.append("".join([pieces_of[x] for x in rest]))
                    score += probability * len(rest)
                    n += len(rest)
                break
            edges = nxt[state]
            if len(edges) == 1:  # the common case deep in a match: one way on
                ((symbol, state),) = edges.items()
                if symbol < 0:
                    break  # the end of an earlier output
            else:
                total = best_count = second_count = 0
                symbol = second = -1
                for s, w in edges.items():
                    c = count[w]
                    total += c
                    if s < 0:
                        continue
                    if c > best_count:
                        second_count, second, best_count, symbol = best_count, symbol, c, s
                    elif c > second_count:
                        second_count, second = c, s
                if self._fork is None and second >= 0 and total:
                    self._fork = (automaton, len(out), second, edges[second], probability * second_count / total, "")
                probability *= best_count / total if total else 0.0
                if symbol < 0 or probability < self.min_probability:
                    break
                state = edges[symbol]
            piece = pieces_of[symbol]
            out.append(piece)
            chars += len(piece)
            score += probability
            n += 1
        return score

    def propose_alternatives(self, max_chars: int) -> list[str]:
        """The draft, and a second one that takes the runner-up piece at the
        draft's first uncertain position (multi-branch drafts).  Only the
        suffix drafter offers this; ``docs/results.md`` ("Multi-branch drafts do not pay") measured
        whether checking the second one pays."""
        self._fork = None
        self._draft_at = -1
        main = self.propose(max_chars)
        fork, self._fork = self._fork, None
        if not main or fork is None:
            return [main] if main else []
        automaton, at, symbol, state, probability, tail = fork
        if probability < self.min_probability:
            return [main]
        prefix = self._last_pieces[:at]
        out = [*prefix, self.vocabulary.pieces[symbol][len(tail) :]]
        self._follow(automaton, state, probability, out, len(self._last_pieces) + 1, max_chars)
        alternative = "".join(out)[:max_chars]
        return [main, alternative] if alternative and alternative != main else [main]
