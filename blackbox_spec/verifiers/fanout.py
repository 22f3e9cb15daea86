"""Verification by concurrent continuations at several draft offsets.

Request *i* continues ``context + draft[:offsets[i]]`` for a few tokens, all
requests at once.  A server with a prefix cache and batching (vLLM, SGLang,
hosted APIs) serves them for little more than one.  The chain:

* request 0 continues the context itself, so its output is target text;
* request *i+1* stands on the target's path if request *i*'s output equals
  the draft up to ``offsets[i+1]`` **and ends a token exactly there** (the
  token-boundary rule of ``_tokens``);
* the first request whose output leaves the draft ends the chain, and its
  whole output is still target text.

As soon as a finished request breaks the chain, the requests after it are
useless, so they are cancelled while still in flight.

With ``offsets == [0]`` this is a plain continuation of the context: the
"plain" strategy is the same code.
"""

from __future__ import annotations

import asyncio
import time

from .._exceptions import TargetResponseError
from .._cancel import cancel_once
from .._target import Completion, TargetAPI
from .._tokens import AlignmentError, Unit
from .base import Plan, Verdict, add_usage, complete_units


def units_through(units: list[Unit], draft: str, start: int, end: int) -> list[Unit] | None:
    """The leading units that spell ``draft[start:end]`` exactly, ending on a
    unit boundary at ``end``; None when the output leaves the draft first."""
    taken: list[Unit] = []
    pos = start
    for unit in units:
        if pos == end:
            return taken
        if pos + len(unit.text) > end or not draft.startswith(unit.text, pos):
            return None
        taken.append(unit)
        pos += len(unit.text)
    return taken if pos == end else None


def is_likely_boundary(text: str, p: int, trims: bool = False) -> bool:
    """Does a token of a BPE target probably end at ``text[:p]``?

    Byte-level BPE tokenizers (GPT-4, Llama 3, Qwen 2) first split text with
    a regex, and merges never cross those splits.  Two splits are nearly
    certain: right after a run of newlines (the next piece starts with the
    indentation or the next word), and right before a space that follows a
    non-space (the space starts the next word's piece).  A newline right
    after punctuation is *not* one: ``"):\n"`` is a single piece.
    ``trims``: the server trims the text's trailing whitespace, so only the
    second kind will do.
    """
    if not 0 < p < len(text):
        return False
    before, after = text[p - 1], text[p]
    if before == "\n":
        return after not in "\r\n" and not trims
    return after == " " and not before.isspace()


def likely_boundaries(draft: str, width: int, segment: int, trims: bool = False) -> list[int]:
    """Offsets near ``segment, 2*segment, ...`` where a token probably ends
    (:func:`is_likely_boundary`, ``trims`` as there).  A wrong guess costs
    only that branch: the chain stops there.
    """
    offsets = [0]
    for k in range(1, width):
        target = k * segment
        if target >= len(draft):
            break
        best = None
        for delta in range(0, segment // 2 + 1):
            for p in (target - delta, target + delta):
                if offsets[-1] < p < len(draft) and is_likely_boundary(draft, p, trims):
                    best = p
                    break
            if best is not None:
                break
        if best is not None and best > offsets[-1]:
            offsets.append(best)
    return offsets


class FanoutVerifier:
    name = "fanout"

    def __init__(self, api: TargetAPI) -> None:
        self.api = api

    async def verify(self, context: str, draft: str, plan: Plan) -> Verdict:
        started = time.perf_counter()
        segment = plan.segment_chars or max(1, len(draft) // max(1, plan.width))
        offsets = likely_boundaries(draft, plan.width, segment, getattr(self.api, "trims_trailing", False)) if draft else [0]
        results, broken, cancelled = await self._run_chain(context, draft, offsets, plan.tokens_per_request)
        verdict = chain_verdict(results, broken, draft, offsets, cancelled)
        verdict.proposed_units = max(verdict.draft_units, round(len(draft) / 4))
        verdict.seconds = time.perf_counter() - started
        return verdict

    async def _run_chain(self, context: str, draft: str, offsets: list[int], max_tokens: int) -> tuple[list[Completion | None], int, int]:
        """All requests at once; each one that finishes may break the chain,
        and those past the break are cancelled while still in flight.  The
        completions (None where cancelled), the index of the request that
        ends the chain, and how many were cancelled."""
        results: list[Completion | None] = [None] * len(offsets)
        tasks = {
            asyncio.ensure_future(
                self.api.complete(context + draft[:o], max_tokens=max_tokens, logprobs=1)
            ): i
            for i, o in enumerate(offsets)
        }
        broken = len(offsets) - 1  # the last request ends the chain anyway
        cancelled = 0
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = tasks[task]
                    if task.exception() is not None:
                        # A failed request (after its retries) only ends the
                        # chain before it: the requests before it still stand
                        # on the target's path.  Without request 0 nothing does;
                        # token strings that don't fit their text are not
                        # trusted in any request (the generation stops reading them).
                        if i == 0 or isinstance(task.exception(), AlignmentError):
                            raise task.exception()  # type: ignore[misc]
                        broken = min(broken, i - 1)
                        continue
                    results[i] = task.result()
                    units = results[i].units
                    if i < broken and (units is None or units_through(units, draft, offsets[i], offsets[i + 1]) is None):
                        broken = i
                useless = {t for t in pending if tasks[t] > broken}
                for task in useless:
                    cancel_once(task)
                cancelled += len(useless)
                pending -= useless
                if all(results[i] is not None for i in range(broken + 1)):
                    break
        finally:
            for task in tasks:
                if not task.done():
                    cancel_once(task)
            await asyncio.gather(*tasks, return_exceptions=True)
        return results, broken, cancelled


def chain_verdict(results: list[Completion | None], broken: int, draft: str, offsets: list[int], cancelled: int) -> Verdict:
    """The verdict of a chain that ``broken`` ends: each request before it
    contributes its draft segment, request ``broken`` its whole output (as
    far as it follows the draft, accepted draft), and the usage of every
    request that answered."""
    verdict = Verdict([], calls=len(offsets), cancelled=cancelled)
    for r in results:
        if r is not None:
            add_usage(verdict.usage, r.usage)
    for i in range(broken + 1):
        r = results[i]
        if r is None or r.units is None:
            raise TargetResponseError("the server sent no logprobs for generated tokens")
        if i < broken:
            verdict.units += units_through(r.units, draft, offsets[i], offsets[i + 1]) or []
            continue
        verdict.draft_units = len(verdict.units)
        tail = complete_units(r.units)
        # Whatever of the tail still follows the draft counts as accepted draft.
        pos = offsets[i]
        for unit in tail:
            if not draft.startswith(unit.text, pos) or not unit.text:
                break
            verdict.draft_units += 1
            pos += len(unit.text)
        verdict.units += tail
        verdict.eos = r.eos and len(tail) == len(r.units)
    return verdict
