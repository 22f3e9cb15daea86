"""The fast path of local target mode: a static KV cache for Qwen2 / Llama
decoders, in the manner of gpt-fast.

:class:`~.eager.CachedLM` drives transformers' own forward with a
``DynamicCache``: each step concatenates every layer's keys and values,
rejected tokens are cropped out, and a forward is ~2,000 small kernel
launches (the H200 profile in ``benchmarks/results/local-cuda-h200``).  Here:

- **one buffer per layer**, ``[rows, kv_heads, capacity, head_dim]``,
  allocated once per request; a token's slot is its position, so a
  rollback is ``lengths -= n`` and rejected entries are simply overwritten;
- **fixed shapes**: a step's inputs are ``[rows, width]`` ids and the mask
  covers the whole buffer, so a step of one width is one graph that
  ``torch.compile`` (CUDA graphs on a GPU) captures once;
- **no host reads**: lengths, positions and masks are computed on the device.

The layers' own modules (projections, norms, MLP, rotary embedding) do the
arithmetic, so the numbers are transformers' own; only the cache and the
attention call are ours.  Other architectures keep the eager path
(:func:`static_unsupported` says why).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

from .tree import DraftTree, ancestor_mask, tree_positions

FAMILIES = ("qwen2", "llama")
# Rotary variants whose frequencies change with the sequence length
# (transformers' dynamic_rope_update) would need the whole length up front.
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
_CAPACITY_STEP = 16
# Compiled buffers start at this size, so short requests share one set of
# graphs (each new size recompiles: minutes on a CPU, and CUDA graphs again).
_COMPILED_SLOTS = 256
COMPILED_WIDTHS = 8  # verify widths up to --gamma auto's 7; wider steps (prompts, a draft's catch-up) run eagerly


def static_unsupported(model: Any) -> str | None:
    """Why ``model`` cannot use the static path, or None when it can."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        return f"{family or type(model).__name__} is not a Qwen2/Llama decoder"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "it has sliding-window layers"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in _LENGTH_DEPENDENT_ROPE:
        return f"its {rope.get('rope_type', rope.get('type'))} rotary embedding depends on the length"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "its modules are not laid out as transformers' Qwen2/Llama"
    return None


