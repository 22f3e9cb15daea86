"""Speed of a fresh `bspec run` process per prompt, as users run it.

For each bench prompt and repeat, one `bspec run FILE --drafter none` (plain
decoding) and one `bspec run FILE` (speculative), in an order that rotates
with the repeat; wall time of the whole process (start-up included); the
texts must be identical.  Medians over repeats, ratios plain / speculative.

    python benchmarks/fresh_process.py --base-url http://127.0.0.1:8123/v1 --workload code-edit free-form --out DIR
    # a simulated server in its own process (python -m blackbox_spec.testing.sim --preset gpu --port 8200):
    python benchmarks/fresh_process.py --base-url http://127.0.0.1:8200/v1 --model sim --workload code-edit

``--profile``: the speculative runs' server profile (auto: the first run
measures the server and later ones start from what it saved; off: every run
measures it again, as a first run ever does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from blackbox_spec.bench.workloads import WORKLOADS, prompts


def run(base_url: str, model: str | None, path: Path, max_tokens: int, extra: list[str]) -> tuple[float, dict]:
    command = [sys.executable, "-m", "blackbox_spec.cli", "run", str(path), "--base-url", base_url, "--max-tokens", str(max_tokens), "--json", *extra]
    if model:
        command += ["--model", model]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bspec run failed ({done.returncode}): {done.stderr.strip()}")
    return wall, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description="fresh `bspec run` processes: speculative against plain")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--prompt", nargs="+", default=None, help="only these prompts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=["auto", "refresh", "off"], default="auto")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--out", type=Path, default=None, help="folder for fresh-process.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for prompt in prompts(args.workload, args.prompt):
            path = Path(tmp) / f"{prompt.name}.txt"
            path.write_text(prompt.text)
            walls: dict[str, list[float]] = {"plain": [], "spec": []}
            texts, stats = {}, []
            for repeat in range(args.repeats):
                order = ["plain", "spec"] if repeat % 2 == 0 else ["spec", "plain"]
                for label in order:
                    extra = ["--drafter", "none"] if label == "plain" else ["--drafter", args.drafter, "--profile", args.profile]
                    wall, data = run(args.base_url, args.model, path, prompt.max_tokens, extra)
                    walls[label].append(wall)
                    texts.setdefault(label, []).append(data["text"])
                    if label == "spec":
                        stats.append(data["stats"])
            identical = all(t == texts["plain"][0] for t in texts["plain"] + texts["spec"])
            plain, spec = statistics.median(walls["plain"]), statistics.median(walls["spec"])
            row = {"prompt": prompt.name, "workload": prompt.workload, "plain_s": round(plain, 3), "spec_s": round(spec, 3),
                   "speedup": round(plain / spec, 3), "identical": identical, "plain_runs": walls["plain"], "spec_runs": walls["spec"],
                   "jumps": [s.get("jumps") for s in stats], "server_profile": [s.get("server_profile") for s in stats],
                   "text": texts["plain"][0]}  # (to compare with other servers' texts)
            rows.append(row)
            print(f"{prompt.name:18} {prompt.workload:10} plain {plain:6.2f}s spec {spec:6.2f}s {plain / spec:5.2f}x"
                  f"{'' if identical else '  TEXTS DIFFER'}", flush=True)
    totals = {}
    for workload in sorted({r["workload"] for r in rows}) + ["all"]:
        chosen = [r for r in rows if workload in ("all", r["workload"])]
        totals[workload] = {"median_speedup": round(statistics.median(r["speedup"] for r in chosen), 3),
                            "worst": min(r["speedup"] for r in chosen), "identical": all(r["identical"] for r in chosen)}
        print(f"  {workload:10} median {totals[workload]['median_speedup']:.2f}x, worst {totals[workload]['worst']:.2f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fresh-process.json").write_text(json.dumps({"base_url": args.base_url, "model": args.model, "repeats": args.repeats,
                                                                  "profile": args.profile, "rows": rows, "totals": totals}, indent=1))


if __name__ == "__main__":
    main()
