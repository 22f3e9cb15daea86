"""Medusa heads in local target mode against plain greedy decoding with the
same target, same run: per prompt, plain (one token per forward, through
the same cached forward) and tree speculation, in alternating order; the
texts must be equal.  Reports tokens per target forward (the mean accepted
length, bonus included), acceptance per depth and speedup.

    python bench/medusa_local.py --target ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-0.5b \\
        --heads HEADS_DIR --workload code-edit free-form --max-tokens 64 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from blackbox_spec._stats import GenerationStats
from blackbox_spec.bench.workloads import WORKLOADS, prompts
from blackbox_spec.drafters.hf import end_tokens, load_folder
from blackbox_spec.local import CachedLM, LocalSpeculator, SamplingParams
from blackbox_spec.local.engine import LocalStats
from blackbox_spec.local.heads import DEFAULT_TREE, MedusaProposer, load_medusa
from blackbox_spec.local.tree_engine import speculate_tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--heads", required=True)
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=["code-edit", "free-form"])
    parser.add_argument("--prompts", type=int, default=3, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tree", type=int, nargs="+", default=list(DEFAULT_TREE), help="children of the likeliest node per depth")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model, tokenizer = load_folder(args.target, device="cpu", dtype="float32", role="target", option="--target", hint="", feature="bench")
    model.eval()
    proposer = MedusaProposer(load_medusa(Path(args.heads), model, tokenizer), args.tree)
    plain = LocalSpeculator(model, None, tokenizer)
    ends = end_tokens(model, tokenizer)
    rows = []
    chosen = [p for w in args.workload for p in prompts([w], None)[: args.prompts]]
    for i, prompt in enumerate(chosen):
        ids = list(tokenizer(prompt.text, add_special_tokens=True)["input_ids"])
        sides = {}
        for side in (["plain", "tree"] if i % 2 == 0 else ["tree", "plain"]):
            started = time.perf_counter()
            if side == "plain":
                tokens = [t for t in plain.sample_tokens(ids, max_tokens=args.max_tokens, sampling=SamplingParams(0), generator=torch.Generator().manual_seed(0))[0].tolist() if t >= 0]
                sides[side] = (time.perf_counter() - started, tokens, None)
            else:
                local = LocalStats()
                tokens = speculate_tree(CachedLM(model), proposer, ids, max_tokens=args.max_tokens, sampling=SamplingParams(0),
                                        generator=torch.Generator().manual_seed(0), ends=ends, stats=GenerationStats(), local=local)
                sides[side] = (time.perf_counter() - started, tokens, local)
        (plain_s, plain_tokens, _), (tree_s, tree_tokens, local) = sides["plain"], sides["tree"]
        row = {"prompt": prompt.name, "workload": prompt.workload, "tokens": len(plain_tokens), "plain_s": round(plain_s, 2), "tree_s": round(tree_s, 2),
               "speedup": round(plain_s / tree_s, 3), "tokens_per_target_forward": round(local.tokens_per_target_forward, 3),
               "accepted_per_depth": local.accepted_per_depth, "rounds": local.target_forwards, "identical": plain_tokens == tree_tokens}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {w: {"median_tokens_per_forward": statistics.median(r["tokens_per_target_forward"] for r in rows if r["workload"] == w),
                   "median_speedup": statistics.median(r["speedup"] for r in rows if r["workload"] == w)} for w in args.workload}
    print(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": args.target, "heads": args.heads, "tree": args.tree, "rows": rows, "summary": summary}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
