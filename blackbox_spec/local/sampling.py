"""Speculative sampling as pure torch functions (Leviathan et al. 2023, Alg. 1).

Names follow the paper: **p** is the target's distribution, **q** the
draft's.  Each draft token x_i was sampled from q_i.  Then, per position:

- **accepted**: x_i is kept when u_i < p_i(x_i) / q_i(x_i), u_i ~ U[0, 1)
  (always when p_i(x_i) >= q_i(x_i));
- **recovered**: at the first rejection, a token is sampled from the residual
  r = max(p_i - q_i, 0) / Σ max(p_i - q_i, 0), and the round ends;
- **bonus**: when all k draft tokens are accepted, one more token is sampled
  from p_{k+1}, the target's row after the last draft token.

Every round therefore emits between 1 and k+1 tokens, distributed exactly as
k+1 draws from p alone (for any q).  Temperature, top-k and top-p are applied
to p and q alike *before* the rule (:func:`sampling_probs`); the output then
follows the target's warped distribution, which is what plain sampling with
the same settings draws from.  Temperature 0 makes p and q one-hot: the rule
reduces to greedy prefix matching, and the recovered token is p's argmax.

All functions are batched over a leading row dimension, run on any device,
and take an explicit ``torch.Generator`` so that a seed reproduces a run.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any

import torch

NO_TOKEN = -1  # fills the positions after a row's last emitted token


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution; the same for p and q.

    ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` switch those
    filters off.  Ties at the k-th logit are all kept, and top-p keeps the
    smallest set of most likely tokens whose mass reaches ``top_p`` (so the
    most likely token always stays).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] → probabilities [..., V] after temperature, top-k, top-p.

    >>> sampling_probs(torch.tensor([1.0, 3.0, 2.0]), SamplingParams(temperature=0))
    tensor([0., 1., 0.])
    >>> sampling_probs(torch.log(torch.tensor([0.5, 0.3, 0.2])), SamplingParams(top_p=0.7)).round(decimals=3)
    tensor([0.6250, 0.3750, 0.0000])
    """
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # half-precision softmax loses the tail
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # Shifted first, so a tiny temperature sends the others to -inf instead
    # of the largest to inf (inf - inf is NaN): the limit is greedy, ties shared.
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        # A token is dropped once the more likely ones already reach top_p.
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` [B, V] (rows need not sum to 1) → [B].

    An exponential race: with E_x ~ Exp(1) independent, argmax_x p(x) / E_x
    is x with probability p(x) / Σp.  Unlike ``torch.multinomial`` it never
    waits for the GPU (no host-side checks), so a round stays on the device.

    >>> sample(torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]]), None)
    tensor([2, 0])
    """
    race = torch.empty_like(probs, dtype=torch.float64 if probs.dtype == torch.float64 else torch.float32)
    race.exponential_(generator=generator)
    # exponential_ may return 0 in float32; a tiny floor keeps p = 0 at 0.
    return (probs / race.clamp_min_(torch.finfo(race.dtype).tiny)).argmax(-1)


def rejection_sample(
    draft_tokens: torch.Tensor,  # [B, k] int64, x_i ~ q_i
    q: torch.Tensor,  # [B, k, V] the draft's probabilities for each x_i
    p: torch.Tensor,  # [B, k+1, V] the target's, one more row for the bonus
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round of the rule: the emitted tokens [B, k+1] and their count [B].

    Row b emits ``draft_tokens[b, :n-1]`` (accepted) and one recovered or
    bonus token, where n = count[b]; the rest of the row is ``NO_TOKEN``.
    The random numbers drawn do not depend on the outcome (k uniforms and
    one race of exponentials per row), so a seeded generator replays a run exactly.

    >>> p = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    >>> q = torch.tensor([[[0.0, 1.0]]])   # the draft is sure of token 1 and right
    >>> rejection_sample(torch.tensor([[1]]), q, p)
    (tensor([[1, 0]]), tensor([2]))
    >>> rejection_sample(torch.tensor([[0]]), torch.tensor([[[1.0, 0.0]]]), p)  # wrong: recovered 1
    (tensor([[ 1, -1]]), tensor([1]))
    """
    rows, k = draft_tokens.shape
    index = draft_tokens.unsqueeze(-1)
    p_x = p[:, :k].gather(-1, index).squeeze(-1)  # [B, k]
    q_x = q.gather(-1, index).squeeze(-1)  # [B, k]
    u = torch.rand((rows, k), generator=generator, device=p.device, dtype=p.dtype)
    accepted = u * q_x < p_x  # u < p/q without dividing by a q of 0
    n_accepted = torch.cumprod(accepted.to(torch.int64), dim=-1).sum(-1)  # [B]

    # Row n_accepted of p is where the round ends: a rejection (recovered
    # from the residual) or, when n_accepted == k, the bonus row (q there is 0).
    end = n_accepted.view(rows, 1, 1).expand(rows, 1, p.shape[-1])
    p_end = p.gather(1, end).squeeze(1)
    q_padded = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)
    q_end = q_padded.gather(1, end).squeeze(1)
    residual = (p_end - q_end).clamp_min(0)
    # p == q leaves no residual, but then the rejection had probability 0;
    # only rounding reaches here, and p is the right fallback.
    empty = residual.sum(-1, keepdim=True) <= 0
    last = sample(torch.where(empty, p_end, residual), generator)

    positions = torch.arange(k + 1, device=p.device)
    tokens = torch.cat([draft_tokens, torch.full((rows, 1), NO_TOKEN, dtype=draft_tokens.dtype, device=p.device)], dim=1)
    tokens = torch.where(positions < n_accepted.unsqueeze(-1), tokens, NO_TOKEN)
    tokens.scatter_(1, n_accepted.unsqueeze(-1), last.unsqueeze(-1))
    return tokens, n_accepted + 1


def multi_draft_rejection(
    p: torch.Tensor,  # [B, V] the target's distribution after a tree node
    child_tokens: torch.Tensor,  # [B, m] the node's children x_j (NO_TOKEN: no child there)
    child_q: torch.Tensor,  # [B, m, V] the q_j each x_j was drawn from
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over a node's children (SpecInfer;
    EAGLE's tree): the chosen child [B] (-1: none) and the emitted token [B].

    Children are tried in order, each against what is left of p: x_j is
    accepted when u_j < r(x_j) / q_j(x_j), with r = p at first; after a
    rejection r becomes the residual (r - q_j)+ / Σ, as in
    :func:`rejection_sample`.  When no child is accepted, the token is drawn
    from the last r.  The token is distributed as p whenever each x_j was
    drawn from its q_j (independently): siblings sampled from one head, with
    repeats, or picked deterministically, as top-k does, with q_j one-hot at
    x_j (then x_j is accepted with probability r(x_j), and r loses x_j).
    At temperature 0 p is one-hot: a child is chosen only if it is p's argmax.

    >>> p = torch.tensor([[0.0, 1.0, 0.0]])
    >>> one_hot = torch.eye(3)[[2, 1]].unsqueeze(0)   # two top-k picks: token 2, then 1
    >>> multi_draft_rejection(p, torch.tensor([[2, 1]]), one_hot)
    (tensor([1]), tensor([1]))
    """
    rows, m = child_tokens.shape
    r = p.clone()
    chosen = torch.full((rows,), -1, dtype=torch.int64, device=p.device)
    token = torch.full((rows,), NO_TOKEN, dtype=torch.int64, device=p.device)
    u = torch.rand((rows, m), generator=generator, device=p.device, dtype=p.dtype)
    for j in range(m):
        x = child_tokens[:, j]
        present = (x != NO_TOKEN) & (chosen < 0)
        index = x.clamp_min(0).unsqueeze(-1)
        r_x = r.gather(-1, index).squeeze(-1)
        q_x = child_q[:, j].gather(-1, index).squeeze(-1)
        accepted = present & (u[:, j] * q_x < r_x)
        chosen = torch.where(accepted, j, chosen)
        token = torch.where(accepted, x, token)
        rejected = (present & ~accepted).unsqueeze(-1)
        residual = (r - child_q[:, j]).clamp_min(0)
        # A zero residual had rejection probability 0: only rounding gets here.
        mass = residual.sum(-1, keepdim=True)
        r = torch.where(rejected & (mass > 0), residual / mass.clamp_min(1e-30), r)
    last = sample(r, generator)
    return chosen, torch.where(chosen < 0, last, token)


def expected_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) per row: the chance that a draft token from q is
    accepted (the paper's α is its mean).  p, q: [..., V] → [...]."""
    return torch.minimum(p, q).sum(-1)


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """The paper's expected walltime improvement (1 − α^(γ+1)) / ((1 − α)(γc + 1)),
    which assumes a target step costs the same for γ+1 tokens as for one.

    >>> round(leviathan_speedup(0.8, 4, 0.1), 3)
    2.401
    """
    tokens_per_round = gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens_per_round / (gamma * c + 1)


def as_generator(seed: int | None, device: Any = "cpu") -> torch.Generator:
    """A generator on ``device``: seeded when ``seed`` is given, else from entropy."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
