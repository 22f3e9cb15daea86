"""Measures --gamma auto on a device from random-init models: the measured costs, projected and measured speed per engine.

--gamma auto on a device, from random-init models (weights cannot travel to the GPU machine).

For a draft/target pair of Qwen2.5 shapes and each engine (eager, static,
static+compiled) it reports:

- the costs --gamma auto measures (calibrate.measure: target steps of 1..7
  tokens and tree widths up to 17, a draft step), as c and v(w);
- chain: the projected speed of γ = 1..5 and of auto's choice at --alpha
  (the acceptance measured with real weights on the CPU), and the measured
  loop (seconds per token: plain, each γ, auto).  Random weights disagree
  (α ~ 0), so the loop checks the other half of the promise: auto stays at
  plain's speed where drafts are useless, where a fixed γ loses;
- trees: a random EAGLE head's and Medusa heads' proposal time, the
  projected speed of each depth cut at --eagle-reach / --medusa-reach (the
  CPU's per-depth acceptance), auto's cut, and the measured auto-depth loop
  against plain at α ~ 0.

    python benchmarks/local_auto.py --pair qwen2.5-0.5b qwen2.5-1.5b --device cuda --out local-auto-cuda.json
    python benchmarks/local_auto.py --pair qwen2.5-0.5b qwen2.5-0.5b --max-tokens 8 --engines static --out /tmp/smoke.json   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from blackbox_spec.local import LocalSpeculator, SamplingParams
from blackbox_spec.local.calibrate import chain_widths, measure, tree_widths
from blackbox_spec.local.costs import MAX_GAMMA, Costs, best_depth, best_gamma, chain_speedup, tree_speedup
from blackbox_spec.local.engine import language_model
from blackbox_spec.local.sampling import as_generator

sys.path.insert(0, str(Path(__file__).parent))
from local_target import ENGINES, SHAPES, random_model  # noqa: E402

# Per-depth reach (accepted nodes at depth d per round) and nodes down to
# each depth, from the CPU runs with trained heads on Qwen2.5-Coder 0.5B
# (benchmarks/results/trees-qwen-0.5b-cpu-21): EAGLE-2 5/4/16, Medusa 3 heads.
EAGLE_REACH = [0.74, 0.36, 0.17, 0.06, 0.01]
MEDUSA_REACH = [0.64, 0.16, 0.03]


def costs_after_prompt(target, draft, prompt: list[int], widths: list[int]) -> Costs:
    """calibrate.measure on the wrapped models with ``prompt`` in their caches."""
    for model in (target, draft):
        if model is not None:
            model.reset(1, len(prompt) + max(widths) + 2)
            ids = torch.tensor([prompt], device=model.device)
            model.forward(ids, torch.ones_like(ids, dtype=torch.bool), last=1)
    return measure(target, draft, widths, SamplingParams(1.0))


def seconds_per_token(speculator: LocalSpeculator, prompt: list[int], max_tokens: int, device: str) -> dict:
    """One untimed run (first shapes, compiles), then one timed."""
    run = lambda: speculator.sample_tokens(prompt, max_tokens=max_tokens, sampling=SamplingParams(1.0), generator=as_generator(1, device))  # noqa: E731
    run()
    _sync(device)
    clock = time.perf_counter()
    out = run()
    _sync(device)
    return {"s_per_token": (time.perf_counter() - clock) / int((out >= 0).sum())}


def tree_loop(target_model, proposer, prompt_text_ids: list[int], max_tokens: int, device: str, engine: dict) -> dict:
    """Seconds per token of generate() with a tree proposer under --gamma auto."""
    speculator = LocalSpeculator(target_model, None, None, proposer=proposer, **engine)
    from blackbox_spec.local.engine import LocalStats
    from blackbox_spec.local.tree_engine import speculate_tree
    from blackbox_spec._stats import GenerationStats

    def run() -> tuple[float, LocalStats]:
        local = LocalStats()
        chooser = lambda nodes: speculator._depth_chooser(nodes, SamplingParams(1.0), local, fit_costs=True)  # noqa: E731
        _sync(device)
        clock = time.perf_counter()
        tokens = speculate_tree(speculator.target, proposer, prompt_text_ids, max_tokens=max_tokens, sampling=SamplingParams(1.0),
                                generator=as_generator(1, device), ends=set(), stats=GenerationStats(), local=local, depth_chooser=chooser)
        _sync(device)
        return (time.perf_counter() - clock) / len(tokens), local

    run()
    seconds, local = run()
    return {"s_per_token": seconds, "depth_rounds": local.auto.get("depth_rounds"), "costs": local.auto.get("costs")}


def proposal_seconds(proposer, hidden: int, prompt: list[int], device: str, dtype) -> float:
    """One proposal after a prompt's features (random), the second of two calls."""
    features = torch.randn((len(prompt), hidden), device=device, dtype=dtype)
    following = torch.tensor(prompt[1:] + [prompt[0]])
    proposer.reset()
    proposer.propose(features, following, SamplingParams(1.0), as_generator(1, device))
    _sync(device)
    clock = time.perf_counter()
    proposer.propose(features[-1:], following[-1:], SamplingParams(1.0), as_generator(1, device))
    _sync(device)
    return time.perf_counter() - clock


