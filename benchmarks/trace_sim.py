"""Where a speculative generation's time goes on a simulated server.

For each real-edit prompt: plain, then one fresh client (no saved profile)
with the n-gram drafter, on one in-process sim preset; prints speedup, the
copy-oracle's figure and share, requests, echo calls, prompt tokens sent
against plain's, and a running total (sum plain / sum spec, as bspec bench).
Without -q: every request (start, time to headers, prompt tokens,
max_tokens, echo) and, with env DECISIONS=1 / TIMING=1, each
``Policy.interrupt`` / ``Policy.branches`` decision, group opened, jump,
Canon check and echo round, timed (monkeypatched: a diagnosis tool).
Env DRAFTER=oracle|perfect|located|trusted drafts the true answer (the
copy-oracle's run, or all of it, or the source from where the run is found
on: a copy drafter that always knows where to copy from), or the n-gram's
drafts all reported as long matches: the verification machinery measured apart from the drafter.
Env PROFILE=auto keeps a saved profile between prompts (as a user's later processes do).
Env CHAT_PREFILL=prefix|trailing|llama serves chat in that form (``FakeTarget.chat_prefill``;
"prefix": Mistral's, a final assistant message continued only with ``"prefix": true``).
Env TUNE="segment_tokens=(1,2);widths=(2,4)" overrides ``policy.TUNING``
fields, FANOUT sets the client's fanout_width.

    python benchmarks/trace_sim.py gpu edits -q              # all 14 edits, totals
    DECISIONS=1 TIMING=1 python benchmarks/trace_sim.py gpu r-hints-py
    python benchmarks/trace_sim.py hosted r-rename-go,r-ctx-go -q

Run nothing beside it: the sim sleeps in real time, and CPU load shows.
"""
import asyncio, sys, time
from blackbox_spec.client import SpecClient
from blackbox_spec.testing.sim import SimulatedTarget
from blackbox_spec.bench.real_edits import REAL_PROMPTS
from blackbox_spec.bench.oracle import sim_oracle
import os, blackbox_spec.policy as P
for kv in filter(None, os.environ.get("TUNE", "").split(";")):
    k, v = kv.split("=", 1); object.__setattr__(P.TUNING, k, eval(v))
FANOUT = int(os.environ.get("FANOUT", "16"))

LOG = []
TOT = [0.0, 0.0]
_orig = SimulatedTarget.handle_async
async def _h(self, request):
    t = time.perf_counter(); n = len(self.requests)
    try:
        return await _orig(self, request)
    finally:
        rec = self.requests[n] if len(self.requests) > n else None
        if rec is not None: rec["_t"] = t; rec["_done"] = time.perf_counter()
SimulatedTarget.handle_async = _h

DEC = []
if os.environ.get("DECISIONS"):
    _int, _br = P.Policy.interrupt, P.Policy.branches
    def _i(self, draft, match, *, remaining=1<<20):
        r = _int(self, draft, match, remaining=remaining)
        opts = self.options(draft, match) if draft else []
        best = max((g/(s+self.costs.stream.fixed) for g,s,_ in opts), default=0)
        DEC.append(f"{time.perf_counter()*1000 % 100000:9.1f} interrupt={r} kind={self.kind(match)} draft={len(draft)} echo_rate={best:.0f} bar={self.echo_bar(draft, match, remaining) if draft else 0:.0f} ctx={self.context_tokens:.0f} step1={self.costs.per_token()*1000:.1f}ms echo={self.costs.echo_seconds(self.context_tokens)*1000:.1f}ms obs={self.costs.stream.observed}")
        return r
    def _b(self, draft, match, *, remaining, **kw):
        r = _br(self, draft, match, remaining=remaining, **kw)
        if r is not None: DEC.append(f"{time.perf_counter()*1000 % 100000:9.1f} BRANCHES {r.width}x{r.segment_chars} kind={self.kind(match)} draft={len(draft)} tps={self.outlook.tokens_per_s:.0f}" + (f" n={self.budget.output_tokens} spent={self.budget.spent()*1e6:.0f} plain={self.budget.plain_cost()*1e6:.0f} room={self.budget.room()*1e6:.0f} cpt={self.chars_per_token:.2f} ctx={self.context_tokens:.0f} draft0={draft[:30]!r}" if self.budget else ""))
        return r
    P.Policy.interrupt, P.Policy.branches = _i, _b

