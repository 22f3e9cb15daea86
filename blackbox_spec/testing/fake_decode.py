"""How the fake server decodes: greedy generation shown through its
detokenizer, cut by its stop rule.

A mixin of :class:`.fake_target.FakeTarget`; it reads the target's ``model``
(through ``tokenizer``), ``token_form`` and ``stop_rule``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import forms


def stop_list(value: Any) -> list[str]:
    """A request's ``stop`` field as a list (one string, a list, or none)."""
    value = value or []
    return [value] if isinstance(value, str) else list(value)


@dataclass
class Answer:
    """One greedy generation, before the server renders it."""

    target: "Decoding"
    ids: list[int]  # generated ids, an end-of-text one included
    raws: list[bytes]  # their bytes (none for the end-of-text)
    steps: list[str]  # the text each id showed ("" while a character was unfinished)
    text: str  # the shown text, cut at a stop string
    finish: str
    held: bytes = b""  # an unfinished character that max_tokens cut

    def shown(self, stream: bool) -> str:
        """The whole answer's text, the unfinished end as the server renders it."""
        return self.text + (forms.lossy(self.held) if self.held and self.target.renders_cut(stream) else "")


class Decoding:
    """The target's greedy decoding, as a plain call and as its endpoints see it."""

    def renders_cut(self, stream: bool) -> bool:
        """Does an unfinished character at the end show (as U+FFFD)?"""
        return self.token_form == "vllm-legacy" or (self.token_form == "llama" and not stream)

    def generate(self, prompt: str, max_tokens: int = 16, stop: list[str] | None = None, *, stream: bool = False) -> tuple[str, str, list[int]]:
        """(text, finish_reason, generated ids) exactly as a plain call returns
        them (``stream``: as a plain streamed call's text adds up)."""
        answer = self._decode(self.tokenizer.encode(prompt), max_tokens, stop or [])
        return answer.shown(stream), answer.finish, answer.ids

    def _decode(self, prompt_ids: list[int], max_tokens: int, stop: list[str]) -> Answer:
        """Greedy decoding with the server's detokenizer and stop rule.

        Text shows as vLLM's incremental detokenizer and llama.cpp show it: a
        token that leaves a character unfinished shows nothing, the one that
        completes it shows all that was held (``forms.visible_steps``).
        Stop strings are looked for in that text after each token that
        showed some, by ``stop_rule``.
        """
        st = self.model.state(prompt_ids)
        answer = Answer(self, [], [], [], "", "length")
        held, sent = b"", [0]
        while len(answer.ids) < max_tokens:
            (token, _), _ = st.ranked()
            answer.ids.append(token)
            if token == self.tokenizer.eos_id:
                answer.finish = "stop"
                answer.steps.append("")
                break
            st.append(token)
            raw = self.tokenizer.token_bytes(token)
            answer.raws.append(raw)
            held += raw
            new, held = (forms.lossy(held), b"") if forms.is_whole(held) else ("", held)
            answer.steps.append(new)
            answer.text += new
            cut = self._stop_cut(answer.text, new, raw, stop, sent) if new and stop else None
            if cut is not None:
                answer.text, answer.finish = answer.text[:cut], "stop"
                break
        answer.held = held if answer.finish == "length" else b""
        return answer

    def _stop_cut(self, text: str, new: str, raw: bytes, stop: list[str], sent: list[int]) -> int | None:
        """Where the server cuts ``text`` after a token that showed ``new``."""
        if self.stop_rule == "earliest-start":
            # llama.cpp: in bytes, in the text not sent yet, each stop from
            # (length - stop - this token's bytes); the earliest start wins.
            # A tail that could begin a stop is not sent yet.
            data = text.encode()
            unsent = data[sent[0] :]
            starts = [unsent.find(w, max(0, len(unsent) - len(w) - len(raw))) for w in (s.encode() for s in stop)]
            starts = [p for p in starts if p != -1]
            if starts:
                return len(data[: sent[0] + min(starts)].decode())
            if not any(unsent.endswith(w[:k]) for w in (s.encode() for s in stop) for k in range(1, min(len(unsent), len(w)) + 1)):
                sent[0] = len(data)
            return None
        found = []
        for order, s in enumerate(stop):
            index = text.find(s, max(0, len(text) - len(new) - len(s) + 1))
            if index == -1:
                continue
            if self.stop_rule == "first-listed":
                return index
            found.append((index + len(s), order, index))  # vLLM 0.32: completes first, then list order
        return min(found)[2] if found else None

