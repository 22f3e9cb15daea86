import asyncio, json, sys, time
from blackbox_spec import SpecClient
from blackbox_spec.bench.workloads import PROMPTS
name, label = sys.argv[1], sys.argv[2]
p = next(x for x in PROMPTS if x.name == name)
async def main():
    async with SpecClient("http://127.0.0.1:8123/v1", model="qwen2.5-coder-1.5b", drafter=None if label == "plain" else "ngram") as c:
        t = time.perf_counter()
        r = await c.generate(p.text, max_tokens=p.max_tokens, prediction=None if label == "plain" else p.prediction)
        s = time.perf_counter() - t
    print(json.dumps({"prompt": name, "label": label, "s": round(s, 2), "text": r.text, "jumps": r.stats.jumps, "trace": r.stats.trace}))
asyncio.run(main())
