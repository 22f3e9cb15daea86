"""``bspec probe``: what a server offers for verification, and what it costs.

The client learns these costs as it generates (``policy.ServerCosts``); the
probe measures them up front, on synthetic text, so a user can see why the
policy chooses what it chooses on their server:

* round trip: a one-token call on a cached prompt;
* decode: seconds per generated token;
* echo (prompt logprobs): seconds as a function of context length, since
  vLLM re-reads the whole context for it (no prefix cache);
* fan-out: ``w`` concurrent 16-token continuations against one, as a speedup
  in tokens per second ("gain"); below 1 means batching does not pay here.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field

from typing import Any, Awaitable, Callable

from ._exceptions import TargetError, TargetHTTPError
from ._stopping import rule_test
from ._target import TargetAPI
from ._tokens import AlignmentError
from .chat import ChatSupport
from .chat_probe import continue_forms, probe_chat
from .server_probe import scoring_call

FILLER = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report. "
    "Each section lists the open items, the owner of each item and the date it is due. "
)


@dataclass
class ProbeReport:
    base_url: str
    model: str
    logprobs: bool = False
    echo: bool = False
    round_trip_s: float = 0.0
    decode_s_per_token: float = 0.0
    echo_s: dict[int, float] = field(default_factory=dict)  # context tokens -> seconds
    echo_s_per_context_token: float | None = None
    fanout_s: dict[int, float] = field(default_factory=dict)  # width -> seconds for width x 16 tokens
    fanout_gain: dict[int, float] = field(default_factory=dict)  # width -> tokens/s relative to width 1
    stop_rule: str | None = None  # which stop string wins when several complete at once (``_stopping``)
    # How one call scores a prompt where ``echo`` (``_scoring.SCORING_FORMS``).
    scoring: str | None = None
    # False: the server refused ``/completions`` (a chat-only hosted API).
    completions: bool = True
    # The chat endpoint: each continuation form's answer (``chat_probe.continue_forms``),
    # the one the client would use, and whether it can speculate there.
    chat: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# A prompt whose plain answer has tokens of three or more characters.
STOP_PROBE_PROMPT = 'def greet(name):\n    return f"Hello, {name}! Welcome back."\n\n\ndef farewell(name):\n    return f"'


async def probe_stop_rule(target: Any, prompt: str = STOP_PROBE_PROMPT) -> str | None:
    """Which stop string this server lets win when several complete in one
    token (``_stopping.RULES``), learned in two small calls: a plain answer
    with logprobs, then the same with stop strings on which the rules end
    the text at three different places.  None when it cannot tell (no token
    long enough, or an answer that fits no rule).  ``target``: the
    completions API or a chat turn (anything with ``complete``)."""
    plain = await target.complete(prompt, max_tokens=12, logprobs=1)
    steps: list[str] = []
    for unit in plain.units or []:
        if unit.steps is None:
            break
        steps += unit.steps
    test = rule_test(steps)
    if test is None:
        return None
    stops, tokens, texts = test
    answer = await target.complete(prompt, max_tokens=tokens, stop=stops)
    return next((rule for rule, text in texts.items() if text == answer.text), None)


async def _timed(call) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


async def probe_server(api: TargetAPI, *, repeats: int = 2, widths: tuple[int, ...] = (1, 2, 4, 8), contexts: tuple[int, ...] = (128, 512, 1024),
                       chat: bool = False, chat_probe: Callable[[], Awaitable[ChatSupport]] | None = None) -> ProbeReport:
    """The completions endpoint's offers and costs; with ``chat``, the chat
    endpoint's continuation and scoring forms too (``probe_chat_forms``;
    ``chat_probe``: how the chat probe runs, a client's own to keep its
    answer, else ``chat_probe.probe_chat``).  A server without completions (404)
    is probed on chat alone."""
    report = ProbeReport(api.base_url, api.model or "")
    prompt = FILLER * 2
    if not await _probe_logprobs(api, report, prompt):
        await probe_chat_forms(api, report, chat_probe)
        return report
    report.round_trip_s = statistics.median([await _timed(api.complete(prompt, max_tokens=1)) for _ in range(repeats + 1)])
    long = statistics.median([await _timed(api.complete(prompt, max_tokens=33)) for _ in range(repeats)])
    report.decode_s_per_token = max(0.0, (long - report.round_trip_s) / 32)
    await _probe_echo(api, report, prompt, repeats, contexts)
    await _probe_fanout(api, report, prompt, repeats, widths)
    try:
        report.stop_rule = await probe_stop_rule(api)
    except TargetError as exc:
        report.notes.append(f"stop rule probe failed: {exc}")
    if chat:
        await probe_chat_forms(api, report, chat_probe)
    return report


async def _probe_logprobs(api: TargetAPI, report: ProbeReport, prompt: str) -> bool:
    """Whether the server returns logprobs that fit its text, onto
    ``report``; False where it has no completions endpoint (404)."""
    try:
        first = await api.complete(prompt, max_tokens=2, logprobs=1)
        report.logprobs = bool(first.units)
    except TargetHTTPError as exc:
        if exc.status_code == 404:
            report.completions = False
            return False
        report.notes.append(f"logprobs refused: {exc}")
        await api.complete(prompt, max_tokens=2)
    except AlignmentError as exc:
        report.notes.append(f"logprobs came, but their token strings do not fit the text ({exc}): nothing can be speculated on them")
    return True


async def _probe_echo(api: TargetAPI, report: ProbeReport, prompt: str, repeats: int, contexts: tuple[int, ...]) -> None:
    """Whether one call scores a whole prompt, in which form, and its
    seconds per context token (a least-squares slope over ``contexts``)."""
    echoed = await scoring_call(api, prompt)  # completions echo (vLLM's, Together's), else SGLang's or TGI's /generate
    report.echo, report.scoring = echoed is not None, api.scoring if echoed is not None else None
    if echoed is None:
        report.notes.append("echo not offered: neither a completions echo nor SGLang's or TGI's /generate returned prompt logprobs")
        return
    tokens_per_filler = max(1, echoed.usage.prompt_tokens // 2)
    for n in contexts:
        text = FILLER * max(1, round(n / tokens_per_filler))
        seconds = []
        for _ in range(repeats):
            c = await api.complete(text, max_tokens=1, logprobs=1, echo=True)
            seconds.append(c.elapsed)
        report.echo_s[c.usage.prompt_tokens] = round(statistics.median(seconds), 4)
    xs, ys = list(report.echo_s), list(report.echo_s.values())
    if len(xs) >= 2:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        spread = sum((x - mx) ** 2 for x in xs)
        report.echo_s_per_context_token = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else None


async def _probe_fanout(api: TargetAPI, report: ProbeReport, prompt: str, repeats: int, widths: tuple[int, ...]) -> None:
    """Seconds for ``w`` concurrent continuations, and the gain in tokens
    per second against one."""
    for width in widths:
        seconds = []
        for _ in range(repeats):
            # Different suffixes, one shared (cached) prefix, as fan-out sends.
            calls = [api.complete(prompt + f" Item {k}:", max_tokens=16) for k in range(width)]
            seconds.append(await _timed(asyncio.gather(*calls)))
        report.fanout_s[width] = round(statistics.median(seconds), 4)
    base = report.fanout_s.get(1)
    if base:
        report.fanout_gain = {w: round(w * base / s, 3) for w, s in report.fanout_s.items()}


async def probe_chat_forms(api: TargetAPI, report: ProbeReport, chat_probe: Callable[[], Awaitable[ChatSupport]] | None = None) -> None:
    """How the chat endpoint takes a partial assistant message (each of
    ``chat.CONTINUE_FORMS``), and what the client's own chat probe
    concludes from it (``chat_probe``, else ``chat_probe.probe_chat``), onto ``report.chat``."""
    try:
        forms = await continue_forms(api)
        support = await (chat_probe() if chat_probe is not None else probe_chat(api))
    except TargetError as exc:
        report.notes.append(f"chat probe failed: {exc}")
        return
    report.chat = {"continue_forms": forms, "continue_form": support.continue_form, "repeats_prefill": support.repeats_prefill,
                   "trims_trailing": support.trims_trailing, "logprobs": support.logprobs, "prompt_logprobs": support.prompt_logprobs,
                   "speculative": support.speculative, "reason": support.reason}


def recommend(report: ProbeReport, context_tokens: int = 1000) -> tuple[str, list[str]]:
    """What ``--strategy auto`` would lean on with this server, and why, from
    the measured costs (the client keeps measuring and decides per draft)."""
    if not report.completions:
        chat = report.chat or {}
        if not chat.get("speculative"):
            return "plain", [f"chat only, and {chat.get('reason') or 'its chat probe failed'}"]
        scoring = "echo rounds on prompt logprobs where they pay" if chat.get("prompt_logprobs") else "no one-call scoring: drafts are checked by streams"
        return "auto (chat): side branches next to the plain stream", [f"chat only, continued with {chat['continue_form']}; {scoring}"]
    if not report.logprobs:
        return "plain", ["the server returns no logprobs, so token boundaries are unknown: every generation decodes plainly"]
    why: list[str] = []
    decode = report.decode_s_per_token or 1e-3
    gain = max(((g, w) for w, g in report.fanout_gain.items() if w > 1), default=(0.0, 1))
    branches = gain[0] >= 1.2
    if branches:
        why.append(f"{gain[1]} requests at once give {gain[0]:.2f}x the tokens/s of one: side branches next to the plain stream are cheap here")
    else:
        why.append(f"concurrent requests give at most {gain[0]:.2f}x the tokens/s of one: side branches would cost nearly as much as they save")
    echo_pays_after = None
    if report.echo and report.echo_s:
        per = report.echo_s_per_context_token or 0.0
        base = min(report.echo_s.values())
        smallest = min(report.echo_s)
        echo_s = base + per * max(0, context_tokens - smallest)
        echo_pays_after = echo_s / decode
        why.append(f"an echo round over a {context_tokens}-token context costs about {echo_s:.2f}s, as much as streaming {echo_pays_after:.0f} tokens: "
                   f"it pays for drafts that hold longer than that")
    elif not report.echo:
        why.append("echo (prompt logprobs) is refused, so every draft is checked by streams")
    if branches and echo_pays_after is not None:
        strategy = "auto: side branches for drafts that hold, echo for long ones that have held before"
    elif branches:
        strategy = "auto: side branches next to the plain stream"
    elif echo_pays_after is not None:
        strategy = "auto: echo rounds for long drafts that hold, plain streaming otherwise"
    else:
        strategy = "auto: plain streaming (no verification here pays for itself)"
    return strategy, why


# How ``describe`` names a scoring form beside "echo: yes" (vLLM's echo: nothing more).
SCORING_NAMES = {
    "together": " (Together's echo)",
    "sglang": " (SGLang /generate)",
    "tgi": " (TGI /generate details: tokens proven where p > 0.51)",
}


def _describe_chat(chat: dict[str, Any] | None) -> list[str]:
    if chat is None:
        return []
    lines = ["  chat, a partial assistant message sent as: " + "; ".join(f"{name}: {said}" for name, said in chat["continue_forms"].items())]
    if chat["continue_form"] is None:
        lines.append("  chat: no continuation form works: chat turns decode plainly")
    else:
        repeat = " (the answer repeats the message first)" if chat["repeats_prefill"] else ""
        if chat.get("trims_trailing"):
            repeat += " (its template trims the message's trailing whitespace: sent up to a token end before it, written again)"
        lines.append(f"  chat: bspec continues with {chat['continue_form']}{repeat}   logprobs: {'yes' if chat['logprobs'] else 'no'}"
                     f"   prompt logprobs (one-call scoring): {'yes' if chat['prompt_logprobs'] else 'no'}")
    if chat["reason"]:
        lines.append(f"  chat: no speculation: {chat['reason']}")
    return lines


def describe(report: ProbeReport) -> list[str]:
    lines = [
        f"server {report.base_url}  model {report.model}",
        f"  logprobs: {'yes' if report.logprobs else 'no'}   echo (prompt logprobs): {'yes' if report.echo else 'no'}"
        f"{SCORING_NAMES.get(report.scoring or '', '')}" if report.completions else
        "  completions: none (chat only)",
        f"  round trip {report.round_trip_s * 1000:.0f} ms   decode {report.decode_s_per_token * 1000:.1f} ms/token"
        f" ({1 / report.decode_s_per_token:.1f} tok/s)" if report.decode_s_per_token and report.completions else "",
    ]
    if report.echo_s:
        curve = ", ".join(f"{n} tok: {s:.2f}s" for n, s in report.echo_s.items())
        per = f"  ≈ {report.echo_s_per_context_token * 1000:.2f} ms per context token" if report.echo_s_per_context_token else ""
        lines.append(f"  echo cost: {curve}{per}")
    if report.fanout_gain:
        lines.append("  fan-out gain (tokens/s vs one request): " + ", ".join(f"x{w}: {g:.2f}" for w, g in report.fanout_gain.items()))
    if report.completions:
        lines.append(f"  stop strings: {report.stop_rule or 'rule not learned (earliest-start assumed)'} wins when several complete in one token")
    lines += _describe_chat(report.chat)
    lines += [f"  note: {n}" for n in report.notes]
    strategy, why = recommend(report)
    lines.append(f"  would choose: {strategy}")
    lines += [f"    because {reason}" for reason in why]
    return [line for line in lines if line]
