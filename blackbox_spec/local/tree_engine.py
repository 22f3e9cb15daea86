"""Tree speculation in local target mode (Medusa, EAGLE): each round, a
:class:`TreeProposer` hangs a tree of candidates below the pending token,
the target runs the whole tree in one forward, and
:func:`~.sampling.multi_draft_rejection` walks it from the root: lossless
at any temperature, plain greedy at temperature 0.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

import torch

from .._stats import GenerationStats
from .costs import DepthChooser
from .sampling import NO_TOKEN, SamplingParams, multi_draft_rejection, sample, sampling_probs
from .eager import CachedLM
from .stats import LocalStats
from .static import StaticLM
from .tree import ROOT, DraftTree, cut_tree, nodes_by_depth


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


def walk_tree(tree: DraftTree, q: torch.Tensor, p_after: Callable[[int], torch.Tensor],
              generator: torch.Generator) -> tuple[list[int], int]:
    """The accepted nodes (root's child first) and the token after them.

    At each node, multi-draft rejection over its children, against
    ``p_after(node)`` (the target's [1, V] distribution after ``node``;
    ``ROOT`` for the pending token); a rejection ends the walk with a
    residual token, a leaf with a bonus token from p.  p is asked for only
    where the walk goes: on a CPU the LM head over all N+1 rows costs ~3x
    one row's (0.5B: ~100 ms against 33 ms).
    """
    accepted: list[int] = []
    node = ROOT
    while True:
        kids = tree.children(node)
        row = p_after(node)
        if not kids:
            return accepted, int(sample(row, generator))
        index = torch.tensor(kids)  # a CPU index serves the tree's tensors wherever they are
        chosen, token = multi_draft_rejection(row, tree.tokens[index].unsqueeze(0).to(row.device), q[index.to(q.device)].unsqueeze(0).to(row.device), generator)
        if int(chosen) < 0:
            return accepted, int(token)
        node = kids[int(chosen)]
        accepted.append(node)


def speculate_tree(target: CachedLM | StaticLM, proposer: TreeProposer, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingParams,
                   generator: torch.Generator, ends: set[int], stats: GenerationStats, local: LocalStats,
                   on_tokens: Callable[[list[int]], None] | None = None, depth_chooser: Callable[[int], DepthChooser] | None = None) -> list[int]:
    """Up to ``max_tokens`` tokens after ``prompt_ids``, ending after the
    first of ``ends``; one target forward per round.  ``depth_chooser``
    (``--gamma auto``), given the first tree's size, makes the
    :class:`~.costs.DepthChooser` that cuts each later tree (0: a plain step)."""
    features, following = _read_prompt(target, proposer, prompt_ids, sampling, generator, stats, local)
    root, tokens = following[-1], following[-1:]
    chooser: DepthChooser | None = None
    proposal_timed = False  # the first proposal reads the whole prompt
    if on_tokens is not None:
        on_tokens([root])
    while tokens[-1] not in ends and len(tokens) < max_tokens:
        clock = time.perf_counter()
        # 1. Draft: a tree of candidates below the pending token, cut where
        #    the chooser says (at depth 0 no proposal: a plain step, and the
        #    proposer reads the features it missed next time).
        depth = chooser.next_depth(getattr(proposer, "depth", 1 << 30)) if chooser is not None else None
        tree, q, whole = _draft(proposer, depth, features, following, sampling, generator)
        drafted_at = time.perf_counter()
        # 2. One target forward over the root and every node (row 0 of
        #    hidden: after the root; row i + 1: after node i).
        hidden = target.forward_tree(root, tree)
        # 3. Walk from the root (see walk_tree).
        accepted, root = walk_tree(tree, q, lambda node: sampling_probs(target.logits(hidden[node + 1 : node + 2]), sampling), generator)
        # 4. Keep the accepted path in the cache; the new token is the next root.
        target.keep_path(accepted)
        features, following, new = _follow_path(hidden, tree, accepted, root, features, following, plain=depth == 0)
        emitted = _until_end(new, ends, max_tokens - len(tokens))
        tokens.extend(emitted)
        # 5. Account: tokens per target forward, acceptance per depth; the
        #    first tree (whole) sizes the costs the chooser measures.
        verified_at = time.perf_counter()
        if chooser is None and depth_chooser is not None and tokens[-1] not in ends and len(tokens) < max_tokens:
            chooser = depth_chooser(len(tree))
        if chooser is not None:
            _observe(chooser, tree, whole, accepted, draft_s=drafted_at - clock if whole is not None and proposal_timed else None)
        proposal_timed = depth != 0
        _account(stats, local, tree, accepted, emitted, rejected=bool(tree.children(accepted[-1] if accepted else ROOT)), plain=whole is None,
                 seconds=(drafted_at - clock, verified_at - drafted_at, verified_at - clock))
        if on_tokens is not None:
            on_tokens(emitted)
    if chooser is not None:
        local.auto.update(chooser.summary())
    return tokens if tokens else [NO_TOKEN]


def _no_tree() -> DraftTree:
    """The tree of a plain step: no candidates, the root alone."""
    return DraftTree(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))


def _read_prompt(target: CachedLM | StaticLM, proposer: TreeProposer, prompt_ids: Sequence[int], sampling: SamplingParams,
                 generator: torch.Generator, stats: GenerationStats, local: LocalStats) -> tuple[torch.Tensor, list[int]]:
    """The prompt's round, plain: the target reads the prompt and samples
    the first token (the first root); the prompt's features and the token
    after each (``following``: the last is the root), for the proposer."""
    clock = time.perf_counter()
    features = target.read_prompt(prompt_ids)
    root = int(sample(sampling_probs(target.logits(features[-1:]), sampling), generator))
    following = list(prompt_ids[1:]) + [root]
    proposer.reset()
    empty = _no_tree()
    prefill_s = time.perf_counter() - clock
    _account(stats, local, empty, [], [root], rejected=False, plain=True, seconds=(0.0, prefill_s, prefill_s))
    return features, following


def _draft(proposer: TreeProposer, depth: int | None, features: torch.Tensor, following: list[int], sampling: SamplingParams,
           generator: torch.Generator) -> tuple[DraftTree, torch.Tensor | None, DraftTree | None]:
    """Step 1: the tree to verify, each node's q, and the tree as proposed
    before ``depth`` cut it (None: no proposal, a plain step)."""
    if depth == 0:
        return _no_tree(), None, None
    tree, q = proposer.propose(features, torch.tensor(following), sampling, generator)
    whole = tree
    if depth is not None:
        tree, kept = cut_tree(tree, depth)
        q = q[kept.to(q.device)]
    return tree, q, whole


def _follow_path(hidden: torch.Tensor, tree: DraftTree, accepted: list[int], next_token: int, features: torch.Tensor,
                 following: list[int], *, plain: bool) -> tuple[torch.Tensor, list[int], list[int]]:
    """Step 4: the features and following tokens the proposer reads next
    (after a plain step, added to those it missed), and the round's new
    tokens: the accepted path's, then ``next_token``."""
    kept_features = hidden[[0] + [n + 1 for n in accepted]]
    new = [int(tree.tokens[n]) for n in accepted] + [next_token]
    if plain:
        return torch.cat([features, kept_features]), following + new, new
    return kept_features, new, new


def _observe(chooser: DepthChooser, tree: DraftTree, whole: DraftTree | None, accepted: list[int], *, draft_s: float | None) -> None:
    """Step 5, for ``--gamma auto``: the round's depth and acceptance; the
    acceptance per depth only from an uncut tree; the proposal's time only
    from a step's (``draft_s`` None: it read the prompt or a plain stretch's
    features)."""
    uncut = whole is not None and len(whole) == len(tree)
    chooser.observe(len(nodes_by_depth(tree)), len(accepted), nodes_by_depth(tree) if uncut else None, draft_s=draft_s)


def _until_end(new: list[int], ends: set[int], room: int) -> list[int]:
    """``new`` cut after its first end token and to ``room`` tokens."""
    for i, token in enumerate(new[:room]):
        if token in ends:
            return new[: i + 1]
    return new[:room]


def _account(stats: GenerationStats, local: "LocalStats", tree: DraftTree, accepted: list[int], emitted: list[int], *,
             rejected: bool, plain: bool, seconds: tuple[float, float, float]) -> None:
    """Tokens per target forward, acceptance per depth, and the round's trace."""
    draft_s, verify_s, round_s = seconds
    local.draft_forwards += 0 if plain else 1
    local.target_forwards += 1
    local.round_tokens.append(len(emitted))
    local.examined_positions += 0 if plain else len(accepted) + 1
    local.rejections += int(rejected)
    for depth in range(len(accepted)):
        if depth >= len(local.accepted_per_depth):
            local.accepted_per_depth.append(0)
        local.accepted_per_depth[depth] += 1
    stats.observe_round("local", calls=1, cancelled=0, seconds=verify_s)
    stats.draft_s += draft_s
    stats.drafted_tokens += len(tree)
    stats.accepted_tokens += min(len(accepted), len(emitted))  # a round cut by max_tokens or an end emits fewer
    stats.output_tokens += len(emitted)
    stats.trace.append(["tree", len(tree), len(accepted), len(emitted), round(round_s, 5)])
