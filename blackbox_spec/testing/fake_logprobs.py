"""How the fake server shows tokens in logprobs: each server's convention
(:mod:`.forms`) for token strings, top candidates, echoed prompts and the
legacy and ``content`` list formats.

A mixin of :class:`.fake_target.FakeTarget`; it reads the target's ``model``
(through ``tokenizer``) and ``token_form``.
"""

from __future__ import annotations

from . import forms
from .fake_tokenizer import EOS_TEXT

# One logprobs entry: token id, its string, its logprob, its top candidates.
Entry = tuple[int, str, float | None, dict | None]


def _own_logprob(token: int, ranked: tuple) -> float:
    """The model's logprob of ``token`` where its top two are ``ranked``
    (a token below them gets a lower one, distinct per token)."""
    (t1, lp1), (t2, lp2) = ranked
    return lp1 if token == t1 else lp2 if token == t2 else lp2 - 3.0 - (token % 5) / 10.0


class LogprobForms:
    """The target's logprobs, in the form its ``token_form`` names."""

    @property
    def prompt_form(self) -> str:
        """How an echoed prompt's tokens show: vLLM 0.10 corrected only
        sampled tokens' strings (its prompt logprobs decode each alone)."""
        return "vllm-legacy" if self.token_form in ("llama", "vllm-0.10") else self.token_form

    def _candidate(self, raws: list[bytes], k: int, token: int, form: str | None = None) -> str:
        """How a candidate for position ``k`` shows in top_logprobs."""
        form = form or self.token_form
        if token == self.tokenizer.eos_id:
            return "" if form == "llama" else EOS_TEXT
        return forms.candidate_string(form, raws, k, self.tokenizer.token_bytes(token), token)

    def _rankings(self, before: list[int], ids: list[int]) -> list[tuple | None]:
        """The model's top two at each of ``ids``' positions, after ``before``
        (None at the very first position of a text: nothing predicts it)."""
        st = self.model.state(before)
        ranked: list[tuple | None] = []
        for token in ids:
            ranked.append(st.ranked() if st.ids else None)
            st.append(token)
        return ranked

    def _own_logprobs(self, ids: list[int]) -> list[float | None]:
        """The model's logprob of each of ``ids`` after those before it (as
        ``_prompt_logprobs`` reports them); None for the first."""
        lps: list[float | None] = [None] if ids else []
        for token, ranked in zip(ids[1:], self._rankings([], ids)[1:]):
            lps.append(_own_logprob(token, ranked))
        return lps

    def _prompt_logprobs(self, prompt_ids: list[int]) -> list[dict | None]:
        """vLLM's ``prompt_logprobs=1``: per prompt position, the prompt's own
        token and the model's top choice, keyed by token id, with rank."""
        st = self.model.state([])
        form = self.prompt_form
        raws = [self.tokenizer.token_bytes(t) for t in prompt_ids]
        entries: list[dict | None] = []
        for i, token in enumerate(prompt_ids):
            if i == 0:
                entries.append(None)
            else:
                ranked = st.ranked()
                (t1, lp1), (t2, _) = ranked
                own = _own_logprob(token, ranked)
                rank = 1 if token == t1 else 2 if token == t2 else 3 + token % 7
                entry = {str(token): {"logprob": own, "rank": rank, "decoded_token": forms.token_string(form, raws, i, token)}}
                if token != t1:
                    entry[str(t1)] = {"logprob": lp1, "rank": 1, "decoded_token": self._candidate(raws, i, t1, form)}
                entries.append(entry)
            st.append(token)
        return entries

    def _rendered(self, ids: list[int], ranked: list[tuple | None], form: str | None = None) -> list[Entry]:
        """Logprobs entries (token id, string, logprob, top dict) for ``ids``,
        as ``form`` (``token_form`` unless given) shows them.  llama.cpp lists
        only the tokens that leave the text whole, each with the text of
        those it left out."""
        tok, form = self.tokenizer, form or self.token_form
        raws = [tok.token_bytes(t) for t in ids]
        if form == "llama":
            body = len(ids) - (1 if ids and ids[-1] == tok.eos_id else 0)
            groups = forms.llama_entries(raws[:body]) + ([(body, body)] if body < len(ids) else [])
        else:
            groups = [(k, k) for k in range(len(ids))]
        entries = []
        for first, last in groups:
            token = ids[last]
            if token == tok.eos_id:
                text = "" if form == "llama" else EOS_TEXT
            elif form == "llama":
                text = forms.lossy(b"".join(raws[first : last + 1]))
            else:
                text = forms.token_string(form, raws, last, token)
            if ranked[last] is None:
                entries.append((token, text, None, None))
                continue
            (t1, lp1), _ = ranked[last]
            own = _own_logprob(token, ranked[last])
            if form == "vllm-0.10" and token != tok.eos_id:
                # The sampled token first, then the top-1: strings by id,
                # the later entry's winning (see ``forms.vllm010_corrected``).
                listed = [(token, raws[last])] + ([(t1, tok.token_bytes(t1))] if t1 != tok.eos_id else [])
                strings = forms.vllm010_corrected(raws, last, listed)
                text = strings[token]
                top = {strings.get(t1, EOS_TEXT): lp1}
                top[text] = own
                entries.append((token, text, own, top))
                continue
            # vLLM builds the dict from ids, then decodes keys: colliding
            # strings keep the later entry.  The chosen token goes in last.
            top = {self._candidate(raws, last, t1, form): lp1}
            top[self._candidate(raws, last, token, form)] = own
            entries.append((token, text, own, top))
        return entries

    def _legacy_logprobs(self, entries: list[Entry]) -> dict:
        """The legacy completions format; ``text_offset`` is the running sum
        of the token strings' lengths (so it is wrong after a lossy one)."""
        offsets, offset = [], 0
        for _, text, _, _ in entries:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": [e[1] for e in entries], "token_logprobs": [e[2] for e in entries],
                "top_logprobs": [e[3] for e in entries], "text_offset": offsets}

    def _content_logprobs(self, entries: list[Entry]) -> list[dict]:
        """Logprobs in the chat (and llama.cpp's) ``content`` list format.
        llama.cpp gives each top candidate its own bytes (the chosen token's
        own, where its entry's text holds pieces before it)."""
        own = {}
        for token, _, _, top in entries:
            if self.token_form == "llama" and top:
                own[token] = list(self.tokenizer.token_bytes(token))
        return [
            {"id": token, "token": text, "bytes": list(text.encode("utf-8", "surrogatepass")), "logprob": lp,
             "top_logprobs": [dict({"token": t, "logprob": v}, **({"bytes": own[token]} if token in own and v == lp else {}))
                              for t, v in (top or {}).items()]}
            for token, text, lp, top in entries
        ]
