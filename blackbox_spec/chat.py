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
by :func:`probe_chat`, never assumed:

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
from typing import TYPE_CHECKING, Any, AsyncIterator, NamedTuple

from ._exceptions import PromptError, TargetError, TargetHTTPError, TargetResponseError
from ._target import THREAD_CHARS, Completion, StreamEnd, StreamPiece, TargetAPI, Usage
from ._resume_align import Aligned
from ._scoring import content_start, prompt_aligned, prompt_positions, prompt_units
from ._tokens import AlignmentError, count_tokens

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
_REFUSALS = (400, 422, 501)
_PROBE_MESSAGES = [{"role": "user", "content": "Count from 1 to 40, separated by spaces. Reply with the numbers only."}]
# The echo cost's second measurement: the same question after ~120 more
# tokens of context (as ``server_probe.ECHO_PROBE_PROMPT``).
_LONG_PROBE_MESSAGES = [{"role": "user", "content": "Hello" + " world" * 120 + ". " + _PROBE_MESSAGES[0]["content"]}]


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


# -- the probe -----------------------------------------------------------------------


async def probe_chat(api: TargetAPI, known: ContinueCheck | None = None, *, measure_echo: bool = True) -> ChatSupport:
    """Learn how this server's chat endpoint can be verified: a plain call,
    then 6 small calls at once for each continuation form tried
    (``CONTINUE_FORMS``, until one works).  With ``known`` (what an earlier process's probe
    saw, from the profile) the plain call is skipped: the continuation is
    checked against it in one round, and only where that fails does the
    full probe run.  (A stale ``known`` can only fail: a server that
    continues ``partial`` into ``rest`` continues a message, whatever its
    own plain answer is today.)  ``measure_echo``: where prompt logprobs
    score a message, time them over a long context too (``echo_sizes``)."""
    if known is not None:
        support = await _check_continuing(api, known, None, measure_echo)
        if support.speculative:
            return support
    try:
        plain = await api.chat(_PROBE_MESSAGES, max_tokens=16, logprobs=True)
        logprobs = bool(plain.units)
    except TargetHTTPError as exc:
        if exc.status_code not in _REFUSALS:
            raise
        plain = await api.chat(_PROBE_MESSAGES, max_tokens=16)
        logprobs = False
    except AlignmentError as exc:
        plain = await api.chat(_PROBE_MESSAGES, max_tokens=16)
        return ChatSupport(False, None, False, plain.elapsed, f"the server's token strings on chat do not fit its text ({exc}), so token boundaries are unknown")
    round_trip = plain.elapsed
    if not logprobs:
        return ChatSupport(False, None, False, round_trip, "the server returns no logprobs on chat, so token boundaries are unknown")
    units = plain.units or []
    if len(units) < 4:
        return ChatSupport(True, None, False, round_trip, f"the probe's answer was too short to test continuing it ({len(units)} tokens)")
    middle = len(units) // 2
    check = ContinueCheck(plain.text[: units[middle].start], plain.text[units[middle].start :], count_tokens(units[middle:]))
    return await _check_continuing(api, check, round_trip, measure_echo)


