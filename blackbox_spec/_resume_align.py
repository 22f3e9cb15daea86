"""Echoed prompts aligned from where the last one left off.

An echo round sends the whole context (prompt, accepted text, draft) and
gets a token string for every position back; aligning them all each round
(``_tokens.align_tokens``) costs time linear in the context, every round, on
the event loop.  But each round's context begins with the last one's.  The
alignment remembers its *sync points*: token counts after which every
placement stands on one byte, having read no byte past a known end.  A
later text that begins with the same token strings and the same bytes up to
there aligns the same way up to that point, so only the rest is aligned.

Only points before ``stable`` characters are reused (the context, whose
units are not read for their logprobs; the draft's are always fresh).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ._tokens import Unit, align_tokens


@dataclass
class Aligned:
    """One echoed prompt's alignment, kept for the next round."""

    text: str
    data: bytes
    tokens: list[str]
    units: list[Unit]
    # (tokens before, byte offset, bytes that must agree, units before), ascending.
    syncs: list[tuple[int, int, int, int]] = field(default_factory=list)


def align_prompt(text: str, tokens: list[str], logprobs: list, tops: list, earlier: Aligned | None = None, stable: int | None = None) -> Aligned:
    """``align_tokens(text, tokens, ..., prompt=True)``, picked up from
    ``earlier``'s last sync point that this text and these tokens share
    (within the first ``stable`` characters)."""
    data = text.encode("utf-8", "surrogatepass")
    k = b = c = u = 0
    kept: list[tuple[int, int, int, int]] = []
    if earlier is not None:
        same_tokens = _common(tokens, earlier.tokens)
        same_bytes = _common(data, earlier.data)
        limit = len(text[:stable].encode("utf-8", "surrogatepass")) if stable is not None else len(data)
        for index in range(len(earlier.syncs) - 1, -1, -1):
            sk, sb, safe, su = earlier.syncs[index]
            if sk <= same_tokens and safe < same_bytes and sb <= limit:
                k, b, u = sk, sb, su
                c = len(data[:b].decode("utf-8", "surrogatepass"))
                kept = earlier.syncs[: index + 1]
                break
    head = earlier.units[:u] if earlier is not None and u else []
    found: list[tuple[int, int, int]] = []
    rest = align_tokens(text[c:], tokens[k:], logprobs[k:], tops[k:], prompt=True, syncs=found)
    units = head + [replace(unit, start=unit.start + c) for unit in rest]
    syncs = kept + _numbered(found, rest, k, b, len(head))
    return Aligned(text, data, tokens, units, syncs)


def _numbered(found: list[tuple[int, int, int]], units: list[Unit], k: int, b: int, before: int) -> list[tuple[int, int, int, int]]:
    """Sync points of a piece aligned from token ``k``, byte ``b``, with the
    number of units (of the whole) that end by each."""
    out, u, listed = [], 0, 0
    for sk, sb, safe in found:
        while u < len(units) and listed + units[u].tokens <= sk:
            listed += units[u].tokens
            u += 1
        if listed == sk:  # (a sync point is a cut: a unit ends there)
            out.append((k + sk, b + sb, b + safe, before + u))
    return out


def _common(a, b) -> int:
    """The length of the longest common prefix of two sequences (memcmp-fast)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo], a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
