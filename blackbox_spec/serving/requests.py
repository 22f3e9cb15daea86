"""What ``bspec serve`` accepts, before anything is read or taken: who may
call (``refusal``), whether a body is JSON it can read (``read_json``),
and whether a request is one to speculate on or to pass through
(``request_problem``, ``passthrough_reason``).  Pure functions."""

from __future__ import annotations

import hmac
import ipaddress
import json
from typing import Any, Sequence

# Request fields a speculated request may carry: everything else means the
# request asks for something greedy text alone does not give (tools,
# penalties, logprobs, response formats...), so it is passed through.
# ``max_completion_tokens`` is a chat field only: the completions endpoint
# ignores it, so there it is passed through, to be ignored upstream.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "user", "metadata", "store", "prediction"}
_HANDLED = {"chat": _COMMON | {"messages", "max_completion_tokens"}, "completions": _COMMON | {"prompt"}}

# Fields named in a pass-through reason (and so a /metrics label); any other
# is "an unknown field": callers choose field names, and labels must come
# from a fixed set (and fit in a header).
_KNOWN_FIELDS = frozenset("""
    audio best_of echo frequency_penalty function_call functions logit_bias logprobs max_completion_tokens
    modalities parallel_tool_calls prediction presence_penalty reasoning_effort response_format service_tier
    suffix tool_choice tools top_logprobs web_search_options verbosity safety_identifier prompt_cache_key
    top_k min_p repetition_penalty min_tokens ignore_eos guided_json guided_regex guided_choice guided_grammar
    structured_outputs chat_template chat_template_kwargs add_generation_prompt continue_final_message
    prompt_logprobs skip_special_tokens spaces_between_special_tokens include_stop_str_in_output
    n_probs cache_prompt samplers grammar json_schema mirostat typical_p tfs_z timings_per_token return_tokens
""".split())

# Beyond this a prompt is passed through, not speculated on: indexing it for
# drafts costs ~4 us and ~75 bytes a character (a 5 MB prompt held the event
# loop 18 s and 370 MB), and an upstream refuses a prompt beyond its context
# anyway.  Where the upstream lists its context, 16 characters a token.
DEFAULT_MAX_PROMPT_CHARS = 500_000
CHARS_PER_TOKEN_BOUND = 16


def prediction_text(prediction: Any) -> str | None:
    """The text of an OpenAI Predicted Outputs ``prediction`` (its content as
    a string or a list of text parts); None if it is not that.

    >>> prediction_text({"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    'ab'
    """
    if not isinstance(prediction, dict) or prediction.get("type") != "content" or set(prediction) - {"type", "content"}:
        return None
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) and set(p) <= {"type", "text"}
                                         for p in content):
        return "".join(p["text"] for p in content)
    return None


def request_problem(kind: str, body: dict[str, Any]) -> str | None:
    """What makes ``body`` a bad request in the OpenAI API's own terms, for
    the fields this server reads itself (None: nothing).  Other fields' types
    are the upstream's to judge (such requests are passed through).

    >>> request_problem("chat", {"stream_options": "x"})
    'stream_options must be an object'
    """
    model = body.get("model")
    if model is not None and not (isinstance(model, str) and model):
        return "model must be a non-empty string"
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return "stream must be true or false"
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return "stream_options must be an object"
        if options.get("include_usage") is not None and not isinstance(options["include_usage"], bool):
            return "stream_options.include_usage must be true or false"
    return None


