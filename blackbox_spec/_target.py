"""The target server, seen through ``/v1/completions`` and ``/v1/chat/completions``.

This is the only module that speaks HTTP.  The httpx client is injectable
(``http_client=`` or ``transport=``), so tests run the whole library against
a fake with no network, as with ``httpx.AsyncClient(transport=...)``.

Errors are mapped here, at the boundary, onto the library's exception tree,
and every message passes through :func:`redact` so the API key never leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

import httpx

from ._exceptions import (
    AuthenticationError,
    ConfigurationError,
    ModelNotFoundError,
    TargetConnectionError,
    TargetError,
    TargetHTTPError,
    TargetResponseError,
    TokenizerError,
    redact,
)
from ._bill import PromptSizes, StreamTally, record_answer
from ._cancel import ShieldedCloseTransport
from ._resume_align import Aligned, align_prompt
from ._scoring import sglang_as_echo, sglang_body, tgi_as_echo, tgi_body, together_as_echo
from ._retry import RetryPolicy, is_retryable, parse_retry_after
from ._tokens import OPAQUE, AlignmentError, Unit, align_tokens, is_token_id, mark_inexact, with_last_bytes

DEFAULT_BASE_URL = "https://api.openai.com/v1"
LLAMA_FINGERPRINT = re.compile(r"^b\d+-")  # llama.cpp's build info (server-task.cpp)
# An echoed prompt longer than this is aligned in a thread (~10 µs a token
# here): the event loop (other generations' streams, ``bspec serve``'s
# /health) keeps running meanwhile.
THREAD_CHARS = 2_000
# The scoring forms asked at the server's root ``/generate``: the request and
# the reading of its answer as vLLM's echo (``_scoring``).
_GENERATE_FORMS = {"sglang": (sglang_body, sglang_as_echo), "tgi": (tgi_body, tgi_as_echo)}


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


def display_url(url: str) -> str:
    """``url`` as messages and reprs show it: credentials in it (user info,
    query values such as ``?key=``) masked, for keys can travel that way too.

    >>> display_url("http://user:sk-1@host:8000/v1?key=sk-2")
    'http://***@host:8000/v1?key=***'
    """
    try:
        parsed = httpx.URL(url)
    except Exception:  # httpx raises several types for bad URLs
        return "<invalid URL>"
    if parsed.userinfo:
        parsed = parsed.copy_with(userinfo=b"***")
    if parsed.query:
        parsed = parsed.copy_with(query="&".join(f"{key}=***" for key in parsed.params.keys()).encode())
    return str(parsed)


def resolve_settings(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """Explicit arguments win; then ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``,
    as the openai SDK reads them; then the SDK's default base URL."""
    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    try:
        parsed = httpx.URL(url)
    except Exception as exc:  # httpx raises several types for bad URLs
        raise ConfigurationError(redact(f"invalid base URL {url!r}: {exc}", key)) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigurationError(redact(f"invalid base URL {display_url(url)!r}: expected http(s)://host[:port]/v1", key))
    return url.rstrip("/"), key


def _token_list(data: dict[str, Any] | None) -> list[int] | None:
    """``/tokenize``'s token ids, or None where the answer holds none."""
    tokens = data.get("tokens") if data else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens):
        return tokens
    return None


