"""One-call scoring forms other than vLLM's completions ``echo``, turned into
the shape that one takes (pure functions).

vLLM answers ``/v1/completions`` with ``echo`` and ``logprobs`` with the
prompt's tokens, their logprobs and their top candidates ahead of the
answer's (the legacy completions ``logprobs`` lists); everything that reads
an echo (``_target._split_echo``) reads that.  SGLang's ``/v1/completions``
echo gives no prompt logprobs (its documentation warns that echo does not
go with logprobs); its native ``/generate`` at the server's root scores the
prompt instead: ``return_logprob`` with ``logprob_start_len`` 0 lists
``[logprob, token_id, token_text]`` for every prompt token and every
generated one, and ``top_logprobs_num`` the best few at each position.
"""

from __future__ import annotations

from typing import Any

SCORING_FORMS = ("echo", "sglang")


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
