"""Measures the suffix drafter's proposal time and insertion cost against the size of its index.

Microbenchmark of the suffix drafter: proposal time and insertion cost
against the size of what it has indexed (1k, 10k and 100k pieces; a piece is
about one token).

The history is real code (the Python standard library's own sources, read
in a fixed order), so matches and their frequencies are those of real text.
After indexing, the drafter follows a copy of an earlier stretch of the
history piece by piece and proposes after each one, as the orchestrator does
after each token of the target.  Medians and 90th percentiles are reported.

    python benchmarks/suffix_microbench.py --out benchmarks/results/suffix-microbench.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sysconfig
import time
from pathlib import Path

from blackbox_spec.drafters.suffix import SessionIndex, SuffixDrafter, split_pieces


def corpus(pieces_needed: int) -> list[str]:
    out: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        out.extend(split_pieces(path.read_text(errors="replace")))
        if len(out) >= pieces_needed:
            break
    return out[:pieces_needed]


def measure(size: int, *, in_session: bool, reuse: bool, proposals: int, rng: random.Random) -> dict:
    pieces = corpus(size + 2000)
    history, later = pieces[:size], pieces[size:]
    session = SessionIndex(max_pieces=max(size * 2, 1000))
    drafter = SuffixDrafter(session=session, reuse=reuse)
    started = time.perf_counter()
    if in_session:
        session.add("".join(history))  # the whole history as one earlier output
        drafter.start("".join(later[:50]))
    else:
        drafter.start("".join(history))
    insert_us = (time.perf_counter() - started) / size * 1e6
    # Follow a copy of an earlier stretch, with a fresh line now and then.
    at = rng.randrange(0, max(1, size - proposals - 1))
    copy = history[at : at + proposals]
    times, lengths = [], []
    for k, piece in enumerate(copy):
        drafter.update(piece if k % 97 else piece + "\n# changed\n", "", 0)
        t0 = time.perf_counter()
        draft = drafter.propose(4096)
        times.append((time.perf_counter() - t0) * 1e6)
        lengths.append(len(draft))
    times.sort()
    return {
        "history_pieces": size,
        "where": "session index" if in_session else "current text",
        "proposals_are": "reused while the text follows them" if reuse else "all fresh searches",
        "insert_us_per_piece": round(insert_us, 2),
        "propose_us_median": round(statistics.median(times), 1),
        "propose_us_p90": round(times[int(0.9 * len(times))], 1),
        "draft_chars_median": statistics.median(lengths),
        "proposals": len(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1_000, 10_000, 100_000])
    parser.add_argument("--proposals", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(0)
    rows = []
    for size in args.sizes:
        for in_session in (False, True):
            for reuse in (False, True):
                row = measure(size, in_session=in_session, reuse=reuse, proposals=args.proposals, rng=rng)
                rows.append(row)
                print(
                    f"{row['history_pieces']:>7} pieces in the {row['where']:<13} ({'reused' if reuse else 'fresh '}): insert {row['insert_us_per_piece']:6.2f} µs/piece, "
                    f"propose median {row['propose_us_median']:6.1f} µs (p90 {row['propose_us_p90']:6.1f}), draft {row['draft_chars_median']:.0f} chars"
                )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"python": platform.python_version(), "machine": platform.processor() or platform.machine(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
