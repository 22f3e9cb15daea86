"""The clients ``bspec serve`` decodes with: one :class:`SpecClient` per
model, upstream key, caller and kind of decoding, made on first use and
dropped least recently used first beyond ``max_clients``.

Every client shares one HTTP pool and, where a draft model is named, one
loaded draft model (``DrafterFactory.sibling``); each caller's suffix index
gets a share of one budget, so memory stays bounded whatever the number of
callers.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import httpx

from .._target import new_http_client
from ..client import SpecClient
from ..drafters import DrafterFactory, SessionIndex
from .tasks import background

# The suffix indexes' budget for the whole process: with a session per
# caller key, each of ``max_clients`` clients gets its share.
SESSION_PIECES, SESSION_CHARS = 200_000, 4_000_000


class ClientPool:
    """The clients by (model, whose key upstream, which caller, speculating),
    least recently used first.

    ``options`` are :class:`SpecClient` arguments; ``share_sessions``: one
    suffix index for every caller (a single-user deployment), else one per
    caller."""

    def __init__(self, base_url: str, options: dict[str, Any], *, transport: httpx.AsyncBaseTransport | None, timeout: float,
                 max_connections: int, max_clients: int, share_sessions: bool) -> None:
        self.base_url = base_url
        self.options = dict(options)
        # Checked first (an unknown drafter or a missing draft model is
        # refused before any HTTP pool is opened).
        self.drafters = shared_drafters(self.options)
        self.max_clients = max_clients
        self.share_sessions = share_sessions
        self.clients: OrderedDict[tuple[str, str, str, bool], SpecClient] = OrderedDict()
        self._session_index = None  # with ``share_sessions``: every caller's
        self.http = new_http_client(transport, timeout, max_connections=max_connections)

    def get(self, model: str, key: str | None = None, speculating: bool = True, tenant: str = "") -> SpecClient:
        """The client for ``model`` called with ``key`` upstream for the
        caller ``tenant``, made on first use; the least recently used is
        dropped beyond ``max_clients`` (a generation still running on it
        finishes)."""
        caller = "" if self.share_sessions or not speculating else tenant
        ident = (model, hashlib.sha256((key or "").encode()).hexdigest()[:16], caller, speculating)
        client = self.clients.get(ident)
        if client is not None:
            self.clients.move_to_end(ident)
            return client
        client = SpecClient(self.base_url, key, model, http_client=self.http, **self._options_for(speculating))
        if speculating and self.share_sessions:
            if self._session_index is None:
                self._session_index = client.session_index
            elif client.session_index is not None:
                client.session_index = self._session_index
        self.clients[ident] = client
        while len(self.clients) > self.max_clients:
            _, dropped = self.clients.popitem(last=False)
            background(dropped.aclose())  # keeps its profile; the shared pool stays open
        return client

    def _options_for(self, speculating: bool) -> dict[str, Any]:
        """A new client's arguments: speculating, or plain decoding through
        the same code path (exact, one stream per request)."""
        if not speculating:
            options = {k: v for k, v in self.options.items() if k in ("timeout", "max_in_flight", "retries")}
            options["drafter"] = None
            return options
        options = dict(self.options)
        if self.drafters is not None:
            # Each caller's index gets a share of one budget, so memory
            # stays bounded whatever the number of keys (an index of 4M
            # characters took ~140 MB in the soak).
            index = None if self.share_sessions else SessionIndex(max(1, SESSION_PIECES // self.max_clients), max(1, SESSION_CHARS // self.max_clients))
            options.update(drafter=self.drafters.sibling(index), draft_model=None)
        return options

    async def aclose(self) -> None:
        """Close every client, then the HTTP pool they share."""
        for client in self.clients.values():
            await client.aclose()
        self.clients.clear()
        await self.http.aclose()


def shared_drafters(options: dict[str, Any]) -> DrafterFactory | None:
    """The drafter every speculating client's is a sibling of (None: a
    drafter instance or none was given, used as it is)."""
    kind = options.get("drafter")
    if not isinstance(kind, str) or kind == "none":
        return None
    return DrafterFactory(kind, draft_model=options.get("draft_model"), draft_device=options.get("draft_device") or "cpu")
