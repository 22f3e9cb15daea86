"""``bspec bench --through``: how a configuration's runs reach the server,
as a user's code would make them.

- ``client``: :class:`~blackbox_spec.SpecClient` called directly (the default).
- ``proxy``: the openai SDK calling ``bspec serve``'s app (in this process,
  without the socket: ``blackbox_spec.sdk``'s in-process ASGI transport).
- ``sdk``: the openai SDK handed ``blackbox_spec.sdk``'s http client, the
  one line a Python user adds.

Through the SDK only the text, the usage and the ``x-bspec`` header come
back, so each run's stats are what the proxy's metrics (``GET /metrics``)
counted for it: the counts of its totals after the run less those before.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import httpx

from .._bill import Bill
from .._stats import GenerationResult, GenerationStats
from .._target_http import resolve_settings
from ..client import SpecClient
from ..proxy import Proxy
from ..serving.metrics import ProxyMetrics
from .workloads import Prompt

THROUGH = ("client", "proxy", "sdk")
# The openai SDK refuses to run without a key; with none set, it sends this one.
NO_KEY = "bspec-bench"
_COUNTS = ("rounds", "jumps", "target_calls", "drafted_tokens", "accepted_tokens", "output_tokens")


def stats_between(before: ProxyMetrics, after: ProxyMetrics, wall_s: float) -> GenerationStats:
    """One request's stats, from the proxy's totals before and after it (a
    request decoded plainly or passed through counts nothing but its wall time)."""
    bill = Bill(**{name: getattr(after.bill, name) - getattr(before.bill, name) for name in Bill.__dataclass_fields__})
    prompt_tokens = after.plain_bill.prompt_tokens - before.plain_bill.prompt_tokens
    counts = {name: getattr(after, name) - getattr(before, name) for name in _COUNTS}
    return GenerationStats(**counts, bill=bill, prompt_tokens=prompt_tokens or None, wall_s=wall_s)


class _KeptOpen(httpx.AsyncBaseTransport):
    """The bench's transport (a simulated server's), lent to a caller that
    closes what it was given: it serves every later run too."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)


class SdkCaller:
    """One configuration's runs made through the openai SDK (``way``:
    "proxy" or "sdk"), each a ``chat.completions`` or ``completions`` call
    at temperature 0.

    ``spec`` is the client the proxy serves these calls with, made here so
    that the bench gives it the profile folder and session memory it gives a
    direct client."""

    def __init__(self, way: str, base_url: str, api_key: str | None, model: str, options: dict[str, Any], *,
                 transport: httpx.AsyncBaseTransport | None, timeout: float) -> None:
        import openai

        from ..sdk.asgi import StreamingASGITransport
        from ..sdk.transports import IN_PROCESS_HOST, SpeculativeTransport

        base_url, key = resolve_settings(base_url, api_key)
        key = key or NO_KEY
        self.way, self.model = way, model
        self.proxy = Proxy(base_url, key, model=model, client_options=options, transport=transport, timeout=timeout)
        # (The proxy's own key is the caller's: the client it picks for a call is this one.)
        self.spec: SpecClient = self.proxy.client_for(model, key, True, Proxy.tenant_of_key(key))
        if way == "sdk":
            upstream = _KeptOpen(transport) if transport is not None else httpx.AsyncHTTPTransport()
            http = httpx.AsyncClient(transport=SpeculativeTransport(self.proxy, upstream), timeout=timeout)
            url = base_url
        elif way == "proxy":
            http = httpx.AsyncClient(transport=StreamingASGITransport(self.proxy.app()), timeout=timeout)
            url = f"http://{IN_PROCESS_HOST}/v1"
        else:
            raise ValueError(f"no SDK way {way!r}: {', '.join(THROUGH[1:])}")
        self.http = http
        self.sdk = openai.AsyncOpenAI(base_url=url, api_key=key, http_client=http, max_retries=0)

    async def run(self, prompt: Prompt, max_tokens: int, chat: bool) -> GenerationResult:
        """``prompt`` through the SDK; its stats as the proxy counted them,
        and where it did not speculate, the ``x-bspec`` header says why."""
        before = copy.deepcopy(self.proxy.metrics)
        started = time.perf_counter()
        if chat:
            raw: Any = await self.sdk.chat.completions.with_raw_response.create(
                model=self.model, messages=prompt.messages, temperature=0, max_tokens=max_tokens)  # type: ignore[arg-type]
            text = raw.parse().choices[0].message.content or ""
        else:
            raw = await self.sdk.completions.with_raw_response.create(model=self.model, prompt=prompt.text, temperature=0, max_tokens=max_tokens)
            text = raw.parse().choices[0].text
        stats = stats_between(before, self.proxy.metrics, time.perf_counter() - started)
        how = raw.headers.get("x-bspec", "")
        if how != "speculative":
            stats.fallback = how or "no x-bspec header"
        return GenerationResult(text, stats)

    async def aclose(self) -> None:
        await self.sdk.close()  # (its http client's transport closes the proxy, on the sdk way)
        await self.proxy.aclose()