def new_http_client(transport: httpx.AsyncBaseTransport | None, timeout: float, max_connections: int = 64) -> httpx.AsyncClient:
    """The HTTP client target calls need (one may be shared by many
    :class:`TargetAPI`, as ``bspec serve`` does for all its models)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(32, max_connections))
    return httpx.AsyncClient(
        # Responses are closed shielded from cancellation (see ``_cancel``).
        transport=ShieldedCloseTransport(transport or httpx.AsyncHTTPTransport(limits=limits)),
        timeout=httpx.Timeout(timeout, connect=10.0), limits=limits,
    )


class TargetAPI:
    """A thin async client for the completions endpoint."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str | None,
        *,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 600.0,
        retries: RetryPolicy | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        self._url = base_url  # requests go here; messages show ``base_url``
        self.base_url = display_url(base_url)
        self._api_key = api_key
        self.model = model
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = http_client is None
        self._client = http_client or new_http_client(transport, timeout)
        self._headers = headers
        self.retries = retries if retries is not None else RetryPolicy()
        self.calls = 0  # HTTP requests, retries included
        self.retried = 0  # of which retries after a transient failure
        # One limit on requests in flight for everything this client runs
        # (generations at once, their branches and fan-outs); a retry waits
        # for its backoff without holding a slot.
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self.in_flight = 0
        self.peak_in_flight = 0
        # How one call scores a whole prompt (``_scoring.SCORING_FORMS``): vLLM's
        # completions echo (or Together's, as its answers show), SGLang's or
        # TGI's native /generate (the probe decides).
        self.scoring = "echo"
        self._tokenizes: str | bool | None = None  # how /tokenize is asked ("vllm", "llama"), False: it isn't there
        self._learning_tokenize = asyncio.Lock()
        # Seen to list fewer tokens than it generated (llama.cpp leaves out
        # the pieces of split characters): unit counts are then lower bounds.
        self.omits_pieces = False
        self.server_kind: str | None = None  # "llama.cpp" where its answers say so (their "timings")
        self._detokenizes: bool | None = None
        self._token_names: dict[str, str] = {}  # "token_id:N" -> its text (see _name_token_ids)
        # Prompt tokens per character as usage reported them, to estimate
        # the bill of a stream closed before its usage came (``_bill``).
        self.prompt_sizes = PromptSizes()

    def __repr__(self) -> str:  # never show the key
        return f"TargetAPI(base_url={self.base_url!r}, model={self.model!r})"

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    # -- requests -------------------------------------------------------------

    def _fail(self, message: str) -> str:
        return redact(message, self._api_key)

    def _connection_error(self, exc: httpx.HTTPError) -> TargetConnectionError:
        """httpx's transport errors, mapped: timeouts and broken connections
        are worth another try, a refused connection or unknown host is not."""
        if isinstance(exc, httpx.TimeoutException):
            return TargetConnectionError(self._fail(f"request to {self.base_url} timed out ({type(exc).__name__})"), retryable=True)
        refused = isinstance(exc, (httpx.ConnectError, httpx.UnsupportedProtocol))
        return TargetConnectionError(self._fail(f"cannot reach {self.base_url}: {exc or type(exc).__name__}"), retryable=not refused)

    def _count_retry(self, error: BaseException, seconds: float) -> None:
        self.retried += 1

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """A place among the requests in flight, held until the answer is read
        (a stream's until it is closed)."""
        if self._slots is not None:
            await self._slots.acquire()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            if self._slots is not None:
                self._slots.release()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *, at_root: bool = False) -> httpx.Response:
        """One call, retried on transient failures (see :mod:`._retry`);
        ``at_root``: ``path`` is at the server's root, not under ``/v1``."""
        async for attempt in self.retries.retrying(self._count_retry):
            with attempt:
                self.calls += 1
                try:
                    async with self._slot():
                        response = await self._client.request(method, (self.root if at_root else self._url) + path, json=body, headers=self._headers)
                except httpx.HTTPError as exc:
                    raise self._connection_error(exc) from None
                if response.status_code >= 400:
                    raise self._http_error(response)
                return response
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self._request("POST", path, body)

    def _http_error(self, response: httpx.Response) -> TargetHTTPError:
        status = response.status_code
        try:
            detail = response.json()
            err = detail.get("error", detail) if isinstance(detail, dict) else detail
            message = err.get("message") if isinstance(err, dict) else None
            message = str(message or err or detail)
        except ValueError:
            message = response.text.strip()[:300] or response.reason_phrase
        path = response._request.url.path if response._request is not None else ""
        if status == 404 and path.endswith("/completions") and not path.endswith("/chat/completions") and "model" not in message.lower():
            # Many hosted APIs serve chat only.
            message += " (this server may serve chat only: use SpecClient.chat, or bspec run --chat)"
        message = self._fail(f"HTTP {status} from {self.base_url}: {message}")
        if status in (401, 403):
            return AuthenticationError(message, status_code=status)
        if status == 404 and "model" in message.lower():
            return ModelNotFoundError(message, status_code=status)
        return TargetHTTPError(message, status_code=status, retry_after=parse_retry_after(response.headers.get("retry-after")))

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            raise TargetResponseError(self._fail(f"{self.base_url} did not answer with JSON")) from None
        if not isinstance(data, dict):
            raise TargetResponseError(self._fail(f"{self.base_url} answered with a JSON {type(data).__name__}, not an object"))
        return data

    @property
    def root(self) -> str:
        """The server's root, where vLLM and llama.cpp serve ``/tokenize``."""
        return self._url[: -len("/v1")] if self._url.endswith("/v1") else self._url

    async def _root_post(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """A call at the server's root (``/tokenize``, ``/detokenize``), with
        the usual retries.  None where the server has no such endpoint: it
        refuses the request (404, 405, any 4xx that a retry would not
        change) or answers with something other than a JSON object.  An
        endpoint that is there but keeps failing (5xx, 429, timeouts, broken
        connections, after the retries) raises :class:`TokenizerError`: that
        is not the same as absent, and the checks resting on it must know."""
        try:
            async for attempt in self.retries.retrying(self._count_retry):
                with attempt:
                    try:
                        async with self._slot():
                            response = await self._client.post(self.root + path, json=body, headers=self._headers)
                    except httpx.HTTPError as exc:
                        raise self._connection_error(exc) from None
                    if response.status_code >= 400:
                        raise self._http_error(response)
                    try:
                        data = response.json()
                    except ValueError:
                        return None
                    return data if isinstance(data, dict) else None
        except TargetError as exc:
            if isinstance(exc, TargetConnectionError) or is_retryable(exc):
                raise TokenizerError(self._fail(f"{path} at {self.base_url} failed: {exc}")) from None
            return None
        except Exception:  # noqa: BLE001 - anything else (a transport that refuses the path, say): not here
            return None
        return None

    async def tokenize(self, text: str) -> list[int] | None:
        """The server's own tokens for ``text`` (vLLM's or llama.cpp's
        ``/tokenize``), without special tokens; None where it has none;
        :class:`TokenizerError` where it has one that keeps failing."""
        if not text:
            return []
        if self._tokenizes is None:
            async with self._learning_tokenize:  # callers at once learn the shape once
                if self._tokenizes is None:
                    return await self._learn_tokenize(text)
        if not self._tokenizes:
            return None
        return _token_list(await self._root_post("/tokenize", self._tokenize_body(str(self._tokenizes), text)))

    async def learn_tokenize(self) -> None:
        """Learn now how this server tokenizes, if that is not known yet: a
        speculative generation starts it beside its first request, so the
        first text it sends back (checked by ``_canon``) does not wait for it.
        (A failure leaves it unlearned: the first check asks again.)"""
        if self._tokenizes is None:
            with contextlib.suppress(TokenizerError):
                await self.tokenize("Hello")

    def _tokenize_body(self, shape: str, text: str) -> dict[str, Any]:
        if shape == "vllm":
            return {"model": self.model, "prompt": text, "add_special_tokens": False}
        return {"content": text, "add_special": False}

    async def _learn_tokenize(self, text: str) -> list[int] | None:
        """Ask in both request shapes at once (one round trip where the
        server has neither, as hosted APIs have not); the first that answers
        with tokens is how this server is asked from now on.  (llama.cpp
        answers vLLM's shape too: with no tokens, for no "content".)"""
        shapes = ("vllm", "llama")
        answers = await asyncio.gather(*(self._root_post("/tokenize", self._tokenize_body(shape, text)) for shape in shapes), return_exceptions=True)
        failed = None
        for shape, data in zip(shapes, answers):
            if isinstance(data, BaseException):
                if not isinstance(data, TokenizerError):
                    raise data
                failed = data
                continue
            tokens = _token_list(data)
            if tokens:
                self._tokenizes = shape
                return tokens
        if failed is not None:
            raise failed  # there but failing: not learned, asked again next time
        self._tokenizes = False
        return None

    async def context_tokens(self, prompt: str, text: str) -> list[int] | None:
        """The server's tokens for ``prompt + text`` (``_canon``); None where
        it can't tokenize."""
        return await self.tokenize(prompt + text)

    async def count_tokens(self, prompt: str, text: str) -> int | None:
        """How many tokens the target made ``text`` of, after ``prompt``: the
        server's own tokenization of both (the greedy path is its own
        tokenization: ``_canon`` checks that before anything is sent back).
        None where the server can't tokenize (:class:`TokenizerError` where
        its tokenizer fails)."""
        whole, head = await asyncio.gather(self.context_tokens(prompt, text), self.context_tokens(prompt, ""))
        if whole is None or head is None or whole[: len(head)] != head:
            return None
        return len(whole) - len(head)

    async def _name_token_ids(self, data: Any) -> None:
        """vLLM's ``--return-tokens-as-token-ids`` shows tokens as
        ``"token_id:N"``: each is named by ``/detokenize`` (once per id and
        client), so it can be placed in the text like any token string.
        Without ``/detokenize`` the ids stay (an answer is then one unit)."""
        strings = [s for s in _token_strings(data) if is_token_id(s)]
        if not strings:
            return
        unknown = {s for s in strings if s not in self._token_names} if self._detokenizes is not False else set()

        async def name(token: str) -> None:
            try:
                answer = await self._root_post("/detokenize", {"model": self.model, "tokens": [int(token.split(":", 1)[1])]})
            except TokenizerError:
                return  # failing now, not absent: the id stays unnamed in this answer
            text = answer.get("prompt") if answer else None
            if isinstance(text, str):
                self._token_names[token] = text
            else:
                self._detokenizes = False

        await asyncio.gather(*(name(token) for token in unknown))
        if self._token_names:
            _rename_tokens(data, self._token_names)

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

    async def _open_stream(self, path: str, body: dict[str, Any], tally: StreamTally | None = None) -> tuple[contextlib.AsyncExitStack, httpx.Response]:
        """The response of a streaming request, once its status is known,
        retried like other calls.  Only the opening is retried: after the
        first chunk the caller owns what was received."""
        async for attempt in self.retries.retrying(self._count_retry):
            with attempt:
                self.calls += 1
                opened = contextlib.AsyncExitStack()
                try:
                    await opened.enter_async_context(self._slot())
                    if tally is not None:
                        tally.sent = True
                    response = await opened.enter_async_context(self._client.stream("POST", self._url + path, json=body, headers=self._headers))
                    if response.status_code >= 400:
                        if tally is not None:
                            tally.sent = False  # (refused: not billed)
                        await response.aread()
                        raise self._http_error(response)
                except BaseException as exc:
                    await opened.aclose()
                    if isinstance(exc, httpx.HTTPError):
                        raise self._connection_error(exc) from None
                    raise
                return opened, response
        raise AssertionError("unreachable: tenacity re-raises the last error")

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
