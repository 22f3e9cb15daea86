"""Measures how often a draft model agrees with the target (alpha, accepted per draft, draft cost), replaying the target's own outputs.

How often a draft model agrees with the target: a replay over the
target's own temperature-0 outputs, without a server in the loop.

For each prompt, the target's plain output is walked as the speculative loop
would walk it: the drafter proposes from the text so far, the longest prefix
that matches the real output is counted as accepted, and the text advances
by that prefix plus one piece (the target's own next token).  It reports
acceptance per drafted token (alpha, in the draft model's tokens), accepted
characters per draft, and the draft model's time per drafted token, and
projects the speedup of Leviathan et al. (2023), eq. 1, for a server that
checks a draft of gamma tokens in one step: (1 - a^(g+1)) / ((1 - a)(g c + 1)).

    python benchmarks/draft_acceptance.py --texts benchmarks/results/vllm-1.5b-fp32-model-drafters/bench.json \\
        --draft-model ~/.cache/blackbox_spec/models/qwen2.5-coder-0.5b.gguf --workload free-form \\
        --target-step-s 0.20 --out benchmarks/results/draft-acceptance-0.5b-for-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from blackbox_spec.bench.workloads import WORKLOADS, prompts
from blackbox_spec.drafters import DrafterFactory
from blackbox_spec.drafters.suffix import split_pieces


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement factor (Leviathan et al. 2023, eq. 1).

    >>> round(leviathan_speedup(0.8, 4, 0.05), 2)
    2.78
    """
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def replay(factory: DrafterFactory, prompt: str, output: str) -> dict:
    drafter = factory()
    drafter.start(prompt)
    model = getattr(drafter, "model", None)
    pos = rounds = accepted_chars = drafted_tokens = accepted_tokens = misses = 0
    draft_s = 0.0
    while pos < len(output):
        started = time.perf_counter()
        drafter._draft_at = -1  # every round a fresh draft, as after a miss
        draft = drafter.propose(4096)
        draft_s += time.perf_counter() - started
        truth = output[pos:]
        k = 0
        while k < min(len(draft), len(truth)) and draft[k] == truth[k]:
            k += 1
        rounds += 1
        accepted_chars += k
        misses += bool(draft) and k < len(draft)
        if model is not None and draft:
            drafted = len(model.tokenize(draft)) - 1
            kept = len(model.tokenize(draft[:k])) - 1 if k else 0
            drafted_tokens += max(drafted, 0)
            accepted_tokens += max(min(kept, drafted), 0)
        rest = split_pieces(truth[k:])
        step = k + (len(rest[0]) if rest else 0)
        drafter.update(output[pos : pos + step], draft, k)
        pos += step
    return {
        "rounds": rounds, "accepted_chars": accepted_chars, "output_chars": len(output),
        "drafted_tokens": drafted_tokens, "accepted_tokens": accepted_tokens, "misses": misses, "draft_s": round(draft_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=Path, required=True, help="plain outputs of the target: a bench.json, or JSON prompt name -> text (as the deleted bench/multibranch_sim.py wrote: see docs/results.md)")
    parser.add_argument("--drafter", default="llama", choices=["llama", "hf"])
    parser.add_argument("--draft-model", required=True)
    parser.add_argument("--workload", nargs="+", default=["free-form"], choices=WORKLOADS)
    parser.add_argument("--target-step-s", type=float, required=True, help="the target's measured seconds per token (for c)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    texts = json.loads(args.texts.read_text())
    if "cells" in texts:  # a bench.json: its plain runs' outputs
        texts = {c["prompt"]: c["text"] for c in texts["cells"] if c["config"] == "plain" and c.get("text")}
    factory = DrafterFactory(args.drafter, draft_model=args.draft_model)
    factory.load()
    rows = []
    for p in prompts(args.workload):
        if p.name not in texts:
            continue
        row = {"prompt": p.name, "workload": p.workload, **replay(factory, p.text, texts[p.name])}
        rows.append(row)
        kept = row["accepted_tokens"] / max(1, row["drafted_tokens"])
        print(f"{p.name:<16} rounds {row['rounds']:>4}  kept {kept:.0%} of drafted tokens  chars/draft {row['accepted_chars'] / row['rounds']:.1f}  draft {row['draft_s']:.1f}s", flush=True)
    summaries = {w: summarize([r for r in rows if r["workload"] == w], args.target_step_s) for w in args.workload if any(r["workload"] == w for r in rows)}
    for w, summary in summaries.items():
        print(w, json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"draft_model": args.draft_model, "target_step_s": args.target_step_s, "by_workload": summaries, "rows": rows}, indent=1) + "\n")


def summarize(rows: list[dict], target_step_s: float, gamma: int = 8) -> dict:
    """Acceptance and the projected speedup over some replayed prompts.
    alpha, the chance that a drafted token is accepted, is estimated as
    accepted / (accepted + rejections): each draft is a run of accepted
    tokens ended by one rejection (or by its own end)."""
    drafted = sum(r["drafted_tokens"] for r in rows)
    accepted = sum(r["accepted_tokens"] for r in rows)
    mean_run = accepted / max(1, sum(r["rounds"] for r in rows))
    alpha = accepted / max(1, accepted + sum(r["misses"] for r in rows))
    per_token = sum(r["draft_s"] for r in rows) / max(1, drafted)
    c = per_token / target_step_s
    best = max(range(1, 17), key=lambda g: leviathan_speedup(alpha, g, c))
    return {
        "prompts": len(rows), "mean_accepted_tokens_per_draft": round(mean_run, 2), "alpha": round(alpha, 3),
        "gamma": gamma, "draft_s_per_token": round(per_token, 4), "c": round(c, 3),
        "leviathan_speedup": round(leviathan_speedup(alpha, gamma, c), 2),
        "best_gamma": best, "leviathan_speedup_best_gamma": round(leviathan_speedup(alpha, best, c), 2),
        # A remote server: drafting overlaps nothing on the target, c is the
        # draft's share of the client's time only; c = 0 is the upper bound.
        "leviathan_speedup_c0": round(leviathan_speedup(alpha, gamma, 0.0), 2),
    }


if __name__ == "__main__":
    main()
