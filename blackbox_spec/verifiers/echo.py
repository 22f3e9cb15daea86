"""Verification in one call, from prompt logprobs (``echo`` + ``logprobs``).

We send ``context + draft`` and ask the server to echo it with logprobs.  At
every prompt position it reports the token there and its own top choice; the
draft continues the target's path exactly as long as the two agree.  At the
first disagreement the top choice *is* the target's next token (the
"correction"), and if all agree, the tokens generated after the draft are the
target's own continuation (the "bonus").
"""

from __future__ import annotations

import time

from .._exceptions import TargetResponseError
from .._resume_align import Aligned
from .._target import TargetAPI
from .._tokens import Unit, is_opaque, looks_special
from .base import Plan, Verdict, complete_units


class EchoUnsupported(TargetResponseError):
    """The server refused or ignored ``echo``."""


class EchoVerifier:
    name = "echo"

    def __init__(self, api: TargetAPI) -> None:
        self.api = api
        # The last round's prompt alignment: each round's context begins with
        # the last one's, so only what is new is aligned (``_resume_align``).
        self.aligned: Aligned | None = None

    async def verify(self, context: str, draft: str, plan: Plan) -> Verdict:
        started = time.perf_counter()
        c = await self.api.complete(context + draft, max_tokens=max(1, plan.extra_tokens), logprobs=1, echo=True,
                                    earlier=self.aligned, stable=len(context))
        if not c.echoed or c.prompt_units is None or c.units is None:
            raise EchoUnsupported("the server did not echo the prompt with logprobs")
        self.aligned = c.prompt_aligned
        verdict = Verdict([], calls=1, usage=c.usage)
        cut = len(context)
        draft_start = next((k for k, u in enumerate(c.prompt_units) if u.start >= cut), len(c.prompt_units))
        if draft_start and c.prompt_units[draft_start - 1].end > cut:
            # The server's tokenization of context + draft has a token across
            # the end of the context: this draft cannot be checked here.
            verdict.plain_next = True
            verdict.seconds = time.perf_counter() - started
            return verdict
        verdict.context_units = c.prompt_units[:draft_start]
        drafted = [u for u in c.prompt_units[draft_start:] if not u.special]
        verdict.proposed_units = len(drafted)
        for unit in drafted:
            if not unit.matches:
                break
            verdict.units.append(unit)
        verdict.draft_units = len(verdict.units)
        if len(verdict.units) == len(drafted):
            bonus = complete_units(c.units)
            verdict.units += bonus
            verdict.eos = c.eos and len(bonus) == len(c.units)
        else:
            mismatch = drafted[len(verdict.units)]
            token = mismatch.correction
            if token is None or is_opaque(token) or looks_special(token):
                verdict.plain_next = True  # unreadable, or maybe end-of-text: ask plainly
            else:
                verdict.units.append(Unit(token, 1, mismatch.start))
        verdict.seconds = time.perf_counter() - started
        return verdict
