"""The API mode's :class:`SpecClient`, made from ``bspec run``'s flags
(one prompt and a batch alike)."""

from __future__ import annotations

import argparse

from .._retry import RetryPolicy
from ..client import SpecClient
from .common import _log


def _client(args: argparse.Namespace) -> SpecClient:
    strategy = "echo" if args.strategy == "logprobs" else args.strategy
    args.drafter = args.drafter or "ngram"
    return SpecClient(
        args.base_url, args.api_key, args.model,
        drafter=None if args.drafter == "none" else args.drafter,
        draft_model=args.draft_model, draft_device=args.draft_device,
        strategy=strategy, timeout=args.timeout, fanout_width=args.fanout_width,
        retries=RetryPolicy(attempts=args.retries + 1), max_in_flight=args.max_in_flight, profile=args.profile,
        prediction_mode=getattr(args, "prediction_mode", "auto"), price=getattr(args, "price", None),
        max_cost=getattr(args, "max_cost", "auto"),
    )


async def _load_drafter(args: argparse.Namespace, client: SpecClient) -> None:
    if args.drafter in ("llama", "hf"):
        if not args.quiet:
            _log(f"loading the draft model {args.draft_model} (seconds, once per run)")
        await client.load_drafter()
