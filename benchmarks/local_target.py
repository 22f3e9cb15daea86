"""Local target mode against plain sampling with the same target, same run.

For each prompt, temperature and repeat it times plain autoregressive
sampling (the target alone, one token per forward, through the same code)
and speculative sampling at each gamma (a draft model), and with
``--heads`` / ``--eagle`` tree speculation from Medusa heads or an EAGLE
head on the target itself, and reports medians of:

- speedup: plain seconds per token / speculative seconds per token;
- tokens per target forward (the bonus or recovered token counted: the
  mean accepted length), and for trees how often each depth was accepted;
- alpha: the mean of beta = sum_x min(p(x), q(x)) over the draft positions
  the rule examined (the paper's estimator, lower variance than counting);
- c: a draft forward of one token / a target forward of one token, and v: a
  target forward of gamma+1 tokens / one of one token (the paper takes v = 1);
- Leviathan's projection (1 - a^(g+1)) / ((1 - a)(g c + 1)), and the same
  with the measured verify cost, (1 - a^(g+1)) / ((1 - a)(g c + v)).

At temperature 0 it also checks that the speculative text equals plain
greedy decoding.  The projections use the costs seen inside the runs: c =
seconds per draft forward and v = seconds per round's target forward, both
over the same repeat's plain seconds per token.  Bare forwards after a
prefill are timed before and after the runs too (the ``costs`` block): on a
shared machine they drift, which is why the in-run figures are used.

With ``--random-init`` no weights are needed: the models are built from
config shapes (``--random-init qwen2.5-0.5b qwen2.5-1.5b``) in bf16/fp32,
and only the costs are timed; the projection then uses ``--alpha`` (for
example the CPU run's).  That is how the GPU figure is made, since weights
cannot travel to the device machine.

    python benchmarks/local_target.py --target-model ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-1.5b \\
        --draft-model ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-0.5b \\
        --out benchmarks/results/local-qwen-0.5b-1.5b-cpu.json
    python benchmarks/local_target.py --target-model ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-0.5b --heads HEADS \\
        --prompts story explain-tcp rename-inventory --out medusa.json
    python benchmarks/local_target.py --target-model ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-0.5b --heads MEDUSA --eagle EAGLE \
        --prompts hints-inventory port-js story sql --temperatures 0 0.7 --repeats 1 --out trees.json
    python benchmarks/local_target.py --random-init qwen2.5-0.5b qwen2.5-7b --device cuda --alpha 0.78 \\
        --out local-random-cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from blackbox_spec.bench.workloads import PROMPTS
from blackbox_spec.local import CachedLM, LocalSpeculator, SamplingParams, leviathan_speedup
from blackbox_spec.local.engine import language_model
from blackbox_spec.local.sampling import as_generator

# Public config shapes (hidden, intermediate, layers, heads, kv heads, tied
# embeddings) of Qwen2.5; the vocabulary is 151936 for all of them.
SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, True),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, True),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, False),
    "qwen2.5-14b": (5120, 13824, 48, 40, 8, False),
    "qwen2.5-32b": (5120, 27648, 64, 40, 8, False),
}


def random_model(name: str, device: str, dtype: torch.dtype):
    import transformers

    hidden, intermediate, layers, heads, kv_heads, tied = SHAPES[name]
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied, max_position_embeddings=32768,
    )
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def time_forward(model: CachedLM, prompt: list[int], width: int, repeats: int) -> float:
    """Median seconds of one forward of ``width`` tokens after the prompt is cached."""
    device = model.device
    times = []
    for _ in range(repeats + int(getattr(model, "compiled", False))):  # a compiled step's first call compiles
        model.reset(1, len(prompt) + width + 1)
        ids = torch.tensor([prompt], device=device)
        model.forward(ids, torch.ones_like(ids, dtype=torch.bool), last=1)
        new = torch.tensor([prompt[-width:]], device=device)
        _sync(device)
        start = time.perf_counter()
        model.forward(new, torch.ones_like(new, dtype=torch.bool), last=width)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[-repeats:])


def measure_costs(target: CachedLM, draft: CachedLM | None, prompt: list[int], gammas: list[int], repeats: int) -> dict:
    target_1 = time_forward(target, prompt, 1, repeats)
    if draft is None:
        return {"target_forward_1_s": target_1}
    draft_1 = time_forward(draft, prompt, 1, repeats)
    costs = {"target_forward_1_s": target_1, "draft_forward_1_s": draft_1, "c": draft_1 / target_1, "v": {}}
    for gamma in gammas:
        if gamma != "auto":
            costs["v"][str(gamma)] = time_forward(target, prompt, gamma + 1, repeats) / target_1
    return costs


# The ways local mode can run a model (``--engines``): transformers' own
# forward and cache, or the static cache, compiled or not.
ENGINES = {
    "eager": {"engine": "eager"},
    "static": {"engine": "static", "compile": False},
    "static+compiled": {"engine": "static", "compile": True},
}


def _tag(engine: str, args: argparse.Namespace) -> str:
    """Side labels name the engine only when several are compared."""
    return f" [{engine}]" if len(args.engines) > 1 else ""


def sides_of(engine: str, speculators: dict, plain: LocalSpeculator, args: argparse.Namespace) -> tuple:
    """The target and draft models as ``engine`` wraps them, for bare forward timings."""
    first = args.engines[0]
    target = plain.target if engine == first else speculators[f"plain{_tag(engine, args)}"].target
    with_draft = speculators.get(f"gamma={args.gammas[0]}{_tag(engine, args)}")
    return target, with_draft.draft if with_draft is not None else None


def projections(alpha: float, gamma: int, c: float, v: float) -> dict:
    tokens_per_round = gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return {
        "leviathan": leviathan_speedup(alpha, gamma, c),
        "with_verify_cost": tokens_per_round / (gamma * c + v),
        "tokens_per_round": tokens_per_round,
    }


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def build_sides(args: argparse.Namespace):
    """The plain baseline and every speculative side: each engine at each
    gamma, and trees from heads trained for this target."""
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if args.device == "cuda" else "float32")
    loaded = LocalSpeculator.from_pretrained(args.target_model, args.draft_model, device=args.device, dtype=dtype, engine="eager")
    target, tokenizer = loaded.target.model, loaded.tokenizer
    # The baseline is plain sampling on the first engine; every other engine
    # adds its own plain side, and each engine drafts at each gamma.
    first, *others = args.engines
    plain = LocalSpeculator(target, None, tokenizer, **ENGINES[first])
    speculators = {f"plain{_tag(e, args)}": LocalSpeculator(target, None, tokenizer, **ENGINES[e]) for e in others}
    for engine in args.engines:
        if loaded.draft:
            speculators |= {f"gamma={g}{_tag(engine, args)}": LocalSpeculator(target, loaded.draft.model, tokenizer, gamma=g, **ENGINES[engine])
                            for g in args.gammas}
    # Trees from heads trained for this target.
    if args.heads:
        from blackbox_spec.local.heads import MedusaProposer, load_medusa

        proposer = MedusaProposer(load_medusa(args.heads, target, tokenizer), nodes=args.medusa_nodes)
        speculators |= {_tree_label("medusa", mode): LocalSpeculator(target, None, tokenizer, proposer=proposer, gamma=mode if mode == "auto" else 1,
                                                                     **ENGINES[first]) for mode in args.tree_modes}
    if args.eagle:
        from blackbox_spec.local.eagle import EagleProposer, load_eagle

        proposer = EagleProposer(load_eagle(args.eagle, target, tokenizer), depth=args.eagle_tree[0], expand=args.eagle_tree[1], nodes=args.eagle_tree[2])
        speculators |= {_tree_label("eagle", mode): LocalSpeculator(target, None, tokenizer, proposer=proposer, gamma=mode if mode == "auto" else 1,
                                                                    **ENGINES[first]) for mode in args.tree_modes}
    return plain, speculators, tokenizer


def warm_up(args: argparse.Namespace, plain, speculators: dict, prompt) -> dict:
    """Untimed generations before the runs; returns what auto's calibration measured."""
    if args.warmup:
        # Compiled steps compile on their first calls (minutes on a CPU): an
        # untimed generation per side first, so the runs time the steps.
        for speculator in [plain, *speculators.values()]:
            speculator.generate(prompt.text, max_tokens=args.max_tokens, sampling=SamplingParams(0.7), seed=1)
    calibration = {}
    for label, speculator in speculators.items():
        if speculator.auto and (speculator.draft is not None or speculator.proposer is not None):
            # --gamma auto measures its costs once per process (and keeps them
            # on disk): a short untimed generation does it here, and says how long.
            warm = speculator.generate(prompt.text, max_tokens=8, sampling=SamplingParams(0.7), seed=1)
            calibration[label] = warm.local.auto.get("costs")
    print(f"calibration: {json.dumps(calibration)}", file=sys.stderr, flush=True)
    return calibration


