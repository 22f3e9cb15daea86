"""``bspec serve``: an OpenAI-compatible server on localhost that speculates.

Any application that speaks the OpenAI API gets faster by changing its
``base_url`` only.  Each request is one of two kinds:

* **speculated**: greedy (``temperature: 0``), one choice, text only, with
  ``max_tokens`` given; it runs through one :class:`~blackbox_spec.SpecClient`
  per model, whose suffix index is shared by every request, so an agent
  that repeats itself speeds up as it goes.  The answer is the upstream's
  own greedy text, byte for byte.  While more than ``max_speculative``
  generations are under way the upstream is busy, and such a request is
  decoded plainly instead (the same answer, at plain cost).
  A ``prediction`` (OpenAI's Predicted Outputs) is drafted from first.
* **passed through**: everything else (sampling, tools, ``n > 1``, logprobs,
  fields we don't know), forwarded unchanged and streamed back as it comes.

Either way the ``x-bspec`` response header says which, and why.  ``GET
/metrics`` reports acceptance, the speedup estimate and the decoding steps
that accepted drafts saved.  A client that goes away cancels its work: the
generation is cancelled, which closes every upstream request it had open.

Who may call it: with ``client_keys`` only callers that send one of them
as a bearer key; without, it should listen on loopback only (``bspec serve``
refuses anything else).  Either way a request must name this server in its
``Host`` (DNS rebinding), carry no foreign ``Origin`` and send JSON (a web
page's "simple" cross-site request can do neither), and its body may be at
most ``max_body_bytes``.  Everything it keeps is bounded: clients per model
in an LRU, the shared suffix index by a budget, ``/metrics`` labels from a
fixed set.

starlette and uvicorn are an optional extra (``pip install
blackbox-spec[serve]``), imported when the server is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import aclosing, suppress
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import httpx

from ._bill import RELATIVE_PRICE, Bill
from ._exceptions import BlackboxSpecError, ConfigurationError, TargetHTTPError, redact, redact_chunks
from ._stats import GenerationResult, GenerationStats
from ._target import new_http_client
from .client import GenerationStream, SpecClient

# Request fields a speculated request may carry: everything else means the
# request asks for something greedy text alone does not give (tools,
# penalties, logprobs, response formats...), so it is passed through.
# ``max_completion_tokens`` is a chat field only: the completions endpoint
# ignores it, so there it is passed through, to be ignored upstream.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "user", "metadata", "store", "prediction"}
_HANDLED = {"chat": _COMMON | {"messages", "max_completion_tokens"}, "completions": _COMMON | {"prompt"}}

# Fields named in a pass-through reason (and so a /metrics label); any other
# is "an unknown field": callers choose field names, and labels must come
# from a fixed set (and fit in a header).
_KNOWN_FIELDS = frozenset("""
    audio best_of echo frequency_penalty function_call functions logit_bias logprobs max_completion_tokens
    modalities parallel_tool_calls prediction presence_penalty reasoning_effort response_format service_tier
    suffix tool_choice tools top_logprobs web_search_options verbosity safety_identifier prompt_cache_key
    top_k min_p repetition_penalty min_tokens ignore_eos guided_json guided_regex guided_choice guided_grammar
    structured_outputs chat_template chat_template_kwargs add_generation_prompt continue_final_message
    prompt_logprobs skip_special_tokens spaces_between_special_tokens include_stop_str_in_output
    n_probs cache_prompt samplers grammar json_schema mirostat typical_p tfs_z timings_per_token return_tokens