if os.environ.get("TIMING"):
    import blackbox_spec._canon as C, blackbox_spec.verifiers.echo as E, blackbox_spec.orchestrator as O
    def wrap(cls, name, label):
        f = getattr(cls, name)
        async def g(*a, **k):
            t = time.perf_counter()
            try: return await f(*a, **k)
            finally: DEC.append(f"{t*1000 % 100000:9.1f} {label} {(time.perf_counter()-t)*1000:.1f}ms")
        setattr(cls, name, g)
    wrap(C.Canon, "holds", "canon.holds")
    BS = O.BranchedStream
    for name in ("open_group", "end_group", "close_group"):
        def mk(name, f=getattr(BS, name)):
            def g(self, *a, **k):
                DEC.append(f"{time.perf_counter()*1000 % 100000:9.1f} {name} tokens={self.out.tokens} group={len(self.group)} {a[1] if name=='open_group' else ''}")
                return f(self, *a, **k)
            return g
        setattr(BS, name, mk(name))
    _jump = BS.jump
    async def jump(self, promoted):
        r = await _jump(self, promoted)
        DEC.append(f"{time.perf_counter()*1000 % 100000:9.1f} JUMP to {promoted.at} tokens={self.out.tokens} replay={len(self.replay)}")
        return r
    BS.jump = jump
    wrap(E.EchoVerifier, "verify", "echo.verify")

class OracleDrafter:
    """Diagnosis only (env DRAFTER=oracle|perfect): drafts the true answer.
    "oracle": the copy-oracle's run (the longest head of the true rest whose
    text occurs in the context so far), so the machinery is measured apart
    from the n-gram drafter; "perfect": the whole true rest."""
    name = "ngram"
    def __init__(self, answer, perfect):
        self.answer, self.perfect, self.last_match = answer, perfect, 256
        self.copy_on = DRAFTER.startswith("located")
        from blackbox_spec.drafters.ngram import NGramDrafter
        self.ngram = NGramDrafter() if DRAFTER == "located+guess" else None
    def start(self, prompt):
        self.context, self.done = prompt, 0
        if self.ngram: self.ngram.start(prompt)
    def propose(self, max_chars):
        rest = self.answer[self.done:self.done + max_chars]
        if self.perfect: return rest
        lo, hi = 0, len(rest)
        while lo < hi:  # longest head of rest found in the context (monotone)
            mid = (lo + hi + 1) // 2
            if rest[:mid] in self.context: lo = mid
            else: hi = mid - 1
        self.last_match = 256 if lo >= 32 else 16
        if self.ngram is not None:
            draft = self.ngram.propose(max_chars)
            if not lo:  # nothing copyable: what the n-gram drafter would guess
                self.last_match = self.ngram.last_match
                return draft
        if self.copy_on and lo:  # the source's text past the run, as a copy drafter would go on
            at = self.context.rfind(rest[:lo])
            return self.context[at:at + max_chars]
        return rest[:lo]
    def update(self, accepted, draft, accepted_draft_chars):
        self.context += accepted; self.done += len(accepted)
        if self.ngram: self.ngram.update(accepted, draft, accepted_draft_chars)
    def outcome(self, draft, accepted_chars): pass
    def finish(self): pass

class TrustedNGram:
    """Diagnosis only (env DRAFTER=trusted): the n-gram drafter's drafts,
    with every non-empty one reported as a long match (how much the policy's
    distrust of short and re-aligned matches costs)."""
    name = "ngram"
    def __init__(self):
        from blackbox_spec.drafters.ngram import NGramDrafter
        self.d = NGramDrafter(); self.last_match = 0
    def start(self, prompt): self.d.start(prompt)
    def propose(self, max_chars):
        draft = self.d.propose(max_chars); self.last_match = 256 if draft else 0; return draft
    def update(self, *a): self.d.update(*a)
    def outcome(self, *a): pass
    def finish(self): pass

DRAFTER = os.environ.get("DRAFTER", "ngram")
MAX_COST = None if os.environ.get("MAX_COST", "inf") == "inf" else float(os.environ["MAX_COST"])

