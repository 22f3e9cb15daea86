"""Medusa heads (arXiv 2401.10774): K small blocks on the target's last
hidden state, each guessing one token further ahead through the target's
own (frozen, shared) LM head, and the static tree they propose.

Head k (k = 1..K) reads the hidden state h_t of the newest accepted token
and guesses the token k + 1 places after it: the first head guesses the
token after the pending one (which the target's LM head itself gave).  A
head is a residual block, x + SiLU(W x + b), initialised to the identity
(W = 0), so an untrained head guesses what the LM head would at its place.

A heads folder holds ``heads.pt`` (the blocks' weights) and ``heads.json``
(the kind, the sizes, and the target's identity: a hash of its config and
one of its tokenizer's vocabulary), and is refused for any other target.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from .._exceptions import ConfigurationError
from .sampling import SamplingParams, sampling_probs
from .tree import ROOT, DraftTree

# Children of the likeliest node at each depth of Medusa's static tree
# (every other node gets one): a full (4, 2, 2, 1) tree has 4 + 8 + 16 + 16
# nodes, too many for a CPU forward, so only the best parent widens.
DEFAULT_TREE = (4, 3, 2, 1)
# Nodes of the sparse tree built from held-out accuracies (the static
# (4, 3, 2) tree of three heads has 17).
SPARSE_NODES = 16
VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures", "use_cache"}


def target_identity(config: Any, tokenizer: Any) -> dict[str, str]:
    """Hashes that tell one target from another: its config (less what
    loading changes) and its tokenizer's vocabulary."""
    settings = {k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS}
    config_hash = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    vocab = sorted(tokenizer.get_vocab().items())
    tokenizer_hash = hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]
    return {"config_sha256": config_hash, "tokenizer_sha256": tokenizer_hash}


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads over hidden states [..., H] -> logits [K, ..., V] through ``lm_head``."""

    def __init__(self, hidden: int, heads: int, lm_head: nn.Module) -> None:
        super().__init__()
        weight = lm_head.weight
        self.blocks = nn.ModuleList(ResBlock(hidden) for _ in range(heads)).to(weight.device, weight.dtype)
        self.lm_head = lm_head  # the target's; frozen and not saved with the heads
        for parameter in lm_head.parameters():
            parameter.requires_grad_(False)

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each head's block output, [K, ..., H]: what the LM head reads."""
        return torch.stack([block(hidden) for block in self.blocks])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # One LM-head matmul for all heads: on a CPU it reads the 151k-row
        # weight once (33 ms for 0.5B in fp32) instead of once per head.
        return self.lm_head(self.features(hidden))

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith("lm_head.")}


def save_heads(folder: Path, module: nn.Module, kind: str, identity: dict[str, str], **details: Any) -> None:
    """``heads.pt`` (what was trained, not the shared LM head) and ``heads.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    state = module.trainable_state() if hasattr(module, "trainable_state") else module.state_dict()
    torch.save(state, folder / "heads.pt")
    (folder / "heads.json").write_text(json.dumps({"kind": kind, "target": identity, **details}, indent=1))


def read_heads_info(folder: Path, identity: dict[str, str]) -> dict[str, Any]:
    """``heads.json``, after checking that the heads were trained for this target."""
    path = Path(folder) / "heads.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigurationError(f"no heads in {folder}: {path.name} is missing or unreadable ({e.__class__.__name__}); train some with `bspec heads train`") from None
    if info.get("target") != identity:
        raise ConfigurationError(
            f"the heads in {folder} were trained for another target (config {info.get('target', {}).get('config_sha256')}, "
            f"tokenizer {info.get('target', {}).get('tokenizer_sha256')}; this one is {identity['config_sha256']}, {identity['tokenizer_sha256']})"
        )
    return info


def load_medusa(folder: Path, target: Any, tokenizer: Any) -> MedusaHeads:
    info = read_heads_info(folder, target_identity(target.config, tokenizer))
    if info.get("kind") != "medusa":
        raise ConfigurationError(f"the heads in {folder} are {info.get('kind')!r} heads, not medusa")
    heads = MedusaHeads(int(info["hidden"]), int(info["heads"]), target.get_output_embeddings())
    heads.load_state_dict(torch.load(Path(folder) / "heads.pt", map_location="cpu", weights_only=True), strict=False)
    heads.rank_accuracy = info.get("held_out_rank_accuracy")  # heads trained before it was recorded have none
    return heads.to(next(target.parameters()).device, next(target.parameters()).dtype).eval()


def sparse_tree(rank_accuracy: Sequence[Sequence[float]], nodes: int = SPARSE_NODES) -> list[tuple[int, ...]]:
    """Medusa's accuracy-optimised tree: the ``nodes`` paths of candidate
    ranks (r_1, ..., r_d) likeliest to be accepted, a path's chance taken
    as the product of its heads' held-out accuracies at those ranks
    (``rank_accuracy[k][r]``; heads treated as independent, as Medusa
    does).  A path never scores above its prefix, so best-first order
    yields a tree, each path after its parent.

    >>> sparse_tree([[0.6, 0.2], [0.5, 0.3]], nodes=4)  # 0.6, 0.3, 0.2, 0.18 (then 0.1)
    [(0,), (0, 0), (1,), (0, 1)]
    """
    import heapq

    frontier = [(-a, (r,)) for r, a in enumerate(rank_accuracy[0]) if a > 0]
    heapq.heapify(frontier)
    paths: list[tuple[int, ...]] = []
    while frontier and len(paths) < nodes:
        score, path = heapq.heappop(frontier)
        paths.append(path)
        if len(path) < len(rank_accuracy):
            for r, a in enumerate(rank_accuracy[len(path)]):
                if a > 0:
                    heapq.heappush(frontier, (score * a, path + (r,)))
    return paths


def tree_of_paths(top: Sequence[torch.Tensor], paths: Sequence[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of a tree given as rank paths, each after its
    parent: the node for path (r_1..r_d) holds the depth-d head's r_d-th
    guess."""
    index = {(): ROOT}
    tokens: list[int] = []
    parents: list[int] = []
    for path in paths:
        tokens.append(int(top[len(path) - 1][path[-1]]))
        parents.append(index[path[:-1]])
        index[path] = len(tokens) - 1
    return tokens, parents


