"""What ``bspec serve`` learns of its upstream beside the requests: the
models it lists (and their contexts), and how it counts a prompt's tokens.

Neither is ever waited for before a request is served: the model list is
refreshed in the background, and a token count runs beside the generation
it is for.  A failure to learn either leaves things as they were.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from .requests import CHARS_PER_TOKEN_BOUND
from .tasks import background


class ModelList:
    """The upstream's model list (id -> context in tokens, or None), learned
    beside requests, never before one; ``listed`` is None until known."""

    def __init__(self, upstream: httpx.AsyncClient, base_url: str, ttl_s: float) -> None:
        self.upstream, self.base_url, self.ttl_s = upstream, base_url, ttl_s
        self.listed: dict[str, int | None] | None = None
        self.listed_at = float("-inf")
        self._listing: asyncio.Task | None = None

    def prompt_limit(self, model: str, max_prompt_chars: int) -> int:
        """The longest prompt speculated on: ``max_prompt_chars``, or less
        where the upstream's context for ``model`` is known to be shorter."""
        context = (self.listed or {}).get(model)
        return min(max_prompt_chars, CHARS_PER_TOKEN_BOUND * context) if context else max_prompt_chars

    def unlisted(self, model: str, key: str | None) -> bool:
        """The upstream's list is known and lacks ``model`` (its list is
        refreshed in the background, never waited for)."""
        if time.monotonic() - self.listed_at > self.ttl_s and (self._listing is None or self._listing.done()):
            self._listing = background(self._list(key))
        return self.listed is not None and model not in self.listed

    async def _list(self, key: str | None) -> None:
        self.listed_at = time.monotonic()
        try:
            response = await self.upstream.get(self.base_url + "/models", headers=bearer(key))
            data = response.json().get("data") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            data = None
        if isinstance(data, list) and all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data) and data:
            listed = {}
            for m in data[:10_000]:
                context = m.get("max_model_len")
                listed[m["id"]] = context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None
            self.listed = listed

    def cancel(self) -> None:
        """Stop a refresh under way (the server shuts down)."""
        if self._listing is not None:
            self._listing.cancel()


class TokenCounts:
    """Prompt token counts as the upstream bills them (vLLM's ``/tokenize``),
    for the ``usage`` of an answer: speculation's calls each bill their own
    prompt, so no one of them says what the caller's prompt was."""

    def __init__(self, upstream: httpx.AsyncClient, base_url: str) -> None:
        self.upstream, self.base_url = upstream, base_url
        self.tokenize: bool | None = None  # whether the upstream counts tokens (None: not known yet)

    async def count(self, model: str | None, kind: str, body: dict[str, Any], key: str | None) -> int:
        """The token count of ``body``'s prompt; 0 where the upstream can't tell."""
        if self.tokenize is False:
            return 0
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        query = {"model": model}
        query.update({"messages": body["messages"], "add_generation_prompt": True} if kind == "chat" else {"prompt": body["prompt"]})
        try:
            response = await self.upstream.post(root + "/tokenize", json=query, headers=bearer(key))
            count = response.json().get("count") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0  # a failure now says nothing about the next time
        if response.status_code in (404, 405, 501):
            self.tokenize = False  # not there: never asked again
        elif isinstance(count, int):
            self.tokenize = True
        return count if isinstance(count, int) else 0


def bearer(key: str | None) -> dict[str, str]:
    """The Authorization header that carries ``key`` (none without one)."""
    return {"authorization": f"Bearer {key}"} if key else {}
