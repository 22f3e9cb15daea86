"""Chat targets: one assistant turn, seen by the orchestrator as a completion.

The orchestrator works on strings: "the context so far" and "continue it".
For a chat the context is the conversation plus the assistant message written
so far.  :class:`ChatTurn` maps one onto the other: the text the orchestrator
calls its prompt is ``head`` (the conversation as plain text, for the drafter
to look things up in) followed by the partial assistant message, and every
call sends the messages with that partial message to be continued
("prefill").  An empty partial message is a plain chat call, exactly what a
user's own request is.

Whether and how a server continues a partial assistant message is learned
by :func:`~blackbox_spec.chat_probe.probe_chat`, never assumed:

* vLLM and SGLang continue it when asked (``continue_final_message`` with
  ``add_generation_prompt=false``); llama.cpp's server, TGI and Groq
  continue a trailing assistant message as it is; Mistral, and DeepSeek on
  its ``/beta`` URL, when that message says ``"prefix": true``; OpenAI's
  API starts a new turn instead (``CONTINUE_FORMS``, tried in that order).
* A chat template may strip whitespace from messages (Gemma's ``| trim``;
  TGI trims a continued message's end; transformers also cut trailing
  whitespace when the template moved it).  Then "Hello\\n" is continued as
  if it were "Hello", and the text would differ from a plain call.  The
  probe compares prompt token counts with and without the whitespace.
  Where only the end is trimmed, a message that ends in whitespace is sent
  only up to the last token end before it, and the answer, which writes the
  rest again, is read from there (``carried``); where the start is
  stripped too, speculation stays off.
* vLLM's ``prompt_logprobs`` on chat give echo-style verification in one
  call: the target's own choice at every token of the prefilled message.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator

from ._exceptions import PromptError, TargetError, TargetResponseError
from ._target import THREAD_CHARS, Completion, StreamEnd, StreamPiece, TargetAPI, Usage
from ._resume_align import Aligned
from ._scoring import prompt_aligned, prompt_units

if TYPE_CHECKING:
    from ._output import Output

# The request fields that make vLLM / SGLang continue the final message.
CONTINUE_FIELDS = {"continue_final_message": True, "add_generation_prompt": False}
# The ways a chat API is asked to continue a final assistant message: (request
# fields, fields on that message).  A bare trailing message before Mistral's
# ``prefix`` (which llama.cpp would ignore, and Mistral refuses the bare one).
CONTINUE_FORMS: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
    (CONTINUE_FIELDS, {}),
    ({}, {}),
    ({}, {"prefix": True}),
)


@dataclass(frozen=True)
class ChatSupport:
    """What a server's chat endpoint offers for speculation, from one probe.

    ``prefill``: the request fields under which the server continued a
    partial assistant message exactly (``{}`` when it does so unasked, as
    llama.cpp does); None when it can't.  ``reason`` says why speculation is
    off, when it is.
    """

    logprobs: bool
    prefill: dict[str, Any] | None
    prompt_logprobs: bool
    round_trip_s: float
    reason: str | None = None
    # The answer to a prefill starts with the prefilled text (llama-server).
    repeats_prefill: bool = False
    # The continuation the probe saw work (kept in the profile: the next
    # process checks it again in one round, see ``probe_chat``).
    check: "ContinueCheck | None" = None
    # Fields the continued assistant message itself carries (Mistral's
    # ``{"prefix": true}``); with ``prefill``, one of ``CONTINUE_FORMS``.
    prefill_message: dict[str, Any] = field(default_factory=dict)
    # The template trims the continued message's trailing whitespace (TGI):
    # such a message is sent only up to a token end before it (``carried``).
    trims_trailing: bool = False
    # Where ``prompt_logprobs`` score a message: (prompt tokens, seconds) of
    # the probe's scoring calls, a short context and a long one, the chat
    # echo round's first measured costs (``server_probe.seed_echo_cost``).
    echo_sizes: tuple[tuple[int, float], ...] = ()

    @property
    def speculative(self) -> bool:
        return self.reason is None

    @property
    def continue_form(self) -> str | None:
        """The continuation form's name (``form_name``); None: none works."""
        return None if self.prefill is None else form_name(self.prefill, self.prefill_message)


