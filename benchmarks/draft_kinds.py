"""How long the n-gram drafter's drafts hold, per draft kind (``policy.draft_kind``).

At every token of the recorded answers of one workload, streamed a token at
a time (as the main stream feeds the drafter): the draft's tokens held
before its first miss, per kind, and split by whether the draft before it
predicted the latest token (the orchestrator's "hunch": side branches open
only after one).  ``mean run`` is accepted / misses over every position, so
a run of L tokens counts L, L-1, ... 1: read it as about half the runs'
length-weighted mean.  Set beside ``policy.TUNING.prior_runs`` (short: 6
tokens): on the real edits short drafts after a held hunch run ~36, on the
free-form prompts ~1 (thirty-first session).  No server, seconds.

    python benchmarks/draft_kinds.py                 # real-edit
    python benchmarks/draft_kinds.py real-free-form
"""
from collections import defaultdict
from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.drafters.ngram import NGramDrafter
from blackbox_spec.policy import draft_kind
from blackbox_spec.testing.sim import Replay
import sys
WL = sys.argv[1] if len(sys.argv) > 1 else "real-edit"
recs = {r.prompt: r for r in Replay().recordings}
stats = defaultdict(lambda: [0, 0, 0])  # accepted tokens, misses, drafts
for p in REAL_PROMPTS:
    if p.workload != WL: continue
    texts = [t.decode("utf-8", "replace") for t in recs[p.text].tokens if t]
    d = NGramDrafter(); d.start(p.text)
    prev = ""
    for i in range(len(texts)):
        draft = d.propose(4096); match = d.last_match
        held_hunch = bool(prev) and prev.startswith(texts[i - 1]) if i else False
        truth = "".join(texts[i:])
        h = 0
        while h < min(len(draft), len(truth)) and draft[h] == truth[h]: h += 1
        tok = chars = 0
        while tok < len(texts) - i and chars + len(texts[i + tok]) <= h:
            chars += len(texts[i + tok]); tok += 1
        if draft:
            for key in (draft_kind(match), draft_kind(match) + ("/held" if held_hunch else "/not")):
                s = stats[key]; s[0] += tok; s[1] += (h < len(draft) and h < len(truth)); s[2] += 1
        d.update(texts[i], draft, min(h, len(texts[i])))
        prev = draft
for k, (acc, miss, n) in sorted(stats.items()):
    print(f"{k:14s} drafts {n:5d} accepted {acc:6d} misses {miss:5d} mean run {acc / max(1, miss):6.1f} hazard {miss / max(1, acc):.3f}")
