"""A small local language model as the drafter (the classic speculative setup).

The target is a black box and may use another tokenizer, so the draft model
works on text: the context is re-tokenized with the *draft* model's tokenizer
on each proposal.  Two things keep that cheap and good:

- **KV reuse.**  The backend remembers which tokens its KV cache holds; a new
  proposal rolls the cache back to the longest common prefix with the new
  tokens and evaluates only the rest, never the whole context again.
- **Token healing.**  The target's text may end inside a word as the draft
  tokenizer cuts it ("parse" + "Query" vs "parseQ" + "uery").  The last
  draft token is dropped and regenerated under the constraint that it start
  with the dropped text, so the draft continues the word instead of
  guessing a new one.

Backends: :class:`~blackbox_spec.drafters.llama.LlamaCppModel` (GGUF files
through llama-cpp-python) and :class:`~blackbox_spec.drafters.hf.HFModel`
(transformers, CPU or CUDA).  Both are optional extras, imported lazily.
"""

from __future__ import annotations

import bisect
import weakref
from typing import Protocol, Sequence

from .base import DraftLength, draft_rest


class DraftModel(Protocol):
    """What the drafter needs from a local model."""

    name: str

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for ``text`` (a BOS token first if it uses one)."""

    def vocabulary(self) -> list[bytes]:
        """Each token id's bytes (empty for special tokens)."""

    def is_end(self, token: int) -> bool:
        """Is ``token`` an end-of-text / end-of-turn token?"""

    def greedy(self, tokens: Sequence[int], n: int, first_allowed: Sequence[int] | None) -> list[int]:
        """Up to ``n`` greedy tokens after ``tokens``, the first one chosen
        among ``first_allowed`` if given; the KV cache is reused for the
        longest common prefix with what it already holds."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixIndex:
    """Token ids by their bytes, to find every token that starts with a
    given byte string (the healing constraint)."""

    def __init__(self, vocabulary: list[bytes]) -> None:
        order = sorted((b, i) for i, b in enumerate(vocabulary) if b)
        self._keys = [b for b, _ in order]
        self._ids = [i for _, i in order]

    def starting_with(self, prefix: bytes) -> list[int]:
        """
        >>> PrefixIndex([b"ab", b"a", b"b", b"abc", b""]).starting_with(b"ab")
        [0, 3]
        """
        lo = bisect.bisect_left(self._keys, prefix)
        hi = lo
        while hi < len(self._keys) and self._keys[hi].startswith(prefix):
            hi += 1
        return self._ids[lo:hi]


class ModelDrafter:
    """Greedy drafts from a local model, on text.

    A draft the target then confirms is not recomputed: while the context
    keeps following the last draft, the rest of that draft is proposed again
    at no cost.  The draft length follows the acceptance of earlier drafts
    (:class:`DraftLength`), in the model's tokens.
    """

    def __init__(self, model: DraftModel, *, start_tokens: int = 8, min_tokens: int = 2, max_tokens: int = 32) -> None:
        self.model = model
        self.name = model.name
        self.length = DraftLength(start=start_tokens, low=min_tokens, high=max_tokens)
        self.start("")

    # -- Drafter protocol ---------------------------------------------------

    def start(self, prompt: str) -> None:
        self.text = prompt
        self._draft_at = -1  # where in ``text`` the last draft began
        self._draft = ""
        self._draft_tokens = 0
        self.last_match = 0
        self.model_calls = 0

    def propose(self, max_chars: int) -> str:
        if max_chars <= 0 or not self.text:
            return ""
        # The context still follows the last draft: propose the rest of it.
        if self._draft_at >= 0:
            rest = draft_rest(self._draft, self.text[self._draft_at :])
            if rest:
                return rest[:max_chars]
        self._draft_at, self._draft = len(self.text), self._fresh_draft()
        return self._draft[:max_chars]

    def update(self, accepted: str, draft: str, accepted_draft_chars: int) -> None:
        self.text += accepted

    def outcome(self, draft: str, accepted_chars: int) -> None:
        # Limits are in the model's tokens; the last fresh draft's own ratio of
        # tokens to characters converts (the checked draft may be a part of it).
        per_char = self._draft_tokens / max(1, len(self._draft)) if self._draft else 0.25
        drafted = max(1, round(len(draft) * per_char)) if draft else 0
        accepted = min(drafted, round(accepted_chars * per_char)) if accepted_chars < len(draft) else drafted
        self.length.observe(drafted, accepted)

    def finish(self) -> None:
        pass

    # -- drafting --------------------------------------------------------------

    def _fresh_draft(self) -> str:
        tokens = self.model.tokenize(self.text)
        if len(tokens) < 2:
            return ""
        # Token healing: regenerate the last token, constrained to start with it.
        vocabulary, prefixes = vocabulary_of(self.model)
        healed = vocabulary[tokens[-1]]
        allowed = prefixes.starting_with(healed) if healed else None
        context = tokens[:-1] if healed else tokens
        self.model_calls += 1
        out = self.model.greedy(context, self.length.limit + (1 if healed else 0), allowed)
        pieces = []
        for t in out:
            if self.model.is_end(t):
                break
            pieces.append(vocabulary[t])
        self._draft_tokens = max(0, len(pieces) - (1 if healed else 0))
        raw = b"".join(pieces)[len(healed) :]
        # A draft may end inside a multi-byte character: drop the partial one.
        return raw.decode("utf-8", errors="ignore")


# Built once per model (151k tokens take a moment), shared by its drafters.
_VOCABULARIES: "weakref.WeakKeyDictionary[object, tuple[list[bytes], PrefixIndex]]" = weakref.WeakKeyDictionary()


def vocabulary_of(model: DraftModel) -> tuple[list[bytes], PrefixIndex]:
    known = _VOCABULARIES.get(model)
    if known is None:
        vocabulary = model.vocabulary()
        known = _VOCABULARIES[model] = (vocabulary, PrefixIndex(vocabulary))
    return known