def static_tree(top: Sequence[torch.Tensor], shape: Sequence[int] = DEFAULT_TREE) -> tuple[list[int], list[int], list[int]]:
    """Medusa's static tree from each depth's ranked candidates ``top[d]``:
    at each depth, ``shape[d]`` children under the likeliest node of the
    depth above (its first) and the top candidate under each other node.
    Returns (tokens, parents, ranks), parents first.

    >>> static_tree([torch.tensor([7, 8]), torch.tensor([5, 6])], shape=(2, 2))
    ([7, 8, 5, 6, 5], [-1, -1, 0, 0, 1], [0, 1, 0, 1, 0])
    """
    tokens: list[int] = []
    parents: list[int] = []
    ranks: list[int] = []
    level = [ROOT]
    for depth, width in enumerate(shape[: len(top)]):
        next_level = []
        for i, parent in enumerate(level):
            for rank in range(width if i == 0 else 1):
                tokens.append(int(top[depth][rank]))
                parents.append(parent)
                ranks.append(rank)
                next_level.append(len(tokens) - 1)
        level = next_level
    return tokens, parents, ranks


class MedusaProposer:
    """Trees from Medusa heads: each depth's candidates are its head's
    top-k, picked deterministically, so each node's q is one-hot at its
    token (the multi-draft rule stays lossless at any temperature)."""

    def __init__(self, heads: MedusaHeads, shape: Sequence[int] | None = None, nodes: int = SPARSE_NODES) -> None:
        """The tree: ``shape`` (see :func:`static_tree`) if given, else the
        sparse tree of ``nodes`` from the heads' held-out accuracies where
        their folder records them, else :data:`DEFAULT_TREE`."""
        self.heads = heads
        rank_accuracy = getattr(heads, "rank_accuracy", None)
        self.paths = sparse_tree(rank_accuracy[: len(heads.blocks)], nodes) if shape is None and rank_accuracy else None
        self.shape = tuple((shape or DEFAULT_TREE)[: len(heads.blocks)])
        self.depth = max(len(path) for path in self.paths) if self.paths else len(self.shape)  # positions a tree reaches past the root

    def reset(self) -> None:
        pass  # heads read only the newest feature

    def propose(self, features: torch.Tensor, following: torch.Tensor, sampling: SamplingParams,
                generator: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
        with torch.inference_mode():
            logits = self.heads(features[-1])  # [K, V]
        probs = sampling_probs(logits, sampling) if not sampling.greedy else logits
        width = max(self.shape) if self.paths is None else 1 + max(path[-1] for path in self.paths)
        top = [row.topk(width).indices for row in probs]
        tokens, parents = tree_of_paths(top, self.paths) if self.paths else static_tree(top, self.shape)[:2]
        tree = DraftTree(torch.tensor(tokens), torch.tensor(parents))
        q = nn.functional.one_hot(tree.tokens, logits.shape[-1]).to(logits.dtype)
        return tree, q
