"""What a generation costs on a server that bills by the token.

A hosted API bills every request's whole prompt (at a discount for the part
its prefix cache held) and every token it generated, a cancelled stream's
included.  Speculation sends many requests, so this is counted per
generation, beside the time:

* :class:`Bill`: requests, prompt tokens sent, of which cached, output
  tokens generated, and how many of those counts are estimates (a cancelled
  stream reports no usage: its prompt is estimated from the characters sent,
  its output from what arrived and how long it ran).
* :class:`Price`: per million tokens, input / cached input / output; the
  cost of a bill, and of plain decoding's (one request) for comparison.
* :func:`counting`: every generating request made inside it, by any task it
  starts (side branches, fan-outs, probes), is added to its bill.  The
  target API records into :func:`current_bill`; a context variable, so
  generations running at once on one client keep separate bills.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass
from typing import Any

from ._exceptions import ConfigurationError


@dataclass
class Bill:
    """Tokens a server billed (or would bill) for some requests."""

    requests: int = 0
    prompt_tokens: int = 0  # every request's whole prompt, cached part included
    cached_tokens: int = 0  # of prompt_tokens, what the server reported read from its cache
    output_tokens: int = 0  # generated, cancelled streams' included
    # Of prompt_tokens + output_tokens, how many are estimates (no usage came).
    estimated_tokens: int = 0

    def __post_init__(self) -> None:
        # (Not fields: the counts are the bill; these are how it is kept.)
        # Requests no usage came back for, as (endpoint, prompt characters):
        # their prompts are counted by :meth:`settle`, once the generation's
        # own reported prompts (``reported``, (endpoint, characters) ->
        # tokens) say the most about them.
        self.unsettled: list[tuple[str, int]] = []
        self.reported: dict[tuple[str, int], int] = {}
        self.running: set[StreamTally] = set()  # streams sent and not yet ended

    def running_cost(self, price: "Price", sizes: "PromptSizes") -> float:
        """The cost so far, at ``price``: requests that ended, the prompts of
        those no usage came for (estimated), and streams still running (their
        prompts, and what they have sent)."""
        fresh = self.prompt_tokens - self.cached_tokens + sum(sizes.estimate(k, c, self.reported) for k, c in self.unsettled)
        output = self.output_tokens
        for tally in list(self.running):
            fresh += sizes.estimate(tally.kind, tally.prompt_chars, self.reported)
            output += tally.received
        return (fresh * price.input + self.cached_tokens * price.cached + output * price.output) / 1e6

    def charge(self, kind: str, prompt_chars: int, usage: Any, output: int, output_seen: int) -> None:
        """One request: its usage, or where it has none, ``output`` tokens
        (``output_seen`` of them counted as they arrived) and its prompt
        to estimate."""
        self.requests += 1
        prompt = getattr(usage, "prompt_tokens", 0) or 0
        if prompt:
            self.prompt_tokens += prompt
            self.cached_tokens += getattr(usage, "cached_tokens", None) or 0
            self.output_tokens += getattr(usage, "completion_tokens", 0) or 0
            self.reported[(kind, prompt_chars)] = prompt
            return
        self.output_tokens += output
        self.estimated_tokens += max(0, output - output_seen)
        self.unsettled.append((kind, prompt_chars))

    def settle(self, sizes: "PromptSizes") -> None:
        """Count the prompts of the requests no usage came back for."""
        for kind, chars in self.unsettled:
            tokens = sizes.estimate(kind, chars, self.reported)
            self.prompt_tokens += tokens
            self.estimated_tokens += tokens
        self.unsettled.clear()

    def add(self, other: "Bill") -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens
        self.estimated_tokens += other.estimated_tokens

    def to_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "output_tokens": self.output_tokens, "estimated_tokens": self.estimated_tokens}


# Relative prices (input 1, cached input 0.25, output 4), OpenAI's usual
# ratios: what "x plain's bill" is computed with when no price is given.
RELATIVE = "in=1,cached=0.25,out=4"
_PRICE_ITEM = re.compile(r"^\s*(in|input|cached|out|output)\s*=\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")


@dataclass(frozen=True)
class Price:
    """Prices per million tokens: prompt (``input``), prompt read from the
    provider's cache (``cached``), generated (``output``)."""

    input: float
    cached: float
    output: float

    @classmethod
    def parse(cls, text: str) -> "Price":
        """``"in=2.5,cached=1.25,out=10"``; ``cached`` defaults to ``in``."""
        found: dict[str, float] = {}
        for item in str(text).split(","):
            m = _PRICE_ITEM.match(item)
            if not m:
                raise ConfigurationError(f"bad price {text!r}: expected in=N,cached=N,out=N (per million tokens, e.g. in=2.5,cached=1.25,out=10)")
            key = {"input": "in", "output": "out"}.get(m.group(1), m.group(1))
            found[key] = float(m.group(2))
        if "in" not in found or "out" not in found:
            raise ConfigurationError(f"bad price {text!r}: both in= and out= are needed (per million tokens, e.g. in=2.5,out=10)")
        return cls(found["in"], found.get("cached", found["in"]), found["out"])

    @classmethod
    def from_dict(cls, data: Any) -> "Price | None":
        try:
            return cls(float(data["input"]), float(data["cached"]), float(data["output"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, float]:
        return {"input": self.input, "cached": self.cached, "output": self.output}

    def __str__(self) -> str:
        return f"in={self.input:g},cached={self.cached:g},out={self.output:g}"

    def cost(self, bill: Bill) -> float:
        """The bill's cost, in the price's currency."""
        fresh = bill.prompt_tokens - bill.cached_tokens
        return (fresh * self.input + bill.cached_tokens * self.cached + bill.output_tokens * self.output) / 1e6


RELATIVE_PRICE = Price.parse(RELATIVE)


def plain_bill(prompt_tokens: int, output_tokens: int) -> Bill:
    """What one plain call for the same output bills (its prompt uncached)."""
    return Bill(requests=1, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


_CURRENT: contextvars.ContextVar[Bill | None] = contextvars.ContextVar("blackbox_spec_bill", default=None)


def current_bill() -> Bill | None:
    return _CURRENT.get()


def context_counting(bill: Bill) -> contextvars.Context:
    """A copy of this context in which requests go on ``bill``: run each step
    of a generation in it (or a copy), and every task the step starts."""
    context = contextvars.copy_context()
    context.run(_CURRENT.set, bill)
    return context


class counting:
    """``with counting(bill):`` requests made in this context go on ``bill``.

    Leaving restores the context's earlier bill where it can; an async
    generator may be closed from another task, whose context never held it."""

    def __init__(self, bill: Bill) -> None:
        self.bill = bill
        self._token: contextvars.Token | None = None

    def __enter__(self) -> Bill:
        self._token = _CURRENT.set(self.bill)
        return self.bill

    def __exit__(self, *exc: object) -> None:
        try:
            _CURRENT.reset(self._token)  # type: ignore[arg-type]
        except ValueError:  # another context (a generator closed elsewhere)
            pass


class PromptSizes:
    """Prompt tokens as the server's usage reported them, to estimate a
    prompt no usage came back for (a stream closed early).

    A request of a generation is its prompt plus drafted text, so the
    estimate starts from the reported prompt nearest in size (per endpoint:
    a chat template adds tokens a plain prompt has not) and adds the
    difference at the characters per token of the server's own answers."""

    KEEP = 256  # prompts whose counts are remembered
    CHARS_PER_TOKEN = 3.5  # until answers say (prose runs ~4, code ~3)

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], int] = {}  # (endpoint, characters) -> tokens reported
        self._text = [0, 0]  # answers' characters and tokens, as reported

    def learn(self, kind: str, chars: int, tokens: int) -> None:
        if chars > 0 and tokens > 0:
            self._seen.pop((kind, chars), None)
            self._seen[(kind, chars)] = tokens
            if len(self._seen) > self.KEEP:
                del self._seen[next(iter(self._seen))]

    def learn_text(self, chars: int, tokens: int) -> None:
        """An answer of ``chars`` characters was ``tokens`` tokens."""
        if chars > 0 and tokens > 0:
            self._text[0] += chars
            self._text[1] += tokens

    @property
    def chars_per_token(self) -> float:
        chars, tokens = self._text
        return chars / tokens if tokens >= 64 else self.CHARS_PER_TOKEN

    def estimate(self, kind: str, chars: int, own: dict[tuple[str, int], int] | None = None) -> int:
        """The tokens of a prompt of ``chars`` characters, from ``own``
        reported prompts (one generation's: the same prompt, more or less
        drafted text) where there are some, else from all."""
        for points in (own or {}, self._seen):
            if (kind, chars) in points:
                return points[(kind, chars)]
        known = [(c, t) for (k, c), t in (own or {}).items() if k == kind]
        known = known or [(c, t) for (k, c), t in self._seen.items() if k == kind] or [(0, 0)]
        below = max((ct for ct in known if ct[0] < chars), default=None)
        above = min((ct for ct in known if ct[0] > chars), default=None)
        if below is not None and above is not None:  # between two: the line through them
            return max(1, round(below[1] + (chars - below[0]) * (above[1] - below[1]) / (above[0] - below[0])))
        ref_chars, ref_tokens = below or above  # type: ignore[misc]
        return max(1, ref_tokens + round((chars - ref_chars) / self.chars_per_token))


def stream_output_estimate(received: int, times: list[float], closed_at: float) -> int:
    """Tokens a stream closed early had generated: what arrived, plus what it
    decoded at its own pace between the last piece and the close (the server
    keeps going until it notices; that tail is not counted)."""
    if len(times) < 2 or received < 2 or times[-1] <= times[0]:
        return received
    step = (times[-1] - times[0]) / (received - 1)
    return received + int(max(0.0, closed_at - times[-1]) / step)


def record_answer(sizes: PromptSizes, kind: str, prompt_chars: int, usage: Any, output_seen: int, output_chars: int) -> None:
    """Add one finished request to the current bill (``usage`` may be empty;
    ``output_seen``: the tokens its answer showed, in ``output_chars``)."""
    if getattr(usage, "prompt_tokens", 0):
        sizes.learn(kind, prompt_chars, usage.prompt_tokens)
        sizes.learn_text(output_chars, usage.completion_tokens)
    bill = current_bill()
    if bill is not None:
        bill.charge(kind, prompt_chars, usage, output_seen, output_seen)


class StreamTally:
    """What one stream received, for its bill when it ends or is closed.

    Made when the stream starts, so it holds the bill of the generation that
    opened it (a stream closed later from elsewhere still pays into it)."""

    def __init__(self, sizes: PromptSizes, kind: str, prompt_chars: int) -> None:
        self.sizes, self.kind, self.prompt_chars = sizes, kind, prompt_chars
        self.bill = current_bill()
        self._sent = False  # handed to the connection (a request still waiting for a slot costs nothing)
        self.received = 0
        self.chars = 0
        self.counted = True  # every piece came with its token strings: ``received`` is exact
        self.times: list[float] = []
        self.generated: int | None = None  # the server's own count (llama.cpp's timings)

    @property
    def sent(self) -> bool:
        return self._sent

    @sent.setter
    def sent(self, value: bool) -> None:
        self._sent = value
        if self.bill is not None:
            (self.bill.running.add if value else self.bill.running.discard)(self)

    def piece(self, text: str, tokens: list[str] | None, generated: int | None, now: float) -> None:
        self.received += len(tokens) if tokens else 1  # (a chunk without token strings: one token, as vLLM streams)
        self.chars += len(text)
        self.counted = self.counted and bool(tokens)
        if generated is not None:
            self.generated = generated
        self.times.append(now)

    def close(self, usage: Any, now: float) -> None:
        reported = bool(getattr(usage, "prompt_tokens", 0))
        if reported:
            self.sizes.learn(self.kind, self.prompt_chars, usage.prompt_tokens)
            self.sizes.learn_text(self.chars, usage.completion_tokens)
        elif self.counted:
            self.sizes.learn_text(self.chars, self.received)
        if self.bill is None or not self.sent:
            return
        received = max(self.received, self.generated or 0)
        output = received if reported else stream_output_estimate(received, self.times, now)
        self.bill.charge(self.kind, self.prompt_chars, usage, output, received)
        self.sent = False  # (charged once)
