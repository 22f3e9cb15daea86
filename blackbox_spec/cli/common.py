"""What every subcommand shares: exit statuses, the one-line-error parser,
argument types that say in one line what they wanted, the options several
subcommands take, and the ``[bspec]`` log line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, NoReturn

from .._bill import Price
from .._budget import check_max_cost
from .._exceptions import ConfigurationError, PromptError
from ..drafters import DRAFTERS

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

HEAD_KINDS = ("medusa", "eagle")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _log(message: str) -> None:
    print(f"[bspec] {message}", file=sys.stderr, flush=True)


def _version() -> str:
    from .. import __version__

    return __version__


def _number_type(convert: Callable[[str], float], accept: Callable[[float], bool], wanted: str) -> Callable[[str], float]:
    """An argparse ``type`` that says in one line what it wanted."""

    def parse(value: str):
        try:
            number = convert(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value!r}") from None
        if not accept(number):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value!r}")
        return number

    return parse


_positive_int = _number_type(int, lambda n: n >= 1, "a whole number >= 1")


def _gamma(value: str) -> int | str:
    return "auto" if value == "auto" else _number_type(int, lambda n: n >= 1, "auto or a whole number >= 1")(value)


_non_negative_int = _number_type(int, lambda n: n >= 0, "a whole number >= 0")
_non_negative_float = _number_type(float, lambda n: 0 <= n < float("inf"), "a finite number >= 0")
_probability = _number_type(float, lambda n: 0 < n <= 1, "a number in (0, 1]")


def _price(value: str) -> Price:
    try:
        return Price.parse(value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


PRICE_HELP = ("what the server charges per million tokens, as in=N,cached=N,out=N (cached: prompt tokens read from its cache; "
              "defaults to in), e.g. in=2.5,cached=1.25,out=10: the bill gets a cost beside plain's. Kept in the server's profile "
              "for later runs (default: the profile's; without one the bill is compared at relative prices in 1, cached 0.25, out 4)")


def _max_cost(value: str) -> float | str | None:
    if value.strip().lower() in ("inf", "none", "off"):
        return None
    if value == "auto":
        return value
    try:
        return check_max_cost(float(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 (times plain's bill) or inf, got {value!r}") from None


MAX_COST_HELP = ("keep each answer's bill within R times what one plain call would bill (every request bills its whole prompt): speculative "
                 "requests that would pass it are not sent, and below 2 nothing is (no probe either: it would cost a third of a short answer's bill); inf: no limit (default: none for a server on loopback or a "
                 "private network, 2 for any other host)")

PROFILE_HELP = (
    "what is kept about each server between runs (its costs, echo/logprobs/chat support, stop rule; never the key), "
    "under $BSPEC_PROFILES (default $BSPEC_CACHE/profiles): auto = start from it and update it, refresh = measure anew "
    "and save, off = neither (default: auto)"
)

DTYPE_HELP = (
    "vLLM only (default: bfloat16). bf16 logits are coarse (one step is 0.125 at a logit of 16), so the "
    "server's prefill and decode paths can pick different tokens where the top two are a step apart; "
    "float32 makes temperature 0 reproducible enough to check exactness, at about half the speed"
)

DRAFTER_HELP = (
    "how to draft: ngram = prompt lookup; suffix = suffix automaton over the text and this "
    "client's earlier outputs; llama = a GGUF model (llama-cpp-python); hf = a transformers "
    "model; none = plain decoding (default: ngram)"
)


def _add_profile_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", choices=["auto", "refresh", "off"], default="auto", help=PROFILE_HELP)


def _add_drafter_arguments(parser: argparse.ArgumentParser, *, local: bool = False) -> None:
    if local:
        parser.add_argument("--drafter", choices=[*DRAFTERS, *HEAD_KINDS, "none"],
                            help=DRAFTER_HELP + "; with --local: hf (a draft model, the default when --draft-model is given), medusa or "
                                 "eagle (trained heads on the target's hidden states, --heads DIR)")
    else:
        parser.add_argument("--drafter", choices=[*DRAFTERS, "none"], help=DRAFTER_HELP + " (default: ngram)")
    parser.add_argument("--draft-model", metavar="PATH", help="the draft model for --drafter llama (a .gguf file), or hf and --local (a transformers folder; with --local it must share the target's tokenizer)")
    parser.add_argument("--draft-device", default="cpu", metavar="DEV", help="torch device for --drafter hf: cpu or cuda (default: cpu)")


def read_prompt(path: str) -> str:
    """The prompt file's text, or a :class:`PromptError` that says why not."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise PromptError(f"prompt file not found: {path}") from None
    except IsADirectoryError:
        raise PromptError(f"prompt file is a directory: {path}") from None
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompt file {path} is not UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
    if not text.strip():
        raise PromptError(f"prompt file {path} is empty")
    return text
