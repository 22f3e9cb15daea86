"""Tree speculation in local target mode (Medusa, EAGLE): each round, a
:class:`TreeProposer` hangs a tree of candidates below the pending token,
the target runs the whole tree in one forward, and
:func:`~.sampling.multi_draft_rejection` walks it from the root: lossless
at any temperature, plain greedy at temperature 0.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import torch

from .._stats import GenerationStats
from .sampling import NO_TOKEN, SamplingParams, multi_draft_rejection, sample, sampling_probs
from .tree import ROOT, DraftTree

if TYPE_CHECKING:
    from .engine import CachedLM, LocalStats


class TreeProposer(Protocol):
    """Where a tree's candidates come from (trained heads on the target's
    hidden states)."""

    def reset(self) -> None:
        """Forget earlier calls: a new text starts."""
        ...

    def propose(self, features: torch.Tensor, following: torch.Tensor, sampling: SamplingParams,
                generator: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
        """A tree below the pending token and, for each node, the q [N, V]
        its token was drawn from (one-hot where it was picked, as top-k
        picks).  ``features`` [L, H]: the target's last hidden states of the
        tokens accepted since the last call (the whole prompt at first);
        ``following`` [L]: the token after each, so the last is the pending
        token (the tree's root)."""
        ...


def speculate_tree(
    target: "CachedLM",
    proposer: TreeProposer,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    sampling: SamplingParams,
    generator: torch.Generator,
    ends: set[int],
    stats: GenerationStats,
    local: "LocalStats",
    on_tokens: Callable[[list[int]], None] | None = None,
) -> list[int]:
    """Up to ``max_tokens`` tokens after ``prompt_ids``, ending after the
    first of ``ends``; one target forward per round."""
    device = target.device
    features = target.read_prompt(prompt_ids)
    root = int(sample(sampling_probs(target.logits(features[-1:]), sampling), generator))
    following = list(prompt_ids[1:]) + [root]
    proposer.reset()
    tokens = [root]
    if on_tokens is not None:
        on_tokens([root])

    while tokens[-1] not in ends and len(tokens) < max_tokens:
        clock = time.perf_counter()
        # 1. Draft: a tree of candidates below the pending token.
        tree, q = proposer.propose(features, torch.tensor(following), sampling, generator)
        drafted_at = time.perf_counter()

        # 2. One target forward over the root and every node (row 0 of
        #    hidden: after the root; row i + 1: after node i).
        hidden = target.forward_tree(root, tree)

        # 3. Walk from the root: at each node, multi-draft rejection over its
        #    children; a rejection ends the round with a residual token, a
        #    leaf with a bonus token from p.
        accepted: list[int] = []
        node = ROOT
        while True:
            kids = tree.children(node)
            # p only where the walk goes: on a CPU the LM head over all N+1
            # rows costs ~3x one row's (0.5B: ~100 ms against 33 ms).
            row = sampling_probs(target.logits(hidden[node + 1 : node + 2]), sampling)
            if not kids:
                next_token = int(sample(row, generator))
                break
            index = torch.tensor(kids, device=device)
            chosen, token = multi_draft_rejection(row, tree.tokens[index].unsqueeze(0).to(device), q[index].unsqueeze(0).to(device), generator)
            if int(chosen) < 0:
                next_token = int(token)
                break
            node = kids[int(chosen)]
            accepted.append(node)

        # 4. Keep the accepted path in the cache; the new token is the next root.
        target.keep_path(accepted)
        features = hidden[[0] + [n + 1 for n in accepted]]
        new = [int(tree.tokens[n]) for n in accepted] + [next_token]
        following = new
        room = max_tokens - len(tokens)
        for i, t in enumerate(new[:room]):
            if t in ends:
                new = new[: i + 1]
                break
        new = new[:room]
        tokens.extend(new)
        root = next_token

        # 5. Account: tokens per target forward, acceptance per depth.
        verified_at = time.perf_counter()
        local.draft_forwards += 1
        local.target_forwards += 1
        local.round_tokens.append(len(new))
        local.examined_positions += len(accepted) + 1
        local.rejections += int(bool(tree.children(node)))
        for depth in range(len(accepted)):
            if depth >= len(local.accepted_per_depth):
                local.accepted_per_depth.append(0)
            local.accepted_per_depth[depth] += 1
        stats.observe_round("local", calls=1, cancelled=0, seconds=verified_at - drafted_at)
        stats.draft_s += drafted_at - clock
        stats.drafted_tokens += len(tree)
        stats.accepted_tokens += len(accepted)
        stats.output_tokens += len(new)
        stats.trace.append(["tree", len(tree), len(accepted), len(new), round(verified_at - clock, 5)])
        if on_tokens is not None:
            on_tokens(new)
    return tokens if tokens else [NO_TOKEN]
