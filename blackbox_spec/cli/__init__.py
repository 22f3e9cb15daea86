"""The ``bspec`` command line.

Every failure ends as one line on stderr and a non-zero exit status, never a
traceback (set ``BSPEC_DEBUG=1`` to see one), and never with the API key in
it.  Text already generated has been printed (or is in the ``--json``
object) before the error line.

One module per subcommand (:mod:`.run`, with :mod:`.batch` and
:mod:`.run_local`; :mod:`.bench`, :mod:`.server`, :mod:`.heads`,
:mod:`.serve`, :mod:`.probe`), each adding its own arguments to
:func:`build_parser`; :mod:`.common` holds what they share.  :func:`main`
dispatches here, by the names below, so a test can replace one.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from typing import Sequence

from .._exceptions import BlackboxSpecError, redact
from .._stats import GenerationResult
from .batch import BatchItem, _run_batch, read_batch  # noqa: F401 (re-exported)
from .bench import _bench
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, _log, read_prompt  # noqa: F401 (re-exported)
from .heads import _heads
from .output import _json_object, _summary  # noqa: F401 (re-exported)
from .parser import build_parser
from .probe import _probe
from .run import _check_mode, _run, chat_messages  # noqa: F401 (re-exported)
from .run_local import _run_local
from .serve import _serve
from .server import _server, _start  # noqa: F401 (re-exported)

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "BatchItem", "build_parser", "chat_messages", "main", "read_batch", "read_prompt"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    secret = args.api_key if getattr(args, "api_key", None) else os.environ.get("OPENAI_API_KEY")
    box: list[GenerationResult] = []
    try:
        if args.command == "bench":
            return asyncio.run(_bench(args))
        if args.command == "server":
            return _server(args)
        if args.command == "probe":
            return asyncio.run(_probe(args))
        if args.command == "serve":
            return _serve(args)
        if args.command == "heads":
            return _heads(args)
        _check_mode(args)
        if args.local:
            return _run_local(args, box)
        return asyncio.run(_run(args, box))
    except BlackboxSpecError as exc:
        message = redact(str(exc), secret)
        if os.environ.get("BSPEC_DEBUG"):
            sys.stderr.write(redact("".join(traceback.format_exception(exc)), secret))
        if getattr(args, "json", False):
            partial = exc.partial if isinstance(exc.partial, GenerationResult) else (box[0] if box else None)
            if partial is not None:
                print(json.dumps(_json_object(partial, args.model, message), ensure_ascii=False))
        elif box and box[0].text:
            sys.stdout.write("\n")
        print(f"bspec: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        # asyncio.run has cancelled the generation, which closed its requests.
        if box:
            box[0].stats.interrupted = box[0].finish_reason is None
        if getattr(args, "json", False) and box:
            print(json.dumps(_json_object(box[0], args.model, "interrupted"), ensure_ascii=False))
        print("\nbspec: interrupted" + (f" after {len(box[0].text)} characters" if box else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, unless asked for more
        if os.environ.get("BSPEC_DEBUG"):
            # The whole traceback, but never the key (a message may hold it).
            sys.stderr.write(redact("".join(traceback.format_exception(exc)), secret))
        else:
            print(f"bspec: internal error: {redact(f'{type(exc).__name__}: {exc}', secret)} (set BSPEC_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_ERROR
