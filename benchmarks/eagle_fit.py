"""Measures how well EAGLE heads fit each bench prompt (first draft step's top-1 and top-4, teacher-forced).

How well EAGLE heads fit each bench prompt: the head's first draft step,
teacher-forced over the target's own greedy answer, top-1 and top-4.  Top-4
bounds what depth 1 of a (5, 4, 16) tree can accept, so a tree loop far
below it is a drafting bug, and a low top-1 is missing training data.

    python benchmarks/eagle_fit.py --target $T --eagle HEADS_A HEADS_B --out fit.json

``--held-out HEADS/hidden-128.pt --corpus N`` also scores every head on the
held-out tenth of ``offline_corpus(N)`` from that cache of hidden states: one set for heads
trained on different amounts of data (none of them saw it), so their
figures line up as a data-scaling curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blackbox_spec.bench.workloads import PROMPTS
from blackbox_spec.drafters.hf import load_folder
from blackbox_spec.local.eagle import load_eagle
from blackbox_spec.local.train_heads import Sequences, distill_sequences, eagle_accuracy, greedy_continuations, offline_corpus, prompt_key

DEFAULT_PROMPTS = ["hints-inventory", "hints-stats", "docstrings-stats", "rename-inventory", "rename-js", "port-js",
                   "story", "explain-tcp", "fizzbuzz", "ideas", "sql", "haiku-continue"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target's transformers folder")
    parser.add_argument("--eagle", nargs="+", required=True, help="EAGLE heads folders trained for --target")
    parser.add_argument("--prompts", nargs="+", default=DEFAULT_PROMPTS)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--held-out", metavar="FILE", help="a heads folder's hidden-N.pt (see --corpus)")
    parser.add_argument("--corpus", type=int, default=2800, help="with --held-out: the corpus size whose last tenth is scored")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model, tokenizer = load_folder(args.target, device="cpu", dtype="float32", role="target model", option="--target", hint="", feature="eagle_fit")
    model = model.eval()
    heads = {folder: load_eagle(Path(folder), model, tokenizer) for folder in args.eagle}
    by_name = {p.name: p for p in PROMPTS}
    rows = []
    for name in args.prompts:
        text = by_name[name].text
        answer = greedy_continuations(model, tokenizer, [text], args.max_tokens)[0]
        data = distill_sequences(model, tokenizer, [text], [answer])
        row = {"prompt": name, "workload": by_name[name].workload}
        for folder, head in heads.items():
            top1, top4 = eagle_accuracy(head, data, k=4)
            row[folder] = {"top1": round(top1, 4), "top4": round(top4, 4)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    held_out = {}
    if args.held_out:
        import torch

        saved = torch.load(args.held_out, weights_only=True)
        where = {key: i for i, key in enumerate(saved["keys"])}
        prompts = offline_corpus(args.corpus)
        data = Sequences(**saved["sequences"]).pick([where[prompt_key(p)] for p in prompts[-(len(prompts) // 10):]])
        for folder, head in heads.items():
            top1, top4 = eagle_accuracy(head, data, k=4)
            held_out[folder] = {"top1": round(top1, 4), "top4": round(top4, 4), "positions": len(data.tokens)}
            print(json.dumps({"held_out": folder, **held_out[folder]}), file=sys.stderr)
    Path(args.out).write_text(json.dumps({"command": sys.argv, "max_tokens": args.max_tokens, "rows": rows, "held_out": held_out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
