"""The eager engine of local target mode: transformers' own forward and
``DynamicCache`` under :class:`CachedLM`, for any causal LM (the static
engine, :mod:`.static`, is the fast path for Qwen2/Llama decoders).

Rows of a batch accept different numbers of tokens, so rejected tokens are
not cut out of the middle of the shared cache: they become *holes*
(attention mask 0) and each row counts its own positions.  The tail that is
a hole in every row is cropped, which for a single row is a plain rollback.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from ..drafters.hf import cache_argument, import_hf
from .tree import DraftTree, ancestor_mask, tree_positions

torch, _ = import_hf("local target mode (--local)")


class CachedLM:
    """A causal LM and a KV cache serving ``rows`` continuations of one prompt."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._cache_arg = cache_argument(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.forwards = 0
        self.reset(1)

    def reset(self, rows: int, capacity: int | None = None) -> None:
        """Start ``rows`` empty rows (the cache grows as needed: ``capacity`` is unused)."""
        self._cache: Any = None
        self.mask = torch.zeros((rows, 0), dtype=torch.int64, device=self.device)  # 1 = a token, 0 = a hole
        self.lengths = torch.zeros(rows, dtype=torch.int64, device=self.device)  # tokens (not holes) per row

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, last: int) -> torch.Tensor:
        """Logits [B, last, V] after the last ``last`` of ids [B, w]; where
        ``valid`` is False the slot is a hole (left padding for rows with
        fewer new tokens)."""
        extra = {"logits_to_keep": last} if self._keeps_logits else {}
        valid = valid.to(torch.int64)
        positions = (self.lengths.unsqueeze(1) + torch.cumsum(valid, 1) - 1).clamp_min(0)
        mask = torch.cat([self.mask, valid], dim=1)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra, **{self._cache_arg: self._cache})
        self._cache = getattr(out, self._cache_arg)
        self.mask, self.lengths = mask, self.lengths + valid.sum(1)
        self.forwards += 1
        return out.logits[:, -last:]

    def scratch_forward(self, width: int) -> torch.Tensor:
        """Logits [rows, width, V] of ``width`` scratch tokens after each
        row's tokens, the cache left as it was (for timing steps)."""
        rows = self.mask.shape[0]
        ids = torch.zeros((rows, width), dtype=torch.int64, device=self.device)
        logits = self.forward(ids, torch.ones_like(ids, dtype=torch.bool), last=width)
        self.forget_last(torch.full((rows,), width, dtype=torch.int64, device=self.device))
        self.forwards -= 1
        return logits

    def read_prompt(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Start one row from ``prompt_ids``: their last hidden states [L, H]
        (heads read them; :meth:`logits` of the last row is the next token's)."""
        self.reset(1)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=self.device)
        extra = {"logits_to_keep": 1} if self._keeps_logits else {}
        with torch.inference_mode():
            out = self.model(input_ids=ids, use_cache=True, output_hidden_states=True, **extra)
        self._cache = getattr(out, self._cache_arg)
        self.mask, self.lengths = torch.ones_like(ids), torch.full((1,), ids.shape[1], dtype=torch.int64, device=self.device)
        self.forwards += 1
        return out.hidden_states[-1][0]

    def forward_tree(self, root: int, tree: DraftTree) -> torch.Tensor:
        """One row, no holes: the last hidden states [N+1, H] after the
        pending token ``root`` and after each node of ``tree``, in one
        forward (each node sees the context and its own path); logits come
        from :meth:`logits`.  The cache then holds all N+1;
        :meth:`keep_path` keeps one path."""
        if self.mask.shape[0] != 1 or not bool(self.mask.all()):
            raise ValueError("tree forwards serve one row without holes")
        past, n = self.mask.shape[1], len(tree)
        dtype = next(self.model.parameters()).dtype
        allowed = torch.cat([torch.ones((n + 1, past), dtype=torch.bool), ancestor_mask(tree.parents)], dim=1).to(self.device)
        mask = torch.zeros((1, 1, n + 1, past + n + 1), dtype=dtype, device=self.device).masked_fill(~allowed, torch.finfo(dtype).min)
        ids = torch.cat([torch.tensor([root]), tree.tokens.cpu()]).to(self.device).unsqueeze(0)
        positions = tree_positions(tree.parents.cpu(), past).to(self.device).unsqueeze(0)
        extra = {"logits_to_keep": 1} if self._keeps_logits else {}
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, output_hidden_states=True,
                             **extra, **{self._cache_arg: self._cache})
        self._cache = getattr(out, self._cache_arg)
        self._tree_at = past
        self.mask = torch.ones((1, past + n + 1), dtype=torch.int64, device=self.device)
        self.lengths = self.lengths + n + 1
        self.forwards += 1
        return out.hidden_states[-1][0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over last hidden states (transformers returns them
        after the final norm: the same logits the forward would give)."""
        with torch.inference_mode():
            return self.model.get_output_embeddings()(hidden)

    def keep_path(self, nodes: list[int]) -> None:
        """After :meth:`forward_tree`: keep the root and ``nodes`` (an
        accepted path, root's child first) in the cache, drop the other
        branches.  Only the accepted entries move (O(accepted), not
        O(context)); the rest is cropped off the end."""
        past, width = self._tree_at, self.mask.shape[1]
        keep = past + 1 + len(nodes)
        if nodes and nodes != list(range(len(nodes))):
            source = torch.tensor([past + 1 + i for i in nodes], device=self.device)
            target = torch.arange(past + 1, keep, device=self.device)
            with torch.inference_mode():
                for keys, values, _ in _cache_tensors(self._cache):
                    keys.index_copy_(-2, target, keys.index_select(-2, source))
                    values.index_copy_(-2, target, values.index_select(-2, source))
        if keep < width:
            self._cache.crop(keep - width)  # negative: drop that many (see forget_last)
        self.mask = torch.ones((1, keep), dtype=torch.int64, device=self.device)
        self.lengths = torch.full((1,), keep, dtype=torch.int64, device=self.device)

    def forget_last(self, counts: torch.Tensor) -> None:
        """Turn the newest ``counts[b]`` tokens of row b into holes (they were
        rejected), then crop the tail that every row has forgotten."""
        width = self.mask.shape[1]
        newest = torch.arange(width, device=self.device) >= width - counts.unsqueeze(1)
        # Only tokens count: a row that has ended feeds holes (see .chain).
        self.lengths = self.lengths - self.mask.masked_fill(~newest, 0).sum(1)
        self.mask = self.mask.masked_fill(newest, 0)
        used = self.mask.any(0).nonzero()
        keep = int(used[-1]) + 1 if len(used) else 0
        if keep < width:
            # A negative count removes that many positions in every
            # transformers release (a positive one meant "keep" before 5.0).
            self._cache.crop(keep - width)
            self.mask = self.mask[:, :keep]



def _cache_tensors(cache: Any):
    """(keys, values, put) per layer of a transformers cache: ``layers``
    since transformers 4.56, ``key_cache``/``value_cache`` lists before."""
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            def put(k: torch.Tensor, v: torch.Tensor, layer: Any = layer) -> None:
                layer.keys, layer.values = k, v
            yield layer.keys, layer.values, put
    else:
        for i in range(len(cache.key_cache)):
            def put(k: torch.Tensor, v: torch.Tensor, i: int = i) -> None:
                cache.key_cache[i], cache.value_cache[i] = k, v
            yield cache.key_cache[i], cache.value_cache[i], put
