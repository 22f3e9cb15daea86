"""The fake target's model: a deterministic greedy generator over the fake
tokenizer's ids (:mod:`.fake_tokenizer`).

Its prediction depends on the *token ids* of the context, so a context cut
inside one of its tokens puts it in a different state.  It copies from its
context (an "induction head") and deviates now and then, so prompt-lookup
drafts are often, but not always, right.  The paths it produces are
canonical: appending a token never changes how the text so far re-tokenizes.
"""

from __future__ import annotations

import codecs
from typing import Iterable

from .fake_tokenizer import FakeTokenizer


def _mix(values: Iterable[int]) -> int:
    """FNV-1a over a few ids: a stable hash (Python's hash() is salted)."""
    h = 0x811C9DC5
    for v in values:
        h = ((h ^ (v & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF
    return h


def _valid_utf8_prefix(data: bytes) -> bool:
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
        return True
    except UnicodeDecodeError:
        return False


def _incomplete_tail(data: bytes) -> bytes:
    """The bytes of a character that ``data`` has started but not finished."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte >= 0xC0 and byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data[-back:] if back < need else b""
    return b""


def _ends_mid_character(data: bytes) -> bool:
    return bool(_incomplete_tail(data))


def _valid_whole(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class _State:
    """A growing context with an n-gram index for the induction head.

    ``last_end[n][gram]`` is the end index of the latest occurrence of
    ``gram`` that ends strictly before the current end, so a lookup finds an
    *earlier* occurrence of the current suffix.
    """

    NGRAM_SIZES = (8, 4, 2, 1)

    def __init__(self, model: "FakeModel") -> None:
        self.model = model
        self.ids: list[int] = []
        self.data = bytearray()
        self.last_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.NGRAM_SIZES}

    def append(self, token: int) -> None:
        end = len(self.ids)
        for n in self.NGRAM_SIZES:
            if end >= n:
                self.last_end[n][tuple(self.ids[end - n : end])] = end
        self.ids.append(token)
        self.data += self.model.tokenizer.token_bytes(token)

    def induction(self) -> int | None:
        end = len(self.ids)
        for n in self.NGRAM_SIZES:
            if end >= n:
                j = self.last_end[n].get(tuple(self.ids[end - n :]))
                if j is not None and j < end:
                    return self.ids[j]
        return None

    def ranked(self) -> tuple[tuple[int, float], tuple[int, float]]:
        """The top-2 next tokens with logprobs (distinct values: no ties)."""
        model, tok = self.model, self.model.tokenizer
        h = _mix(self.ids[-3:] + [len(self.ids) % 7])
        mid_char = _ends_mid_character(bytes(self.data[-4:]))
        candidates: list[int] = []
        follow = self.induction()
        if follow is not None and follow != tok.eos_id and (mid_char or h % model.deviate_every):
            candidates.append(follow)
        text_end = bytes(self.data[-1:])
        if not mid_char and len(self.ids) > 2 and text_end in (b"\n", b".") and h % model.eos_every == 0:
            candidates.insert(0, tok.eos_id)
        start = h % len(model.free_choices)
        candidates += model.free_choices[start:] + model.free_choices[:start]
        if mid_char:
            candidates += model.completions
        top: list[tuple[int, float]] = []
        # Second pass only for contexts that are not canonical themselves
        # (built by hand in tests): then no candidate can keep them canonical.
        for canonical in (True, False):
            for c in candidates:
                if len(top) == 2:
                    return top[0], top[1]
                if c in (t for t, _ in top) or (c != tok.eos_id and not self._acceptable(c, canonical)):
                    continue
                lp = -(0.01 + (h % 50) / 100.0) if not top else top[0][1] - 1.0 - (h % 7) / 10.0
                top.append((c, lp))
        raise AssertionError("the fake model found no next token")  # pragma: no cover

    def _acceptable(self, token: int, canonical: bool = True) -> bool:
        tok = self.model.tokenizer
        raw = tok.token_bytes(token)
        if not _valid_utf8_prefix(_incomplete_tail(bytes(self.data[-4:])) + raw):
            return False
        if not canonical:
            return True
        # Canonical: re-tokenizing the tail (from a token boundary far enough
        # back that no longest match can reach across it) gives the same ids.
        k, width = len(self.ids), 0
        while k > 0 and width < tok.max_token_bytes:
            k -= 1
            width += len(tok.token_bytes(self.ids[k]))
        window = self.ids[k:] + [token]
        return tok.encode_bytes(b"".join(tok.token_bytes(t) for t in window)) == window


class FakeModel:
    """A greedy 'model' over fake token ids. Deterministic, no randomness."""

    def __init__(self, tokenizer: FakeTokenizer | None = None, *, deviate_every: int = 9, eos_every: int = 31) -> None:
        self.tokenizer = tokenizer or FakeTokenizer()
        self.deviate_every = deviate_every
        self.eos_every = eos_every
        tok = self.tokenizer
        whole = [i for i, raw in enumerate(tok.vocab) if len(raw) > 1 and _valid_utf8_prefix(raw) and not _ends_mid_character(raw)]
        ascii_printable = [i for i in range(32, 127)]
        self.free_choices = whole + ascii_printable + [10]
        if tok.byte_level:  # it also starts characters it does not finish ("中\\xe6")
            starts_whole = [i for i, raw in enumerate(tok.vocab) if len(raw) > 1 and (raw[0] < 0x80 or raw[0] >= 0xC0)]
            self.free_choices += [i for i in starts_whole if _valid_utf8_prefix(tok.vocab[i]) and _ends_mid_character(tok.vocab[i])]
        self.completions = [i for i, raw in enumerate(tok.vocab) if not _valid_whole(raw)]

    def state(self, ids: Iterable[int]) -> _State:
        st = _State(self)
        for t in ids:
            st.append(t)
        return st
