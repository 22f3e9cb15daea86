"""EAGLE (arXiv 2401.15077) with EAGLE-2's dynamic tree (arXiv 2406.16858):
a one-layer autoregressive head that drafts the target's *features*.

The target's last hidden state f_j (after the final norm: what its LM head
reads) at position j predicts token x_{j+1}.  The head reads the pair
(f_j, embed(x_{j+1})), fused by one linear layer ``fc``, through one decoder
layer that attends over all earlier pairs, and predicts f_{j+1}; the
target's own (frozen, shared) LM head turns that into a guess at x_{j+2}.
Drafting feeds the predicted feature back with each candidate token, so a
whole tree grows from one confirmed position.

Left out from the papers: EAGLE-3's fusion of low, middle and high layers
and its training-time test (the head here learns from the target's true
features only, with noise, as EAGLE-1 does).  Kept from EAGLE-3: a draft
vocabulary (the tokens the training data holds), so a draft step's LM head
is a few thousand rows, not the target's 151,936; the target still checks
every token against its whole vocabulary, so this costs acceptance, never
exactness.

The layer's weights start as a copy of the target's last decoder layer
(same shapes: Qwen2 / Llama-style), which trains faster on little data than
a random start.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._exceptions import ConfigurationError
from .heads import read_heads_info, target_identity
from .sampling import SamplingParams, sampling_probs
from .tree import ROOT, DraftTree

# EAGLE-2's dynamic tree on a CPU: each depth expands the `EXPAND` likeliest
# new nodes by their path's confidence, each offering its `EXPAND` best
# children; the `NODES` likeliest of all are verified.  (The paper's GPU
# defaults: 10 / 10 / 60.)  Measured with benchmarks/local_target.py.
DEFAULT_DEPTH = 5
DEFAULT_EXPAND = 4
DEFAULT_NODES = 16


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    rope_theta: float
    eps: float

    @classmethod
    def of(cls, config: Any) -> "LayerShape":
        heads = int(config.num_attention_heads)
        # transformers 5 keeps rope_theta in rope_parameters; 4.x on the config.
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        return cls(int(config.hidden_size), heads, int(getattr(config, "num_key_value_heads", heads) or heads),
                   int(config.intermediate_size), float(theta), float(getattr(config, "rms_norm_eps", 1e-6)))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., T, head_dim] for rotate-half RoPE at ``positions``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class EagleHead(nn.Module):
    """fc(f_j, embed(x_{j+1})) -> one decoder layer -> predicted f_{j+1}.

    ``forward`` runs new rows [B, T] over an optional cache of earlier rows'
    keys and values; ``allowed`` [T, P + T] says which of the cache and the
    new rows each new row sees (causal for training, ancestors in a tree)."""

    def __init__(self, shape: LayerShape, embed: nn.Module, lm_head: nn.Module, vocab: torch.Tensor) -> None:
        super().__init__()
        H, d = shape.hidden, shape.head_dim
        self.shape = shape
        self.fc = nn.Linear(2 * H, H)
        with torch.no_grad():  # start as "the feature itself"
            self.fc.weight.zero_()
            self.fc.weight[:, :H] = torch.eye(H)
            self.fc.bias.zero_()
        self.input_norm = RMSNorm(H, shape.eps)
        self.q_proj = nn.Linear(H, shape.heads * d)
        self.k_proj = nn.Linear(H, shape.kv_heads * d)
        self.v_proj = nn.Linear(H, shape.kv_heads * d)
        self.o_proj = nn.Linear(shape.heads * d, H, bias=False)
        self.post_norm = RMSNorm(H, shape.eps)
        self.gate_proj = nn.Linear(H, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(H, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, H, bias=False)
        # The target's own, frozen and not saved with the head.
        self.embed, self.lm_head = embed, lm_head
        for module in (embed, lm_head):
            for parameter in module.parameters():
                parameter.requires_grad_(False)
        self.register_buffer("vocab", vocab.to(torch.int64), persistent=True)
        # The LM head's rows of the draft vocabulary, gathered once: a gather
        # per draft step copied 122 MB (34k rows) each time.
        bias = getattr(lm_head, "bias", None)
        self.register_buffer("draft_rows", lm_head.weight.detach()[self.vocab].clone(), persistent=False)
        self.register_buffer("draft_bias", None if bias is None else bias.detach()[self.vocab].clone(), persistent=False)

    def copy_layer(self, layer: nn.Module) -> None:
        """Start from a decoder layer of the target (Qwen2 / Llama names)."""
        pairs = {"input_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm,
                 "q_proj": layer.self_attn.q_proj, "k_proj": layer.self_attn.k_proj, "v_proj": layer.self_attn.v_proj,
                 "o_proj": layer.self_attn.o_proj, "gate_proj": layer.mlp.gate_proj, "up_proj": layer.mlp.up_proj, "down_proj": layer.mlp.down_proj}
        with torch.no_grad():
            for name, source in pairs.items():
                mine = getattr(self, name)
                mine.weight.copy_(source.weight)
                if getattr(mine, "bias", None) is not None:
                    bias = getattr(source, "bias", None)
                    mine.bias.copy_(bias if bias is not None else torch.zeros_like(mine.bias))

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ([..., len(vocab)]): the target's
        LM-head rows of those tokens only."""
        return nn.functional.linear(features, self.draft_rows, self.draft_bias)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """features [B, T, H], tokens and positions [B, T], allowed [T, P + T]
        bool -> (predicted next features [B, T, H], this call's keys and
        values [B, kv, T, d] each, to extend a cache)."""
        s, d = self.shape, self.shape.head_dim
        B, T, _ = features.shape
        x = self.fc(torch.cat([features, self.embed(tokens).to(features.dtype)], dim=-1))
        h = self.input_norm(x)
        q = self.q_proj(h).view(B, T, s.heads, d).transpose(1, 2)
        k = self.k_proj(h).view(B, T, s.kv_heads, d).transpose(1, 2)
        v = self.v_proj(h).view(B, T, s.kv_heads, d).transpose(1, 2)
        cos, sin = rotary(positions, d, s.rope_theta, x.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        new = (k, v)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        repeat = s.heads // s.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed.to(q.device))
        x = x + self.o_proj(attended.transpose(1, 2).reshape(B, T, s.heads * d))
        h = self.post_norm(x)
        x = x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
        return x, new

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed.", "lm_head."))}


def causal(T: int, device: Any = None) -> torch.Tensor:
    return torch.ones((T, T), dtype=torch.bool, device=device).tril()


def new_head(target: Any, vocab: torch.Tensor) -> EagleHead:
    """A head for ``target``, its layer copied from the target's last."""
    head = EagleHead(LayerShape.of(target.config), target.get_input_embeddings(), target.get_output_embeddings(), vocab)
    head.copy_layer(target.get_decoder().layers[-1])
    weight = target.get_output_embeddings().weight
    return head.to(weight.device, weight.dtype)


def load_eagle(folder: Path, target: Any, tokenizer: Any) -> EagleHead:
    info = read_heads_info(folder, target_identity(target.config, tokenizer))
    if info.get("kind") != "eagle":
        raise ConfigurationError(f"the heads in {folder} are {info.get('kind')!r} heads, not eagle")
    state = torch.load(Path(folder) / "heads.pt", map_location="cpu", weights_only=True)
    head = EagleHead(LayerShape.of(target.config), target.get_input_embeddings(), target.get_output_embeddings(), state["vocab"])
    head.load_state_dict(state, strict=False)
    weight = target.get_output_embeddings().weight
    return head.to(weight.device, weight.dtype).eval()


@dataclass
class _Node:
    token: int
    parent: int  # index into the drafted list, or ROOT
    depth: int
    score: float  # log of the path's confidence


@dataclass
class _TreeRows:
    """The head's keys and values of a round's tree rows, in the order they
    ran, and which node each row is (dropped after the round)."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)


class EagleProposer:
    """Trees from an EAGLE head (a :class:`~.tree_engine.TreeProposer`).

    The head keeps a cache of the confirmed pairs (f_j, x_{j+1}) across
    rounds; each round's tree rows are dropped afterwards.  Candidates are
    each expanded node's top children over the draft vocabulary, chosen
    deterministically, so every node's q is one-hot at its token and the
    multi-draft rule stays lossless at any temperature."""

    def __init__(self, head: EagleHead, *, depth: int = DEFAULT_DEPTH, expand: int = DEFAULT_EXPAND, nodes: int = DEFAULT_NODES) -> None:
        self.head, self.depth, self.expand, self.nodes = head, depth, expand, nodes
        self.reset()

    def reset(self) -> None:
        self.past: tuple[torch.Tensor, torch.Tensor] | None = None
        self.length = 0

    def _confidences(self, features: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """log-probabilities over the draft vocabulary, [R, V'], for ranking."""
        logits = self.head.draft_logits(features).float()
        if sampling.greedy:
            return logits.log_softmax(-1)
        return sampling_probs(logits, sampling).clamp_min(1e-30).log()

    def propose(self, features: torch.Tensor, following: torch.Tensor, sampling: SamplingParams,
                generator: torch.Generator) -> tuple[DraftTree, torch.Tensor]:
        """See :meth:`.tree_engine.TreeProposer.propose`; ``generator`` is
        unused: the candidates are picked, not drawn."""
        weight = self.head.lm_head.weight
        with torch.inference_mode():
            # 1. Confirm the new pairs (f_j, x_{j+1}): the target's own
            #    features of the tokens accepted since the last round, the
            #    newest paired with the pending token (the tree's root).
            root_feature = self._confirm(features, following)
            # 2. Grow the tree depth by depth (EAGLE-2): the root's children,
            #    then the children of the likeliest new nodes by the
            #    product of confidences along their path.
            drafted = self._grow(root_feature, sampling)
            # 3. Keep the likeliest nodes (a child never scores above its
            #    parent, so the kept set holds every kept node's parent),
            #    parents first.
            tokens, parents = self._keep(drafted)
        tree = DraftTree(tokens, parents)
        q = nn.functional.one_hot(tree.tokens, weight.shape[0]).to(weight.dtype)
        return tree, q

    def _confirm(self, features: torch.Tensor, following: torch.Tensor) -> torch.Tensor:
        """Step 1: the head reads the new pairs into its cache; the feature
        it predicts after the newest (the root's)."""
        head = self.head
        device, dtype = head.lm_head.weight.device, head.lm_head.weight.dtype
        L = len(features)
        positions = torch.arange(self.length, self.length + L, device=device).unsqueeze(0)
        allowed = torch.cat([torch.ones((L, self.length), dtype=torch.bool, device=device), causal(L, device)], dim=1)
        out, new = head(features.to(dtype).unsqueeze(0), following.to(device).unsqueeze(0), positions, allowed, self.past)
        self.past = new if self.past is None else (torch.cat([self.past[0], new[0]], 2), torch.cat([self.past[1], new[1]], 2))
        self.length += L
        return out[0, -1]

    def _grow(self, root_feature: torch.Tensor, sampling: SamplingParams) -> list[_Node]:
        """Step 2: every node drafted, depth by depth, parents before children."""
        drafted: list[_Node] = []
        frontier = [(ROOT, 0.0, root_feature)]  # (node, score, predicted feature after it)
        rows = _TreeRows()
        for depth in range(1, self.depth + 1):
            born = self._expand(frontier, drafted, depth, sampling)
            if depth == self.depth or not born:
                break
            chosen = heapq.nlargest(self.expand, born, key=lambda i: drafted[i].score)
            out = self._run(chosen, {node: f for node, _, f in frontier}, drafted, depth, rows)
            frontier = [(node, drafted[node].score, out[0, r]) for r, node in enumerate(chosen)]
        return drafted

    def _expand(self, frontier: list[tuple[int, float, torch.Tensor]], drafted: list[_Node], depth: int, sampling: SamplingParams) -> list[int]:
        """Each frontier node's ``expand`` likeliest children, appended to
        ``drafted`` at ``depth``; their indices there."""
        scores = self._confidences(torch.stack([f for _, _, f in frontier]), sampling)
        top = scores.topk(min(self.expand, scores.shape[-1]), dim=-1)
        born = []
        for (parent, score, _), values, picks in zip(frontier, top.values.tolist(), top.indices.tolist()):
            for value, pick in zip(values, picks):
                if value == -math.inf:
                    continue
                drafted.append(_Node(int(self.head.vocab[pick]), parent, depth, score + value))
                born.append(len(drafted) - 1)
        return born

    def _run(self, chosen: list[int], parent_feature: dict[int, torch.Tensor], drafted: list[_Node], depth: int, rows: "_TreeRows") -> torch.Tensor:
        """Run the chosen nodes through the head, each with its parent's
        predicted feature: each sees the confirmed rows, its ancestors' tree
        rows and itself, at its depth's position.  Their predicted features
        [1, len(chosen), H]; their keys and values join ``rows``."""
        device, confirmed, ran = self.head.lm_head.weight.device, self.length, rows.nodes
        allowed = torch.zeros((len(chosen), confirmed + len(ran) + len(chosen)), dtype=torch.bool, device=device)
        allowed[:, :confirmed] = True
        for r, node in enumerate(chosen):
            ancestor = drafted[node].parent
            while ancestor != ROOT:
                allowed[r, confirmed + ran.index(ancestor)] = True
                ancestor = drafted[ancestor].parent
            allowed[r, confirmed + len(ran) + r] = True
        inputs = torch.stack([parent_feature[drafted[n].parent] for n in chosen]).unsqueeze(0)
        tokens = torch.tensor([[drafted[n].token for n in chosen]], device=device)
        positions = torch.tensor([[confirmed - 1 + depth for _ in chosen]], device=device)
        past = self.past if not ran else (torch.cat([self.past[0], *rows.keys], 2), torch.cat([self.past[1], *rows.values], 2))
        out, new = self.head(inputs, tokens, positions, allowed, past)
        rows.keys.append(new[0])
        rows.values.append(new[1])
        ran.extend(chosen)
        return out

    def _keep(self, drafted: list[_Node]) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3: the kept nodes' tokens and parents (indices into the kept)."""
        kept = sorted(heapq.nlargest(self.nodes, range(len(drafted)), key=lambda i: (drafted[i].score, -drafted[i].depth)),
                      key=lambda i: (drafted[i].depth, i))
        self.drafted, self.kept = drafted, kept  # for traces and tests: every node's path confidence
        where = {node: i for i, node in enumerate(kept)}
        tokens = torch.tensor([drafted[n].token for n in kept], dtype=torch.int64)
        parents = torch.tensor([ROOT if drafted[n].parent == ROOT else where[drafted[n].parent] for n in kept], dtype=torch.int64)
        return tokens, parents
