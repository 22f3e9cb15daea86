"""One-call scoring forms other than vLLM's completions ``echo``, turned into
the shape that one takes (pure functions).

vLLM answers ``/v1/completions`` with ``echo`` and ``logprobs`` with the
prompt's tokens, their logprobs and their top candidates ahead of the
answer's (the legacy completions ``logprobs`` lists); everything that reads
an echo (``_target_answers._split_echo``) reads that.  SGLang's ``/v1/completions``
echo gives no prompt logprobs (its documentation warns that echo does not
go with logprobs); its native ``/generate`` at the server's root scores the
prompt instead: ``return_logprob`` with ``logprob_start_len`` 0 lists
``[logprob, token_id, token_text]`` for every prompt token and every
generated one, and ``top_logprobs_num`` the best few at each position.
TGI's ``/generate`` with ``details`` and ``decoder_input_details`` lists
each prompt token with its own logprob (``details.prefill``), and Together's
completions with ``echo`` and ``logprobs`` list them beside the choices
(``prompt[0].logprobs``), both without the target's own choice at each
position.  A token whose probability is above one half is the target's
choice all the same (no other can be more likely), so those positions are
read as confirmed (``proven_top``); any other says nothing, and the round
ends there, as at a disagreement whose correction is unreadable.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ._exceptions import TargetResponseError
from ._resume_align import Aligned, align_prompt
from ._tokens import AlignmentError, Unit

if TYPE_CHECKING:
    from ._target_answers import Completion

# The forms a scoring call may take, tried in this order by the probe
# (``server_probe.scoring_call``).  "together" is asked as "echo" is and
# named where its answer comes in Together's shape.
SCORING_FORMS = ("echo", "sglang", "tgi")
# A logprob above this proves its token the most likely (p > 0.51: above
# one half with a margin for the server's rounding).
PROVEN_LOGPROB = math.log(0.51)
_FINISH = {"eos_token": "stop", "stop_sequence": "stop", "eos": "stop"}


def proven_top(token: str, logprob: Any) -> dict[str, float] | None:
    """A position's top candidates as far as its own logprob proves them:
    the token alone where it is more likely than all others together.

    >>> proven_top("a", -0.1), proven_top("a", -0.9), proven_top("a", None)
    ({'a': -0.1}, None, None)
    """
    return {token: float(logprob)} if isinstance(logprob, (int, float)) and logprob > PROVEN_LOGPROB else None


def sglang_body(prompt: str, max_tokens: int, logprobs: int | None, stop: list[str] | None) -> dict[str, Any]:
    """A temperature-0 ``/generate`` request that scores all of ``prompt``.

    >>> sglang_body("ab", 1, None, None)["sampling_params"]
    {'max_new_tokens': 1, 'temperature': 0}
    """
    params: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": 0}
    if stop:
        params["stop"] = stop
    return {"text": prompt, "sampling_params": params, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": max(1, logprobs or 1), "return_text_in_logprobs": True}


def sglang_as_echo(prompt: str, data: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``/generate`` answer as vLLM's completions echo answer: the
    text is the prompt and the answer, the logprobs the prompt's tokens then
    the answer's.  A malformed answer raises TypeError, KeyError or
    ValueError (the caller reports it as a malformed completion).

    >>> answer = {"text": " c", "meta_info": {"prompt_tokens": 2, "completion_tokens": 1, "finish_reason": {"type": "length"},
    ...     "input_token_logprobs": [[None, 5, "a"], [-0.5, 6, "b"]], "output_token_logprobs": [[-0.1, 7, " c"]],
    ...     "input_top_logprobs": [None, [[-0.5, 6, "b"]]], "output_top_logprobs": [[[-0.1, 7, " c"]]]}}
    >>> echo = sglang_as_echo("ab", answer)
    >>> echo["choices"][0]["text"], echo["choices"][0]["logprobs"]["tokens"], echo["choices"][0]["logprobs"]["top_logprobs"]
    ('ab c', ['a', 'b', ' c'], [None, {'b': -0.5}, {' c': -0.1}])
    >>> echo["choices"][0]["finish_reason"], echo["usage"]["prompt_tokens"]
    ('length', 2)
    """
    meta = data["meta_info"]
    text = data["text"]
    if not isinstance(text, str) or not isinstance(meta, dict):
        raise TypeError("text is not a string or meta_info not an object")
    entries = list(meta["input_token_logprobs"]) + list(meta["output_token_logprobs"])
    tops = list(meta.get("input_top_logprobs") or [None] * len(meta["input_token_logprobs"]))
    tops += list(meta.get("output_top_logprobs") or [None] * len(meta["output_token_logprobs"]))
    if len(tops) != len(entries) or any(not isinstance(e, list) or len(e) < 3 or not isinstance(e[2], str) for e in entries):
        raise ValueError("token logprobs without their text (return_text_in_logprobs) or of unequal lengths")
    finish = meta.get("finish_reason")
    finish = finish.get("type") if isinstance(finish, dict) else finish
    logprobs = {
        "tokens": [e[2] for e in entries],
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": [None if top is None else {c[2]: c[0] for c in top} for top in tops],
    }
    prompt_tokens, completion_tokens = int(meta["prompt_tokens"]), int(meta["completion_tokens"])
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if meta.get("cached_tokens"):
        usage["prompt_tokens_details"] = {"cached_tokens": int(meta["cached_tokens"])}
    return {"choices": [{"index": 0, "text": prompt + text, "finish_reason": finish, "logprobs": logprobs}], "usage": usage}