@dataclass(frozen=True)
class ContinueCheck:
    """The probe's plain answer, cut in two: asked to continue ``partial``,
    a server that continues a message exactly answers ``rest`` (in
    ``rest_tokens`` tokens)."""

    partial: str
    rest: str
    rest_tokens: int
    # The form it worked under (``ChatSupport.prefill``, ``repeats_prefill``):
    # a later process's side branches use it while the check runs again
    # (``ChatTurn.side_stream``).  None: a profile from before it was kept.
    prefill: dict[str, Any] | None = None
    repeats_prefill: bool = False
    prefill_message: dict[str, Any] = field(default_factory=dict)
    trims_trailing: bool = False


@dataclass
class _Request:
    """One continuing call: the messages and fields to send, and what the
    answer writes before its own text: ``repeated`` (llama-server repeats
    the prefilled message, without logprobs) or ``carried`` (trimmed
    whitespace, and the tokens before it, written again in
    ``carried_tokens`` tokens: ``ChatTurn._carry``)."""

    messages: list[dict[str, Any]]
    fields: dict[str, Any]
    repeated: str = ""
    carried: str = ""
    carried_tokens: int = 0


def form_name(fields: dict[str, Any], message: dict[str, Any]) -> str:
    """How a continuation form is named to users.

    >>> form_name(CONTINUE_FIELDS, {}), form_name({}, {"prefix": True}), form_name({}, {})
    ('continue_final_message', 'prefix: true', 'trailing assistant message')
    """
    if fields.get("continue_final_message"):
        return "continue_final_message"
    if message.get("prefix"):
        return "prefix: true"
    return "trailing assistant message"


