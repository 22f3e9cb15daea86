"""What a target server answers, read: the parsed types and the pure
functions that read ``/v1/completions`` and ``/v1/chat/completions``
answers and stream chunks (usage, logprobs in either format, echoed
prompts, carried text).  No HTTP here: :mod:`._target` makes the calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ._exceptions import TargetResponseError
from ._resume_align import Aligned, align_prompt
from ._tokens import AlignmentError, Unit, align_tokens


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Predicted Outputs (``usage.completion_tokens_details``), when reported.
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    # Of prompt_tokens, what the server read from its prefix cache (OpenAI's
    # and vLLM's ``prompt_tokens_details.cached_tokens``, DeepSeek's
    # ``prompt_cache_hit_tokens``), when reported.
    cached_tokens: int | None = None


@dataclass
class Completion:
    """One parsed ``/v1/completions`` answer.

    ``text`` is the generated part only (any echoed prompt removed).
    ``prompt_units`` / ``units`` are the aligned tokens of the sent prompt
    (echo only) and of the generated text; None when the server sent no
    logprobs.  ``eos`` is True when the target ended its text.
    """

    text: str
    finish_reason: str | None
    usage: Usage
    elapsed: float
    units: list[Unit] | None = None
    prompt_units: list[Unit] | None = None
    echoed: bool = False
    # Chat only: vLLM's ``prompt_logprobs`` as sent (see ``chat``).
    prompt_logprobs: list | None = None
    # The echoed prompt's alignment, for the next round to pick up (``_resume_align``).
    prompt_aligned: Aligned | None = None

    @property
    def eos(self) -> bool:
        return self.finish_reason == "stop"


@dataclass
class StreamPiece:
    """Text from one stream chunk, with its token strings when logprobs were asked."""

    text: str
    tokens: list[str] | None = None
    # Each token's own length in bytes, where the server says (llama.cpp's
    # top candidates carry their bytes; its stop window counts them).
    own_bytes: list[int | None] | None = None
    # Tokens generated so far, where the server says (llama.cpp's timings per
    # token): it lists only tokens that finish a character.
    generated: int | None = None
    # The chunk also ended the stream (its text may stop short of its
    # tokens' ends: a stop string cut it).
    final: bool = False


@dataclass
class StreamEnd:
    finish_reason: str | None
    usage: Usage = field(default_factory=Usage)



def message_chars(messages: list[dict[str, Any]]) -> int:
    """The characters of a conversation's contents (to estimate its prompt tokens)."""
    return sum(len(m.get("content")) if isinstance(m.get("content"), str) else len(json.dumps(m.get("content"))) for m in messages)


def _shown_tokens(completion: Completion) -> int:
    """The tokens an answer showed: its units where it had logprobs, else ~4 characters a token."""
    return len(completion.units) if completion.units is not None else max(1, round(len(completion.text) / 4))


def _logprob_blocks(data: Any) -> list[dict]:
    """The ``logprobs`` objects of an answer or a stream chunk."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return [c["logprobs"] for c in choices or [] if isinstance(c, dict) and isinstance(c.get("logprobs"), dict)]


def _token_strings(data: Any) -> list[str]:
    """Every token string in an answer's logprobs (tokens and top entries)."""
    strings: list[str] = []
    for lp in _logprob_blocks(data):
        strings += [t for t in lp.get("tokens") or [] if isinstance(t, str)]
        strings += [k for top in lp.get("top_logprobs") or [] if isinstance(top, dict) for k in top]
        for entry in lp.get("content") or []:
            if isinstance(entry, dict):
                strings += [entry.get("token")] + [t.get("token") for t in entry.get("top_logprobs") or [] if isinstance(t, dict)]
    return [s for s in strings if isinstance(s, str)]


def _rename_tokens(data: Any, names: dict[str, str]) -> None:
    """Replace token strings in place (keys of top dicts too)."""
    for lp in _logprob_blocks(data):
        if isinstance(lp.get("tokens"), list):
            lp["tokens"] = [names.get(t, t) if isinstance(t, str) else t for t in lp["tokens"]]
        if isinstance(lp.get("top_logprobs"), list):
            lp["top_logprobs"] = [{names.get(k, k): v for k, v in top.items()} if isinstance(top, dict) else top for top in lp["top_logprobs"]]
        for entry in lp.get("content") or []:
            if isinstance(entry, dict):
                entry["token"] = names.get(entry.get("token"), entry.get("token"))
                for t in entry.get("top_logprobs") or []:
                    if isinstance(t, dict):
                        t["token"] = names.get(t.get("token"), t.get("token"))


def _usage(raw: Any) -> Usage | None:
    """The ``usage`` object, if there is one (a wrong type raises TypeError or ValueError)."""
    if not raw:
        return None
    usage = Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0))
    prompt_details = raw.get("prompt_tokens_details")
    if isinstance(prompt_details, dict) and prompt_details.get("cached_tokens") is not None:
        usage.cached_tokens = int(prompt_details["cached_tokens"])
    elif raw.get("prompt_cache_hit_tokens") is not None:
        usage.cached_tokens = int(raw["prompt_cache_hit_tokens"])
    details = raw.get("completion_tokens_details")
    if isinstance(details, dict):
        for name in ("accepted_prediction_tokens", "rejected_prediction_tokens"):
            if details.get(name) is not None:
                setattr(usage, name, int(details[name]))
    return usage