def tgi_body(prompt: str, max_tokens: int, logprobs: int | None, stop: list[str] | None) -> dict[str, Any]:
    """A greedy TGI ``/generate`` request that lists the prompt's tokens
    (``decoder_input_details``) and the answer's, with the best few of
    each answer position (``top_n_tokens``).

    >>> tgi_body("ab", 2, None, ["x"])["parameters"]["stop"]
    ['x']
    """
    params: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False, "details": True, "decoder_input_details": True,
                              "top_n_tokens": max(1, logprobs or 1)}
    if stop:
        params["stop"] = stop
    return {"inputs": prompt, "parameters": params}


def tgi_as_echo(prompt: str, data: dict[str, Any]) -> dict[str, Any]:
    """TGI's ``/generate`` answer as vLLM's completions echo answer (see
    the module docstring for what its prompt logprobs prove).  Malformed:
    TypeError, KeyError or ValueError.

    >>> answer = {"generated_text": " c", "details": {"finish_reason": "eos_token", "generated_tokens": 2,
    ...     "prefill": [{"id": 5, "text": "a", "logprob": None}, {"id": 6, "text": "b", "logprob": -0.2}],
    ...     "tokens": [{"id": 7, "text": " c", "logprob": -0.1, "special": False}, {"id": 2, "text": "</s>", "logprob": -0.3, "special": True}],
    ...     "top_tokens": [[{"id": 7, "text": " c", "logprob": -0.1}], [{"id": 2, "text": "</s>", "logprob": -0.3}]]}}
    >>> echo = tgi_as_echo("ab", answer)
    >>> echo["choices"][0]["text"], echo["choices"][0]["logprobs"]["top_logprobs"], echo["choices"][0]["finish_reason"]
    ('ab c', [None, {'b': -0.2}, {' c': -0.1}, {'</s>': -0.3}], 'stop')
    """
    details, text = data["details"], data["generated_text"]
    if not isinstance(text, str) or not isinstance(details, dict):
        raise TypeError("generated_text is not a string or details not an object")
    prefill, generated = list(details["prefill"]), list(details["tokens"])
    tops = details.get("top_tokens") or [None] * len(generated)
    if len(tops) != len(generated) or any(not isinstance(t.get("text"), str) for t in prefill + generated):
        raise ValueError("token details without their text, or top tokens of another length")
    top_lists = [proven_top(t["text"], t.get("logprob")) for t in prefill]
    top_lists += [{c["text"]: c["logprob"] for c in top} if top else proven_top(t["text"], t.get("logprob")) for t, top in zip(generated, tops)]
    logprobs = {"tokens": [t["text"] for t in prefill + generated], "token_logprobs": [t.get("logprob") for t in prefill + generated],
                "top_logprobs": top_lists}
    finish = details.get("finish_reason")
    usage = {"prompt_tokens": len(prefill), "completion_tokens": int(details["generated_tokens"]),
             "total_tokens": len(prefill) + int(details["generated_tokens"])}
    return {"choices": [{"index": 0, "text": prompt + text, "finish_reason": _FINISH.get(finish, finish), "logprobs": logprobs}], "usage": usage}


