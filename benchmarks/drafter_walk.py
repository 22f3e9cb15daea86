"""How far the n-gram drafter is from the copy-oracle, with rounds free.

Walks each real edit's recorded answer (``testing/data/replay-*``): at each
position the drafter drafts, and a round takes what held plus the target's
next token at the oracle's own round cost (``bench.oracle.RoundCosts`` of a
sim preset), or streams one token where that is cheaper.  Beside it, the
copy-oracle on the same costs.  No server, no policy: this isolates where
the drafter's drafts are wrong (the answer's start, the first draft after
an edit), in seconds.  Used for the resync changes of issue 39.

    python benchmarks/drafter_walk.py            # gpu preset costs
    python benchmarks/drafter_walk.py hosted
"""
import statistics
import sys

from blackbox_spec.bench.oracle import RoundCosts, copy_runs, oracle_seconds
from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.drafters.ngram import NGramDrafter
from blackbox_spec.testing.sim import PRESETS, Replay


def walk(prompt: str, texts: list[str], drafter, costs: RoundCosts) -> float:
    """Plain's seconds over the walk's, for one answer of ``texts`` tokens."""
    drafter.start(prompt)
    i, seconds, n = 0, costs.request_s, len(texts)
    while i < n:
        truth = "".join(texts[i:])
        draft = drafter.propose(4096)
        held = 0
        while held < min(len(draft), len(truth)) and draft[held] == truth[held]:
            held += 1
        chars = tokens = 0  # whole tokens the held characters cover
        while tokens < n - i - 1 and chars + len(texts[i + tokens]) <= held:
            chars += len(texts[i + tokens])
            tokens += 1
        take = tokens + 1 if tokens and costs.copy_round_s(tokens) < (tokens + 1) * costs.step_s else 1
        seconds += costs.copy_round_s(tokens) if take > 1 else costs.step_s
        accepted = "".join(texts[i : i + take])
        drafter.update(accepted, draft, min(held, len(accepted)))
        i += take
    return (costs.request_s + n * costs.step_s) / seconds


def main(preset: str) -> None:
    if preset not in PRESETS:
        sys.exit(f"drafter_walk.py: unknown preset {preset!r}; one of: {', '.join(PRESETS)}")
    c = PRESETS[preset]
    costs = RoundCosts(step_s=c.decode_s, request_s=c.rtt_s + c.overhead_s + c.decode_s, prefill_s=c.prefill_s)
    recordings = {r.prompt: r for r in Replay().recordings}
    shares = []
    for p in REAL_PROMPTS:
        if p.workload != "real-edit":
            continue
        tokens = [t for t in recordings[p.text].tokens if t]
        texts = [t.decode("utf-8", "replace") for t in tokens]
        ours = walk(p.text, texts, NGramDrafter(), costs)
        best = oracle_seconds(copy_runs(p.text.encode(), tokens), costs, first_s=costs.request_s).speedup
        shares.append(ours / best)
        print(f"{p.name:15s} n-gram {ours:6.2f}x  oracle {best:6.2f}x  share {ours / best:4.0%}")
    print(f"median share {statistics.median(shares):.0%}, least {min(shares):.0%}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu")