def passthrough_reason(kind: str, body: dict[str, Any], max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS) -> str | None:
    """Why a request can't be speculated on (None: it can).  Every reason is
    one of a fixed set of ASCII strings (it is a header and a metrics label).

    >>> passthrough_reason("chat", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 9})
    >>> passthrough_reason("chat", {"messages": [], "temperature": 0.7, "max_tokens": 9})
    'temperature is not 0'
    >>> passthrough_reason("chat", {"messages": [], "temperature": 0, "max_tokens": 9, "字": 1})
    'an unknown field'
    """
    temperature = body.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature != 0:
        return "temperature is not 0" if temperature is not None else "temperature not given (the API's default samples)"
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        return "n > 1"
    if "tools" in body or "functions" in body or "tool_choice" in body:
        return "tools"
    unknown = sorted(set(body) - _HANDLED[kind])
    if unknown:
        named = [name for name in unknown if name in _KNOWN_FIELDS]
        return f"field {named[0]}" if named else "an unknown field"
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if kind == "chat" else body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens not given (the server's own default is unknown here)"
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        return "stop is not a string or a list of strings"
    if stop == "" or isinstance(stop, list) and "" in stop:
        return "an empty stop string"  # servers differ on it: the upstream's own answer it is
    if "prediction" in body and prediction_text(body["prediction"]) is None:
        return "a prediction that is not text"
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) and set(m) <= {"role", "content", "name"}
            for m in messages
        ):
            return "messages that are not plain text"
        if messages[-1]["role"] == "assistant":
            # Servers disagree on what that asks for (vLLM starts a new turn,
            # llama.cpp continues the message): the upstream's own answer it is.
            return "the conversation ends with an assistant message"
        size = sum(len(m["content"]) for m in messages)
    else:
        if not isinstance(body.get("prompt"), str) or not body.get("prompt"):
            return "prompt is not one string"
        size = len(body["prompt"])
    if size > max_prompt_chars:
        return "prompt longer than the speculation limit"
    return None


class Refused(Exception):
    """A request this server answers itself with a 4xx (never a 500)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only.

    >>> is_loopback("127.0.0.2"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name in a Host header or an Origin (no scheme, port or brackets).

    >>> host_name("[::1]:8100"), host_name("http://localhost:8100"), host_name("Example.COM")
    ('::1', 'localhost', 'example.com')
    """
    value = value.split("://", 1)[-1].split("/", 1)[0].lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def bearer_token(headers: dict[str, str]) -> str:
    """The bearer key of an Authorization header ("" where none)."""
    given = headers.get("authorization", "")
    return given[7:].strip() if given[:7].lower() == "bearer " else ""


def refusal(scope: dict[str, Any], *, allowed_hosts: set[str], client_keys: Sequence[bytes], max_body_bytes: int) -> Refused | None:
    """Why a request may not be served at all (None: it may): checked
    before anything is read or taken."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    host = host_name(headers.get("host", ""))
    if host and not (is_loopback(host) or host in allowed_hosts or "*" in allowed_hosts):
        # A web page that rebinds its own name to this address sends that name.
        return Refused(403, f"the Host header names {host!r}, not this server (add it with --allow-host)")
    origin = headers.get("origin")
    if origin is not None and not (is_loopback(host_name(origin)) or host_name(origin) in allowed_hosts):
        return Refused(403, "requests from web pages of other origins are refused")
    if client_keys and scope.get("path") != "/health":
        token = bearer_token(headers).encode("latin-1")
        if not any(hmac.compare_digest(token, key) for key in client_keys):
            return Refused(401, "a bearer key of this server is needed (Authorization: Bearer <one of --client-key>)")
    if scope.get("method") == "POST":
        kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            return Refused(415, "the request body must be JSON (Content-Type: application/json)")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return Refused(413, f"the request body is larger than {max_body_bytes >> 20} MB (--max-body-mb)")
    return None


async def read_json(request, max_body_bytes: int) -> tuple[bytes, dict[str, Any]]:
    """The body, read up to ``max_body_bytes``, as a JSON object (else ``Refused``)."""
    from starlette.requests import ClientDisconnect

    raw = bytearray()
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                raise Refused(413, f"the request body is larger than {max_body_bytes >> 20} MB (--max-body-mb)")
    except ClientDisconnect:
        raise Refused(499, "the client went away while sending its request") from None
    try:
        body = json.loads(raw or b"{}", parse_constant=_not_json)
    except RecursionError:
        raise Refused(400, "the request body is nested too deeply") from None
    except ValueError:
        raise Refused(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the request body must be a JSON object")
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise Refused(400, "the request body holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
    except RecursionError:
        raise Refused(400, "the request body is nested too deeply") from None
    return bytes(raw), body


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")