async def continue_forms(api: TargetAPI) -> dict[str, str]:
    """How the server answers each continuation form (``CONTINUE_FORMS``),
    by name, for ``bspec probe``: one plain answer (no logprobs needed),
    then its first half sent back in each form, at once.  "continues",
    "repeats the message, then continues", "answers anew" (a new turn, or
    fields ignored) or "refused (HTTP n)".  The client's own probe
    (``probe_chat``) stops at the first form that works."""
    plain = await api.chat(_PROBE_MESSAGES, max_tokens=16)
    text = plain.text
    cut = text.rfind(" ", 0, len(text) // 2 + 1)
    if cut <= 0:
        return {form_name(*form): "untested (the probe's answer had no space to cut it at)" for form in CONTINUE_FORMS}
    partial, rest = text[:cut], text[cut:]

    async def answer(fields: dict[str, Any], message: dict[str, Any]) -> str:
        try:
            got = (await api.chat(continued_messages(_PROBE_MESSAGES, partial, message), max_tokens=16, extra=fields)).text
        except TargetHTTPError as exc:
            return f"refused (HTTP {exc.status_code})"
        if got.startswith(partial + rest):
            return "repeats the message, then continues"
        if got and (got.startswith(rest) or rest.startswith(got)):
            return "continues"
        return "answers anew"

    answers = await asyncio.gather(*(answer(*form) for form in CONTINUE_FORMS))
    return {form_name(*form): said for form, said in zip(CONTINUE_FORMS, answers)}


_PREDICTION_PROBE = {"type": "content", "content": "1 2 3 4 5 6 7 8 9 10 11 12"}


async def probe_predictions(api: TargetAPI) -> bool:
    """Does the server speculate on a Predicted Outputs ``prediction`` itself?
    One small call with one: a server that does reports the predicted tokens
    it accepted and rejected in its usage (OpenAI's); one that ignores the
    field reports neither, or zeros (vLLM, llama.cpp), and one that refuses
    it answers 4xx."""
    try:
        answer = await api.chat(_PROBE_MESSAGES, max_tokens=8, extra={"prediction": _PREDICTION_PROBE})
    except TargetHTTPError as exc:
        if exc.status_code not in _REFUSALS:
            raise
        return False
    usage = answer.usage
    return (usage.accepted_prediction_tokens or 0) + (usage.rejected_prediction_tokens or 0) > 0


async def _check_continuing(api: TargetAPI, check: ContinueCheck, round_trip: float | None, measure_echo: bool) -> ChatSupport:
    """Does the server continue ``check.partial`` into ``check.rest``, under
    which fields, and may its template and prompt logprobs be trusted?
    (``round_trip``: None takes the continuation's own time.)"""
    found, answered = await _find_continuing_form(api, check, measure_echo)
    if found is None:
        return ChatSupport(True, None, False, round_trip or 0.0,
                           f"the server does not continue a partial assistant message (asked to continue {check.partial!r}, it answered {answered[:40]!r})")
    fields, message, answer, trimmed, echoes = found.fields, found.message, found.answer, found.trimmed, bool(found.echo_sizes)
    prefill, repeats = dict(fields), answer.text != check.rest
    if trimmed is None:
        reason: str | None = "the server reports no usage, so whether its chat template keeps whitespace can't be checked"
    elif trimmed == "leading":
        reason = "the chat template strips leading whitespace from a prefilled assistant message, so a partial message can't be continued exactly"
    else:
        reason = None
    trailing = trimmed == "trailing"
    seconds = answer.elapsed if round_trip is None else round_trip
    kept = replace(check, prefill=prefill, repeats_prefill=repeats, prefill_message=dict(message), trims_trailing=trailing) if reason is None else None
    # (Prompt logprobs score the message as sent: not where its end is trimmed.)
    scores = echoes and reason is None and not trailing
    return ChatSupport(True, prefill, scores, seconds, reason, repeats_prefill=repeats, check=kept,
                       prefill_message=dict(message), trims_trailing=trailing, echo_sizes=found.echo_sizes if scores else ())


class _ContinuingForm(NamedTuple):
    """A form under which the server continued the probe's message."""

    fields: dict[str, Any]  # the request's
    message: dict[str, Any]  # the prefilled message's
    answer: Completion
    trimmed: str | None  # which whitespace the template strips (``_template_trims``)
    # Where prompt logprobs score the prefilled message, their calls'
    # (prompt tokens, seconds) (``_scores_prefill``); empty where they don't.
    echo_sizes: tuple[tuple[int, float], ...]


async def _find_continuing_form(api: TargetAPI, check: ContinueCheck, measure_echo: bool) -> tuple[_ContinuingForm | None, str]:
    """The first form (``CONTINUE_FORMS``) under which the server continues
    ``check.partial`` into ``check.rest``; None where none does, with the
    last answer's text."""
    # vLLM's and SGLang's fields first, with the checks that depend on them
    # at once (one round trip, not three, on the servers that take them:
    # a fresh process pays for this probe); then the other forms
    # (``CONTINUE_FORMS``), where they were refused or not honoured.  A
    # profile's check tries its own form first.
    answered = ""
    known = (check.prefill, check.prefill_message) if check.prefill is not None else None
    for fields, message in sorted(CONTINUE_FORMS, key=lambda form: form != known):
        checks = asyncio.gather(_template_trims(api, fields, message), _scores_prefill(api, check.partial, fields, message, measure_echo))
        answer = None
        try:
            answer = await _continued(api, check, fields, message)
            if answer is not None and answer.text in (check.rest, check.partial + check.rest):
                trimmed, echo_sizes = await checks
                return _ContinuingForm(fields, message, answer, trimmed, echo_sizes), answered
        finally:
            if not checks.done():  # not needed (or the continuation failed): no stray calls left behind
                checks.cancel()
            await asyncio.gather(checks, return_exceptions=True)
        answered = answer.text if answer is not None else answered
    return None, answered


async def _continued(api: TargetAPI, check: ContinueCheck, fields: dict[str, Any], message: dict[str, Any]) -> Completion | None:
    """The answer to the prefilled message in this form; None: refused."""
    try:
        return await api.chat(continued_messages(_PROBE_MESSAGES, check.partial, message), max_tokens=check.rest_tokens, extra=fields)
    except TargetHTTPError as exc:
        if exc.status_code not in _REFUSALS:
            raise
        return None


async def _prompt_tokens(api: TargetAPI, content: str, fields: dict[str, Any], message: dict[str, Any]) -> int:
    c = await api.chat(continued_messages(_PROBE_MESSAGES, content, message), max_tokens=1, extra=fields)
    return c.usage.prompt_tokens


async def _template_trims(api: TargetAPI, fields: dict[str, Any], message: dict[str, Any]) -> str | None:
    """Which whitespace the template strips from a prefilled message:
    "leading" (and maybe trailing), "trailing" or "none".  None: no
    usage to tell by."""
    # (Leading spaces and tabs in turn: no vocabulary merges them with
    # the template's text before them, as "\n" may be with its "\n".)
    lead = " \t" * 4
    texts = ("1 2", "1 2\n\n", lead + "1 2", lead + "1 2\n\n")
    bare, spaced, led, led_spaced = await asyncio.gather(*(_prompt_tokens(api, t, fields, message) for t in texts))
    if not bare:
        return None
    return "leading" if led <= bare else "trailing" if spaced <= bare or led_spaced <= led else "none"


async def _scores_prefill(api: TargetAPI, partial: str, fields: dict[str, Any], message: dict[str, Any],
                          measure_echo: bool) -> tuple[tuple[int, float], ...]:
    """Do prompt logprobs score the prefilled message, at its content?  The
    (prompt tokens, seconds) of the calls that asked (empty: they don't):
    with ``measure_echo``, where they do, a second one over a long context
    (after the first: a server that refuses them is asked once).  A
    chat echo round's cost grows with the context it re-reads, and priced
    from the prior (prefill an eighth of a decoding step a token) it looked
    too dear to try on a GPU-like server: chat never used one there (sim
    gpu, a real Go edit: 0.87 s on side branches, 0.49 s once echo rounds
    had been measured, as completions' probe does: ``server_probe``)."""
    try:
        scored = await _prompt_logprobs(api, _PROBE_MESSAGES, partial, fields, message)
        if scored.prompt_logprobs is None or content_start(prompt_positions(scored.prompt_logprobs)[0], partial) is None:
            return ()
    except (TargetHTTPError, TargetResponseError, TypeError, KeyError, ValueError, AttributeError):
        return ()
    answers = [scored]
    if measure_echo:
        try:
            answers.append(await _prompt_logprobs(api, _LONG_PROBE_MESSAGES, partial, fields, message))
        except (TargetHTTPError, TargetResponseError):
            pass  # (only the echo cost's slope is lost: the prior stays)
    return tuple((a.usage.prompt_tokens, a.elapsed) for a in answers if a.usage.prompt_tokens)


async def _prompt_logprobs(api: TargetAPI, messages: list[dict[str, Any]], partial: str, fields: dict[str, Any], message: dict[str, Any]) -> Completion:
    """One 1-token call with prompt logprobs over ``messages`` and the prefilled ``partial``."""
    return await api.chat(continued_messages(messages, partial, message), max_tokens=1, logprobs=True, extra={**fields, "prompt_logprobs": 1})
