"""Measuring what a round costs on this machine (for :mod:`.costs`).

After the prompt is in the caches, the target runs scratch steps of 1..w
tokens (forward, then the sampling rule over their rows) and the draft one
step of one token; the caches are left as they were (``scratch_forward``).
Random numbers come from a throwaway generator, so measuring never moves a
seeded run's stream.  Results are kept on disk per (models, engine, device,
dtype, threads, rows), so a process measures once a day, not once a call.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..profile import write_json_atomically
from .costs import Costs
from .sampling import SamplingParams, rejection_sample, sample, sampling_probs

REPEATS = 2  # passes over the widths; each width's fastest is kept
MAX_AGE_S = 24 * 3600  # stored costs older than this are measured again


def chain_widths(max_gamma: int) -> list[int]:
    """Target widths to time for γ in 0..max_gamma: every one (a chain's
    verify widths are few, and compiled engines run one graph per width)."""
    return list(range(1, max_gamma + 2))


def tree_widths(max_nodes: int) -> list[int]:
    """Widths to time for trees of up to ``max_nodes`` nodes: 1, 2, 3, then
    roughly doubling, ending at ``max_nodes + 1`` (linear in between).

    >>> tree_widths(16)
    [1, 2, 3, 5, 9, 17]
    """
    widths = [1, 2, 3]
    while widths[-1] < max_nodes + 1:
        widths.append(min(2 * widths[-1] - 1, max_nodes + 1))
    return widths


def measure(target: Any, draft: Any | None, widths: Sequence[int], sampling: SamplingParams) -> Costs:
    """Seconds per target step at each width and per draft step, from the
    models' current state (the prompt read), which is left unchanged."""
    generator = torch.Generator(device=target.device)
    generator.manual_seed(0)
    # Warm-up: the first steps pay for allocation (the first width timed read
    # 1.5x its cost); compiled steps compile, then capture, on their first calls.
    compiled = getattr(target, "compiled", False)
    for w in widths if compiled else (1, max(widths)):
        for _ in range(3 if compiled else 1):
            _verify_step(target, w, sampling, generator)
    if draft is not None and getattr(draft, "compiled", False):
        for _ in range(3):
            draft.scratch_forward(1)
    # Passes over all widths rather than repeats of one, so that a slow
    # moment of the machine spoils one pass's figure, not one width's.
    times: dict[int, list[float]] = {w: [] for w in widths}
    draft_times: list[float] = []
    for _ in range(REPEATS):
        for w in widths:
            times[w].append(_timed(lambda w=w: _verify_step(target, w, sampling, generator), target.device))
        if draft is not None:
            draft_times.append(_timed(lambda: sample(sampling_probs(draft.scratch_forward(1)[:, -1], sampling), generator), draft.device))
    return Costs({w: min(t) for w, t in times.items()}, min(draft_times, default=0.0), measured_at=time.time())


def stored_or_measured(key_parts: Sequence[object], root: Path | None, target: Any, draft: Any | None,
                       widths: Sequence[int], sampling: SamplingParams, progress: Callable[[str], None] | None = None) -> tuple[Costs, str]:
    """Costs kept under ``root`` for these parts if every width is there, else
    measured now (and kept, ``progress`` told first); with how they were
    had, for the summary."""
    key = costs_key(*key_parts)
    stored = load_costs(key, root) if root is not None else None
    if stored is not None and set(widths) <= set(stored.verify_s) and (draft is None or stored.draft_s > 0):
        return stored, "stored"
    if progress is not None:
        progress(f"--gamma auto: timing this machine's steps of 1..{max(widths)} tokens (once a day; kept in {root})")
    clock = time.perf_counter()
    costs = measure(target, draft, widths, sampling)
    if root is not None:
        save_costs(key, costs, root)
    return costs, f"measured in {time.perf_counter() - clock:.1f}s"


def model_name(lm: Any) -> str:
    """What identifies a wrapped model for stored costs: its folder (or
    config) and dtype."""
    if lm is None:
        return "none"
    model = lm.model
    return f"{getattr(model.config, '_name_or_path', '') or model.config.to_json_string()}:{next(model.parameters()).dtype}"


def costs_key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


def load_costs(key: str, root: Path) -> Costs | None:
    """Costs measured earlier on this machine, or None (none, unreadable, too old)."""
    try:
        costs = Costs.from_dict(json.loads((root / f"local-{key}.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return costs if time.time() - costs.measured_at < MAX_AGE_S else None


def save_costs(key: str, costs: Costs, root: Path) -> None:
    """Keep the costs; a read-only cache only costs the next process a measurement."""
    write_json_atomically(root / f"local-{key}.json", costs.to_dict())


def _verify_step(target: Any, width: int, sampling: SamplingParams, generator: torch.Generator) -> None:
    """What a round's target side does at ``width``: the forward, p over
    its rows, and the rule against drafts (here the scratch tokens, with p
    standing in for q)."""
    p = sampling_probs(target.scratch_forward(width), sampling)
    drafts = torch.zeros((p.shape[0], width - 1), dtype=torch.int64, device=p.device)
    rejection_sample(drafts, p[:, : width - 1], p, generator)


def _timed(step: Any, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    clock = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - clock