def together_as_echo(prompt: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """Together's completions answer to ``echo`` with ``logprobs`` (the
    prompt's tokens in ``prompt[0].logprobs``, the answer's in the choice)
    as vLLM's; None where the answer is not in that shape (vLLM's own).
    Top candidates where listed, else what each logprob proves.

    >>> answer = {"prompt": [{"text": "ab", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [None, -0.2]}}],
    ...     "choices": [{"text": " c", "finish_reason": "length", "logprobs": {"tokens": [" c"], "token_logprobs": [-0.1]}}],
    ...     "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    >>> echo = together_as_echo("ab", answer)
    >>> echo["choices"][0]["text"], echo["choices"][0]["logprobs"]["top_logprobs"]
    ('ab c', [None, {'b': -0.2}, {' c': -0.1}])
    """
    parts = data.get("prompt")
    if not isinstance(parts, list) or not parts or not isinstance(parts[0], dict) or not isinstance(parts[0].get("logprobs"), dict):
        return None
    choice = data["choices"][0]
    given, answered = parts[0]["logprobs"], choice.get("logprobs") or {}
    listed = []
    for part in (given, answered):
        tokens, lps = list(part.get("tokens") or []), list(part.get("token_logprobs") or [])
        tops = part.get("top_logprobs")
        tops = list(tops) if isinstance(tops, list) and len(tops) == len(tokens) else [proven_top(t, lp) for t, lp in zip(tokens, lps)]
        if len(lps) != len(tokens):
            raise ValueError("token logprobs of another length than the tokens")
        listed.append((tokens, lps, tops))
    text = choice["text"]
    if not isinstance(text, str):
        raise TypeError("text is not a string")
    logprobs = {"tokens": listed[0][0] + listed[1][0], "token_logprobs": listed[0][1] + listed[1][1], "top_logprobs": listed[0][2] + listed[1][2]}
    finish = choice.get("finish_reason")
    return {"choices": [{"index": 0, "text": prompt + text, "finish_reason": _FINISH.get(finish, finish), "logprobs": logprobs}],
            "usage": data.get("usage")}


# -- vLLM's prompt_logprobs on chat, as echo units (pure) ------------------------------


def prompt_positions(entries: list[Any]) -> tuple[list[str | None], list[float | None], list[dict[str, float] | None]]:
    """Per prompt position: the prompt's own token, its logprob, and a top
    dict {token: logprob} holding the target's first choice.

    vLLM keys each position by token id; with ``prompt_logprobs=1`` it holds
    the prompt's token and, when that was not the first choice, the first
    choice too (``rank`` 1).  The first position has no entry (None).

    >>> prompt_positions([None, {"7": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}},
    ...                   {"9": {"logprob": -2.0, "rank": 3, "decoded_token": "b"}, "4": {"logprob": -0.5, "rank": 1, "decoded_token": "c"}}])
    ([None, 'a', 'b'], [None, -0.1, -2.0], [None, {'a': -0.1}, {'c': -0.5, 'b': -2.0}])
    """
    tokens: list[str | None] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for entry in entries:
        if not entry:
            tokens.append(None), lps.append(None), tops.append(None)
            continue
        if not isinstance(entry, dict):
            raise TypeError("a prompt_logprobs entry is not an object")
        items = [(str(v.get("decoded_token") or ""), float(v["logprob"]), v.get("rank")) for v in entry.values()]
        own = next((item for item in items if item[2] != 1), items[0]) if len(items) > 1 else items[0]
        best = next((item for item in items if item[2] == 1), own)
        tokens.append(own[0])
        lps.append(own[1])
        tops.append({best[0]: best[1], own[0]: own[1]} if best is not own else {own[0]: own[1]})
    return tokens, lps, tops


def content_start(tokens: list[str | None], content: str) -> int | None:
    """The index of the prompt token where ``content`` (the end of the prompt)
    begins, when the token strings spell it exactly from a token boundary;
    None otherwise (a token across its start, or unreadable token strings)."""
    total = 0
    for j in range(len(tokens) - 1, -1, -1):
        token = tokens[j]
        if token is None:
            return None
        total += len(token)
        if total >= len(content):
            if total == len(content) and "".join(t or "" for t in tokens[j:]) == content:
                return j
            return None
    return None


def prompt_aligned(c: Completion, content: str, earlier: Aligned | None, stable: int | None) -> Aligned | None:
    """The prefilled message's alignment from vLLM's ``prompt_logprobs``
    (picked up from ``earlier``: ``_resume_align``); None where its tokens
    can't be found exactly."""
    if c.prompt_logprobs is None:
        return None
    try:
        tokens, lps, tops = prompt_positions(c.prompt_logprobs)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise TargetResponseError(f"malformed prompt_logprobs: {type(exc).__name__}") from None
    start = content_start(tokens, content)
    try:
        if start is None:
            raise AlignmentError("the message's tokens are not readable")
        return align_prompt(content, [t or "" for t in tokens[start:]], lps[start:], tops[start:], earlier, stable)
    except AlignmentError:
        return None


def prompt_units(c: Completion, content: str, offset: int) -> list[Unit] | None:
    """Echo units for the prefilled message, placed at ``offset`` (the head's
    length) in the orchestrator's text.  When the message's tokens can't be
    found exactly, one unit spans it all: the verifier then asks plainly."""
    if c.prompt_logprobs is None:
        return None
    if c.prompt_aligned is None:
        tokens = c.prompt_logprobs
        return [Unit(content, max(1, len(tokens)), offset, matches=False)]
    return [replace(u, start=u.start + offset) for u in c.prompt_aligned.units]