""".split())

# Beyond this a prompt is passed through, not speculated on: indexing it for
# drafts costs ~4 us and ~75 bytes a character (a 5 MB prompt held the event
# loop 18 s and 370 MB), and an upstream refuses a prompt beyond its context
# anyway.  Where the upstream lists its context, 16 characters a token.
DEFAULT_MAX_PROMPT_CHARS = 500_000
CHARS_PER_TOKEN_BOUND = 16


def prediction_text(prediction: Any) -> str | None:
    """The text of an OpenAI Predicted Outputs ``prediction`` (its content as
    a string or a list of text parts); None if it is not that.

    >>> prediction_text({"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    'ab'
    """
    if not isinstance(prediction, dict) or prediction.get("type") != "content" or set(prediction) - {"type", "content"}:
        return None
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and set(p) <= {"type", "text"}
                                         for p in content):
        return "".join(p["text"] for p in content)
    return None


def request_problem(kind: str, body: dict[str, Any]) -> str | None:
    """What makes ``body`` a bad request in the OpenAI API's own terms, for
    the fields this server reads itself (None: nothing).  Other fields' types
    are the upstream's to judge (such requests are passed through).

    >>> request_problem("chat", {"stream_options": "x"})
    'stream_options must be an object'
    """
    model = body.get("model")
    if model is not None and not (isinstance(model, str) and model):
        return "model must be a non-empty string"
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return "stream must be true or false"
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return "stream_options must be an object"
        if options.get("include_usage") is not None and not isinstance(options["include_usage"], bool):
            return "stream_options.include_usage must be true or false"
    return None


def passthrough_reason(kind: str, body: dict[str, Any], max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS) -> str | None:
    """Why a request can't be speculated on (None: it can).  Every reason is
    one of a fixed set of ASCII strings (it is a header and a metrics label).

    >>> passthrough_reason("chat", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 9})
    >>> passthrough_reason("chat", {"messages": [], "temperature": 0.7, "max_tokens": 9})
    'temperature is not 0'
    >>> passthrough_reason("chat", {"messages": [], "temperature": 0, "max_tokens": 9, "字": 1})
    'an unknown field'
    """
    temperature = body.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature != 0:
        return "temperature is not 0" if temperature is not None else "temperature not given (the API's default samples)"
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        return "n > 1"
    if "tools" in body or "functions" in body or "tool_choice" in body:
        return "tools"
    unknown = sorted(set(body) - _HANDLED[kind])
    if unknown:
        named = [name for name in unknown if name in _KNOWN_FIELDS]
        return f"field {named[0]}" if named else "an unknown field"
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if kind == "chat" else body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens not given (the server's own default is unknown here)"
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        return "stop is not a string or a list of strings"
    if stop == "" or isinstance(stop, list) and "" in stop:
        return "an empty stop string"  # servers differ on it: the upstream's own answer it is
    if "prediction" in body and prediction_text(body["prediction"]) is None:
        return "a prediction that is not text"
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) and set(m) <= {"role", "content", "name"}
            for m in messages
        ):
            return "messages that are not plain text"
        if messages[-1]["role"] == "assistant":
            # Servers disagree on what that asks for (vLLM starts a new turn,
            # llama.cpp continues the message): the upstream's own answer it is.
            return "the conversation ends with an assistant message"
        size = sum(len(m["content"]) for m in messages)
    else:
        if not isinstance(body.get("prompt"), str) or not body.get("prompt"):
            return "prompt is not one string"
        size = len(body["prompt"])
    if size > max_prompt_chars:
        return "prompt longer than the speculation limit"
    return None


@dataclass
class ProxyMetrics:
    """Totals since the server started (``GET /metrics``)."""

    requests: int = 0
    speculated: int = 0
    speculating: int = 0  # now
    peak_speculating: int = 0
    plain_when_busy: int = 0  # greedy requests decoded plainly: max_speculative were speculating
    passed_through: dict[str, int] = field(default_factory=dict)
    in_progress: int = 0
    queued: int = 0
    refused: int = 0  # answered 4xx here: not allowed, too large, not JSON, bad fields
    rejected_busy: int = 0
    disconnected: int = 0
    failed: int = 0
    output_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    target_calls: int = 0
    wall_s: float = 0.0
    plain_estimate_s: float = 0.0
    estimated_wall_s: float = 0.0  # wall time of the generations that have a plain estimate
    # What upstream billed for the speculated answers (every request, closed
    # streams estimated), and what one plain call each would have: the
    # proxy's cost of speed (``_bill``).  ``cost`` where a price is known.
    bill: Bill = field(default_factory=Bill)
    plain_bill: Bill = field(default_factory=Bill)
    cost: float | None = None
    plain_cost: float | None = None

    def observe(self, stats: GenerationStats) -> None:
        self.bill.add(stats.bill)
        plain = stats.plain_bill
        if plain is not None:
            self.plain_bill.add(plain)
        if stats.price is not None and plain is not None:
            self.cost = (self.cost or 0.0) + stats.price.cost(stats.bill)
            self.plain_cost = (self.plain_cost or 0.0) + stats.price.cost(plain)
        self.output_tokens += stats.output_tokens
        self.drafted_tokens += stats.drafted_tokens
        self.accepted_tokens += stats.accepted_tokens
        self.rounds += stats.rounds
        self.target_calls += stats.target_calls
        self.wall_s += stats.wall_s
        if stats.plain_estimate_s is not None:
            self.plain_estimate_s += stats.plain_estimate_s
            self.estimated_wall_s += stats.wall_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bill"], data["plain_bill"] = self.bill.to_dict(), self.plain_bill.to_dict()
        relative = RELATIVE_PRICE
        data["bill_vs_plain"] = round(relative.cost(self.bill) / relative.cost(self.plain_bill), 3) if relative.cost(self.plain_bill) else None
        for key in ("cost", "plain_cost"):
            data[key] = None if data[key] is None else round(data[key], 8)
        data["acceptance_rate"] = round(self.accepted_tokens / self.drafted_tokens, 4) if self.drafted_tokens else None
        # Every accepted draft token is one sequential decoding step of the
        # target that was not needed.
        data["decode_steps_saved"] = self.accepted_tokens
        data["speedup_estimate"] = round(self.plain_estimate_s / self.estimated_wall_s, 3) if self.estimated_wall_s else None
        for key in ("wall_s", "plain_estimate_s", "estimated_wall_s"):
            data[key] = round(data[key], 3)
        return data


class Busy(Exception):
    """More requests are waiting than ``max_queue`` allows."""


class Refused(Exception):
    """A request this server answers itself with a 4xx (never a 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only.

    >>> is_loopback("127.0.0.2"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The name in a Host header or an Origin (no scheme, port or brackets).

    >>> _host_name("[::1]:8100"), _host_name("http://localhost:8100"), _host_name("Example.COM")
    ('::1', 'localhost', 'example.com')
    """
    value = value.split("://", 1)[-1].split("/", 1)[0].lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Proxy:
    """The application: routes, one speculative client per model, metrics.

    ``client_options`` are :class:`SpecClient` arguments (drafter, strategy,
    timeout...); ``transport`` is the httpx transport of every upstream call
    (tests pass one over the fake).  ``upstream`` carries the passed-through
    requests.  ``client_keys``: the bearer keys callers must send (none: any
    caller, so listen on loopback only); ``allowed_hosts``: names a request's
    ``Host`` may give besides loopback ones (``"*"``: any).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        model: str | None = None,
        client_options: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrency: int = 16,
        max_speculative: int = 1,
        max_queue: int = 256,
        timeout: float = 600.0,
        client_keys: Sequence[str] = (),
        allowed_hosts: Sequence[str] = (),
        max_body_bytes: int = 8 << 20,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
        max_clients: int = 16,
        models_ttl_s: float = 60.0,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0 or max_body_bytes < 1 or max_prompt_chars < 1 or max_clients < 1:
            raise ConfigurationError("max_concurrency, max_body_bytes, max_prompt_chars and max_clients must be at least 1, max_queue at least 0")
        if any(not key or len(key) < 8 for key in client_keys):
            raise ConfigurationError("client keys must be at least 8 characters long")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.default_model = model
        self._options = dict(client_options or {})
        self._transport = transport
        self.client_keys = [key.encode() for key in client_keys]
        self.allowed_hosts = {_host_name(h) for h in allowed_hosts}
        self.max_body_bytes = max_body_bytes
        self.max_prompt_chars = max_prompt_chars
        self.max_clients = max_clients
        # (model, whose key, speculating) -> client, least recently used first.
        # All share one HTTP pool and (speculating) one suffix index.
        self._clients: OrderedDict[tuple[str, str, bool], SpecClient] = OrderedDict()
        self._session_index = None
        self._slots = asyncio.Semaphore(max_concurrency)
        self.max_speculative = max_speculative
        self.max_queue = max_queue
        self.metrics = ProxyMetrics()
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.upstream = httpx.AsyncClient(base_url=self.base_url, transport=transport, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self._http = new_http_client(transport, timeout, max_connections=max(64, 4 * max_concurrency))
        self._tokenize: bool | None = None  # whether the upstream counts tokens (vLLM's /tokenize)
        # The upstream's model list (id -> context in tokens, or None), learned
        # beside requests, never before one; None until known.
        self._models_listed: dict[str, int | None] | None = None
        self._models_at = float("-inf")
        self._models_ttl_s = models_ttl_s
        self._listing: asyncio.Task | None = None

    # -- clients -------------------------------------------------------------------

    def client_for(self, model: str, key: str | None = None, speculating: bool = True) -> SpecClient:
        """The client for ``model`` called with ``key`` (the proxy's own, or
        a caller's), made on first use; the least recently used is dropped
        beyond ``max_clients`` (a generation still running on it finishes)."""
        ident = (model, hashlib.sha256((key or "").encode()).hexdigest()[:16], speculating)
        client = self._clients.get(ident)
        if client is not None:
            self._clients.move_to_end(ident)
            return client
        if speculating:
            options = self._options
        else:  # plain decoding through the same code path (exact, one stream per request)
            options = {k: v for k, v in self._options.items() if k in ("timeout", "max_in_flight", "retries")}
            options["drafter"] = None
        client = SpecClient(self.base_url, key, model, http_client=self._http, **options)
        if speculating:
            if self._session_index is None:
                self._session_index = client.session_index
            elif client.session_index is not None:
                client.session_index = self._session_index
        self._clients[ident] = client
        while len(self._clients) > self.max_clients:
            _, dropped = self._clients.popitem(last=False)
            _background(dropped.aclose())  # keeps its profile; the shared pool stays open
        return client

    async def aclose(self) -> None:
        if self._listing is not None:
            self._listing.cancel()
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
        await self._http.aclose()
        await self.upstream.aclose()

    def _prompt_limit(self, model: str) -> int:
        context = (self._models_listed or {}).get(model)
        return min(self.max_prompt_chars, CHARS_PER_TOKEN_BOUND * context) if context else self.max_prompt_chars

    def _unlisted(self, model: str, key: str | None) -> bool:
        """The upstream's list is known and lacks ``model`` (its list is
        refreshed in the background, never waited for)."""
        if time.monotonic() - self._models_at > self._models_ttl_s and (self._listing is None or self._listing.done()):
            self._listing = _background(self._list_models(key))
        return self._models_listed is not None and model not in self._models_listed

    async def _list_models(self, key: str | None) -> None:
        self._models_at = time.monotonic()
        try:
            response = await self.upstream.get(self.base_url + "/models", headers=_bearer(key))
            data = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            data = None
        if isinstance(data, list) and all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data) and data:
            listed = {}
            for m in data[:10_000]:
                context = m.get("max_model_len")
                listed[m["id"]] = context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None
            self._models_listed = listed

    def app(self):  # -> starlette.applications.Starlette
        try:
            from starlette.applications import Starlette
            from starlette.routing import Route
        except ImportError:
            raise ConfigurationError("bspec serve needs starlette and uvicorn: pip install 'blackbox-spec[serve]'") from None
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )
        return _Gate(app, self)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app) -> AsyncIterator[None]:
        yield
        await self.aclose()

    def refusal(self, scope: dict[str, Any]) -> Refused | None:
        """Why a request may not be served at all (None: it may): checked
        before anything is read or taken."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = _host_name(headers.get("host", ""))
        if host and not (is_loopback(host) or host in self.allowed_hosts or "*" in self.allowed_hosts):
            # A web page that rebinds its own name to this address sends that name.
            return Refused(403, f"the Host header names {host!r}, not this server (add it with --allow-host)")
        origin = headers.get("origin")
        if origin is not None and not (is_loopback(_host_name(origin)) or _host_name(origin) in self.allowed_hosts):
            return Refused(403, "requests from web pages of other origins are refused")
        if self.client_keys and scope.get("path") != "/health":
            given = headers.get("authorization", "")
            token = given[7:].strip().encode("latin-1") if given[:7].lower() == "bearer " else b""
            if not any(hmac.compare_digest(token, key) for key in self.client_keys):
                return Refused(401, "a bearer key of this server is needed (Authorization: Bearer <one of --client-key>)")
        if scope.get("method") == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json" and not kind.endswith("+json"):
                return Refused(415, "the request body must be JSON (Content-Type: application/json)")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                return Refused(413, f"the request body is larger than {self.max_body_bytes >> 20} MB (--max-body-mb)")
        return None

    def upstream_key(self, request) -> str | None:
        """The key upstream calls carry: the proxy's own; else the caller's,
        unless callers authenticate to this server (their key is ours, not
        the upstream's, and is never passed on)."""
        if self._api_key or self.client_keys:
            return self._api_key
        given = request.headers.get("authorization", "")
        return given[7:].strip() or None if given[:7].lower() == "bearer " else None

    # -- routes ------------------------------------------------------------------

    async def _health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok"})

    async def _metrics(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse(self.metrics.to_dict())

    async def _models(self, request):
        return await self._pass_through(request, b"", "not a generation")

    async def _chat(self, request):
        return await self._generation(request, "chat")

    async def _completions(self, request):
        return await self._generation(request, "completions")

    async def _read_json(self, request) -> tuple[bytes, dict[str, Any]]:
        """The body, read up to ``max_body_bytes``, as a JSON object."""
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.max_body_bytes:
                raise Refused(413, f"the request body is larger than {self.max_body_bytes >> 20} MB (--max-body-mb)")
        try:
            body = json.loads(raw or b"{}", parse_constant=_not_json)
        except RecursionError:
            raise Refused(400, "the request body is nested too deeply") from None
        except ValueError:
            raise Refused(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "the request body must be a JSON object")
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise Refused(400, "the request body holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
        except RecursionError:
            raise Refused(400, "the request body is nested too deeply") from None
        return bytes(raw), body

    async def _generation(self, request, kind: str):
        self.metrics.requests += 1
        try:
            raw, body = await self._read_json(request)
            problem = request_problem(kind, body)
            if problem is not None:
                raise Refused(400, problem)
        except Refused as refused:
            self.metrics.refused += 1
            return _error(refused.status, refused.message)
        key = self.upstream_key(request)
        model = body.get("model") or self.default_model
        reason = passthrough_reason(kind, body, self._prompt_limit(model) if model else self.max_prompt_chars)
        if reason is None and not model:
            reason = "no model named"
        if reason is None and self._unlisted(model, key):
            reason = "a model the upstream does not list"
        if reason is not None:
            self.metrics.passed_through[reason] = self.metrics.passed_through.get(reason, 0) + 1
            return await self._pass_through(request, raw, reason)
        try:
            lease = await self._admit(request)
        except Busy:
            self.metrics.rejected_busy += 1
            return _error(503, f"bspec serve is busy: {self.max_queue} requests are already waiting", headers={"retry-after": "1"})
        if lease is None:  # the caller left while queued: nothing was started
            self.metrics.disconnected += 1
            return _error(499, "the client went away")
        # From here the lease owns the slot and the generation: every way out
        # gives both back (a streamed answer hands them to its feed).
        handed_over = False
        try:
            # Speculation spends the upstream's spare capacity, and a busy
            # upstream has none: 16 clients at once on vLLM-cpu (2 cores) got
            # 0.22 requests/s speculating against 0.59 plain; with 4 of them
            # speculating 0.51, with 2 0.57.  So a request speculates only
            # while at most ``max_speculative`` generations are under way,
            # itself included; the others decode plainly here: still exact,
            # at plain cost.
            speculating = self.metrics.in_progress <= self.max_speculative and self.metrics.speculating < self.max_speculative
            client = self.client_for(model, key, speculating)
            try:
                lease.attach(self._start(client, kind, body, speculating), speculating)
            except BlackboxSpecError as exc:
                self.metrics.failed += 1
                return _error(400, self._redact(str(exc), key))
            if body.get("stream"):
                response = await self._stream_response(client, kind, body, lease, key)
                handed_over = lease.handed_over
                return response
            return await self._whole_response(request, client, kind, body, lease, key)
        finally:
            if not handed_over:
                await lease.release()

    async def _admit(self, request) -> "_Lease | None":
        """A slot among the generations running (backpressure: wait, or
        refuse at once when too many are already waiting).  None: the caller
        went away while it waited."""
        if self._slots.locked():
            if self.metrics.queued >= self.max_queue:
                raise Busy()
            self.metrics.queued += 1
            acquiring = asyncio.ensure_future(self._slots.acquire())
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait({acquiring, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.metrics.queued -= 1
                gone.cancel()
                if not acquiring.done():
                    acquiring.cancel()
                    with suppress(asyncio.CancelledError):
                        await acquiring
            got = acquiring.done() and not acquiring.cancelled()
            if gone.done() and not gone.cancelled():
                if got:
                    self._slots.release()
                return None
            if not got:
                return None
        else:
            await self._slots.acquire()
        self.metrics.in_progress += 1
        return _Lease(self)

    def _leave(self, result: GenerationResult | None, speculating: bool) -> None:
        self._slots.release()
        self.metrics.in_progress -= 1
        if speculating:
            self.metrics.speculating -= 1
            if result is not None:
                self.metrics.observe(result.stats)

    def _start(self, client: SpecClient, kind: str, body: dict[str, Any], speculating: bool) -> GenerationStream:
        # A prediction is drafted from here where the upstream verifies
        # drafts, and sent on otherwise (the client's prediction_mode auto);
        # a busy upstream gets the plain call.
        prediction = prediction_text(body["prediction"]) if "prediction" in body and speculating else None
        if kind == "chat":
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            return client.stream_chat(body["messages"], max_tokens=max_tokens, stop=body.get("stop"), prediction=prediction)
        return client.stream(body["prompt"], max_tokens=body.get("max_tokens"), stop=body.get("stop"), prediction=prediction)

    def _redact(self, text: str, key: str | None) -> str:
        """No key in anything we say, and no upstream URL (it may name
        internal hosts, or hold credentials)."""
        return redact(text, [self._api_key, key, self.base_url])

    async def _prompt_tokens(self, client: SpecClient, kind: str, body: dict[str, Any], key: str | None) -> int:
        """The prompt's token count as the upstream bills it: speculation's
        calls each bill their own, so it is asked for (vLLM's ``/tokenize``);
        0 where the upstream can't tell."""
        if self._tokenize is False:
            return 0
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        query = {"model": client.model}
        query.update({"messages": body["messages"], "add_generation_prompt": True} if kind == "chat" else {"prompt": body["prompt"]})
        try:
            response = await self.upstream.post(root + "/tokenize", json=query, headers=_bearer(key))
            count = response.json().get("count") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0  # a failure now says nothing about the next time
        if response.status_code in (404, 405, 501):
            self._tokenize = False  # not there: never asked again
        elif isinstance(count, int):
            self._tokenize = True
        return count if isinstance(count, int) else 0

    # -- answers -------------------------------------------------------------------

    async def _whole_response(self, request, client: SpecClient, kind: str, body: dict[str, Any], lease: "_Lease", key: str | None):
        from starlette.responses import JSONResponse

        stream = lease.stream
        assert stream is not None

        async def generate() -> tuple[GenerationResult, int]:
            counting = asyncio.ensure_future(self._prompt_tokens(client, kind, body, key))
            try:
                async with aclosing(stream):
                    async for _ in stream:
                        pass
                return stream.result, await counting
            finally:
                counting.cancel()

        work = asyncio.ensure_future(generate())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                # The client went away: cancelling the generation closes
                # every upstream request it had open.
                work.cancel()
                self.metrics.disconnected += 1
                with suppress(asyncio.CancelledError, BlackboxSpecError):
                    await work
                return JSONResponse({}, status_code=499)
            try:
                result, prompt_tokens = work.result()
            except BlackboxSpecError as exc:
                self.metrics.failed += 1
                return _error(exc.status_code if isinstance(exc, TargetHTTPError) else 502, self._redact(str(exc), key))
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # cancelled here itself (the server shuts down): the generation goes too
                with suppress(BaseException):
                    await asyncio.wait({work})
        answer = _whole_answer(kind, client.model or "", result, prompt_tokens)
        return JSONResponse(answer, headers=_spec_headers(result) if lease.speculating else {"x-bspec": _BUSY})

    async def _stream_response(self, client: SpecClient, kind: str, body: dict[str, Any], lease: "_Lease", key: str | None):
        from starlette.background import BackgroundTask
        from starlette.responses import StreamingResponse

        stream = lease.stream
        assert stream is not None
        ident = _ident(kind)
        created = int(time.time())
        model = client.model or body.get("model") or ""
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        feed = _Feed(stream, lease.give_back)
        counting = asyncio.ensure_future(self._prompt_tokens(client, kind, body, key)) if with_usage else None
        try:
            # The first piece is awaited here, so that an error before any
            # text (an unknown model, a refused request) is an HTTP error, as
            # upstream's.
            first = await feed.get()
        except BaseException:
            feed.cancel()
            if counting is not None:
                counting.cancel()
            raise
        lease.handed_over = True  # the feed gives the slot back when its generation ends
        if isinstance(first, BlackboxSpecError):
            self.metrics.failed += 1
            if counting is not None:
                counting.cancel()
            return _error(first.status_code if isinstance(first, TargetHTTPError) else 502, self._redact(str(first), key))
        proxy = self

        async def events() -> AsyncIterator[bytes]:
            # starlette cancels this when the client disconnects; the feed's
            # task is then cancelled, which closes every upstream request.
            item: str | BlackboxSpecError | None = first
            try:
                if kind == "chat":
                    yield _event(_chunk(kind, ident, created, model, {"role": "assistant", "content": ""}, None))
                while isinstance(item, str):
                    yield _event(_chunk(kind, ident, created, model, item, None))
                    item = await feed.get()
                if isinstance(item, BlackboxSpecError):
                    proxy.metrics.failed += 1
                    yield _event({"error": {"message": proxy._redact(str(item), key), "type": type(item).__name__}})
                    return
                result = stream.result
                yield _event(_chunk(kind, ident, created, model, None, result.finish_reason or "length"))
                if counting is not None:
                    yield _event({"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [],
                                  "usage": _usage(await counting, result.stats)})
                yield b"data: [DONE]\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                proxy.metrics.disconnected += 1
                raise
            finally:
                if counting is not None:
                    counting.cancel()
                feed.cancel()

        # Also cancelled after the response, in case the client left before
        # the body was ever started (then ``events`` never runs).
        how = "speculative" if lease.speculating else _BUSY
        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-bspec": how, "cache-control": "no-cache"},
                                 background=BackgroundTask(feed.cancel_later))

    async def _pass_through(self, request, raw: bytes, reason: str):
        """Forward the request unchanged and stream the answer back as it comes."""
        from starlette.background import BackgroundTask
        from starlette.responses import StreamingResponse

        key = self.upstream_key(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        if key and not self._api_key:
            headers["authorization"] = f"Bearer {key}"  # the caller's own key: the proxy has none
        path = request.url.path[len("/v1"):] if request.url.path.startswith("/v1") else request.url.path
        upstream_request = self.upstream.build_request(request.method, self.base_url + path, content=raw or None, headers=headers, params=request.query_params)
        try:
            response = await self.upstream.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, self._redact(f"cannot reach the upstream: {exc or type(exc).__name__}", key), headers={"x-bspec": f'passthrough; reason="{reason}"'})
        try:
            secrets = [self._api_key, key]
            kept = {k: redact(v, secrets) for k, v in response.headers.items() if k.lower() in ("content-type", "retry-after", "x-request-id")}
            kept["x-bspec"] = f'passthrough; reason="{reason}"'
            # Decoded bytes (aiter_bytes): a compressed upstream answer goes
            # out uncompressed, since its content-encoding header is not
            # copied.  The upstream's bytes, but never a key: an upstream that
            # echoes the Authorization header in an error would show it.
            body = redact_chunks(response.aiter_bytes(), secrets)
            return StreamingResponse(body, status_code=response.status_code, headers=kept, background=BackgroundTask(response.aclose))
        except BaseException:
            await response.aclose()  # nothing may keep an upstream connection it won't read
            raise


class _Gate:
    """ASGI middleware: who may call at all (:meth:`Proxy.refusal`), before
    any body is read or any slot taken."""

    def __init__(self, app, proxy: Proxy) -> None:
        self.app, self.proxy = app, proxy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.proxy.refusal(scope)
        if refused is not None:
            self.proxy.metrics.refused += 1
            await _error(refused.status, refused.message)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _bearer(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def _background(coroutine) -> asyncio.Task:
    """A task that outlives its caller, kept referenced until it ends."""
    task = asyncio.ensure_future(coroutine)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


_TASKS: set[asyncio.Task] = set()


class _Feed:
    """A generation running in a task of its own, read piece by piece.

    The queue is short, so a client that reads slowly pauses the generation
    (and with it the upstream stream) instead of piling text up here; and the
    generation lives in one task from start to end, whichever task reads it,
    so cancelling that task is what a disconnect does."""

    def __init__(self, stream: GenerationStream, on_done: Callable[[], None], depth: int = 32) -> None:
        self._stream = stream
        self._on_done = on_done
        self._queue: asyncio.Queue[str | BlackboxSpecError | None] = asyncio.Queue(depth)
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        # The generation is opened, read and closed in this task only, and it
        # reads ahead of the response by up to ``depth`` pieces.  (Cleanup
        # under starlette's repeated cancellations is GenerationStream's job.)
        try:
            async with aclosing(self._stream):  # type: ignore[type-var]
                async for piece in self._stream:
                    await self._queue.put(str(piece))
            await self._queue.put(None)
        except BlackboxSpecError as exc:
            await self._queue.put(exc)
        finally:
            self._on_done()

    async def get(self) -> str | BlackboxSpecError | None:
        """The next piece; an error the generation ended with; None at the end."""
        getting = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait({getting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        if self._queue.qsize():
            return self._queue.get_nowait()
        error = self._task.exception() if not self._task.cancelled() else None
        raise error or asyncio.CancelledError()

    def cancel(self) -> None:
        """Stop the generation (its task cleans up and calls ``on_done``)."""
        if not self._task.done():
            self._task.cancel()

    async def cancel_later(self) -> None:  # as a starlette background task
        self.cancel()


class _Lease:
    """One generation's slot, given back exactly once, with its stream closed."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy, self.stream, self.speculating = proxy, None, False
        self.released = self.handed_over = False

    def attach(self, stream: GenerationStream, speculating: bool) -> None:
        self.stream, self.speculating = stream, speculating
        metrics = self.proxy.metrics
        if speculating:
            metrics.speculated += 1
            metrics.speculating += 1
            metrics.peak_speculating = max(metrics.peak_speculating, metrics.speculating)
        else:
            metrics.plain_when_busy += 1

    async def release(self) -> None:
        if not self.released and self.stream is not None:
            with suppress(Exception):
                await self.stream.aclose()
        self.give_back()

    def give_back(self) -> None:
        if not self.released:
            self.released = True
            self.proxy._leave(self.stream.result if self.stream is not None else None, self.speculating)


async def _disconnected(request) -> None:
    """Returns when the client has gone away (the body has been read, so
    the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _error(status: int, message: str, headers: dict[str, str] | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "bspec_error", "code": status}}, status_code=status, headers=headers)


def _ident(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _object(kind: str, chunk: bool) -> str:
    if kind == "chat":
        return "chat.completion.chunk" if chunk else "chat.completion"
    return "text_completion"


def _usage(prompt_tokens: int, stats: GenerationStats) -> dict[str, Any]:
    completion_tokens = stats.output_tokens
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if stats.accepted_prediction_tokens is not None:
        usage["completion_tokens_details"] = {"accepted_prediction_tokens": stats.accepted_prediction_tokens,
                                              "rejected_prediction_tokens": stats.rejected_prediction_tokens or 0}
    return usage


def _whole_answer(kind: str, model: str, result: GenerationResult, prompt_tokens: int) -> dict[str, Any]:
    finish = result.finish_reason or "length"
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
    return {"id": _ident(kind), "object": _object(kind, False), "created": int(time.time()), "model": model,
            "choices": [choice], "usage": _usage(prompt_tokens, result.stats)}


def _chunk(kind: str, ident: str, created: int, model: str, content: str | dict | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat":
        delta = content if isinstance(content, dict) else ({"content": content} if content is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}
    return {"id": ident, "object": _object(kind, True), "created": created, "model": model, "choices": [choice]}


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


_BUSY = 'plain; reason="max_speculative generations are speculating"'


def _spec_headers(result: GenerationResult) -> dict[str, str]:
    stats = result.stats
    headers = {"x-bspec": "speculative", "x-bspec-accepted-tokens": str(stats.accepted_tokens), "x-bspec-rounds": str(stats.rounds)}
    if stats.fallback:
        # A header is Latin-1 on the wire, and the reason may quote the
        # server's text (token strings, error messages): kept to printable ASCII.
        reason = stats.fallback.encode("ascii", "backslashreplace").decode().replace('"', "'")
        headers["x-bspec"] = f'speculative; fallback="{"".join(c if c.isprintable() else " " for c in reason)}"'
    return headers


def serve(proxy: Proxy, host: str = "127.0.0.1", port: int = 8100, *, log_level: str = "warning", app=None) -> None:
    """Run the proxy with uvicorn until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigurationError("bspec serve needs starlette and uvicorn: pip install 'blackbox-spec[serve]'") from None
    uvicorn.run(app or proxy.app(), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


@contextlib.contextmanager
def running(proxy: Proxy, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``proxy`` with uvicorn in a background thread (its own event
    loop) for as long as the block runs; yields the ``/v1`` URL.  For tests,
    benchmarks and embedding; ``bspec serve`` uses :func:`serve`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(proxy.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=2, loop="asyncio"))
    thread = threading.Thread(target=server.run, name="bspec-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ConfigurationError(f"bspec serve did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}/v1"
    finally:
        server.should_exit = True
        thread.join(15)
