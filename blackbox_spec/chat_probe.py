"""How a server's chat endpoint can be verified, learned by asking it
(:func:`probe_chat`; what :class:`~blackbox_spec.chat.ChatTurn` relies on):
whether it continues a partial assistant message and under which request
form (``chat.CONTINUE_FORMS``), whether its template strips whitespace from
it, whether ``prompt_logprobs`` score it and what such a scoring call costs;
also how it answers each form (:func:`continue_forms`, for ``bspec probe``)
and whether it speculates on a Predicted Outputs ``prediction`` itself
(:func:`probe_predictions`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, NamedTuple

from ._exceptions import TargetHTTPError, TargetResponseError
from ._scoring import content_start, prompt_positions
from ._target import Completion, TargetAPI
from ._tokens import AlignmentError, count_tokens
from .chat import CONTINUE_FORMS, ChatSupport, ContinueCheck, continued_messages, form_name

_REFUSALS = (400, 422, 501)
_PROBE_MESSAGES = [{"role": "user", "content": "Count from 1 to 40, separated by spaces. Reply with the numbers only."}]
# The echo cost's second measurement: the same question after ~120 more
# tokens of context (as ``server_probe.ECHO_PROBE_PROMPT``).
_LONG_PROBE_MESSAGES = [{"role": "user", "content": "Hello" + " world" * 120 + ". " + _PROBE_MESSAGES[0]["content"]}]


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
    fields, message, answer, trimmed, echoes = found.fields, found.message, found.answer, found.trimmed, found.echo_sizes is not None
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
                       prefill_message=dict(message), trims_trailing=trailing, echo_sizes=(found.echo_sizes or ()) if scores else ())


class _ContinuingForm(NamedTuple):
    """A form under which the server continued the probe's message."""

    fields: dict[str, Any]  # the request's
    message: dict[str, Any]  # the prefilled message's
    answer: Completion
    trimmed: str | None  # which whitespace the template strips (``_template_trims``)
    # Where prompt logprobs score the prefilled message, their calls'
    # (prompt tokens, seconds) (``_scores_prefill``); None where they don't.
    echo_sizes: tuple[tuple[int, float], ...] | None


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
                          measure_echo: bool) -> tuple[tuple[int, float], ...] | None:
    """Do prompt logprobs score the prefilled message, at its content?  The
    (prompt tokens, seconds) of the calls that asked, where the server
    reports usage (None: they don't score it):
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
            return None
    except (TargetHTTPError, TargetResponseError, TypeError, KeyError, ValueError, AttributeError):
        return None
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
