"""The fake server's routes: which request goes to which endpoint, the
refusals real servers answer with, and the completions, ``/tokenize`` and
native ``/generate`` (SGLang, TGI) endpoints.  (Chat: :mod:`.fake_chat`.)

A mixin of :class:`.fake_target.FakeTarget`; it reads the target's fields
that say which endpoints it offers and how (``echo``, ``api_key``,
``context_window``, ``completions``, ``tokenize``, ...).
"""

from __future__ import annotations

import json
from typing import Any

from .fake_decode import stop_list
from .fake_stream import LLAMA_FINGERPRINT


class Routes:
    """Every request's way from method, path and body to (status, payload, stream chunks)."""

    def _dispatch(self, method: str, path: str, headers: Any, content: bytes) -> tuple[int, dict, list | None]:
        try:
            status, payload, chunks = self._answer(method, path, headers, content)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # A field of the wrong type: real servers validate the request
            # (vLLM with pydantic) and answer 400, never 500.
            status, payload, chunks = self._error(400, f"Invalid request: {type(exc).__name__}", "BadRequestError")
        if self.leaky_errors and status >= 400:
            payload["error"]["message"] += f" (request had authorization: {headers.get('authorization')})"
        return status, payload, chunks

    def _answer(self, method: str, path: str, headers: Any, content: bytes) -> tuple[int, dict, list | None]:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return self._error(401, "Invalid API key.", "AuthenticationError")
        if method == "GET" and path.endswith("/models"):
            listed = {"id": self.model_name, "object": "model"}
            if self.context_window is not None:
                listed["max_model_len"] = self.context_window  # as vLLM lists it
            return 200, {"object": "list", "data": [listed]}, None
        if not self.tokenize and path.endswith("tokenize"):
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        if method == "POST" and path.endswith("/tokenize") and not path.startswith("/v1"):
            return self._tokenize(content)  # vLLM's, at the server's root
        if method == "POST" and path.endswith("/detokenize") and not path.startswith("/v1"):
            ids = json.loads(content or b"{}").get("tokens") or []
            return 200, {"prompt": self.tokenizer.decode(int(i) for i in ids)}, None
        if method == "POST" and path.endswith("/generate") and not path.startswith("/v1") and (self.sglang_generate or self.tgi_generate):
            body = json.loads(content or b"{}")
            if self.tgi_generate:
                return self._tgi(body) if isinstance(body.get("inputs"), str) else self._error(422, "Failed to deserialize the JSON body: missing field `inputs`", "validation")
            return self._sglang(body)
        if method != "POST" or not path.endswith("/completions"):
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        try:
            body = json.loads(content or b"{}")
        except ValueError:
            return self._error(400, "Invalid JSON body.", "BadRequestError")
        if not isinstance(body, dict):
            return self._error(400, "The body must be a JSON object.", "BadRequestError")
        if body.get("model") != self.model_name:
            return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if path.endswith("/chat/completions"):
            return self._chat(body)
        if not self.completions:
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        if body.get("echo") and self.echo == "refuse":
            return self._error(400, "echo is not supported for this model", "BadRequestError")
        return self._complete(body)

    def _error(self, status: int, message: str, kind: str) -> tuple[int, dict, None]:
        return status, {"error": {"message": message, "type": kind, "code": status}}, None

    def _too_long(self, prompt_ids: list[int], max_tokens: int):
        """vLLM's 400 for a prompt and max_tokens beyond the context window (where one is set)."""
        if self.context_window is None or len(prompt_ids) + max_tokens <= self.context_window:
            return None
        return self._error(
            400,
            f"This model's maximum context length is {self.context_window} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
            "BadRequestError",
        )

    def _tokenize(self, content: bytes) -> tuple[int, dict, None]:
        body = json.loads(content or b"{}")
        if "messages" in body:
            text = self.render_chat(body["messages"], add_generation_prompt=body.get("add_generation_prompt", True))
        else:
            text = body.get("prompt", body.get("content", ""))  # vLLM's field, llama.cpp's
        ids = self.tokenizer.encode(text)
        return 200, {"count": len(ids), "max_model_len": self.context_window or 32768, "tokens": ids}, None

    def _complete(self, body: dict) -> tuple[int, dict, list | None]:
        tok = self.tokenizer
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return self._error(400, "prompt must be a string", "BadRequestError")
        max_tokens = int(body.get("max_tokens", 16))
        stop = stop_list(body.get("stop"))
        logprobs = body.get("logprobs")
        echo = bool(body.get("echo")) and self.echo == "yes"
        prompt_ids = tok.encode(prompt)
        if (refused := self._too_long(prompt_ids, max_tokens)) is not None:
            return refused
        answer = self._decode(prompt_ids, max_tokens, stop)
        out = answer.ids
        record = dict(body, _generated=len(out), _prefilled=len(prompt_ids) if echo else 0, _prompt_ids=prompt_ids, _generated_ids=out)
        self.requests.append(record)
        usage = record["_usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "total_tokens": len(prompt_ids) + len(out)}
        if body.get("stream"):
            return 200, {}, self._stream_chunks(answer, usage, body, prompt_ids=prompt_ids)
        text = answer.shown(stream=False)
        choice: dict[str, Any] = {"index": 0, "text": (prompt + text) if echo else text, "finish_reason": answer.finish, "logprobs": None}
        if logprobs is not None:
            entries = (self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form) if echo else []) + self._rendered(out, self._rankings(prompt_ids, out))
            if self.token_form == "llama":
                choice["logprobs"] = {"content": self._content_logprobs(entries)}
            else:
                choice["logprobs"] = self._legacy_logprobs(entries)
        answer = {"id": "cmpl-fake", "object": "text_completion", "model": self.model_name, "choices": [choice], "usage": usage}
        if self.token_form == "llama":
            answer["timings"] = {"predicted_n": len(out)}  # llama.cpp's server sends its timings
            answer["system_fingerprint"] = LLAMA_FINGERPRINT
        return 200, answer, None

    def _sglang(self, body: dict) -> tuple[int, dict, list | None]:
        """SGLang's ``/generate``, as its documentation shapes it: ``text`` and
        ``sampling_params`` in; the answer's ``text`` and ``meta_info`` with
        ``[logprob, token_id, token_text]`` lists for the prompt (from
        ``logprob_start_len``; the first has no logprob) and the output, and
        the top ``top_logprobs_num`` per position.  (Top candidates' ids are
        not kept by the fake: null.)"""
        prompt, params = body["text"], body.get("sampling_params") or {}
        if not isinstance(prompt, str) or not isinstance(params, dict):
            return self._error(400, "text must be a string and sampling_params an object", "BadRequestError")
        prompt_ids = self.tokenizer.encode(prompt)
        answer = self._decode(prompt_ids, int(params.get("max_new_tokens", 128)), stop_list(params.get("stop")))
        out, scored = answer.ids, bool(body.get("return_logprob"))
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if scored else 0, _prompt_ids=prompt_ids, _generated_ids=out))
        meta: dict[str, Any] = {"id": "fake", "prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "cached_tokens": 0,
                                "finish_reason": {"type": answer.finish} if answer.finish != "stop" else {"type": "stop", "matched": None}}
        if scored:
            start = max(0, int(body.get("logprob_start_len", -1))) if int(body.get("logprob_start_len", -1)) >= 0 else len(prompt_ids)
            listed = lambda entries: [[lp, token, text if body.get("return_text_in_logprobs") else None] for token, text, lp, _ in entries]
            tops = lambda entries: [None if top is None else [[lp, None, text] for text, lp in sorted(top.items(), key=lambda kv: -kv[1])][: int(body.get("top_logprobs_num", 0))]
                                    for _, _, _, top in entries]
            prompt_entries = self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form)[start:]
            out_entries = self._rendered(out, self._rankings(prompt_ids, out))
            meta |= {"input_token_logprobs": listed(prompt_entries), "output_token_logprobs": listed(out_entries)}
            if body.get("top_logprobs_num"):
                meta |= {"input_top_logprobs": tops(prompt_entries), "output_top_logprobs": tops(out_entries)}
        return 200, {"text": answer.shown(stream=False), "meta_info": meta}, None

    def _tgi(self, body: dict) -> tuple[int, dict, list | None]:
        """TGI's ``/generate``, as its documentation shapes it: ``inputs`` and
        ``parameters`` in; ``generated_text`` and ``details`` out, with
        ``prefill`` (each prompt token's own logprob: no top candidates; the
        first none) under ``decoder_input_details``, ``tokens`` (``special``
        marks the end of text) and ``top_tokens`` under ``top_n_tokens``."""
        params = body.get("parameters") or {}
        stop = params.get("stop") or []
        prompt_ids = self.tokenizer.encode(body["inputs"])
        answer = self._decode(prompt_ids, int(params.get("max_new_tokens") or 20), list(stop))
        out, listed = answer.ids, bool(params.get("decoder_input_details"))
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if listed else 0, _prompt_ids=prompt_ids, _generated_ids=out))
        eos = self.tokenizer.eos_id
        finish = "length" if answer.finish == "length" else "eos_token" if out and out[-1] == eos else "stop_sequence"
        details: dict[str, Any] = {"finish_reason": finish, "generated_tokens": len(out), "seed": None}
        if params.get("details"):
            rendered = self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form) if listed else []
            details["prefill"] = [{"id": token, "text": text, "logprob": lp} for (token, text, _, _), lp in zip(rendered, self._own_logprobs(prompt_ids))]
            entries = self._rendered(out, self._rankings(prompt_ids, out))
            details["tokens"] = [{"id": token, "text": text, "logprob": lp, "special": token == eos} for token, text, lp, _ in entries]
            if params.get("top_n_tokens"):
                details["top_tokens"] = [[{"id": None, "text": t, "logprob": v, "special": False} for t, v in sorted((top or {}).items(), key=lambda kv: -kv[1])]
                                         [: int(params["top_n_tokens"])] for _, _, _, top in entries]
        return 200, {"generated_text": answer.shown(stream=False), "details": details}, None