def side_cell(result, base, temperature: float) -> dict:
    """One speculative side's run against this repeat's plain run."""
    local = result.local
    plain_step = base.stats.wall_s / base.stats.output_tokens
    cell = {
        "s": result.stats.wall_s, "tokens": result.stats.output_tokens, "alpha": local.alpha, "engine": local.engine,
        "accepted_per_drafted": result.stats.acceptance_rate,
        "tokens_per_target_forward": local.tokens_per_target_forward,
        "draft_s": result.stats.draft_s, "verify_s": result.stats.verify_s,
        # In-run costs against this repeat's plain step (prefill included in both).
        "c_in_run": result.stats.draft_s / max(local.draft_forwards, 1) / plain_step,
        "v_in_run": result.stats.verify_s / result.stats.rounds / plain_step,
        "speedup": plain_step / (result.stats.wall_s / result.stats.output_tokens),
    }
    if local.accepted_per_depth:
        cell["accepted_per_depth"] = [n / max(local.target_forwards, 1) for n in local.accepted_per_depth]
    if local.auto:
        cell["auto"] = local.auto
    if temperature == 0:
        cell["same_text_as_plain"] = result.text == base.text
    return cell


def timed_runs(args: argparse.Namespace, plain, speculators: dict, chosen: list) -> list[dict]:
    """Plain, then every side, per prompt, temperature and repeat (same seed)."""
    runs = []
    for prompt in chosen:
        for temperature in args.temperatures:
            sampling = SamplingParams(temperature=temperature, top_p=args.top_p)
            for repeat in range(args.repeats):
                seed = 1000 * repeat + 7
                base = plain.generate(prompt.text, max_tokens=args.max_tokens, sampling=sampling, seed=seed)
                row = {"prompt": prompt.name, "temperature": temperature, "repeat": repeat,
                       "plain": {"s": base.stats.wall_s, "tokens": base.stats.output_tokens}}
                for label, speculator in speculators.items():
                    result = speculator.generate(prompt.text, max_tokens=args.max_tokens, sampling=sampling, seed=seed)
                    row[label] = side_cell(result, base, temperature)
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return runs


