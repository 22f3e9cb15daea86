"""One exception tree for the whole library.

BlackboxSpecError
├── ConfigurationError        bad option, bad URL, missing model name
├── PromptError               the prompt cannot be read or is empty
└── TargetError               anything that went wrong talking to the target
    ├── TargetConnectionError unreachable server, timeout, connection reset
    ├── TargetHTTPError       the server answered with an HTTP error status
    │   ├── AuthenticationError  401 / 403
    │   └── ModelNotFoundError   the model name is unknown to the server
    ├── TargetResponseError   the server answered, but not with what the API promises
    │   └── NondeterministicTargetError  the same plain request came back with other text
    └── TokenizerError        the server's /tokenize is there but kept failing

Low-level errors (httpx, json) are mapped at the boundary with
``raise OurError(msg) from exc``.  Messages never contain the API key:
:func:`redact` scrubs it wherever a message could echo user input.

A failure in the middle of a generation carries what was already generated
in ``partial`` (a :class:`~blackbox_spec.GenerationResult`), so nothing that
the target confirmed is lost.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Iterable


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


class NondeterministicTargetError(TargetResponseError):
    """A plain call made again from the prompt (after its stream broke, or
    where speculation had to give up) did not start with the text already
    emitted: this server does not answer a temperature-0 request the same
    way twice.  ``partial`` holds what was emitted; nothing is spliced."""


class TokenizerError(TargetError):
    """The server's ``/tokenize`` (or ``/detokenize``) exists but failed
    after its retries (a 5xx, a timeout), which is not the same as a server
    without one: exactness checks that rest on it are not silently dropped."""


_MASK = "***"


def _secret(secret: str | None) -> bool:
    return bool(secret) and len(secret) >= 4  # shorter ones would mangle ordinary text


def secret_forms(secrets: str | None | Iterable[str | None]) -> list[str]:
    """Every way each secret may be written in text we pass on: as it is,
    and JSON-escaped (an upstream that echoes a header inside a JSON error
    writes non-ASCII, quotes and backslashes as escapes, or every character
    as ``\\uXXXX``).  Longest first, so a form is replaced before a part of it.

    >>> secret_forms("sk-é1234")[2:]
    ['sk-\\\\u00e91234', 'sk-é1234']
    """
    if secrets is None or isinstance(secrets, str):
        secrets = [secrets]
    forms: set[str] = set()
    for secret in secrets:
        if not _secret(secret):
            continue
        forms.add(secret)
        forms.add(json.dumps(secret)[1:-1])  # ensure_ascii: non-ASCII as \uXXXX
        forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
        every = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else json.dumps(c)[1:-1] for c in secret)
        forms.update((every, every.replace("\\u", "\\U").upper().replace("\\U", "\\u")))
    return sorted(forms, key=lambda f: (-len(f), f))


def redact(text: str, secrets: str | None | Iterable[str | None]) -> str:
    """Replace every occurrence of each secret (in any of its forms) in ``text``."""
    for form in secret_forms(secrets):
        text = text.replace(form, _MASK)
    return text


async def redact_chunks(chunks: AsyncIterator[bytes], secrets: str | None | Iterable[str | None]) -> AsyncIterator[bytes]:
    """``chunks`` with every occurrence of each secret replaced, also where
    it is split across chunks.  Only a tail that could begin a secret is held
    back until the next chunk, so an SSE event (ending in a blank line) is
    never delayed."""
    keys = [form.encode() for form in secret_forms(secrets)]
    if not keys:
        async for chunk in chunks:
            yield chunk
        return
    held = b""
    async for chunk in chunks:
        text = held + chunk
        for key in keys:
            text = text.replace(key, _MASK.encode())
        keep = max(_longest_start_of(key, text) for key in keys)
        held = text[len(text) - keep :] if keep else b""
        if len(text) > keep:
            yield text[: len(text) - keep]
    if held:
        yield held


def _longest_start_of(key: bytes, text: bytes) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``key``.

    >>> _longest_start_of(b"sk-secret", b"data: sk-se"), _longest_start_of(b"sk-secret", b"done\\n\\n")
    (5, 0)
    """
    for size in range(min(len(key) - 1, len(text)), 0, -1):
        if text.endswith(key[:size]):
            return size
    return 0
