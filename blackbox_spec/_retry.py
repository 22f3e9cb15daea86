"""Retries of target calls: the one retry layer of the library (tenacity).

The HTTP calls are made with httpx directly, never through the openai SDK,
so there is no second layer of retries underneath this one.

What is retried: HTTP 408, 409, 429 and 5xx but 501 and 505, connect and read timeouts, and
reset connections (a :class:`TargetConnectionError` marked ``retryable``).
What is not: other 4xx (a bad key, an unknown model, a context overflow stay
the same on a second try), a refused connection or an unknown host (a wrong
URL, said at once), and answers that are not what the API describes.

How: jittered exponential backoff ("full jitter": a uniform wait below
``base_s * 2**n``, capped at ``max_wait_s``), or the server's ``Retry-After``
when it sends one, within ``attempts`` tries and ``max_total_wait_s`` seconds of
waiting in all.  ``sleep`` is injectable, so tests run without waiting.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from ._exceptions import TargetConnectionError, TargetHTTPError

RETRY_STATUSES = frozenset({408, 409, 429})
# 501 Not Implemented and 505 HTTP Version Not Supported will not change: a
# 501 is how some servers refuse echo, which the capability probe reads.
PERMANENT_5XX = frozenset({501, 505})


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, TargetHTTPError):
        return exc.status_code in RETRY_STATUSES or (exc.status_code >= 500 and exc.status_code not in PERMANENT_5XX)
    return isinstance(exc, TargetConnectionError) and exc.retryable


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    >>> parse_retry_after("3")
    3.0
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0)
    10.0
    >>> parse_retry_after("soon") is None
    True
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment is None:
        return None
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class RetryPolicy:
    """How target calls are retried; ``RetryPolicy(attempts=1)`` turns retries off."""

    attempts: int = 6
    base_s: float = 0.5
    max_wait_s: float = 30.0
    max_total_wait_s: float = 120.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, compare=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def wait_s(self, attempt: int, exc: BaseException | None) -> float:
        """The wait before try ``attempt + 1`` (attempt counts from 1)."""
        hinted = getattr(exc, "retry_after", None)
        if hinted is not None:
            return min(float(hinted), self.max_wait_s)
        return self.rng.uniform(0, min(self.max_wait_s, self.base_s * 2 ** (attempt - 1)))

    def retrying(self, on_retry: Callable[[BaseException, float], None] | None = None) -> AsyncRetrying:
        """A tenacity controller: ``async for attempt in policy.retrying(): with attempt: ...``.

        ``on_retry(error, seconds)`` hears of each retry before its wait."""

        def hinted(state: RetryCallState) -> float | None:
            exc = state.outcome.exception() if state.outcome else None
            return getattr(exc, "retry_after", None)

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number >= self.attempts or state.idle_for >= self.max_total_wait_s:
                return True
            # Waiting less than the server asked for is pointless: give up now.
            asked = hinted(state)
            return asked is not None and state.idle_for + min(asked, self.max_wait_s) > self.max_total_wait_s

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            seconds = min(self.wait_s(state.attempt_number, exc), self.max_total_wait_s - state.idle_for)
            if on_retry is not None and exc is not None:
                on_retry(exc, seconds)
            return seconds

        return AsyncRetrying(stop=stop, wait=wait, retry=retry_if_exception(is_retryable), sleep=self.sleep, reraise=True)


NO_RETRIES = RetryPolicy(attempts=1)
