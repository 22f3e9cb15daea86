"""How real servers show tokens that split characters: pure functions over bytes.

Each function takes the raw bytes of a token sequence (what the model
produced) and returns what a server would put in its logprobs, written from
those servers' own sources (vLLM 0.32 ``v1/engine/logprobs.py`` and
``v1/engine/detokenizer.py``, llama.cpp ``tools/server``):

* ``"vllm-legacy"``: each token decoded alone, broken bytes as U+FFFD (older
  vLLM, HF ``decode([id])``);
* ``"vllm"``: vLLM 0.32's ``_correct_decoded_token``: a token whose text
  ends in U+FFFD is decoded again with up to 4 tokens before it; the pieces
  before it that also end in U+FFFD (which showed ``""``) are put on it;
  ``""`` when nothing completes it;
* ``"vllm-0.10"``: the first ``_correct_decoded_token`` (vLLM 0.10's
  ``v1/engine/logprobs.py``): a token whose text ends in U+FFFD is decoded
  again with the entry before it in the same list (the sampled token, then
  the top-k), then with the previous position's sampled token too; ``""``
  if that still ends in U+FFFD.  The list's strings go into a dict keyed by
  token id, so under greedy (sampled = top-1) the sampled token's string is
  its top-1 entry's, decoded after itself: every token whose own text ends
  in U+FFFD, the one that completes a character included, reads ``""``.
  Its prompt logprobs are not corrected (each token decoded alone);
* ``"openai"``: ``"bytes:\\\\xe4\\\\xb8"`` for a token that is not UTF-8 alone;
* ``"token-id"``: vLLM's ``--return-tokens-as-token-ids``;
* ``"llama"``: llama.cpp's server sends (and lists in logprobs) a token only
  once the text is whole again; the tokens before it are left out and the
  listed one shows all the text since the last one.

Text is shown as vLLM's incremental detokenizer and llama.cpp show it: a
token that leaves the text inside a character shows nothing, and the token
that completes it shows everything held back (:func:`visible_steps`).
"""

from __future__ import annotations

FORMS = ("vllm-legacy", "vllm", "vllm-0.10", "openai", "token-id", "llama")
OPAQUE = "\ufffd"


def lossy(raw: bytes) -> str:
    """Bytes as tokenizers decode them: each broken sequence as U+FFFD."""
    return raw.decode("utf-8", "replace")


def is_whole(raw: bytes) -> bool:
    """Do these bytes end on a character boundary (nothing left to complete)?"""
    return not lossy(raw).endswith(OPAQUE)


def vllm_corrected(raws: list[bytes], k: int) -> str:
    """Token ``k``'s string in vLLM 0.32's logprobs, ``raws[:k]`` being the
    tokens sampled before it (only those of this answer: the prompt is not
    its context)."""
    alone = lossy(raws[k])
    if not alone.endswith(OPAQUE):
        return alone
    context = raws[max(0, k - 4) : k]
    for num_ctx in range(1, len(context) + 1):
        ctx = context[-num_ctx:]
        full = lossy(b"".join(ctx) + raws[k])
        if full.endswith(OPAQUE):
            continue
        clean_end = len(ctx)
        for j in range(len(ctx) - 1, -1, -1):
            if lossy(ctx[j]).endswith(OPAQUE):
                clean_end = j
            else:
                break
        clean = lossy(b"".join(ctx[:clean_end]))
        if full.startswith(clean):
            return full[len(clean) :]
        common = 0
        for a, b in zip(clean, full):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


def vllm010_corrected(raws: list[bytes], k: int, entries: list[tuple[int, bytes]]) -> dict[int, str]:
    """Position ``k``'s strings in vLLM 0.10's logprobs, by token id:
    ``entries`` is its list as the sampler gives it, (id, bytes) of the
    sampled token first, then the top-k by rank; ``raws[:k]`` the tokens
    sampled before it in this answer.  A later entry of the same id
    overwrites an earlier one's string (the dict is keyed by id)."""
    strings: dict[int, str] = {}
    for idx, (token_id, raw) in enumerate(entries):
        text = lossy(raw)
        if text.endswith(OPAQUE):
            text = _vllm010_correct(raws[:k], entries[idx - 1][1] if idx else None, raw)
        strings[token_id] = text
    return strings


def _vllm010_correct(before: list[bytes], previous_entry: bytes | None, raw: bytes) -> str:
    if previous_entry is not None:
        text = lossy(previous_entry + raw)
        if not text.endswith(OPAQUE):
            return text
    if before:  # the previous position's sampled token
        text = lossy(before[-1] + (previous_entry or b"") + raw)
        if not text.endswith(OPAQUE):
            return text
    return ""


def token_string(form: str, raws: list[bytes], k: int, token_id: int) -> str:
    """Token ``k``'s string in ``form`` (not "llama": see :func:`llama_entries`)."""
    if form == "vllm":
        return vllm_corrected(raws, k)
    if form == "vllm-0.10":
        # Greedy: the sampled token is the top-1 too, whose entry wins.
        return vllm010_corrected(raws, k, [(token_id, raws[k])] * 2)[token_id]
    if form == "openai":
        text = lossy(raws[k])
        return text if OPAQUE not in text else "bytes:" + "".join(f"\\x{b:02x}" for b in raws[k])
    if form == "token-id":
        return f"token_id:{token_id}"
    return lossy(raws[k])


def candidate_string(form: str, raws: list[bytes], k: int, raw: bytes, token_id: int) -> str:
    """How a *candidate* for position ``k`` (a top_logprobs key) is shown,
    after the sampled ``raws[:k]``."""
    if form == "llama":
        return _valid_prefix(raw)  # llama.cpp cuts a candidate's text at its last whole character
    return token_string(form, raws[:k] + [raw], k, token_id)


def visible_steps(raws: list[bytes]) -> list[str]:
    """The text each token makes visible ("" while a character is unfinished)."""
    steps, held = [], b""
    for raw in raws:
        held += raw
        if is_whole(held):
            steps.append(lossy(held))
            held = b""
        else:
            steps.append("")
    return steps


def held_tail(raws: list[bytes]) -> bytes:
    """The bytes of an unfinished character at the end, never made visible."""
    held = b""
    for raw in raws:
        held = b"" if is_whole(held + raw) else held + raw
    return held


def llama_entries(raws: list[bytes]) -> list[tuple[int, int]]:
    """llama.cpp's logprobs entries as (first token, last token) index pairs:
    one per token that left the text whole, covering the tokens left out
    before it.  Tokens of an unfinished character at the end have none."""
    entries, first, held = [], 0, b""
    for k, raw in enumerate(raws):
        held += raw
        if is_whole(held):
            entries.append((first, k))
            first, held = k + 1, b""
    return entries


def _valid_prefix(raw: bytes) -> str:
    """llama.cpp's ``validate_utf8`` (an unfinished character at the end is
    cut off), then its JSON writer's replacement of other broken bytes."""
    for back in range(1, min(4, len(raw)) + 1):
        c = raw[-back]
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
        if need and back < need:
            return lossy(raw[:-back])
    return lossy(raw)
