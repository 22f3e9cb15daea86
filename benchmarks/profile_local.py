"""Measures where a local speculative round spends its time on a device (torch.profiler, random-init Qwen2.5 shapes).

Where a local speculative round spends its time on a device: random-init
Qwen2.5 shapes (no weights travel), one warm run per gamma, then one under
torch.profiler.  Prints seconds per round split into draft / verify+accept
and the top operators, so engine overhead shows next to the forwards.

    python benchmarks/profile_local.py --pair qwen2.5-0.5b qwen2.5-7b --device cuda --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from local_target import _sync, random_model  # noqa: E402

from blackbox_spec import GenerationStats  # noqa: E402
from blackbox_spec.local import LocalSpeculator, LocalStats, SamplingParams  # noqa: E402
from blackbox_spec.local.sampling import as_generator  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", nargs=2, default=["qwen2.5-0.5b", "qwen2.5-7b"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gammas", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    draft = random_model(args.pair[0], args.device, dtype)
    target = random_model(args.pair[1], args.device, dtype)
    prompt = list(range(1000, 1064))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for gamma in args.gammas:
        engine = LocalSpeculator(target, draft if gamma else None, None, gamma=max(gamma, 1))
        for attempt in ("warm", "timed", "profiled"):
            stats, local = GenerationStats(), LocalStats()
            run = lambda: engine.sample_tokens(prompt, max_tokens=args.max_tokens, sampling=SamplingParams(1.0),  # noqa: E731
                                               generator=as_generator(1, args.device), stats=stats, local=local)
            _sync(args.device)
            start = time.perf_counter()
            if attempt == "profiled":
                activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if args.device == "cuda" else [])
                with torch.profiler.profile(activities=activities) as profile:
                    run()
                table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
                (out / f"profile-gamma{gamma}.txt").write_text(table)
                print(f"gamma={gamma} top operators by self CPU time:\n{table}", flush=True)
            else:
                run()
            _sync(args.device)
            seconds = time.perf_counter() - start
            rounds = local.target_forwards
            row = {"s": seconds, "rounds": rounds, "s_per_round": seconds / rounds, "draft_s_per_round": stats.draft_s / rounds,
                   "verify_s_per_round": stats.verify_s / rounds, "tokens": stats.output_tokens,
                   "draft_forwards": local.draft_forwards}
            report[f"gamma={gamma} {attempt}"] = row
            print(f"gamma={gamma} {attempt}: {json.dumps(row)}", flush=True)
    (out / "profile-local.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
