"""The transport under :class:`._target.TargetAPI`: settings, the httpx
client, requests with retries and a limit on those in flight, and HTTP and
connection failures mapped onto the library's exceptions.

Every message passes through :func:`redact` so the API key never leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any, AsyncIterator

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
from ._cancel import ShieldedCloseTransport
from ._retry import RetryPolicy, is_retryable, parse_retry_after

if TYPE_CHECKING:
    from ._bill import StreamTally

DEFAULT_BASE_URL = "https://api.openai.com/v1"


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


def new_http_client(transport: httpx.AsyncBaseTransport | None, timeout: float, max_connections: int = 64) -> httpx.AsyncClient:
    """The HTTP client target calls need (one may be shared by many
    :class:`TargetAPI`, as ``bspec serve`` does for all its models)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(32, max_connections))
    return httpx.AsyncClient(
        # Responses are closed shielded from cancellation (see ``_cancel``).
        transport=ShieldedCloseTransport(transport or httpx.AsyncHTTPTransport(limits=limits)),
        timeout=httpx.Timeout(timeout, connect=10.0), limits=limits,
    )


class TargetHTTP:
    """Requests to one server's API (the base of :class:`._target.TargetAPI`):
    retried on transient failures, counted, and limited in flight."""

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