async def main(preset, name, strategy="auto", verbose=True):
    sim = SimulatedTarget.preset(preset, replay=True, model_name="sim", **({"chat_prefill": os.environ["CHAT_PREFILL"]} if os.environ.get("CHAT_PREFILL") else {}))
    p = next(p for p in REAL_PROMPTS if p.name == name)
    chat = not sim.completions
    plain = SpecClient(f"http://sim-{preset}/v1", None, "sim", drafter=None, transport=sim.transport())
    t = time.perf_counter()
    r0 = await (plain.chat(p.messages, max_tokens=p.max_tokens) if chat else plain.generate(p.text, max_tokens=p.max_tokens))
    plain_s = time.perf_counter() - t
    orc = sim_oracle(sim)(p, r0.text)
    spec = SpecClient(f"http://sim-{preset}/v1", None, "sim", drafter={"ngram": "ngram", "trusted": TrustedNGram()}.get(DRAFTER) or OracleDrafter(r0.text, DRAFTER == "perfect"), strategy=strategy, fanout_width=FANOUT, transport=sim.transport(), profile=os.environ.get("PROFILE", "off"), max_cost=MAX_COST)
    n0 = len(sim.requests)
    await (spec.probe_chat() if chat else spec.probe())
    n1 = len(sim.requests)
    t = time.perf_counter()
    r = await (spec.chat(p.messages, max_tokens=p.max_tokens) if chat else spec.generate(p.text, max_tokens=p.max_tokens))
    s = time.perf_counter() - t
    assert r.text == r0.text, "DIFF"
    reqs = sim.requests[n1:]
    sent = sum(len(q.get("_prompt_ids") or ()) for q in reqs)
    print(f"{name} {preset} {strategy}: plain {plain_s:.2f}s spec {s:.2f}s speedup {plain_s/s:.2f}x oracle {orc and orc['speedup']} "
          f"share {(plain_s/s)/orc['speedup']*100 if orc else 0:.0f}% reqs {len(reqs)} echo {sum(1 for q in reqs if q.get('_prefilled'))} "
          f"tokens {r.stats.output_tokens} sent/plain {sent/ max(1,len(sim.requests[n0-1].get('_prompt_ids') or [1])):.1f}")
    print(f"   {r.stats.bill_summary()}")
    if verbose:
        print(" ", r.stats.to_dict().get("notes"))
        for d in DEC: print("  ", d)
        for q in reqs:
            print(f"   t {(q.get('_t',0)-t)*1000:7.1f}ms ret {(q.get('_done',0)-q.get('_t',0))*1000:6.1f} pid {len(q.get('_prompt_ids') or ()):5d} max {q.get('max_tokens')} gen {q.get('_generated')} echo {bool(q.get('_prefilled'))}")
    await spec.aclose(); await plain.aclose()
    TOT[0] += plain_s; TOT[1] += s
    print(f'   running total {TOT[0]/TOT[1]:.2f}x')
    return plain_s / s, orc and orc['speedup']

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip() if len(sys.argv) > 1 else "usage: trace_sim.py PRESET PROMPTS[,...] [STRATEGY] [-q]  (--help for more)")
        sys.exit(0 if len(sys.argv) > 1 else 2)
    preset, names = sys.argv[1], sys.argv[2].split(",")
    known = {p.name for p in REAL_PROMPTS} | {"edits", "all"}
    if unknown := [n for n in names if n not in known]:
        sys.exit(f"trace_sim.py: unknown prompt {unknown[0]!r}; one of: edits, all, " + ", ".join(sorted(known - {"edits", "all"})))
    strategy = next((a for a in sys.argv[3:] if not a.startswith("-")), "auto")
    if names == ["edits"]: names = [p.name for p in REAL_PROMPTS if p.workload == "real-edit"]
    if names == ["all"]: names = [p.name for p in REAL_PROMPTS]
    out = []
    for n in names:
        DEC.clear()
        out.append(asyncio.run(main(preset, n, strategy, verbose="-q" not in sys.argv)))
    if len(out) > 1:
        import statistics
        print("geo-ish: median speedup", statistics.median(o[0] for o in out), "least share", min(o[0]/o[1] for o in out))
