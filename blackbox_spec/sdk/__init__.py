"""Speculation inside the openai SDK, with no proxy to run.

Hand the SDK an httpx client from here and every temperature-0
``chat.completions.create`` and ``completions.create`` (streamed or not,
``prediction`` honoured) is decoded speculatively, exactly; everything else
(sampling, embeddings, files, tools the proxy passes on...) goes to the
server untouched::

    import openai
    from blackbox_spec.sdk import http_client

    client = openai.OpenAI(base_url=URL, api_key=KEY, http_client=http_client(URL, KEY))

    # or, from a client you already have (sync or async):
    from blackbox_spec.sdk import speculative
    client = speculative(openai.AsyncOpenAI(base_url=URL, api_key=KEY))

It is ``bspec serve``'s request handling (:class:`~blackbox_spec.proxy.Proxy`)
in this process, reached through an in-process transport: the same answers,
headers (``x-bspec``) and ``usage`` fields, no port and no second process.
The SDK keeps its own retries, timeouts, raw responses, streaming helpers and
error types.  Needs the ``serve`` extra (starlette).
"""

from __future__ import annotations

from typing import Any

import httpx

from ..proxy import Proxy
from .transports import SpeculativeTransport, SyncSpeculativeTransport

__all__ = ["async_http_client", "http_client", "speculative"]

# As the openai SDK's own default client: it follows redirects, and its
# requests carry their own timeouts (this one only applies where none is set).
_CLIENT_DEFAULTS: dict[str, Any] = {"follow_redirects": True, "timeout": httpx.Timeout(600.0, connect=5.0)}


def _upstream(server: Any, api_key: str | None) -> tuple[str, str | None]:
    """(base URL, key) from a URL and key, or from an openai client."""
    if isinstance(server, (str, httpx.URL)):
        return str(server), api_key
    return str(server.base_url), api_key if api_key is not None else getattr(server, "api_key", None)


def _proxy(server: Any, api_key: str | None, transport: httpx.AsyncBaseTransport | None, client_options: dict[str, Any] | None,
           proxy_options: dict[str, Any]) -> Proxy:
    base_url, key = _upstream(server, api_key)
    return Proxy(base_url, key, client_options=client_options, transport=transport, **proxy_options)


def async_http_client(server: Any, api_key: str | None = None, *, transport: httpx.AsyncBaseTransport | None = None,
                      client_options: dict[str, Any] | None = None, **proxy_options: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for ``openai.AsyncOpenAI(http_client=...)``.

    ``server``: the upstream's base URL (``https://host/v1``) or an openai
    client to take it (and its key) from.  ``client_options``: what
    :class:`~blackbox_spec.SpecClient` takes (``drafter``, ``strategy``...);
    ``proxy_options``: what :class:`~blackbox_spec.proxy.Proxy` takes
    (``max_speculative``, ``max_concurrency``...).  ``transport`` carries
    every upstream call (tests pass a mock).  Use it on one event loop, as
    any ``httpx.AsyncClient``."""
    proxy = _proxy(server, api_key, transport, client_options, proxy_options)
    return httpx.AsyncClient(transport=SpeculativeTransport(proxy, transport or httpx.AsyncHTTPTransport()), **_CLIENT_DEFAULTS)


def http_client(server: Any, api_key: str | None = None, *, transport: httpx.BaseTransport | None = None,
                upstream_transport: httpx.AsyncBaseTransport | None = None, client_options: dict[str, Any] | None = None,
                **proxy_options: Any) -> httpx.Client:
    """An ``httpx.Client`` for ``openai.OpenAI(http_client=...)``: as
    :func:`async_http_client`, for the sync SDK (the speculation runs on an
    event loop of its own, in a daemon thread).  ``transport`` carries the
    requests passed through untouched, ``upstream_transport`` the
    speculative ones' calls."""
    proxy = _proxy(server, api_key, upstream_transport, client_options, proxy_options)
    return httpx.Client(transport=SyncSpeculativeTransport(proxy, transport or httpx.HTTPTransport()), **_CLIENT_DEFAULTS)


def speculative(client: Any, **options: Any) -> Any:
    """A copy of an ``openai.OpenAI`` / ``openai.AsyncOpenAI`` client that
    speculates (``options`` as :func:`http_client`)."""
    import openai

    if isinstance(client, openai.AsyncOpenAI):
        return client.with_options(http_client=async_http_client(client, **options))
    return client.with_options(http_client=http_client(client, **options))
