"""The fake server's chat endpoint: its template, and how it treats a final
assistant message as each server family does (``chat_prefill``).

A mixin of :class:`.fake_target.FakeTarget`; it reads the target's
``chat_prefill``, ``chat_template``, ``chat_trims``, ``strict_fields``,
``predicted_outputs`` and ``echo``, and answers through the target's
decoding, logprobs, streaming and refusals.
"""

from __future__ import annotations

from typing import Any

from .fake_decode import Answer, stop_list


class Chat:
    """``/v1/chat/completions``, on the same model as the completions endpoint."""

    _VLLM_FIELDS = ("continue_final_message", "add_generation_prompt", "prompt_logprobs", "echo")

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, continue_final: bool = False) -> str:
        """The fake's chat template; a continued final message is left open.
        (Plain words by default, not ``<|im_start|>``-like markers: the fake's
        induction head would copy those into its answers; ChatML only for a
        replay, whose recorded prompts are ChatML text.)"""
        if self.chat_template == "chatml":
            opening, closing, reply = "<|im_start|>{role}\n", "<|im_end|>\n", "<|im_start|>assistant\n"
        else:
            opening, closing, reply = "{Role}:\n", "\n\n", "Assistant:\n"
        parts = []
        for i, message in enumerate(messages):
            content = message.get("content") or ""
            if self.chat_trims:
                content = content.strip()
            head = opening.format(role=message["role"], Role=message["role"].title())
            if continue_final and i == len(messages) - 1:
                parts.append(head + (content.rstrip() if self.chat_prefill == "tgi" else content))
                return "".join(parts)
            parts.append(head + content + closing)
        if add_generation_prompt:
            parts.append(reply)
        return "".join(parts)

    def _chat(self, body: dict) -> tuple[int, dict, list | None]:
        if (refused := self._chat_refusal(body)) is not None:
            return refused
        messages = body["messages"]
        continue_final, add_generation_prompt = self._chat_mode(body)
        prompt = self.render_chat(messages, add_generation_prompt=add_generation_prompt, continue_final=continue_final)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt_ids = self.tokenizer.encode(prompt)
        if (refused := self._too_long(prompt_ids, max_tokens)) is not None:
            return refused
        answer = self._decode(prompt_ids, max_tokens, stop_list(body.get("stop")))
        wants_prompt_logprobs = self.chat_prefill == "vllm" and body.get("prompt_logprobs") is not None
        if wants_prompt_logprobs and self.echo == "refuse":
            return self._error(400, "prompt_logprobs is not supported for this model", "BadRequestError")
        out = answer.ids
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if wants_prompt_logprobs else 0, _rendered=prompt,
                                  _prompt_ids=prompt_ids, _generated_ids=out))
        usage = self._chat_usage(body, prompt_ids, out)
        self.requests[-1]["_usage"] = usage  # (the simulator adds what its cache held, before it is sent)
        # llama-server's answer to a prefill repeats the prefilled text before
        # the new text (in the first chunk, when streaming); logprobs cover
        # only the new tokens.
        repeated = messages[-1]["content"] if continue_final and self.chat_prefill == "llama" else ""
        if body.get("stream"):
            return 200, {}, self._chat_stream(answer, usage, body, prompt_ids, repeated)
        text = repeated + answer.shown(False)
        if self.chat_prefill == "vllm" and body.get("echo") and continue_final:
            text = messages[-1]["content"] + text
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": answer.finish, "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._content_logprobs(self._rendered(out, self._rankings(prompt_ids, out)))}
        reply = {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model_name, "choices": [choice], "usage": usage}
        if wants_prompt_logprobs:
            reply["prompt_logprobs"] = self._prompt_logprobs(prompt_ids)
        return 200, reply, None

    def _chat_refusal(self, body: dict) -> tuple[int, dict, None] | None:
        """The error a server of this family answers the request with, if any."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str) for m in messages
        ):
            return self._error(400, "messages must be a non-empty list of {role, content} objects", "BadRequestError")
        if self.strict_fields:
            unknown = [k for k in self._VLLM_FIELDS if k in body]
            if unknown:
                return self._error(400, f"Unrecognized request argument supplied: {unknown[0]}", "BadRequestError")
        if self.chat_prefill == "vllm":
            continue_final, add_generation_prompt = self._chat_mode(body)
            if continue_final and add_generation_prompt:
                return self._error(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "BadRequestError")
        elif self.chat_prefill == "prefix":
            if messages[-1]["role"] == "assistant" and messages[-1].get("prefix") is not True:
                return self._error(400, "Expected last role User or Tool (or Assistant with prefix True) for serving but got assistant", "invalid_request_message_order")
            if unknown := [k for k in self._VLLM_FIELDS if k in body]:
                return self._error(422, f"body.{unknown[0]}: Extra inputs are not permitted", "invalid_request_error")
        return None

    def _chat_mode(self, body: dict) -> tuple[bool, Any]:
        """(continue the final message, add a generation prompt), as this
        server family decides them: vLLM from the request's fields, the
        prefilling ones from whether the final message is the assistant's,
        OpenAI's never continuing."""
        final_is_assistant = body["messages"][-1]["role"] == "assistant"
        if self.chat_prefill == "vllm":
            return bool(body.get("continue_final_message")), body.get("add_generation_prompt", True)
        if self.chat_prefill in ("prefix", "llama", "trailing", "tgi"):
            return final_is_assistant, not final_is_assistant
        return False, True

    def _chat_usage(self, body: dict, prompt_ids: list[int], out: list[int]) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "total_tokens": len(prompt_ids) + len(out)}
        prediction = body.get("prediction")
        if self.predicted_outputs and isinstance(prediction, dict) and isinstance(prediction.get("content"), str):
            # Predicted Outputs' accounting, simplified: the predicted tokens
            # the output begins with are accepted, the rest rejected.
            predicted = self.tokenizer.encode(prediction["content"])
            accepted = next((k for k, (a, b) in enumerate(zip(out, predicted)) if a != b), min(len(out), len(predicted)))
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": len(predicted) - accepted}
        return usage

    def _chat_stream(self, answer: Answer, usage: dict, body: dict, prompt_ids: list[int], repeated: str) -> list[dict]:
        """The answer's chunks, a prefill's repeat (llama-server) in the first with text."""
        chunks = self._chat_chunks(answer, usage, body, prompt_ids)
        if repeated:
            first = next((c for c in chunks[1:] if c["choices"][0]["delta"].get("content") is not None), None)
            if first is None:  # an answer with no text at all: the repeat comes alone
                first = chunks[0]
                first["choices"][0]["delta"]["content"] = ""
            first["choices"][0]["delta"]["content"] = repeated + first["choices"][0]["delta"]["content"]
        return chunks