class StaticLM:
    """A Qwen2/Llama causal LM over a static KV cache, with
    :class:`~.eager.CachedLM`'s interface: ``rows`` continuations of one
    prompt, each row at its own length (no holes are stored: a slot is a
    position).

    ``compile=True`` compiles the narrow steps (draft and verify widths)
    with ``torch.compile``: CUDA graphs (``reduce-overhead``) on a GPU.
    """

    def __init__(self, model: Any, *, compile: bool = False) -> None:
        reason = static_unsupported(model)
        if reason is not None:
            raise ValueError(f"no static path for this model: {reason}")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        inner = model.model
        self._embed, self._layers, self._norm, self._rotary = inner.embed_tokens, list(inner.layers), inner.norm, inner.rotary_emb
        self._lm_head = model.get_output_embeddings()
        self._rotate = sys.modules[type(inner.layers[0].self_attn).__module__].apply_rotary_pos_emb
        attention = inner.layers[0].self_attn
        self._head_dim, self._scaling = int(attention.head_dim), float(attention.scaling)
        self._kv_heads = int(model.config.num_key_value_heads)
        self.compiled = compile
        self._step = self._chain_step
        if compile:
            # Each model compiles a few widths (verify γ+1; draft 1 and 2),
            # and every model in a process counts against one limit.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self._step = torch.compile(self._chain_step, mode=mode, fullgraph=True, dynamic=False)
        self.forwards = 0
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self.reset(1)

    @property
    def capacity(self) -> int:
        """Positions a row can hold; the last slot is scratch for holes."""
        return self._keys[0].shape[2] - 1 if self._keys else 0

    def reset(self, rows: int, capacity: int | None = None) -> None:
        """Start ``rows`` empty rows able to hold ``capacity`` positions each
        (the chain engine knows its bound: prompt + max_tokens + γ + 1)."""
        self.lengths = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._length = 0  # host copy, single-row (tree) forwards only
        self._started = False
        slots = self._slots(capacity if capacity is not None else 4 * _CAPACITY_STEP)
        have = self._keys[0].shape if self._keys else (0, 0, 0)
        # A compiled step is one graph per buffer size, so a larger buffer is
        # kept; an eager step pays for every slot (the mask covers the buffer).
        if have[0] != rows or have[2] < slots or (have[2] != slots and not self.compiled):
            self._allocate(rows, slots)

    def _slots(self, capacity: int) -> int:
        """Buffer size for ``capacity`` positions and the scratch slot: powers
        of two when compiled (few graphs across requests), else a little over."""
        return max(_COMPILED_SLOTS, 1 << capacity.bit_length()) if self.compiled else -(-(capacity + 1) // _CAPACITY_STEP) * _CAPACITY_STEP

    def _allocate(self, rows: int, slots: int, keep: int = 0) -> None:
        shape = (rows, self._kv_heads, slots, self._head_dim)
        old = list(zip(self._keys, self._values))
        self._keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self._layers]
        self._values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self._layers]
        for (k, v), new_k, new_v in zip(old, self._keys, self._values):
            if keep:
                new_k[:, :, :keep], new_v[:, :, :keep] = k[:, :, :keep], v[:, :, :keep]
        if self.compiled and self.device.type == "cuda":
            for buffer in self._keys + self._values:
                torch._dynamo.mark_static_address(buffer)  # written in place inside CUDA graphs

    # -- the arithmetic -------------------------------------------------------------

    def _layers_forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor,
                        keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """Normed last hidden states [B, w, H] for ``ids`` [B, w] at
        ``positions``, written to cache ``slots`` of ``keys`` and ``values``
        (a buffer per layer); query i of row b sees the slots where
        ``visible[b, i]`` (a [B, w, slots] bool) is True.  The buffers are
        arguments, not attributes, so that a compiled step guards on their
        shapes and not on which tensors they are."""
        hidden = self._embed(ids)
        cos, sin = self._rotary(hidden, positions)
        rows, width = ids.shape
        index = slots[:, None, :, None].expand(rows, self._kv_heads, width, self._head_dim)
        mask = visible.unsqueeze(1)
        for layer, layer_keys, layer_values in zip(self._layers, keys, values):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attention.q_proj(x).view(rows, width, -1, self._head_dim).transpose(1, 2)
            k = attention.k_proj(x).view(rows, width, -1, self._head_dim).transpose(1, 2)
            v = attention.v_proj(x).view(rows, width, -1, self._head_dim).transpose(1, 2)
            q, k = self._rotate(q, k, cos, sin)
            layer_keys.scatter_(2, index, k)
            layer_values.scatter_(2, index, v)
            out = F.scaled_dot_product_attention(q, layer_keys, layer_values, attn_mask=mask, scale=self._scaling, enable_gqa=True)
            hidden = hidden + attention.o_proj(out.transpose(1, 2).reshape(rows, width, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self._norm(hidden)

    def _chain_step(self, ids: torch.Tensor, valid: torch.Tensor, lengths: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                    last: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of ``ids`` [B, w] after each row's ``lengths`` tokens:
        logits [B, last, V] and the new lengths.  A slot where ``valid`` is
        False is a hole: it is computed (fixed shapes) but written to the
        scratch slot and not counted."""
        valid = valid.to(torch.int64)
        positions = (lengths.unsqueeze(1) + torch.cumsum(valid, 1) - 1).clamp_min(0)
        scratch = keys[0].shape[2] - 1
        slots = torch.where(valid.bool(), positions, scratch)
        reach = torch.arange(scratch + 1, device=ids.device)
        visible = (reach <= positions.unsqueeze(-1)) & (reach < scratch)
        hidden = self._layers_forward(ids, positions, slots, visible, keys, values)
        return self._lm_head(hidden[:, -last:]), lengths + valid.sum(1)

    # -- CachedLM's interface ---------------------------------------------------------

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, last: int) -> torch.Tensor:
        """Logits [B, last, V] after the last ``last`` of ids [B, w]; where
        ``valid`` is False the slot is a hole (a row feeding fewer tokens)."""
        # The prompt (the first forward after a reset) runs eagerly: one
        # graph per prompt length would not pay.
        step = self._step if self._started and ids.shape[1] <= COMPILED_WIDTHS else self._chain_step
        self._started = True
        with torch.inference_mode():
            logits, lengths = step(ids, valid, self.lengths, self._keys, self._values, last)
        # A CUDA graph's outputs are overwritten by its next replay: the
        # lengths outlive it (the logits are read at once, before the next step).
        self.lengths = lengths.clone() if self.compiled else lengths
        self.forwards += 1
        return logits

    def scratch_forward(self, width: int) -> torch.Tensor:
        """Logits [rows, width, V] of ``width`` scratch tokens after each
        row's tokens, the cache left as it was (for timing steps)."""
        rows, longest = self.lengths.shape[0], int(self.lengths.max())
        if longest + width > self.capacity:
            self._allocate(rows, self._slots(longest + width), keep=longest)
        ids = torch.zeros((rows, width), dtype=torch.int64, device=self.device)
        lengths, started = self.lengths, self._started
        self._started = True  # time the step a round would run (compiled, where it is)
        logits = self.forward(ids, torch.ones_like(ids, dtype=torch.bool), last=width)
        # Restored: a model's first real forward (its prompt) stays eager.
        self.lengths, self.forwards, self._started = lengths, self.forwards - 1, started
        return logits

    def forget_last(self, counts: torch.Tensor) -> None:
        """Row b drops its newest ``counts[b]`` tokens: a length, not a copy
        (the caller passes 0 for rows that fed holes)."""
        self.lengths = self.lengths - counts

    def read_prompt(self, prompt_ids: list[int] | Any) -> torch.Tensor:
        """Start one row from ``prompt_ids``: their last hidden states [L, H]."""
        self.reset(1, capacity=len(prompt_ids) + 4 * _CAPACITY_STEP)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=self.device)
        hidden = self._tree_forward(ids, torch.arange(ids.shape[1], device=self.device), torch.ones((ids.shape[1], ids.shape[1]), dtype=torch.bool).tril())
        return hidden

    def forward_tree(self, root: int, tree: DraftTree) -> torch.Tensor:
        """The last hidden states [N+1, H] after the pending token ``root``
        and each node of ``tree`` (each node sees the context and its own
        path); :meth:`keep_path` then keeps one path."""
        ids = torch.cat([torch.tensor([root]), tree.tokens.cpu()]).to(self.device).unsqueeze(0)
        self._tree_at = self._length
        return self._tree_forward(ids, tree_positions(tree.parents.cpu(), self._length).to(self.device), ancestor_mask(tree.parents))

    def _tree_forward(self, ids: torch.Tensor, positions: torch.Tensor, among: torch.Tensor) -> torch.Tensor:
        """One row: ``ids`` [1, w] written after the row's tokens; ``among``
        [w, w] says which new tokens each new token sees (it sees all older ones)."""
        past, width = self._length, ids.shape[1]
        if past + width > self.capacity:
            self._allocate(1, self._slots(2 * (past + width)), keep=past)
        slots = torch.arange(past, past + width, device=self.device)
        visible = torch.zeros((width, self._keys[0].shape[2]), dtype=torch.bool, device=self.device)
        visible[:, :past] = True
        visible[:, past : past + width] = among.to(self.device)
        with torch.inference_mode():
            hidden = self._layers_forward(ids, positions.unsqueeze(0), slots.unsqueeze(0), visible.unsqueeze(0), self._keys, self._values)
        self._length = past + width
        self.lengths = torch.full((1,), self._length, dtype=torch.int64, device=self.device)
        self.forwards += 1
        return hidden[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over last hidden states."""
        with torch.inference_mode():
            return self._lm_head(hidden)

    def keep_path(self, nodes: list[int]) -> None:
        """After :meth:`forward_tree`: keep the root and ``nodes`` (an
        accepted path, root's child first); only those entries move."""
        past = self._tree_at
        if nodes:
            source = torch.tensor([past + 1 + i for i in nodes], device=self.device)
            target = torch.arange(past + 1, past + 1 + len(nodes), device=self.device)
            for buffer in self._keys + self._values:
                buffer.index_copy_(2, target, buffer.index_select(2, source))
        self._length = past + 1 + len(nodes)
        self.lengths = torch.full((1,), self._length, dtype=torch.int64, device=self.device)