def continued_messages(messages: list[dict[str, Any]], partial: str, message_fields: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages`` followed by the assistant message ``partial`` to be continued."""
    return messages + [{"role": "assistant", "content": partial, **message_fields}]


def whitespace_cut(generated: str, ends: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Where a message ending in ``generated`` may be cut for a template that
    trims trailing whitespace: the last token end (``ends``: (characters,
    tokens) pairs, ascending, ``(0, 0)`` first where the message may be
    sent without any of it) that no whitespace precedes, and how many tokens
    follow it.  None: ``generated``'s own end or such a cut is not known.

    >>> ends = [(0, 0), (3, 1), (7, 2), (11, 3)]     # "def", " foo", "():\\n" (one token)
    >>> whitespace_cut("def foo():\\n", ends)          # not at "def foo():": no token ends there
    (7, 1)
    >>> whitespace_cut("def foo", ends[:3]), whitespace_cut("def foo():\\n", ends[1:3])
    ((7, 0), None)
    """
    counts = dict(ends)
    if len(generated) not in counts:
        return None
    for offset, tokens in reversed(ends):
        if offset <= len(generated) and not generated[:offset][-1:].isspace():
            return offset, counts[len(generated)] - tokens
    return None


def conversation_text(messages: list[dict[str, Any]]) -> str:
    """The conversation as the drafter sees it: each message's text, in order.
    (Only for drafting: the server renders messages with its own template.)"""
    return "".join(f"{m['role']}:\n{m['content']}\n\n" for m in messages) + "assistant:\n"


def check_messages(messages: object) -> list[dict[str, Any]]:
    """Messages as the chat API takes them, text content only; a clear error otherwise."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"message {k} must be an object with a 'role' string")
        if not isinstance(message.get("content"), str):
            raise PromptError(f"message {k} must have text 'content' (a string); other content is passed through by `bspec serve`, not speculated on")
    return [dict(m) for m in messages]


class ChatTurn:
    """One assistant turn as a completions-style target (``complete`` / ``stream``).

    ``prompt`` is what the orchestrator starts from: the conversation's text,
    plus, with ``continue_final``, the assistant message the conversation
    ends with (that message is then continued, as a prefill).
    """

    def __init__(self, api: TargetAPI, messages: list[dict[str, Any]], *, extra: dict[str, Any] | None = None, continue_final: bool = False) -> None:
        self.api = api
        self.ends_with_assistant = messages[-1]["role"] == "assistant"
        prefilled = messages[-1]["content"] if continue_final and self.ends_with_assistant else None
        self.messages = messages[:-1] if prefilled is not None else messages
        self.head = conversation_text(self.messages)
        self.prompt = self.head + (prefilled or "")
        self.support: ChatSupport | None = None
        # The probe of how this server continues a message, still running
        # beside the turn's first request (which continues nothing).
        self.pending: asyncio.Future[ChatSupport] | None = None
        self.extra = dict(extra or {})
        self.usage_seen: list[Usage] = []  # each call's usage (Predicted Outputs' counts ride on it)
        # While ``pending`` runs: the continuation form an earlier process's
        # probe saw work (the profile's), which side branches may use at
        # once; their text is taken only once ``side_confirmed``.
        self.provisional: ChatSupport | None = None
        self.provisional_used = False
        # The generation this turn serves (set by its caller): where the
        # target's tokens end in its text, for templates that trim (``_carry``).
        self.output: Output | None = None

    @property
    def server_kind(self) -> str | None:
        return self.api.server_kind

    @property
    def omits_pieces(self) -> bool:
        return self.api.omits_pieces

    @omits_pieces.setter
    def omits_pieces(self, value: bool) -> None:
        self.api.omits_pieces = value

    async def context_tokens(self, prompt: str, text: str) -> list[int] | None:
        """The server's tokens for the assistant message so far (the part of
        it in ``prompt``, and ``text``): the message starts after the
        template's own markers, so its text alone is what can merge."""
        return await self.api.tokenize(prompt[len(self.head):] + text)

    async def count_tokens(self, prompt: str, text: str) -> int | None:
        """How many tokens the assistant's ``text`` is, after the part of the
        message in ``prompt`` (see ``TargetAPI.count_tokens``)."""
        return await self.api.count_tokens(prompt[len(self.head):], text)

    @property
    def trims_trailing(self) -> bool:
        """Does the server trim a continued message's trailing whitespace?
        (Then side branches start only where no whitespace ends their text.)"""
        support = self.support or self.provisional
        return support is not None and support.trims_trailing

    async def _request(self, prompt: str, provisional: bool = False) -> _Request:
        """What to send for ``prompt``, and what the answer puts before its
        own text.  ``provisional``: a side branch, which may go out under
        the stored form while the probe still runs."""
        if not prompt.startswith(self.head):
            raise AssertionError("a chat turn continues its own conversation only")
        partial = prompt[len(self.head):]
        if not partial:
            return _Request(self.messages, dict(self.extra))
        support = self.support
        if support is None and provisional and self.provisional is not None and self.pending is not None and not self.pending.done():
            support = self.provisional
            self.provisional_used = True
        elif support is None and self.pending is not None:
            support = self.support = await asyncio.shield(self.pending)  # (one caller giving up leaves the probe to the rest)
        if support is None or support.prefill is None:
            raise TargetError(f"{self.api.base_url} cannot continue a partial assistant message, so this chat turn cannot resume part-way")
        trimmed = support.trims_trailing and partial[-1].isspace() and prompt != self.prompt  # (the caller's own message goes as it is)
        carried, carried_tokens = self._carry(prompt) if trimmed else ("", 0)
        partial = partial[: len(partial) - len(carried)]
        if not partial:
            return _Request(self.messages, dict(self.extra), carried=carried, carried_tokens=carried_tokens)
        repeated = partial if support.repeats_prefill else ""
        return _Request(continued_messages(self.messages, partial, support.prefill_message), {**support.prefill, **self.extra},
                        repeated, carried, carried_tokens)

    def _carry(self, prompt: str) -> tuple[str, int]:
        """For a template that trims trailing whitespace: the end of
        ``prompt`` to leave out, back to the last token end no whitespace
        precedes, and its tokens.  The answer writes it again first (the
        server continues from a token end the target chose, as it did)."""
        out, generated = self.output, prompt[len(self.prompt):]
        prefilled = self.prompt[len(self.head):]
        start = [] if prefilled[-1:].isspace() else [(0, 0)]
        cut = None
        if out is not None and len(prompt) >= len(self.prompt) and out.text.startswith(generated):
            cut = whitespace_cut(generated, start + out.ends)
        if cut is None:
            raise TargetError(f"{self.api.base_url} trims a continued message's trailing whitespace, and no token end is known before "
                              "this one's: it can't be continued exactly")
        return generated[cut[0]:], cut[1]

    async def side_confirmed(self) -> bool:
        """May a side branch's text be taken?  Yes unless one went out under
        the stored form (``provisional``) and the probe, once it answers, did
        not see that same form work."""
        if not self.provisional_used:
            return True
        if self.support is None and self.pending is not None:
            try:
                self.support = await asyncio.shield(self.pending)
            except Exception:  # (the probe failed: the turn goes on plainly, see ``_chat_probed``)
                return False
        used, support = self.provisional, self.support
        return (support is not None and used is not None and support.speculative
                and support.prefill == used.prefill and support.prefill_message == used.prefill_message
                and support.repeats_prefill == used.repeats_prefill and support.trims_trailing == used.trims_trailing)

    async def complete(self, prompt: str, *, max_tokens: int, logprobs: int | None = None, echo: bool = False, stop: list[str] | None = None,
                       earlier: Aligned | None = None, stable: int | None = None) -> Completion:
        sent = await self._request(prompt)
        fields = sent.fields
        if echo:
            if sent.carried:
                raise TargetError("prompt logprobs can't score a message the server trims")
            fields["prompt_logprobs"] = 1
        c = await self.api.chat(sent.messages, max_tokens=max_tokens + sent.carried_tokens, logprobs=logprobs is not None or echo, stop=stop,
                                extra=fields, repeated=sent.repeated, carried=sent.carried)
        self.usage_seen.append(c.usage)
        if sent.carried_tokens and c.usage.completion_tokens:
            c.usage = replace(c.usage, completion_tokens=c.usage.completion_tokens - sent.carried_tokens)
        if echo:
            part = None if stable is None else max(0, stable - len(self.head))
            align = functools.partial(prompt_aligned, c, prompt[len(self.head):], earlier, part)
            c.prompt_aligned = await asyncio.to_thread(align) if len(prompt) - len(self.head) > THREAD_CHARS else align()
            c.prompt_units = prompt_units(c, prompt[len(self.head):], len(self.head))
            c.echoed = c.prompt_units is not None
        return c

    def side_stream(self, prompt: str, *, max_tokens: int, stop: list[str] | None = None, logprobs: int | None = None) -> AsyncIterator[StreamPiece | StreamEnd]:
        """A side branch's :meth:`stream` (see ``provisional``)."""
        return self.stream(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs, provisional=True)

    async def stream(self, prompt: str, *, max_tokens: int, stop: list[str] | None = None, logprobs: int | None = None,
                     provisional: bool = False) -> AsyncIterator[StreamPiece | StreamEnd]:
        sent = await self._request(prompt, provisional)
        repeated, carried = sent.repeated, sent.carried
        stream = self.api.chat_stream(sent.messages, max_tokens=max_tokens + sent.carried_tokens, stop=stop, logprobs=logprobs is not None,
                                      extra=sent.fields)
        try:
            async for item in stream:
                if isinstance(item, StreamEnd):
                    self.usage_seen.append(item.usage)
                    if sent.carried_tokens and item.usage.completion_tokens:
                        item = replace(item, usage=replace(item.usage, completion_tokens=item.usage.completion_tokens - sent.carried_tokens))
                elif carried:
                    item, carried = self._drop_carried(item, carried)
                    if item is None:
                        continue
                elif repeated:
                    # The repeated prefill comes first; its tokens carry no logprobs.
                    cut = min(len(repeated), len(item.text))
                    if item.text[:cut] != repeated[:cut]:
                        raise TargetResponseError(f"{self.api.base_url} did not repeat the prefilled message before its answer, as it did before")
                    repeated = repeated[cut:]
                    item = replace(item, text=item.text[cut:])
                    if not item.text and not item.tokens:
                        continue
                yield item
            if carried:
                raise TargetResponseError(f"{self.api.base_url}'s answer ended before it wrote the trimmed whitespace again")
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    def _drop_carried(self, item: StreamPiece, carried: str) -> tuple[StreamPiece | None, str]:
        """``item`` without the part of ``carried`` it writes again (text and
        tokens: whole tokens, as it began at a token end), and what of
        ``carried`` is still to come."""
        cut = min(len(carried), len(item.text))
        if item.text[:cut] != carried[:cut]:
            raise TargetResponseError(f"{self.api.base_url} did not write the trimmed end of the message again")
        tokens, own_bytes, dropped, covered = item.tokens, item.own_bytes, 0, 0
        if tokens is not None:
            while dropped < len(tokens) and covered < cut:
                covered += len(tokens[dropped])
                dropped += 1
            if covered != cut:
                raise TargetResponseError(f"{self.api.base_url} wrote the trimmed end of the message again in other tokens")
            tokens, own_bytes = tokens[dropped:], None if own_bytes is None else own_bytes[dropped:]
        generated = None if item.generated is None else item.generated - dropped
        rest = replace(item, text=item.text[cut:], tokens=tokens, own_bytes=own_bytes, generated=generated)
        return (rest if rest.text or rest.tokens or rest.final else None), carried[cut:]
