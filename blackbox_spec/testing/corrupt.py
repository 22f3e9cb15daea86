"""Token strings that can't be trusted: a fake target's logprobs, corrupted.

:func:`corrupting` wraps a :class:`~blackbox_spec.testing.FakeTarget`'s
handler so that some of its answers and stream chunks carry token strings
that no longer fit their text: an entry dropped, duplicated, split in two,
merged with the next, its last character moved onto the next, replaced by
``""`` or by U+FFFD, and ``text_offset`` shifted.  The text itself is never
touched: a plain call (no logprobs) is the reference a client must match.
"""

from __future__ import annotations

import json
import random
from typing import Any, Awaitable, Callable

import httpx

KINDS = ("drop", "duplicate", "split", "merge", "move", "empty", "fffd", "offsets")
_LISTS = ("tokens", "token_logprobs", "top_logprobs")


def corrupting(handler: Callable[[httpx.Request], Awaitable[httpx.Response]], rng: random.Random, rate: float = 0.3,
               kinds: tuple[str, ...] = KINDS) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    """An async respx/MockTransport handler: ``handler``'s answers, each
    answer (or stream chunk) with logprobs corrupted with probability ``rate``."""

    async def handle(request: httpx.Request) -> httpx.Response:
        response = await handler(request)
        await response.aread()
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            lines = []
            for line in response.text.split("\n\n"):
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if rng.random() < rate:
                        corrupt(chunk, rng, kinds)
                    line = "data: " + json.dumps(chunk)
                lines.append(line)
            return httpx.Response(response.status_code, content="\n\n".join(lines).encode(), headers={"content-type": "text/event-stream"})
        try:
            data = response.json()
        except ValueError:
            return response
        if isinstance(data, dict) and rng.random() < rate:
            corrupt(data, rng, kinds)
        return httpx.Response(response.status_code, json=data)

    return handle


def corrupt(data: dict[str, Any], rng: random.Random, kinds: tuple[str, ...] = KINDS) -> None:
    """One corruption of the logprobs in ``data`` (an answer or a chunk), in place."""
    for choice in data.get("choices") or []:
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list) and logprobs["tokens"]:
            _corrupt_legacy(logprobs, rng, rng.choice(kinds))
        elif isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list) and logprobs["content"]:
            _corrupt_content(logprobs["content"], rng, rng.choice(kinds))


def _corrupt_legacy(lp: dict[str, Any], rng: random.Random, kind: str) -> None:
    tokens = lp["tokens"]
    n = len(tokens)
    k = rng.randrange(n)
    rows = [lp[name] if isinstance(lp.get(name), list) and len(lp[name]) == n else None for name in _LISTS]
    if kind == "offsets":
        if isinstance(lp.get("text_offset"), list) and lp["text_offset"]:
            lp["text_offset"][k] += rng.choice([-3, -1, 1, 2, 7])
        return
    strings = _edit(tokens, k, rng, kind)
    for row, name in zip(rows[1:], _LISTS[1:]):
        if row is not None:
            lp[name] = _resize(row, k, kind, len(strings))
    lp["tokens"] = strings
    if isinstance(lp.get("text_offset"), list):
        offsets, at = [], lp["text_offset"][0] if lp["text_offset"] else 0
        for s in strings:
            offsets.append(at)
            at += len(s)
        lp["text_offset"] = offsets


def _corrupt_content(content: list[dict], rng: random.Random, kind: str) -> None:
    k = rng.randrange(len(content))
    strings = _edit([str(e.get("token", "")) for e in content], k, rng, kind)
    entries = _resize(content, k, kind, len(strings))
    for entry, s in zip(entries, strings):
        entry["token"] = s
        entry["bytes"] = list(s.encode("utf-8", "surrogatepass"))
    content[:] = entries


def _edit(tokens: list[str], k: int, rng: random.Random, kind: str) -> list[str]:
    """The token strings with entry ``k`` corrupted by ``kind``."""
    out = list(tokens)
    s = out[k]
    if kind == "drop":
        del out[k]
    elif kind == "duplicate":
        out.insert(k, s)
    elif kind == "split":
        cut = rng.randint(0, len(s))
        out[k : k + 1] = [s[:cut], s[cut:]]
    elif kind == "merge" and k + 1 < len(out):
        out[k : k + 2] = [s + out[k + 1]]
    elif kind == "move" and k + 1 < len(out) and s:
        out[k], out[k + 1] = s[:-1], s[-1] + out[k + 1]
    elif kind == "empty":
        out[k] = ""
    elif kind == "fffd":
        out[k] = "\ufffd" if not s or rng.random() < 0.5 else s[: (i := rng.randrange(len(s)))] + "\ufffd" + s[i + 1 :]
    return out


def _resize(row: list, k: int, kind: str, size: int) -> list:
    """A parallel list (logprobs, top entries) kept as long as the strings."""
    row = [dict(x) if isinstance(x, dict) else x for x in row]
    while len(row) < size:
        row.insert(k, dict(row[k]) if isinstance(row[k], dict) else row[k])
    while len(row) > size:
        del row[min(k, len(row) - 1)]
    return row
