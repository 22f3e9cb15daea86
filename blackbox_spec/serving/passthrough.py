"""Requests ``bspec serve`` does not speculate on (sampling, tools, the
model list...): forwarded unchanged, their answer streamed back as it comes.

They take a slot like any generation (``admission``), and give it back when
the upstream's answer ends or the caller leaves, whichever comes first.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import httpx

from .._exceptions import redact, redact_chunks
from .admission import Admission, Lease
from .answers import EventStream, admitted, error, first_of, stop
from .metrics import ProxyMetrics


class Forwarder(Protocol):
    """What passing a request through needs of the server (``Proxy``)."""

    base_url: str
    upstream: httpx.AsyncClient
    admission: Admission
    metrics: ProxyMetrics

    @property
    def has_own_key(self) -> bool: ...

    @property
    def own_key(self) -> str | None: ...

    def upstream_key(self, request) -> str | None: ...

    def redact(self, text: str, key: str | None) -> str: ...


async def forward(proxy: Forwarder, request, raw: bytes, reason: str):
    """The upstream's answer to the request (``raw``, its body as read), once
    a slot is free; ``reason`` (why it is not speculated on) goes in its
    ``x-bspec`` header."""
    lease = await admitted(proxy.admission, request, "passthrough")
    if not isinstance(lease, Lease):
        return lease
    try:
        return await pass_through(proxy, request, raw, reason, lease)
    except BaseException:
        lease.give_back()
        raise


async def pass_through(proxy: Forwarder, request, raw: bytes, reason: str, lease: Lease):
    """Forward the request unchanged and stream the answer back as it comes;
    the slot is given back when that answer ends or the caller leaves."""
    key = proxy.upstream_key(request)
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
    if key and not proxy.has_own_key:
        headers["authorization"] = f"Bearer {key}"  # the caller's own key: the proxy has none
    path = request.url.path[len("/v1"):] if request.url.path.startswith("/v1") else request.url.path
    upstream = proxy.upstream
    upstream_request = upstream.build_request(request.method, proxy.base_url + path, content=raw or None, headers=headers, params=request.query_params)
    sent = asyncio.ensure_future(upstream.send(upstream_request, stream=True))
    try:
        answered = await first_of(sent, request)
    finally:
        await stop(sent)
    if not answered or sent.cancelled() or sent.exception() is not None:
        lease.give_back()
        if not answered:
            proxy.metrics.disconnected += 1
            if not sent.cancelled() and sent.exception() is None:
                await sent.result().aclose()  # (it came as the caller left)
            return error(499, "the client went away")
        exc = sent.exception() if not sent.cancelled() else None
        text = f"cannot reach the upstream: {exc or type(exc).__name__}"
        return error(502, proxy.redact(text, key), headers={"x-bspec": f'passthrough; reason="{reason}"'})
    response = sent.result()
    secrets = [proxy.own_key, key]
    kept = {k: redact(v, secrets) for k, v in response.headers.items() if k.lower() in ("content-type", "retry-after", "x-request-id")}
    kept["x-bspec"] = f'passthrough; reason="{reason}"'

    async def cleanup() -> None:
        await response.aclose()  # nothing may keep an upstream connection it won't read
        lease.give_back()

    # Decoded bytes (aiter_bytes): a compressed upstream answer goes out
    # uncompressed, since its content-encoding header is not copied.  The
    # upstream's bytes, but never a key: an upstream that echoes the
    # Authorization header in an error would show it.
    body = redact_chunks(response.aiter_bytes(), secrets)
    return EventStream(body, status=response.status_code, headers=kept, media_type=response.headers.get("content-type", "application/json"),
                       cleanup=cleanup)
