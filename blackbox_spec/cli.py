"""The ``bspec`` command line.

Every failure ends as one line on stderr and a non-zero exit status, never a
traceback (set ``BSPEC_DEBUG=1`` to see one), and never with the API key in
it.  Text already generated has been printed (or is in the ``--json``
object) before the error line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from ._exceptions import BlackboxSpecError, PromptError, redact
from ._stats import GenerationResult
from .client import SpecClient

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

RUN_EXAMPLES = """\
examples:
  bspec run prompt.txt --base-url http://127.0.0.1:8000/v1 --model qwen
  bspec run prompt.txt --drafter none            # plain decoding, the baseline
  bspec run prompt.txt --strategy fanout --json  # force one verification strategy
  cat prompt.txt | bspec run -                   # prompt from standard input

The output is exactly what a plain temperature-0 call to the same server
returns.  OPENAI_BASE_URL and OPENAI_API_KEY are read when the flags are not
given, as the openai SDK does.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bspec", description="Exact speculative decoding for black-box LLM APIs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser(
        "run",
        help="generate a continuation of a prompt file, speculatively",
        description="Generate the continuation of PROMPT_FILE with speculative decoding.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("prompt_file", metavar="PROMPT_FILE", help="UTF-8 text file with the prompt ('-' reads standard input)")
    run.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
    run.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY); never printed")
    run.add_argument("--model", help="model name (default: the first one the server lists)")
    run.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N", help="most target tokens to generate (default: 256)")
    run.add_argument("--stop", nargs="+", default=None, metavar="S", help="stop sequences; the text ends before the first one")
    run.add_argument("--drafter", choices=["ngram", "none"], default="ngram", help="how to draft: prompt lookup (ngram) or none = plain decoding")
    run.add_argument(
        "--strategy", choices=["auto", "logprobs", "echo", "fanout", "plain"], default="auto",
        help="verification: auto (measure and choose), logprobs/echo (one call from prompt logprobs), fanout (concurrent calls), plain",
    )
    run.add_argument("--fanout-width", type=_positive_int, default=4, metavar="W", help="parallel requests per fan-out round (default: 4)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for one server response (default: 600)")
    run.add_argument("--json", action="store_true", help="print one JSON object with text and stats instead of streaming")
    run.add_argument("--quiet", action="store_true", help="do not print the stats line on stderr")
    return parser


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def _version() -> str:
    from . import __version__

    return __version__


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


async def _run(args: argparse.Namespace, result_box: list[GenerationResult]) -> int:
    prompt = read_prompt(args.prompt_file)
    strategy = "echo" if args.strategy == "logprobs" else args.strategy
    async with SpecClient(
        args.base_url, args.api_key, args.model,
        drafter=None if args.drafter == "none" else args.drafter,
        strategy=strategy, timeout=args.timeout, fanout_width=args.fanout_width,
    ) as client:
        stream = client.stream(prompt, max_tokens=args.max_tokens, stop=args.stop)
        result_box.append(stream.result)
        async for piece in stream:
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()
        result = stream.result
        if args.json:
            print(json.dumps(_json_object(result, client.model), ensure_ascii=False))
        else:
            sys.stdout.write("\n")
            if not args.quiet:
                print(_summary(result), file=sys.stderr)
    return 0


def _json_object(result: GenerationResult, model: str | None, error: str | None = None) -> dict:
    data = {"text": result.text, "finish_reason": result.finish_reason, "model": model, "stats": result.stats.to_dict()}
    if error is not None:
        data["error"] = error
    return data


def _summary(result: GenerationResult) -> str:
    s = result.stats
    return (
        f"[bspec] {s.output_tokens} tokens in {s.wall_s:.2f}s ({s.tokens_per_second:.1f} tok/s), "
        f"{s.rounds} rounds, {s.target_calls} calls, acceptance {s.acceptance_rate:.0%}, "
        f"{s.mean_accepted_per_round:.2f} tokens/round, finish: {s.finish_reason}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    secret = args.api_key or os.environ.get("OPENAI_API_KEY")
    box: list[GenerationResult] = []
    try:
        return asyncio.run(_run(args, box))
    except BlackboxSpecError as exc:
        message = redact(str(exc), secret)
        if args.json:
            partial = exc.partial if isinstance(exc.partial, GenerationResult) else (box[0] if box else None)
            if partial is not None:
                print(json.dumps(_json_object(partial, args.model, message), ensure_ascii=False))
        elif box and box[0].text:
            sys.stdout.write("\n")
        print(f"bspec: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if args.json and box:
            print(json.dumps(_json_object(box[0], args.model, "interrupted"), ensure_ascii=False))
        print("\nbspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, unless asked for more
        if os.environ.get("BSPEC_DEBUG"):
            raise
        print(f"bspec: internal error: {redact(f'{type(exc).__name__}: {exc}', secret)} (set BSPEC_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
