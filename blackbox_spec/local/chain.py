"""The steps of a chain round in local target mode, each its own function;
:meth:`.engine.LocalSpeculator.sample_tokens` runs them in order.

A round drafts k tokens per row from q, runs one target forward over them
(p), accepts with the rejection rule (:mod:`.sampling`), rolls both caches
back past the rejected tokens, and emits what each row accepted.  Rows of a
batch (n samples of one prompt) go through every round together: a row
that has ended feeds holes, so its positions stop growing while its draws
keep a seed's stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .._stats import GenerationStats
from ..drafters.hf import import_hf
from .costs import GammaChooser
from .sampling import NO_TOKEN, SamplingParams, expected_acceptance, sample, sampling_probs
from .stats import LocalStats

torch, _ = import_hf("local target mode (--local)")


@dataclass
class ChainBatch:
    """What a request's rounds carry from one round to the next, per row.

    ``*_pending``: the tokens a model has not read yet (the prompt at
    first); ``*_valid``: which of them are tokens, not holes.  The draft's
    are None without a draft model."""

    out: torch.Tensor  # [rows, max_tokens + γ + 1]: emitted tokens, NO_TOKEN after
    count: torch.Tensor  # tokens emitted per row
    done: torch.Tensor  # rows that have ended
    target_pending: torch.Tensor
    target_valid: torch.Tensor
    draft_pending: torch.Tensor | None = None
    draft_valid: torch.Tensor | None = None

    @property
    def running(self) -> torch.Tensor:
        """[rows, 1]: rows still emitting (the others feed holes)."""
        return (~self.done).unsqueeze(1)

    def room(self, max_tokens: int) -> int:
        """Tokens the furthest-behind running row may still emit."""
        return max_tokens - int(self.count[~self.done].min())


@dataclass
class ChainRound:
    """One round's outcome, for the accounting."""

    k: int  # draft tokens per row
    tokens: torch.Tensor  # [rows, k + 1]: accepted drafts, then the recovered or bonus token
    n: torch.Tensor  # tokens each row took (accepted + 1)
    p: torch.Tensor  # [rows, k + 1, V]: the target's distributions
    q: torch.Tensor  # [rows, k, V]: the draft's
    live: torch.Tensor  # rows that were running in this round
    emitted: torch.Tensor  # [rows, k + 1]: which of ``tokens`` each row emitted


def start_batch(target: Any, draft: Any | None, prompt_ids: Sequence[int], rows: int, max_tokens: int, gamma: int) -> ChainBatch:
    """``rows`` copies of the prompt, pending in both (reset) caches."""
    device = target.device
    prompt = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=device).expand(rows, -1)
    batch = ChainBatch(
        out=torch.full((rows, max_tokens + gamma + 1), NO_TOKEN, dtype=torch.int64, device=device),
        count=torch.zeros(rows, dtype=torch.int64, device=device),
        done=torch.zeros(rows, dtype=torch.bool, device=device),
        target_pending=prompt, target_valid=torch.ones_like(prompt, dtype=torch.bool),
    )
    # The most positions a row reaches: prompt, output, and a round's drafts past max_tokens.
    capacity = len(prompt_ids) + max_tokens + gamma + 1
    target.reset(rows, capacity)
    if draft is not None:
        draft.reset(rows, capacity)
        batch.draft_pending, batch.draft_valid = prompt, torch.ones_like(prompt, dtype=torch.bool)
    return batch


