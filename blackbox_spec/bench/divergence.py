"""Tell a near-tie apart from a bug when two greedy texts differ.

Temperature 0 is not fully deterministic on real servers: batched prefill
and decode logits differ in the last bits, so where the top two tokens are
within a hair of each other, either may come out.  A divergence is excused
only there, and only when the target's own logprobs at that position show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._exceptions import TargetHTTPError
from .._target import TargetAPI, _logprob_lists

NEAR_TIE = 1e-3  # top-2 logprob gap below which either token is a legitimate greedy choice


@dataclass
class Divergence:
    position: int  # character offset in the generated text
    expected: str  # a few characters of the plain text from there
    got: str  # ... and of the speculative text
    gap: float | None  # top-1 minus top-2 logprob at that position, None if unknown
    top: list[tuple[str, float]]
    # A plain call from the divergence point picks the speculative text's
    # token: the server disagrees with its own earlier plain run (bf16
    # prefill vs decode numerics, batch composition), not with us.
    server_agrees_with_spec: bool = False

    @property
    def near_tie(self) -> bool:
        return self.gap is not None and self.gap < NEAR_TIE

    def describe(self) -> str:
        kind = "near-tie" if self.near_tie else "MISMATCH"
        if not self.near_tie and self.server_agrees_with_spec:
            kind += " (the server's own plain call from this point gives the speculative text)"
        gap = "unknown" if self.gap is None else f"{self.gap:.2e}"
        return f"{kind} at char {self.position}: plain {self.expected!r} vs spec {self.got!r}, top-2 gap {gap}, top {self.top}"


def first_difference(a: str, b: str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


async def explain(api: TargetAPI, prompt: str, plain: str, spec: str) -> Divergence | None:
    """None if the texts are equal; else where they part and how close the
    target's top two tokens were there.

    The position asked about is the start of the target token that contains
    the first differing character: the last token boundary of the plain text
    before it, found from the plain continuation's own logprobs.
    """
    at = first_difference(plain, spec)
    if at is None:
        return None
    probe = await api.complete(prompt, max_tokens=max(1, len(plain)), logprobs=1)
    start = 0
    for unit in probe.units or []:
        if start + len(unit.text) > at:
            break
        start += len(unit.text)
    # Ask for the top-2 at the token that starts at ``start``.
    top = await top_logprobs(api, prompt + plain[:start])
    gap = top[0][1] - top[1][1] if len(top) >= 2 else None
    agrees = bool(top) and bool(top[0][0]) and spec.startswith(top[0][0], start) and not plain.startswith(top[0][0], start)
    return Divergence(at, plain[at : at + 20], spec[at : at + 20], gap, [(t, round(lp, 5)) for t, lp in top], agrees)


async def resumed_plain_gives_spec(api: TargetAPI, prompt: str, plain: str, spec: str, back: int = 12) -> int | None:
    """The token boundary from which a plain greedy call of the server's own
    writes the speculative text through the divergence, or None.

    A speculative run resumes the target from many points: the text up to
    each point is prefilled as a batch, the rest decoded one token at a time.
    On servers whose logits depend on that split (llama.cpp on CPU: up to
    ~0.3 apart, docs/design.md) the greedy choice at a non-tie can flip with it.
    Resuming from each of the last ``back`` boundaries before the divergence
    (and from the prompt itself) tries those splits, each with the server's
    prompt cache and, where it has one to turn off (llama.cpp's
    ``cache_prompt``), without: concurrent requests land on slots whose
    cache holds nothing of the prompt, which then is prefilled whole.  If
    none writes the speculative text, the server never chose it and the
    difference is ours.
    """
    at = first_difference(plain, spec)
    if at is None:
        return None
    probe = await api.complete(prompt, max_tokens=max(1, len(plain)), logprobs=1)
    bounds = [0]
    for unit in probe.units or []:
        if bounds[-1] + len(unit.text) > at:
            break
        bounds.append(bounds[-1] + len(unit.text))
    cuts = list(reversed(bounds[-back:] + ([0] if len(bounds) > back else [])))
    for extra in ({}, {"cache_prompt": False}):
        for cut in cuts:
            tokens = len(bounds) - bounds.index(cut)  # through the token that holds the divergence
            try:
                written = plain[:cut] + await _greedy_text(api, prompt + plain[:cut], tokens, extra)
            except TargetHTTPError:
                break  # a server without that field (one that refuses unknown ones)
            common = min(len(written), len(spec))
            if common > at and written[:common] == spec[:common]:  # its whole divergent token
                return cut
    return None


async def _greedy_text(api: TargetAPI, context: str, max_tokens: int, extra: dict) -> str:
    body = {"model": api.model, "prompt": context, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = await api._post("/completions", body)
    return api._json(response)["choices"][0].get("text") or ""


async def top_logprobs(api: TargetAPI, context: str, k: int = 5) -> list[tuple[str, float]]:
    """The target's top-``k`` next tokens after ``context``, best first."""
    response = await api._post("/completions", {"model": api.model, "prompt": context, "max_tokens": 1, "temperature": 0, "logprobs": k})
    choice = api._json(response)["choices"][0]
    _, _, tops = _logprob_lists(choice.get("logprobs"))  # legacy or llama.cpp's "content" format
    top = (tops[0] if tops else None) or {}
    return sorted(((t, float(lp)) for t, lp in top.items()), key=lambda kv: -kv[1])[:k]
