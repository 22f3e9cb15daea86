"""The ``bspec`` argument parser: each subcommand's module adds its own."""

from __future__ import annotations

import argparse

from .bench import _add_bench_parser
from .common import _Parser, _version
from .heads import _add_heads_parser
from .probe import _add_probe_parser
from .run import _add_run_parser
from .serve import _add_serve_parser
from .server import _add_server_parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bspec", description="Exact speculative decoding for black-box LLM APIs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run_parser(commands)
    _add_bench_parser(commands)
    _add_server_parser(commands)
    _add_heads_parser(commands)
    _add_serve_parser(commands)
    _add_probe_parser(commands)
    return parser
