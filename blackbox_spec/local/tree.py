"""Draft trees (Medusa, EAGLE): candidates as a tree, checked by one target
forward.

A tree hangs below the *root*: the last token the target has not yet run
(the pending token).  Its nodes are listed parents first; ``parents[i]`` is
the index of node i's parent, or ``ROOT`` (-1) for the root's children.
The target runs the root and every node at once: node i sees the context,
the root and its own ancestors (:func:`ancestor_mask`), at the position its
depth gives it (:func:`tree_positions`).  Row 0 of that forward's output is
the target after the root; row i + 1 the target after node i.

Pure functions of small integer tensors, tested against loops of
single-path forwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROOT = -1


@dataclass(frozen=True)
class DraftTree:
    """Candidate tokens below the pending token; nodes parents first."""

    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, ROOT or an earlier index

    def __post_init__(self) -> None:
        if self.tokens.shape != self.parents.shape or self.tokens.dim() != 1:
            raise ValueError("tokens and parents must be 1-D and of one length")
        order = torch.arange(len(self.parents))
        if bool(((self.parents < ROOT) | (self.parents >= order)).any()):
            raise ValueError("each node's parent must be ROOT or an earlier node")

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Indices of ``node``'s children (``ROOT`` for the root's), in order."""
        return (self.parents == node).nonzero().flatten().tolist()

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node``."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = int(self.parents[node])
        return nodes[::-1]


def depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of each node: 1 for the root's children.

    >>> depths(torch.tensor([-1, -1, 0, 2]))
    tensor([1, 1, 2, 3])
    """
    out = torch.zeros_like(parents)
    for i, parent in enumerate(parents.tolist()):
        out[i] = 1 if parent == ROOT else out[parent] + 1
    return out


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[N+1, N+1] bool: row a may attend to column b within the tree, where
    index 0 is the root and index i + 1 is node i (ancestors and itself).

    >>> ancestor_mask(torch.tensor([-1, -1, 0])).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 1, 0],
            [1, 1, 0, 1]], dtype=torch.int32)
    """
    n = len(parents)
    mask = torch.zeros((n + 1, n + 1), dtype=torch.bool)
    mask[0, 0] = True
    for i, parent in enumerate(parents.tolist()):
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return mask


def tree_positions(parents: torch.Tensor, start: int) -> torch.Tensor:
    """Position ids of the root (at ``start``) and then of each node."""
    return start + torch.cat([torch.zeros(1, dtype=torch.int64), depths(parents)])


def greedy_walk(tree: DraftTree, target_next: torch.Tensor) -> tuple[list[int], int]:
    """The longest path the target's argmax follows, and the token after it.

    ``target_next[0]`` is the target's token after the root and
    ``target_next[i + 1]`` after node i.  Returns the accepted nodes (root's
    child first) and the bonus token: the text equals plain greedy decoding.

    >>> tree = DraftTree(torch.tensor([5, 7, 8, 9]), torch.tensor([-1, -1, 1, 1]))
    >>> greedy_walk(tree, torch.tensor([7, 0, 9, 0, 4]))
    ([1, 3], 4)
    """
    accepted: list[int] = []
    node = ROOT
    while True:
        wanted = int(target_next[node + 1])
        following = [c for c in tree.children(node) if int(tree.tokens[c]) == wanted]
        if not following:
            return accepted, wanted
        node = following[0]
        accepted.append(node)


def cut_tree(tree: DraftTree, depth: int) -> tuple[DraftTree, torch.Tensor]:
    """The tree without its nodes deeper than ``depth``, and the kept nodes'
    indices in the old tree (to cut q alike); parents still come first.

    >>> tree = DraftTree(torch.tensor([5, 7, 8, 9, 4]), torch.tensor([-1, -1, 1, 1, 2]))
    >>> cut, kept = cut_tree(tree, 2)
    >>> cut.tokens.tolist(), cut.parents.tolist(), kept.tolist()
    ([5, 7, 8, 9], [-1, -1, 1, 1], [0, 1, 2, 3])
    >>> cut_tree(tree, 0)[0].tokens.tolist()
    []
    """
    kept = (depths(tree.parents) <= depth).nonzero().flatten()
    renumbered = torch.full((len(tree) + 1,), ROOT, dtype=torch.int64)
    renumbered[kept] = torch.arange(len(kept))
    parents = tree.parents[kept]
    return DraftTree(tree.tokens[kept], torch.where(parents == ROOT, ROOT, renumbered[parents])), kept


def nodes_by_depth(tree: DraftTree) -> list[int]:
    """How many nodes lie at depth <= d, for d = 1 .. the tree's depth.

    >>> nodes_by_depth(DraftTree(torch.tensor([5, 7, 8, 9, 4]), torch.tensor([-1, -1, 1, 1, 2])))
    [2, 4, 5]
    """
    d = depths(tree.parents)
    return [int((d <= level).sum()) for level in range(1, int(d.max()) + 1)] if len(tree) else []