def draft_tokens(draft: Any, batch: ChainBatch, k: int, sampling: SamplingParams, generator: torch.Generator,
                 vocab_size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Step 1: k tokens per row [rows, k], each sampled from its q (the
    draft's logits fitted to the target's ``vocab_size``), and the k q's."""
    running = batch.running
    drafted, q_rows = [], []
    for _ in range(k):
        logits = draft.forward(batch.draft_pending, batch.draft_valid, last=1)[:, -1]
        q_i = sampling_probs(fit_vocabulary(logits, vocab_size), sampling)
        x_i = sample(q_i, generator)
        drafted.append(x_i)
        q_rows.append(q_i)
        batch.draft_pending, batch.draft_valid = x_i.unsqueeze(1), running.clone()
    if not drafted:
        return torch.zeros((batch.out.shape[0], 0), dtype=torch.int64, device=batch.out.device), q_rows
    return torch.stack(drafted, 1), q_rows


def verify(target: Any, batch: ChainBatch, drafted: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Step 2: one target forward over the pending token(s) and the draft:
    the k + 1 rows of p after each row's last k + 1 tokens."""
    ids = torch.cat([batch.target_pending, drafted], 1)
    valid = torch.cat([batch.target_valid, batch.running.expand_as(drafted)], 1)
    return sampling_probs(target.forward(ids, valid, last=drafted.shape[1] + 1), sampling)


def roll_back(target: Any, draft: Any | None, batch: ChainBatch, drafted: torch.Tensor, tokens: torch.Tensor, n: torch.Tensor) -> None:
    """Step 4: forget the rejected tokens in both caches and queue what each
    model has not seen yet (which of it is a hole is settled in :func:`emit`)."""
    k, running = drafted.shape[1], batch.running
    n_accepted = n - 1
    last = tokens[torch.arange(len(n), device=batch.out.device), n_accepted]
    target.forget_last(torch.where(running[:, 0], k - n_accepted, 0))
    batch.target_pending = last.unsqueeze(1)
    if draft is None:
        return
    if k > 0:  # the draft saw x_1..x_{k-1}; x_k was sampled, never fed
        draft.forget_last(torch.where(running[:, 0], (k - 1 - n_accepted).clamp_min(0), 0))
        unseen, unseen_valid = drafted[:, -1:], (n_accepted == k).unsqueeze(1)
    else:
        unseen, unseen_valid = batch.draft_pending, batch.draft_valid
    batch.draft_pending = torch.cat([unseen, last.unsqueeze(1)], 1)
    batch.draft_valid = torch.cat([unseen_valid & running, running], 1)


def emit(batch: ChainBatch, tokens: torch.Tensor, n: torch.Tensor, ends: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Step 5: rows still running append their first n tokens and stop at an
    end token or at max_tokens; which of ``tokens`` each row emitted."""
    live, device = ~batch.done, batch.out.device
    width = tokens.shape[1]
    slots = batch.count.unsqueeze(1) + torch.arange(width, device=device)
    keep = (torch.arange(width, device=device) < n.unsqueeze(1)) & live.unsqueeze(1)
    out = batch.out
    out.scatter_(1, torch.where(keep, slots, out.shape[1] - 1), torch.where(keep, tokens, out[:, -1:].expand_as(tokens)))
    ended = (torch.isin(tokens, ends) & keep).any(1)
    batch.count = batch.count + torch.where(live, n, 0)
    batch.done = batch.done | ended | (batch.count >= max_tokens)
    # Rows that have just ended feed holes from now on.
    batch.target_valid = batch.running
    if batch.draft_pending is not None:
        batch.draft_valid = batch.draft_valid & batch.target_valid
        if not bool(batch.draft_valid[:, 0].any()):  # no row feeds the first column: drop it
            batch.draft_pending, batch.draft_valid = batch.draft_pending[:, 1:], batch.draft_valid[:, 1:]
    return keep


def account(stats: GenerationStats, local: LocalStats, chooser: GammaChooser | None, result: ChainRound,
            clock: tuple[float, float, float], draft_timed: bool) -> None:
    """Step 6: the round in ``local`` (α's β over the examined positions)
    and ``stats``, given when it started, drafted and verified; and in
    ``chooser`` (``--gamma auto``), the draft's time only where
    ``draft_timed`` (a step's, not a catch-up's)."""
    k, live, n_accepted = result.k, result.live, result.n - 1
    started, drafted_at, verified_at = clock
    examined = (torch.arange(k, device=n_accepted.device) <= n_accepted.unsqueeze(1)) & live.unsqueeze(1)
    beta = float((expected_acceptance(result.p[:, :k], result.q) * examined).sum())
    local.draft_forwards += k
    local.target_forwards += 1
    local.examined_positions += int(examined.sum())
    local.rejections += int(((n_accepted < k) & live).sum())
    local.beta_sum += beta
    local.round_tokens.append(int(torch.where(live, result.n, 0).sum()))
    stats.observe_round("local", calls=1, cancelled=0, seconds=verified_at - drafted_at)
    stats.draft_s += drafted_at - started
    accepted = int(torch.where(live, n_accepted, 0).sum())
    emitted = int(result.emitted.sum())
    stats.drafted_tokens += k * int(live.sum())
    stats.accepted_tokens += accepted
    stats.output_tokens += emitted
    stats.trace.append(["local", k, accepted, emitted, round(verified_at - started, 5)])
    if chooser is not None:
        chooser.observe(beta, int(examined.sum()), gamma=k, draft_s=drafted_at - started if draft_timed else 0.0, verify_s=verified_at - drafted_at)


def fit_vocabulary(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's ids: extra draft ids dropped, missing ones impossible."""
    if logits.shape[-1] >= size:
        return logits[..., :size]
    pad = torch.full((*logits.shape[:-1], size - logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], -1)


def cut_after_end(tokens: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """NO_TOKEN after each row's first end token (later tokens were sampled
    after the text had ended)."""
    is_end = torch.isin(tokens, ends).to(torch.int64)
    after_end = (torch.cumsum(is_end, 1) - is_end) > 0
    return tokens.masked_fill(after_end, NO_TOKEN)


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
