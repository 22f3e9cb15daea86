"""One exception tree for the whole library.

BlackboxSpecError
├── ConfigurationError        bad option, bad URL, missing model name
├── PromptError               the prompt cannot be read or is empty
└── TargetError               anything that went wrong talking to the target
    ├── TargetConnectionError unreachable server, timeout, connection reset
    ├── TargetHTTPError       the server answered with an HTTP error status
    │   ├── AuthenticationError  401 / 403
    │   └── ModelNotFoundError   the model name is unknown to the server
    └── TargetResponseError   the server answered, but not with what the API promises

Low-level errors (httpx, json) are mapped at the boundary with
``raise OurError(msg) from exc``.  Messages never contain the API key:
:func:`redact` scrubs it wherever a message could echo user input.

A failure in the middle of a generation carries what was already generated
in ``partial`` (a :class:`~blackbox_spec.GenerationResult`), so nothing that
the target confirmed is lost.
"""

from __future__ import annotations

from typing import Any


class BlackboxSpecError(Exception):
    """Base class of every error this library raises."""

    def __init__(self, message: str, *, partial: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.partial = partial

    def __str__(self) -> str:
        return self.message


class ConfigurationError(BlackboxSpecError):
    """An option or argument is invalid."""


class PromptError(BlackboxSpecError):
    """The prompt cannot be read, or is empty."""


class TargetError(BlackboxSpecError):
    """Talking to the target server failed."""


class TargetConnectionError(TargetError):
    """The server could not be reached, or the connection broke.

    ``retryable`` is True for timeouts and broken connections (worth another
    try) and False for a refused connection or an unknown host."""

    def __init__(self, message: str, *, partial: Any = None, retryable: bool = False) -> None:
        super().__init__(message, partial=partial)
        self.retryable = retryable


class TargetHTTPError(TargetError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, *, status_code: int, partial: Any = None, retry_after: float | None = None) -> None:
        super().__init__(message, partial=partial)
        self.status_code = status_code
        self.retry_after = retry_after  # seconds, from the server's Retry-After header


class AuthenticationError(TargetHTTPError):
    """The server refused the API key."""


class ModelNotFoundError(TargetHTTPError):
    """The server does not serve a model of that name."""


class TargetResponseError(TargetError):
    """The server's answer is not what the OpenAI API describes."""


def redact(text: str, secret: str | None) -> str:
    """Replace every occurrence of ``secret`` in ``text``."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text
