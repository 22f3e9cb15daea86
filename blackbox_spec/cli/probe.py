"""``bspec probe``: what a server offers for verification and what each
call costs (saved as its profile unless ``--no-save``)."""

from __future__ import annotations

import argparse
import json

from ..client import SpecClient
from .common import _positive_int


def _add_probe_parser(commands) -> None:
    probe = commands.add_parser(
        "probe", help="measure what a server offers for verification and what each call costs",
        description="Measure round trip, decode rate, echo cost by context length and fan-out gain by width.",
    )
    probe.add_argument("--base-url", help="OpenAI-compatible API root (default: $OPENAI_BASE_URL)")
    probe.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY); never printed")
    probe.add_argument("--model", help="model name (default: the first one the server lists)")
    probe.add_argument("--repeats", type=_positive_int, default=2, metavar="N", help="timings per point; medians are shown (default: 2)")
    probe.add_argument("--json", action="store_true", help="print the measurements as one JSON object")
    probe.add_argument("--no-save", action="store_true", help="do not write the server's profile (by default the client's own probe runs too, and "
                       "its findings are saved for later runs: see `bspec run --profile`)")


async def _probe(args: argparse.Namespace) -> int:
    from ..probe import describe, probe_server, recommend

    async with SpecClient(args.base_url, args.api_key, args.model, profile="off" if args.no_save else "refresh") as client:
        await client.ensure_model()
        # (Saving, the chat probe is the client's own: its answer goes in the profile.)
        report = await probe_server(client.api, repeats=args.repeats, chat=True, chat_probe=None if args.no_save else client.probe_chat)
        if not args.no_save and report.completions:
            await client.probe()  # what a client measures for itself, saved as the server's profile
            await client.learn_stop_rule()
    if args.json:
        strategy, why = recommend(report)
        print(json.dumps(report.to_dict() | {"would_choose": strategy, "because": why}))
    else:
        print("\n".join(describe(report)))
    return 0
