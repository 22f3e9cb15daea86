"""Is llama-server deterministic at temperature 0?  For the prompts where an
exactness run differed, ask the plain call again, and from the point where the
texts part: the same non-streamed request repeated, and a plain call continuing
the common prefix (what any client that sends text back does).

    python bench/llama_determinism.py --base-url http://127.0.0.1:8124/v1 --run bench/results/exactness-llama-server-0.5b/run.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from blackbox_spec.bench.exactness import CASES, Case, bench_cases, plain_answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--run", required=True, help="an exactness_real.py JSON")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run = json.load(open(args.run))
    cases = {c.name: c for c in CASES + bench_cases(128)}
    report = []
    for o in run["outcomes"]:
        if o["identical"]:
            continue
        case = cases[o["name"]]
        again = [(await plain_answer(args.base_url, "x", case))[0] for _ in range(args.repeats)]
        k = len(os.path.commonprefix([o["plain"], o["spec"]]))
        prefix = o["plain"][:k]
        cont = Case(case.name, case.prompt + prefix, case.max_tokens, case.stop)
        from_prefix = (await plain_answer(args.base_url, "x", Case(cont.name, cont.prompt, 24, case.stop)))[0]
        entry = {
            "name": o["name"], "parts_at_char": k,
            "plain_then": o["plain"][k : k + 30], "bspec": o["spec"][k : k + 30],
            "plain_repeated_differ": len(set(again)) > 1 or again[0] != o["plain"],
            "plain_again_equals_bspec": any(a == o["spec"] for a in again),
            "plain_from_the_common_prefix": from_prefix[:30],
            "that_continues_like_bspec": o["spec"][k:].startswith(from_prefix[: max(1, min(len(from_prefix), 12))]),
        }
        report.append(entry)
        print(json.dumps(entry, ensure_ascii=False))
    json.dump(report, open(args.run.replace(".json", "-determinism.json"), "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    asyncio.run(main())