def trees(args, target_model, prompt: list[int], engine_name: str) -> dict:
    from blackbox_spec.local.eagle import EagleProposer, new_head
    from blackbox_spec.local.heads import MedusaHeads, MedusaProposer
    from blackbox_spec.local.tree import nodes_by_depth

    hidden, dtype = target_model.config.hidden_size, next(target_model.parameters()).dtype
    proposers = {
        "eagle": (EagleProposer(new_head(target_model, torch.arange(target_model.config.vocab_size)).eval(), depth=5, expand=4, nodes=16), args.eagle_reach),
        "medusa": (MedusaProposer(MedusaHeads(hidden, 3, target_model.get_output_embeddings()).to(args.device, dtype).eval()), args.medusa_reach),
    }
    target = language_model(target_model, **ENGINES[engine_name])[0]
    out = {}
    for name, (proposer, reach) in proposers.items():
        features = torch.randn((len(prompt), hidden), device=args.device, dtype=dtype)
        tree, _ = proposer.propose(features, torch.tensor(prompt[1:] + [prompt[0]]), SamplingParams(1.0), as_generator(1, args.device))
        nodes = nodes_by_depth(tree)
        costs = costs_after_prompt(target, None, prompt, tree_widths(len(tree)))
        costs.draft_s = proposal_seconds(proposer, hidden, prompt, args.device, dtype)
        depth, speed = best_depth(reach[: len(nodes)], nodes, costs)
        out[name] = {"nodes_by_depth": nodes, "reach_assumed": reach, "proposal_s": costs.draft_s, "plain_s": costs.plain_s,
                     "projected_by_depth": {str(d): round(tree_speedup(reach, d, nodes, costs), 3) for d in range(len(nodes) + 1)},
                     "auto_depth": depth, "auto_projected": speed,
                     "loop_alpha0": tree_loop(target_model, proposer, prompt, args.max_tokens, args.device, ENGINES[engine_name])}
    return out


def chain(args, draft_model, target_model, prompt: list[int], engine_name: str) -> dict:
    engine = ENGINES[engine_name]
    target, draft = language_model(target_model, **engine)[0], language_model(draft_model, **engine)[0]
    costs = costs_after_prompt(target, draft, prompt, chain_widths(MAX_GAMMA))
    gamma, speed = best_gamma(args.alpha, costs)
    loop = {"plain": seconds_per_token(LocalSpeculator(target_model, None, None, **engine), prompt, args.max_tokens, args.device)}
    for g in [*args.gammas, "auto"]:
        speculator = LocalSpeculator(target_model, draft_model, None, gamma=g, **engine)
        speculator.ends = torch.tensor([-7], device=speculator.target.device)
        loop[f"gamma={g}"] = seconds_per_token(speculator, prompt, args.max_tokens, args.device)
        loop[f"gamma={g}"]["vs_plain_at_alpha0"] = round(loop["plain"]["s_per_token"] / loop[f"gamma={g}"]["s_per_token"], 3)
    return {"costs": costs.to_dict(), "c": round(costs.draft_s / costs.plain_s, 3),
            "v": {str(w): round(costs.verify(w) / costs.plain_s, 3) for w in chain_widths(MAX_GAMMA)},
            "projected": {f"gamma={g}": round(chain_speedup(args.alpha, g, costs), 3) for g in args.gammas},
            "auto_gamma": gamma, "auto_projected": speed, "loop_alpha0": loop}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, metavar=("DRAFT", "TARGET"), choices=list(SHAPES), default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["eager", "static", "static+compiled"])
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--alpha", type=float, default=0.66, help="chain acceptance for projections (default: the CPU's, 0.5B -> 1.5B)")
    parser.add_argument("--eagle-reach", type=float, nargs="+", default=EAGLE_REACH)
    parser.add_argument("--medusa-reach", type=float, nargs="+", default=MEDUSA_REACH)
    parser.add_argument("--no-trees", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    draft_model, target_model = (random_model(name, args.device, dtype) for name in args.pair)
    prompt = torch.randint(0, 151936, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    report = {"pair": args.pair, "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "alpha_assumed": args.alpha}
    for engine in args.engines:
        clock = time.perf_counter()
        # One part failing (a compile error) must not lose the others' figures.
        report[engine] = {}
        for part, run in (("chain", lambda: chain(args, draft_model, target_model, prompt, engine)),
                          ("trees", lambda: None if args.no_trees else trees(args, target_model, prompt, engine))):
            try:
                report[engine][part] = run()
            except Exception as exc:
                report[engine][part] = {"error": f"{type(exc).__name__}: {exc}"}
        report[engine]["seconds"] = round(time.perf_counter() - clock, 1)
        print(json.dumps({engine: report[engine]}), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