def summary_entry(label: str, temperature: float, runs: list[dict], chosen: list) -> dict:
    """Medians of one side at one temperature, with its kind's own figures."""
    cells = [r[label] for r in runs if r["temperature"] == temperature]
    entry = {
        "speedup_median": statistics.median(c["speedup"] for c in cells),
        "speedup_per_prompt": {p.name: statistics.median(r[label]["speedup"] for r in runs if r["prompt"] == p.name and r["temperature"] == temperature) for p in chosen},
        "tokens_per_target_forward_median": statistics.median(c["tokens_per_target_forward"] for c in cells),
    }
    if label.startswith("plain"):
        pass
    elif label.startswith(("medusa", "eagle")):
        workloads = {p.workload for p in chosen}
        # The figure: the mean accepted length (tokens per
        # target forward, bonus included) per workload.
        entry["tokens_per_target_forward_mean_per_workload"] = {
            w: statistics.fmean(r[label]["tokens_per_target_forward"] for r in runs
                                if r["temperature"] == temperature and next(p for p in chosen if p.name == r["prompt"]).workload == w)
            for w in sorted(workloads)}
        per_depth = [c.get("accepted_per_depth", []) for c in cells]
        entry["accepted_per_depth_per_forward_mean"] = [statistics.fmean(d[k] if k < len(d) else 0.0 for d in per_depth)
                                                        for k in range(max(map(len, per_depth)))]
    elif label.startswith("gamma=auto"):
        entry |= {"alpha_median": statistics.median(c["alpha"] for c in cells),
                  "gamma_rounds": _sum_counts(c["auto"].get("gamma_rounds", {}) for c in cells)}
    else:
        gamma = int(label.split("=")[1].split()[0])
        alpha = statistics.median(c["alpha"] for c in cells)
        c_run = statistics.median(c["c_in_run"] for c in cells)
        v_run = statistics.median(c["v_in_run"] for c in cells)
        entry |= {"alpha_median": alpha, "accepted_per_drafted_median": statistics.median(c["accepted_per_drafted"] for c in cells),
                  "c_in_run_median": c_run, "v_in_run_median": v_run,
                  **{f"projected_{k}": v for k, v in projections(alpha, gamma, c_run, v_run).items()}}
    if temperature == 0:
        entry["same_text_as_plain"] = f"{sum(c['same_text_as_plain'] for c in cells)}/{len(cells)}"
    return entry


