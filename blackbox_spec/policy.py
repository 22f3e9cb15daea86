"""The policy: which verification strategy, how long a draft, how wide a
fan-out, decided each round from what has been measured in this run.

Nothing here is assumed about a server.  Each strategy's throughput is the
target tokens it gained per round over the seconds that round took
(exponential moving averages, so it follows the text as drafts get better or
worse).  Every strategy is tried once, the best is used, and the others are
re-tried now and then, because their relative cost changes with context
length (echo re-reads the whole context; fan-out pays per branch).

"plain" (continue the context with no draft) is always a candidate, which is
what keeps speculation from being slower than plain decoding: when drafts
stop paying, plain wins the comparison, and its chunks grow so that the extra
round trips fade.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._tokens import count_tokens
from .verifiers.base import Plan, Verdict

SPECULATIVE = ("echo", "fanout")


@dataclass
class Throughput:
    """Moving averages of tokens gained and seconds spent per round."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: int = 0
    smoothing: float = 0.35

    def add(self, tokens: int, seconds: float) -> None:
        if self.rounds == 0:
            self.tokens, self.seconds = float(tokens), seconds
        else:
            a = self.smoothing
            self.tokens += a * (tokens - self.tokens)
            self.seconds += a * (seconds - self.seconds)
        self.rounds += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.inf


class Policy:
    def __init__(
        self,
        strategies: list[str],
        *,
        forced: str | None = None,
        min_draft_chars: int = 16,
        max_draft_chars: int = 2048,
        start_draft_chars: int = 96,
        fanout_width: int = 4,
        plain_chunk: int = 16,
        max_plain_chunk: int = 256,
        explore_every: int = 8,
    ) -> None:
        self.strategies = [s for s in strategies if s in SPECULATIVE]
        self.forced = forced
        self.min_draft_chars = min_draft_chars
        self.max_draft_chars = max_draft_chars
        self.draft_chars = {s: start_draft_chars for s in SPECULATIVE}
        self.fanout_width = fanout_width
        self.start_plain_chunk = plain_chunk
        self.plain_chunk = plain_chunk
        self.max_plain_chunk = max_plain_chunk
        self.explore_every = explore_every
        self.rates = {s: Throughput() for s in (*SPECULATIVE, "plain")}
        self.chars_per_token = 4.0
        self.decisions = 0

    def drop(self, strategy: str) -> None:
        """The server refused ``strategy``; never plan it again."""
        if strategy in self.strategies:
            self.strategies.remove(strategy)
        if self.forced == strategy:
            self.forced = None

    def choose(self) -> str:
        if self.forced in self.strategies or self.forced == "plain":
            return self.forced  # type: ignore[return-value]
        candidates = [*self.strategies, "plain"]
        untried = [s for s in candidates if self.rates[s].rounds == 0]
        if untried:
            return untried[0]
        self.decisions += 1
        ranked = sorted(candidates, key=lambda s: self.rates[s].rate, reverse=True)
        if len(ranked) > 1 and self.decisions % self.explore_every == 0:
            return ranked[1]
        return ranked[0]

    def plan(self, *, plain_next: bool, remaining: int) -> Plan:
        strategy = "plain" if plain_next else self.choose()
        if strategy == "plain":
            return self.plain(remaining)
        draft = self.draft_chars[strategy]
        if strategy == "echo":
            return Plan("echo", draft_chars=draft, extra_tokens=1)
        width = self.fanout_width
        per_request = math.ceil(draft / width / self.chars_per_token) + 2
        return Plan("fanout", draft_chars=draft, width=width, tokens_per_request=min(per_request, remaining))

    def plain(self, remaining: int) -> Plan:
        # At least 4 tokens, so that a character spread over byte tokens completes.
        return Plan("plain", tokens_per_request=max(1, min(max(4, self.plain_chunk), remaining)))

    def observe(self, plan: Plan, verdict: Verdict, drafted_chars: int, accepted_draft_chars: int) -> None:
        tokens = count_tokens(verdict.units)
        self.rates[plan.strategy].add(tokens, verdict.seconds)
        chars = sum(len(u.text) for u in verdict.units)
        if tokens:
            self.chars_per_token += 0.2 * (chars / tokens - self.chars_per_token)
        if plan.strategy == "plain":
            # Consecutive plain rounds: grow the chunk so round trips fade.
            self.plain_chunk = min(self.max_plain_chunk, self.plain_chunk * 2)
            return
        self.plain_chunk = self.start_plain_chunk
        if not drafted_chars:
            return
        size = self.draft_chars[plan.strategy]
        if accepted_draft_chars >= drafted_chars:
            size *= 2
        elif accepted_draft_chars < drafted_chars / 2:
            size //= 2
        self.draft_chars[plan.strategy] = max(self.min_draft_chars, min(self.max_draft_chars, size))
