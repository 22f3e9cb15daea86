"""The target server, seen through ``/v1/completions`` and ``/v1/chat/completions``.

This module and the three below it are the only ones that speak HTTP:
``_target_http`` (settings, requests, retries, errors mapped onto the
library's exception tree), ``_target_tokenize`` (the server's
``/tokenize``), ``_target_answers`` (the answers' types and their pure
reading); here, the completion, chat and streaming calls.  The httpx client
is injectable (``http_client=`` or ``transport=``), so tests run the whole
library against a fake with no network, as with
``httpx.AsyncClient(transport=...)``.

Every message passes through :func:`redact` so the API key never leaks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from typing import Any, AsyncIterator

import httpx

from ._exceptions import TargetConnectionError, TargetResponseError
from ._bill import PromptSizes, StreamTally, record_answer
from ._resume_align import Aligned
from ._scoring import sglang_as_echo, sglang_body, tgi_as_echo, tgi_body, together_as_echo
from ._target_answers import (  # noqa: F401 (fold_specials: imported from here too)
    Completion,
    StreamEnd,
    StreamPiece,
    Usage,
    _align_generated,
    _logprob_lists,
    _parse_chunk,
    _shown_tokens,
    _split_echo,
    _usage,
    _without_carried,
    fold_specials,
    message_chars,
    own_bytes,
)
from ._target_http import DEFAULT_BASE_URL, display_url, new_http_client, resolve_settings  # noqa: F401 (imported from here)
from ._target_tokenize import ServerTokenizer
from ._tokens import OPAQUE, AlignmentError, mark_inexact, with_last_bytes

LLAMA_FINGERPRINT = re.compile(r"^b\d+-")  # llama.cpp's build info (server-task.cpp)
# An echoed prompt longer than this is aligned in a thread (~10 µs a token
# here): the event loop (other generations' streams, ``bspec serve``'s
# /health) keeps running meanwhile.
THREAD_CHARS = 2_000
# The scoring forms asked at the server's root ``/generate``: the request and
# the reading of its answer as vLLM's echo (``_scoring``).
_GENERATE_FORMS = {"sglang": (sglang_body, sglang_as_echo), "tgi": (tgi_body, tgi_as_echo)}


class TargetAPI(ServerTokenizer):
    """A thin async client for the completions endpoint."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # TargetHTTP's settings: url, key, model, client, retries
        # How one call scores a whole prompt (``_scoring.SCORING_FORMS``): vLLM's
        # completions echo (or Together's, as its answers show), SGLang's or
        # TGI's native /generate (the probe decides).
        self.scoring = "echo"
        self._start_tokenizer()
        # Seen to list fewer tokens than it generated (llama.cpp leaves out
        # the pieces of split characters): unit counts are then lower bounds.
        self.omits_pieces = False
        self.server_kind: str | None = None  # "llama.cpp" where its answers say so (their "timings")
        # Prompt tokens per character as usage reported them, to estimate
        # the bill of a stream closed before its usage came (``_bill``).
        self.prompt_sizes = PromptSizes()

    def __repr__(self) -> str:  # never show the key
        return f"TargetAPI(base_url={self.base_url!r}, model={self.model!r})"

    async def list_models(self) -> list[str]:
        response = await self._request("GET", "/models")
        data = self._json(response).get("data") or []
        return [m.get("id") for m in data if isinstance(m, dict) and m.get("id")]

    async def complete(
        self,
        prompt: str,
        *,
        max_tokens: int,
        logprobs: int | None = None,
        echo: bool = False,
        stop: list[str] | None = None,
        earlier: Aligned | None = None,
        stable: int | None = None,
    ) -> Completion:
        """One temperature-0 completion, parsed and aligned.  With ``echo``:
        ``earlier`` is the last round's prompt alignment, picked up where
        this prompt begins the same way, in its first ``stable`` characters
        (``_resume_align``); a long prompt is aligned off the event loop."""
        if echo and self.scoring in _GENERATE_FORMS:
            started = time.perf_counter()
            body_of, as_echo = _GENERATE_FORMS[self.scoring]
            answer = self._json(await self._request("POST", "/generate", body_of(prompt, max_tokens, logprobs, stop), at_root=True))
            try:
                data = as_echo(prompt, answer)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
                raise TargetResponseError(self._fail(f"malformed /generate answer from {self.base_url}: {type(exc).__name__}: {exc}")) from None
        else:
            body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            if logprobs is not None:
                body["logprobs"] = logprobs
            if echo:
                body["echo"] = True
            if stop:
                body["stop"] = stop
            started = time.perf_counter()
            response = await self._post("/completions", body)
            data = self._json(response)
            if echo:
                data = self._as_echo(prompt, data)
        await self._name_token_ids(data)
        parse = functools.partial(self._parse, data, prompt if echo else None, time.perf_counter() - started, earlier=earlier, stable=stable)
        completion = await asyncio.to_thread(parse) if echo and len(prompt) > THREAD_CHARS else parse()
        record_answer(self.prompt_sizes, "completions", len(prompt), completion.usage, _shown_tokens(completion), len(completion.text))
        return completion

    def _as_echo(self, prompt: str, data: Any) -> Any:
        """An echo answer in Together's shape read as vLLM's (and the form
        named: ``scoring``); others as they are."""
        try:
            converted = together_as_echo(prompt, data) if isinstance(data, dict) else None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise TargetResponseError(self._fail(f"malformed echo answer from {self.base_url}: {type(exc).__name__}: {exc}")) from None
        if converted is None:
            return data
        self.scoring = "together"
        return converted

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        logprobs: bool = False,
        stop: list[str] | None = None,
        extra: dict[str, Any] | None = None,
        repeated: str = "",
        carried: str = "",
    ) -> Completion:
        """One temperature-0 chat completion; ``text`` is the message's content.
        ``extra`` carries server-specific fields (``continue_final_message``,
        ``prompt_logprobs``, ``prediction``).  ``repeated``: text the server
        puts before its answer (llama-server repeats a prefilled message),
        removed here; an answer that does not start with it is malformed.
        ``carried``: text the answer writes again first, in tokens of its own
        (a trimmed message's end: ``ChatTurn._carry``), removed with them."""
        body = self._chat_body(messages, max_tokens, logprobs, stop, extra)
        started = time.perf_counter()
        response = await self._post("/chat/completions", body)
        data = self._json(response)
        await self._name_token_ids(data)
        completion = self._parse(data, None, time.perf_counter() - started, chat=True, repeated=repeated, carried=carried)
        record_answer(self.prompt_sizes, "chat", message_chars(messages), completion.usage, _shown_tokens(completion), len(completion.text))
        return completion

    def _chat_body(self, messages: list[dict[str, Any]], max_tokens: int, logprobs: bool, stop: list[str] | None, extra: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        if logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 1
        if stop:
            body["stop"] = stop
        body.update(extra or {})
        return body

    def _parse(self, data: dict[str, Any], echoed_prompt: str | None, elapsed: float, *, chat: bool = False, repeated: str = "",
               carried: str = "", earlier: Aligned | None = None, stable: int | None = None) -> Completion:
        try:
            choice = data["choices"][0]
            full = (choice["message"].get("content") or "") if chat else choice["text"]
            if not isinstance(full, str):
                raise TypeError("text is not a string")
            if repeated:
                if not full.startswith(repeated):
                    raise ValueError("the answer does not repeat the prefilled message as this server's others did")
                full = full[len(repeated):]
            usage = _usage(data.get("usage")) or Usage()
            finish = choice.get("finish_reason")
            tokens, lps, tops = _logprob_lists(choice.get("logprobs"))
            if carried:
                full, tokens, lps, tops, written_again = _without_carried(full, carried, tokens, lps, tops)
            prompt_logprobs = data.get("prompt_logprobs") if chat else None
            if prompt_logprobs is not None and not isinstance(prompt_logprobs, list):
                raise TypeError("prompt_logprobs is not a list")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise TargetResponseError(self._fail(f"malformed completion from {self.base_url}: {type(exc).__name__}: {exc}")) from None
        self._recognize(data)
        echoed = echoed_prompt is not None and full.startswith(echoed_prompt)
        text = full[len(echoed_prompt):] if echoed else full
        completion = Completion(text, finish, usage, elapsed, echoed=echoed, prompt_logprobs=prompt_logprobs)
        if tokens is None:
            return completion
        if echoed:
            completion.prompt_aligned, completion.units = _split_echo(full, len(echoed_prompt), tokens, lps, tops, usage, earlier, stable)
            completion.prompt_units = completion.prompt_aligned.units
        else:
            left_out = usage.completion_tokens - len(tokens) - (written_again if carried else 0) if usage.completion_tokens else None
            if left_out is not None and left_out < 0:
                # (Every server lists at most one string per token it generated.)
                raise AlignmentError(f"{len(tokens)} token strings for {usage.completion_tokens} generated tokens")
            completion.units = _align_generated(text, tokens, lps, tops)
            # Fewer tokens listed than generated: the server leaves out the
            # pieces of characters (llama.cpp), so counts are lower bounds.
            if left_out is not None and left_out > 0:
                self.omits_pieces = True
            if self.omits_pieces:
                completion.units = mark_inexact(completion.units, left_out if left_out is not None and not text.endswith(OPAQUE) else None)
                completion.units = with_last_bytes(completion.units, own_bytes(choice.get("logprobs")))
        return completion

    def stream(
        self, prompt: str, *, max_tokens: int, stop: list[str] | None = None, logprobs: int | None = None
    ) -> AsyncIterator[StreamPiece | StreamEnd]:
        """Plain streaming completion: yields :class:`StreamPiece` s, then a
        :class:`StreamEnd`.  Closing the iterator early closes the connection,
        which makes vLLM and llama.cpp abort the request."""
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if stop:
            body["stop"] = stop
        if logprobs is not None:
            body["logprobs"] = logprobs
        self._count_each_token(body)
        return self._stream("/completions", body, logprobs is not None, len(prompt))

    def _recognize(self, data: Any) -> None:
        """llama.cpp's server says who it is in every answer and stream chunk
        (``system_fingerprint`` "b<build>-<commit>"; ``timings`` in answers):
        it lists only tokens that finish a character, and applies stop
        strings its own way."""
        if not isinstance(data, dict) or self.server_kind == "llama.cpp":
            return
        fingerprint = data.get("system_fingerprint")
        if "timings" in data or isinstance(fingerprint, str) and LLAMA_FINGERPRINT.match(fingerprint):
            self.server_kind = "llama.cpp"
            self.omits_pieces = True

    def _count_each_token(self, body: dict[str, Any]) -> None:
        """llama.cpp lists only tokens that finish a character, and shows no
        text for those of a character max_tokens cut: its timings per token
        say how many it generated (``StreamPiece.generated``)."""
        if self.server_kind == "llama.cpp":
            body["timings_per_token"] = True

    def chat_stream(
        self, messages: list[dict[str, Any]], *, max_tokens: int, stop: list[str] | None = None,
        logprobs: bool = False, extra: dict[str, Any] | None = None,
    ) -> AsyncIterator[StreamPiece | StreamEnd]:
        """As :meth:`stream`, over ``/chat/completions`` (the deltas' content)."""
        body = self._chat_body(messages, max_tokens, logprobs, stop, extra)
        body.update(stream=True, stream_options={"include_usage": True})
        self._count_each_token(body)
        return self._stream("/chat/completions", body, logprobs, message_chars(messages))

    async def _stream(self, path: str, body: dict[str, Any], with_tokens: bool, prompt_chars: int) -> AsyncIterator[StreamPiece | StreamEnd]:
        end = StreamEnd(None)
        tally = StreamTally(self.prompt_sizes, "chat" if path.startswith("/chat") else "completions", prompt_chars)
        try:
            opened, response = await self._open_stream(path, body, tally)
        except asyncio.CancelledError:  # left before the answer came: the server has the prompt
            tally.close(Usage(), time.perf_counter())
            raise
        except BaseException:  # refused or unreachable: nothing billed
            tally.sent = False
            raise
        try:
            async with opened:
                seen_data = complete = False
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    seen_data = True
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        complete = True
                        break
                    try:
                        chunk = json.loads(payload)
                        if with_tokens:
                            await self._name_token_ids(chunk)
                        pieces, finish, usage = _parse_chunk(chunk, with_tokens)
                        self._recognize(chunk)
                    except (ValueError, TypeError, AttributeError, KeyError) as exc:
                        raise TargetResponseError(self._fail(f"malformed stream chunk from {self.base_url}: {type(exc).__name__}")) from None
                    if usage is not None:
                        end.usage = usage
                    for piece in pieces:
                        tally.piece(piece.text, piece.tokens, piece.generated, time.perf_counter())
                        yield piece
                    if finish:
                        end.finish_reason = finish
                        complete = True
                if not seen_data:
                    raise TargetResponseError(self._fail(f"{self.base_url} did not answer with a server-sent event stream"))
                if not complete:
                    # Neither [DONE] nor a finish reason: the connection closed
                    # part-way (an HTTP/1.0 stream ends so), not the text.
                    raise TargetConnectionError(self._fail(f"stream from {self.base_url} ended early, without [DONE] or a finish reason"), retryable=True)
        except httpx.TimeoutException:
            raise TargetConnectionError(self._fail(f"stream from {self.base_url} timed out"), retryable=True) from None
        except httpx.HTTPError as exc:
            # A stream that broke after it opened: worth another try (the
            # orchestrator resumes from the last whole token it accepted).
            raise TargetConnectionError(self._fail(f"stream from {self.base_url} broke: {exc or type(exc).__name__}"), retryable=True) from None
        finally:  # ended, broke or closed early: the server billed it either way
            tally.close(end.usage, time.perf_counter())
        yield end