def run_real(args: argparse.Namespace) -> dict:
    import transformers

    plain, speculators, tokenizer = build_sides(args)
    chosen = [p for p in PROMPTS if p.name in args.prompts]
    first_ids = list(tokenizer(chosen[0].text)["input_ids"])
    engine_costs = lambda: {e: measure_costs(*sides_of(e, speculators, plain, args), first_ids, args.gammas, args.cost_repeats) for e in args.engines}  # noqa: E731
    costs = engine_costs()
    print(f"costs: {json.dumps(costs)}", file=sys.stderr, flush=True)
    calibration = warm_up(args, plain, speculators, chosen[0])
    runs = timed_runs(args, plain, speculators, chosen)
    costs = {"before_runs": costs, "after_runs": engine_costs()}
    summary = {f"T={temperature} {label}": summary_entry(label, temperature, runs, chosen)
               for temperature in args.temperatures for label in speculators}
    return {"baseline": f"plain sampling, engine {plain.engine}", "costs": costs, "calibration": calibration, "summary": summary, "runs": runs,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def _tree_label(kind: str, mode: str) -> str:
    return kind if mode == "auto" else f"{kind} whole"


def _sum_counts(dicts) -> dict:
    total: dict = {}
    for counts in dicts:
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def run_random(args: argparse.Namespace) -> dict:
    import transformers

    dtype = getattr(torch, args.dtype if args.dtype != "auto" else ("bfloat16" if args.device == "cuda" else "float32"))
    draft_name, target_name = args.random_init
    draft_model, target_model = random_model(draft_name, args.device, dtype), random_model(target_name, args.device, dtype)
    prompt = torch.randint(0, 151936, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    costs, projected, loop = {}, {}, {}
    args.gammas = [g for g in args.gammas if g != "auto"]  # auto on random weights: benchmarks/local_auto.py
    for engine in args.engines:
        target, draft = language_model(target_model, **ENGINES[engine])[0], language_model(draft_model, **ENGINES[engine])[0]
        costs[engine] = measure_costs(target, draft, prompt, args.gammas, args.cost_repeats)
        projected[engine] = {str(g): projections(args.alpha, g, costs[engine]["c"], costs[engine]["v"][str(g)]) for g in args.gammas}
        # The whole loop too: random weights disagree (alpha ~ 0), so a round
        # emits about one token; seconds per round check gamma * draft + verify,
        # and with the plain step they give the speedup at --alpha:
        # tokens per round at alpha / (seconds per round / plain seconds per token).
        loop[engine] = {}
        plain = LocalSpeculator(target_model, None, None, **ENGINES[engine])
        for gamma in [0, *args.gammas]:
            speculator = plain if gamma == 0 else LocalSpeculator(target_model, draft_model, None, gamma=gamma, **ENGINES[engine])
            name = "plain" if gamma == 0 else f"gamma={gamma}"
            # An untimed run first: on CUDA the first run of each shape (kernel
            # selection, allocator growth, compiling) was 5x slower than the next.
            speculator.sample_tokens(prompt, max_tokens=args.max_tokens, sampling=SamplingParams(1.0), generator=as_generator(1, args.device))
            speculator.target.forwards = 0
            _sync(args.device)
            start = time.perf_counter()
            out = speculator.sample_tokens(prompt, max_tokens=args.max_tokens, sampling=SamplingParams(1.0), generator=as_generator(1, args.device))
            _sync(args.device)
            seconds = time.perf_counter() - start
            loop[engine][name] = {"s_per_token": seconds / int((out >= 0).sum()), "s_per_round": seconds / speculator.target.forwards,
                                  "target_forwards": speculator.target.forwards, "engine": speculator.engine}
        baseline = loop[args.engines[0]]["plain"]["s_per_token"]
        for gamma in args.gammas:
            cell = loop[engine][f"gamma={gamma}"]
            cell["speedup_at_alpha_vs_first_engine_plain"] = projections(args.alpha, gamma, 0, 1)["tokens_per_round"] / (cell["s_per_round"] / baseline)
    return {
        "models": {"draft": draft_name, "target": target_name, "dtype": str(dtype), "weights": "random init (no weights travel)"},
        "alpha_assumed": args.alpha, "costs": costs, "projected": projected, "loop_random_draft": loop,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-model", help="transformers folder of the target")
    parser.add_argument("--draft-model", help="transformers folder of the draft (same tokenizer)")
    parser.add_argument("--heads", help="Medusa heads trained for --target-model (bspec heads train): a tree side")
    parser.add_argument("--medusa-nodes", type=int, default=16, help="nodes of the Medusa sparse tree (heads with recorded accuracies; default: 16)")
    parser.add_argument("--eagle", help="an EAGLE head trained for --target-model (bspec heads train --kind eagle): a tree side")
    parser.add_argument("--eagle-tree", type=int, nargs=3, default=[5, 4, 16], metavar=("DEPTH", "EXPAND", "NODES"),
                        help="EAGLE-2's dynamic tree: depth, nodes expanded per depth (and children each), nodes verified")
    parser.add_argument("--random-init", nargs=2, metavar=("DRAFT", "TARGET"), choices=list(SHAPES), help="time random-init models of these shapes instead")
    parser.add_argument("--alpha", type=float, default=0.78, help="alpha for --random-init projections (default: 0.78)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["eager"],
                        help="how the models run, compared side by side; the first engine's plain sampling is the baseline (default: eager)")
    parser.add_argument("--warmup", action="store_true", help="one untimed generation per side before the runs (compiled engines compile then)")
    parser.add_argument("--gammas", type=lambda v: v if v == "auto" else int(v), nargs="+", default=["auto", 2, 4], help="draft lengths, or auto (default: auto 2 4)")
    parser.add_argument("--tree-modes", nargs="+", choices=["auto", "whole"], default=["auto", "whole"],
                        help="trees cut at the depth --gamma auto chooses, and/or always whole (default: both)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--prompts", nargs="+", default=["story", "explain-tcp", "fizzbuzz"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cost-repeats", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=64, help="prompt length for --random-init")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    report = run_random(args) if args.random_init else run_real(args)
    report["command"] = " ".join(sys.argv)
    report["threads"] = torch.get_num_threads()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report.get("summary") or report.get("projected"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
