"""Measures EAGLE-2 tree shapes in local mode: tokens per target forward and speed against plain greedy.

EAGLE-2 tree shapes on this machine: tokens per target forward and speed
against plain greedy, same target, same run, T=0 (the text must not change).

    python benchmarks/eagle_tree_sweep.py --target ~/.cache/blackbox_spec/models/hf/qwen2.5-coder-0.5b --eagle HEADS \\
        --trees 5,4,16 6,4,24 4,3,10 --prompts hints-inventory port-js story sql --out sweep.json

Each tree is DEPTH,EXPAND,NODES (see ``blackbox_spec.local.eagle``).  Plain
and each tree run in turn per prompt; medians over prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from blackbox_spec.bench.workloads import PROMPTS
from blackbox_spec.local import LocalSpeculator, SamplingParams
from blackbox_spec.local.eagle import EagleProposer, load_eagle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", required=True)
    parser.add_argument("--trees", nargs="+", default=["5,4,16"], help="DEPTH,EXPAND,NODES each")
    parser.add_argument("--prompts", nargs="+", default=["hints-inventory", "port-js", "story", "sql"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    loaded = LocalSpeculator.from_pretrained(args.target)
    target, tokenizer = loaded.target.model, loaded.tokenizer
    head = load_eagle(Path(args.eagle), target, tokenizer)
    plain = LocalSpeculator(target, None, tokenizer)
    trees = {t: LocalSpeculator(target, None, tokenizer, proposer=EagleProposer(head, depth=d, expand=e, nodes=n))
             for t in args.trees for d, e, n in [map(int, t.split(","))]}
    greedy = SamplingParams(temperature=0)
    rows = []
    for prompt in [p for p in PROMPTS if p.name in args.prompts]:
        base = plain.generate(prompt.text, max_tokens=args.max_tokens, sampling=greedy)
        row = {"prompt": prompt.name, "plain_s": base.stats.wall_s}
        for label, speculator in trees.items():
            result = speculator.generate(prompt.text, max_tokens=args.max_tokens, sampling=greedy)
            row[label] = {"tokens_per_target_forward": result.local.tokens_per_target_forward, "s": result.stats.wall_s,
                          "speedup": base.stats.wall_s / result.stats.wall_s, "same_text": result.text == base.text}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    summary = {label: {"tokens_per_target_forward_median": statistics.median(r[label]["tokens_per_target_forward"] for r in rows),
                       "speedup_median": statistics.median(r[label]["speedup"] for r in rows),
                       "same_text": f"{sum(r[label]['same_text'] for r in rows)}/{len(rows)}"} for label in trees}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "summary": summary, "runs": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
