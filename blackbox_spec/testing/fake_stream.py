"""How the fake server streams: server-sent event chunks per token (or per
step of a server that speculates on its own), as completions or chat deltas.

A mixin of :class:`.fake_target.FakeTarget`; it reads the target's
``model_name``, ``token_form``, ``timings_per_token`` and ``speculates``, and
renders logprobs with :class:`.fake_logprobs.LogprobForms`.
"""

from __future__ import annotations

import json

from . import forms
from .fake_decode import Answer

LLAMA_FINGERPRINT = "b6500-fake0000"  # llama.cpp's "b<build>-<commit>"


def _ngram_draft(context: list[int], k: int) -> list[int]:
    """Prompt lookup as vLLM's n-gram does it: the tokens after the latest
    earlier occurrence of the context's last 4 (else 3, else 2) tokens."""
    for n in (4, 3, 2):
        if len(context) <= n:
            continue
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


def _merged_steps(chunks: list[dict], runs: list[int]) -> list[dict]:
    """Per-token stream chunks joined into one per step (``runs``: tokens
    per step): their texts and logprobs lists concatenated."""
    merged, k = [], 0
    for run in runs:
        group = chunks[k : k + run]
        k += run
        if not group:
            break
        first = json.loads(json.dumps(group[0]))
        choice = first["choices"][0]
        for chunk in group[1:]:
            other = chunk["choices"][0]
            choice["text"] += other["text"]
            for key, values in (other.get("logprobs") or {}).items():
                if isinstance(values, list):
                    choice["logprobs"][key] = choice["logprobs"][key] + values
        merged.append(first)
    return merged + chunks[k:]


class Streaming:
    """The target's streamed answers, chunk by chunk."""

    def _stream_chunks(self, answer: Answer, usage: dict, body: dict, content_format: bool = False, prompt_ids: list[int] | None = None) -> list[dict]:
        """One chunk per token, as vLLM streams with logprobs (even for a token
        that shows no text); without logprobs, only chunks with text.  In
        llama.cpp's form, one per token that leaves the text whole."""
        chunks, sent, shown = [], "", ""
        final = answer.shown(stream=True)
        with_logprobs = body.get("logprobs") is not None
        # llama.cpp's entries carry their top candidates (with their bytes).
        ranked = self._rankings(prompt_ids, answer.ids) if self.token_form == "llama" and with_logprobs and prompt_ids is not None else [None] * len(answer.ids)
        entries = self._rendered(answer.ids, ranked)
        ends = [last for last in range(len(answer.ids))] if self.token_form != "llama" else None
        if ends is None:
            raws = [self.tokenizer.token_bytes(t) for t in answer.ids]
            body_len = len(answer.ids) - (1 if answer.ids and answer.ids[-1] == self.tokenizer.eos_id else 0)
            ends = [last for _, last in forms.llama_entries(raws[:body_len])] + ([body_len] if body_len < len(answer.ids) else [])
        steps = answer.steps
        k = 0
        for entry, last in zip(entries, ends):
            while k <= last and k < len(steps):
                shown += steps[k]
                k += 1
            # Stop truncation caps what is visible.
            visible = final[: len(shown)]
            if with_logprobs:
                if content_format or self.token_form == "llama":
                    logprobs = {"content": self._content_logprobs([entry])}
                else:
                    logprobs = {"tokens": [entry[1]], "token_logprobs": [None], "top_logprobs": [None]}
                chunks.append(self._chunk(visible[len(sent) :], None, logprobs))
                if self.token_form == "llama" and self.timings_per_token and body.get("timings_per_token"):
                    chunks[-1]["timings"] = {"predicted_n": last + 1}  # llama.cpp: tokens generated so far
                sent = visible
            elif len(visible) > len(sent):
                chunks.append(self._chunk(visible[len(sent) :], None))
                if self.token_form == "llama" and self.timings_per_token and body.get("timings_per_token"):
                    chunks[-1]["timings"] = {"predicted_n": last + 1}
                sent = visible
        if self.speculates and with_logprobs and not content_format and self.token_form != "llama":
            chunks = _merged_steps(chunks, self._accepted_runs(prompt_ids or [], answer.ids))
        if len(final) > len(sent):
            chunks.append(self._chunk(final[len(sent) :], None))
        last_chunk = self._chunk("", answer.finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            last_chunk["usage"] = usage
        chunks.append(last_chunk)
        return chunks

    def _accepted_runs(self, prompt_ids: list[int], ids: list[int]) -> list[int]:
        """How many of ``ids`` each step of a self-speculating server sends:
        the first alone (prefill), then each step its draft's accepted
        tokens plus its own."""
        runs, i = [1], 1
        while i < len(ids):
            context = prompt_ids + ids[:i]
            draft = _ngram_draft(context, self.speculates)
            accepted = 0
            while accepted < len(draft) and i + accepted < len(ids) and draft[accepted] == ids[i + accepted]:
                accepted += 1
            step = min(accepted + 1, len(ids) - i)
            runs.append(step)
            i += step
        return runs

    def _chunk(self, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
        chunk = {"id": "cmpl-fake", "object": "text_completion", "model": self.model_name,
                 "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
        if self.token_form == "llama":
            chunk["system_fingerprint"] = LLAMA_FINGERPRINT  # llama.cpp's build info, in every chunk
        return chunk

    def _chat_chunks(self, answer: Answer, usage: dict, body: dict, prompt_ids: list[int] | None = None) -> list[dict]:
        """The completions stream's pieces, as chat deltas."""
        chunks = [{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model_name,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}]}]
        for chunk in self._stream_chunks(answer, usage, dict(body, logprobs=1 if body.get("logprobs") else None), content_format=True, prompt_ids=prompt_ids):
            choice = chunk["choices"][0]
            delta = {"content": choice["text"]} if choice["text"] or choice["finish_reason"] is None else {}
            converted = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model_name,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"], "logprobs": choice["logprobs"]}]}
            if "usage" in chunk:
                converted["usage"] = chunk["usage"]
            chunks.append(converted)
        return chunks