def _parse_chunk(chunk: Any, with_tokens: bool) -> tuple[list[StreamPiece], str | None, Usage | None]:
    """One server-sent event's pieces, finish reason and usage; anything not
    shaped as the API describes raises TypeError, ValueError or the like."""
    pieces: list[StreamPiece] = []
    finish = None
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        if not isinstance(text, str):
            raise TypeError("text is not a string")
        tokens = _logprob_lists(choice.get("logprobs"))[0] if with_tokens else None
        if text or tokens:
            pieces.append(StreamPiece(text, tokens, own_bytes(choice.get("logprobs")) if with_tokens else None, final=bool(choice.get("finish_reason"))))
        finish = choice.get("finish_reason") or finish
    timings = chunk.get("timings")
    if pieces and isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
        pieces[-1].generated = timings["predicted_n"]
    return pieces, finish, _usage(chunk.get("usage"))


def own_bytes(logprobs: Any) -> list[int | None] | None:
    """Per ``content`` entry, the chosen token's own length in bytes: its top
    candidate's ``bytes`` (greedy: the token itself).  llama.cpp lists an
    entry per token that finishes a character, with the text of the pieces
    before it, so this is the only place the token's own size shows."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    sizes: list[int | None] = []
    for entry in content:
        tops = [t for t in (entry.get("top_logprobs") or []) if isinstance(t, dict) and isinstance(t.get("bytes"), list)] if isinstance(entry, dict) else []
        best = max(tops, key=lambda t: t.get("logprob") or float("-inf"), default=None)
        sizes.append(len(best["bytes"]) if best is not None else None)
    return sizes


def _logprob_lists(logprobs: Any) -> tuple[list[str] | None, list, list]:
    """Token strings, their logprobs and top dicts, from either the legacy
    completions format or the ``content`` list format (llama.cpp, chat)."""
    if not isinstance(logprobs, dict):
        return None, [], []
    if isinstance(logprobs.get("tokens"), list):
        tokens = logprobs["tokens"]
        n = len(tokens)
        lps = list(logprobs.get("token_logprobs") or [None] * n)
        tops = list(logprobs.get("top_logprobs") or [None] * n)
        if len(lps) != n or len(tops) != n:
            raise TargetResponseError("logprobs lists have different lengths")
        if not all(top is None or isinstance(top, dict) for top in tops):
            raise TypeError("top_logprobs entries are not objects")
        return [str(t) for t in tokens], lps, tops
    content = logprobs.get("content")
    if isinstance(content, list):
        tokens = [str(c.get("token", "")) for c in content]
        lps = [c.get("logprob") for c in content]
        tops = [{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} or None for c in content]
        return tokens, lps, tops
    return None, [], []


def _align_generated(text: str, tokens: list[str], lps: list, tops: list) -> list[Unit]:
    return fold_specials(align_tokens(text, tokens, lps, tops))


def fold_specials(units: list[Unit]) -> list[Unit]:
    """Generated units without zero-width special tokens.  One inside the text
    still counts against max_tokens, so it joins the unit after it; trailing
    ones (the end-of-text token) are left out: ``Completion.eos`` says so."""
    folded: list[Unit] = []
    held = 0
    for unit in units:
        if unit.special:
            held += unit.tokens
            continue
        if held:
            steps = ("",) * held + unit.steps if unit.steps is not None else None
            sizes = (0,) * held + unit.sizes if unit.sizes is not None else None
            unit = replace(unit, tokens=unit.tokens + held, matches=False, correction=None, steps=steps, sizes=sizes)
            held = 0
        folded.append(unit)
    return folded


def _without_carried(full: str, carried: str, tokens: list[str] | None, lps: list, tops: list) -> tuple[str, list[str] | None, list, list, int]:
    """An answer without ``carried``, the text it wrote again first, and
    without the tokens that wrote it (whole tokens, or the answer is
    malformed); the last item is how many tokens those were.  Pure.

    >>> _without_carried("\\n  x", "\\n  ", ["\\n", "  ", "x"], [0, 0, -1], [None, None, None])
    ('x', ['x'], [-1], [None], 2)
    """
    if not full.startswith(carried):
        raise ValueError("the answer does not write the trimmed end of the message again")
    if tokens is None:
        return full[len(carried):], None, lps, tops, 0
    k = covered = 0
    while k < len(tokens) and covered < len(carried):
        covered += len(tokens[k])
        k += 1
    if covered != len(carried):
        raise ValueError("the answer wrote the trimmed end of the message again in other tokens")
    return full[len(carried):], tokens[k:], lps[k:], tops[k:], k


def _split_echo(full: str, prompt_len: int, tokens: list[str], lps: list, tops: list, usage: Usage,
                earlier: Aligned | None = None, stable: int | None = None) -> tuple[Aligned, list[Unit]]:
    """Split echoed logprobs into the prompt's alignment and the generated
    units (the prompt picked up from ``earlier``: ``_resume_align``).

    The server tokenized the prompt on its own, so its tokens end exactly at
    ``prompt_len``; ``usage.completion_tokens`` says how many came after.
    """
    n_generated = usage.completion_tokens if usage.completion_tokens else None
    split = len(tokens) - n_generated if n_generated is not None and n_generated <= len(tokens) else None
    if split is not None and usage.prompt_tokens and split != usage.prompt_tokens:
        # One string per prompt token, each with that position's top choice:
        # a list of another length can't say which position a top belongs to.
        raise AlignmentError(f"{split} token strings for a prompt of {usage.prompt_tokens} tokens")
    if split is None:  # no usage: find the token that ends at the prompt's end
        units = align_tokens(full, tokens, lps, tops)
        prompt_units = [u for u in units if u.end <= prompt_len and not (u.special and u.start == prompt_len)]
        return Aligned(full[:prompt_len], b"", [], prompt_units), fold_specials(units[len(prompt_units):])
    aligned = align_prompt(full[:prompt_len], tokens[:split], lps[:split], tops[:split], earlier, stable)
    generated = align_tokens(full[prompt_len:], tokens[split:], lps[split:], tops[split:])
    return aligned, fold_specials(generated)
