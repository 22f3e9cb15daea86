"""Local target mode: target and draft are transformers models on this machine.

Unlike the black-box mode, both distributions are visible here, so the whole
algorithm of the paper runs: sampling at any temperature, with the output
distributed exactly as the target alone would sample it
(:mod:`.sampling`).  Each round costs k draft forwards of one token and
**one** target forward over the pending token and the k draft tokens.

Both models keep a KV cache across rounds.  Rows of a batch (n samples of
one prompt) accept different numbers of tokens, so rejected tokens are not
cut out of the middle of a shared cache: they become *holes* (attention mask
0) and each row counts its own positions.  The tail that is a hole in every
row is cropped, which for a single row is a plain rollback.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .._exceptions import ConfigurationError
from .._stats import GenerationResult, GenerationStats
from ..drafters.hf import import_hf, cache_argument, end_tokens, load_folder
from ..profile import profiles_dir
from .costs import MAX_GAMMA, Costs, DepthChooser, GammaChooser, RoundTimes
from .sampling import NO_TOKEN, SamplingParams, as_generator, expected_acceptance, rejection_sample, sample, sampling_probs
from .tree import DraftTree, ancestor_mask, tree_positions
from .static import StaticLM, static_unsupported
from .tree_engine import speculate_tree

torch, _ = import_hf("local target mode (--local)")

# γ is chosen each round from this machine's measured costs and the
# acceptance seen so far (.costs): on 2 CPU cores a target forward of 5
# tokens cost 2-2.7x one of 1 token and a fixed γ = 4 ran at half the plain
# speed; on a GPU wider steps cost about the same and a larger γ pays.
DEFAULT_GAMMA = "auto"


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
        # Only tokens count: a row that has ended feeds holes (see sample_tokens).
        self.lengths = self.lengths - self.mask.masked_fill(~newest, 0).sum(1)
        self.mask = self.mask.masked_fill(newest, 0)
        used = self.mask.any(0).nonzero()
        keep = int(used[-1]) + 1 if len(used) else 0
        if keep < width:
            # A negative count removes that many positions in every
            # transformers release (a positive one meant "keep" before 5.0).
            self._cache.crop(keep - width)
            self.mask = self.mask[:, :keep]


@dataclass
class LocalStats:
    """What the local rounds did, beyond :class:`GenerationStats`: enough
    for the paper's α (mean β over examined positions) and c."""

    gamma: int = 0  # with --gamma auto: the γ most rounds used (auto says more)
    engine: str = ""  # "static", "static+compiled" or "eager (why)": see language_model()
    draft_forwards: int = 0
    target_forwards: int = 0
    examined_positions: int = 0  # draft positions the rule looked at
    rejections: int = 0
    beta_sum: float = 0.0  # Σ β = Σ_x min(p, q) over examined positions
    round_tokens: list[int] = field(default_factory=list)
    accepted_per_depth: list[int] = field(default_factory=list)  # tree rounds: how often depth d's node was accepted
    auto: dict[str, Any] = field(default_factory=dict)  # --gamma auto: what was chosen, from which costs, and why

    @property
    def alpha(self) -> float:
        """The paper's α, estimated as the mean of β = Σ min(p, q)."""
        return self.beta_sum / self.examined_positions if self.examined_positions else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        return sum(self.round_tokens) / self.target_forwards if self.target_forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "gamma": self.gamma, "engine": self.engine, "alpha": round(self.alpha, 4), "draft_forwards": self.draft_forwards,
            "target_forwards": self.target_forwards, "tokens_per_target_forward": round(self.tokens_per_target_forward, 3),
            "examined_positions": self.examined_positions, "rejections": self.rejections,
        } | ({"accepted_per_depth": self.accepted_per_depth} if self.accepted_per_depth else {}) | ({"auto": self.auto} if self.auto else {})


class LocalSpeculator:
    """Speculative sampling with a local target and draft (shared tokenizer).

    ``draft=None`` samples from the target alone, one token per forward: the
    baseline, through the same code.  ``proposer`` (Medusa heads,
    :mod:`.heads`) drafts trees from the target's own hidden states instead
    of a draft model: one target forward per round over the whole tree
    (:func:`.tree_engine.speculate_tree`), one sample at a time.

    >>> # speculator = LocalSpeculator.from_pretrained("qwen-1.5b/", "qwen-0.5b/")
    >>> # speculator.generate("def fib(n):", max_tokens=64, sampling=SamplingParams(0.7), seed=1).text
    """

    def __init__(self, target: Any, draft: Any | None, tokenizer: Any, *, gamma: int | str = DEFAULT_GAMMA, proposer: Any | None = None,
                 engine: str = "auto", compile: bool | None = None, costs: Costs | None = None, costs_root: Path | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        """``gamma``: draft tokens per round, or "auto": chosen each round
        from ``costs`` (default: measured once on this machine and kept
        under ``costs_root``, default the profiles folder) and the
        acceptance seen so far; see :mod:`.costs`.  ``progress`` hears
        about long work (measuring the costs)."""
        if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1):
            raise ConfigurationError(f"gamma (draft tokens per round) must be auto or a whole number >= 1, got {gamma!r}")
        if proposer is not None and draft is not None:
            raise ConfigurationError("draft with a draft model or with trained heads, not both")
        self.proposer = proposer
        self.target, self.engine = language_model(target, engine, compile)
        self.draft = None
        if draft is not None:
            self.draft, draft_engine = language_model(draft, engine, compile)
            if draft_engine != self.engine:
                self.engine = f"target {self.engine}, draft {draft_engine}"
        if self.draft is not None and self.draft.device != self.target.device:
            raise ConfigurationError(f"the target is on {self.target.device} and the draft on {self.draft.device}; local mode runs both on one device")
        self.tokenizer = tokenizer
        self.gamma, self.auto = gamma, gamma == "auto"
        self.max_gamma = MAX_GAMMA if self.auto else int(gamma)
        self.costs, self.costs_root = costs, costs_root if costs_root is not None else profiles_dir()
        self._costs_by_kind: dict[tuple[str, int], Costs] = {}
        self.progress = progress
        # Timing draft and verify apart costs a host sync mid-round on a GPU;
        # the fast path only times whole rounds there.
        self._timed_phases = self.target.device.type != "cuda" or isinstance(self.target, CachedLM)
        self._fixed_shapes = getattr(self.target, "compiled", False)
        self.ends = torch.tensor(sorted(end_tokens(target, tokenizer)), dtype=torch.int64, device=self.target.device)
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 1 << 30))

    @classmethod
    def from_pretrained(cls, target_path: str, draft_path: str | None = None, *, device: str = "cpu", dtype: str = "auto", gamma: int | str = DEFAULT_GAMMA,
                        heads_path: str | None = None, heads_kind: str = "medusa", engine: str = "auto", compile: bool | None = None,
                        progress: Callable[[str], None] | None = None) -> "LocalSpeculator":
        """Load both models from transformers folders (no downloads) and check
        that they share a tokenizer; or the target and heads trained for it
        (``bspec heads train``), refused for any other target."""
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        hint = "a .gguf file converts to one with `bspec server prepare vllm --model NAME`"
        target, tokenizer = load_folder(target_path, device=device, dtype=dtype, role="target model", option="--device", hint=hint, feature="--local")
        draft = None
        if draft_path is not None:
            draft, draft_tokenizer = load_folder(draft_path, device=device, dtype=dtype, role="draft model", option="--device", hint=hint, feature="--local")
            check_same_tokenizer(tokenizer, draft_tokenizer)
            draft = draft.to(device)
        target = target.to(device)
        proposer = None
        if heads_path is not None and heads_kind == "eagle":
            from .eagle import EagleProposer, load_eagle

            proposer = EagleProposer(load_eagle(heads_path, target, tokenizer))
        elif heads_path is not None:
            from .heads import MedusaProposer, load_medusa

            proposer = MedusaProposer(load_medusa(heads_path, target, tokenizer))
        return cls(target, draft, tokenizer, gamma=gamma, proposer=proposer, engine=engine, compile=compile, progress=progress)

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        sampling: SamplingParams = SamplingParams(),
        seed: int | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> GenerationResult:
        """Sample one continuation of ``prompt``; ``on_text`` gets each new
        piece of text as rounds end (whole characters only)."""
        prompt_ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        stats, local = GenerationStats(), LocalStats(gamma=self.max_gamma if self.draft is not None and not self.auto else 0, engine=self.engine)
        tokens: list[int] = []
        shown, ends = [""], set(self.ends.tolist())

        def show(new: Sequence[int]) -> None:
            for token in new:
                if token in ends:
                    return  # the text has ended; the loop stops after this round
                tokens.append(token)
            text = self.tokenizer.decode(tokens)
            if on_text is not None and not text.endswith("\ufffd") and len(text) > len(shown[0]):
                on_text(text[len(shown[0]) :])
                shown[0] = text

        start = time.perf_counter()
        generator = as_generator(seed, self.target.device)
        if self.proposer is not None:
            self._check_request(prompt_ids, max_tokens, 1, generator)
            chooser = (lambda nodes: self._depth_chooser(nodes, sampling, local, fit_costs=seed is None)) if self.auto else None
            row = speculate_tree(self.target, self.proposer, prompt_ids, max_tokens=max_tokens, sampling=sampling, generator=generator,
                                 ends=set(self.ends.tolist()), stats=stats, local=local, on_tokens=show, depth_chooser=chooser)
        else:
            out = self.sample_tokens(prompt_ids, max_tokens=max_tokens, sampling=sampling, generator=generator, stats=stats, local=local, on_tokens=show,
                                     fit_costs=seed is None)
            row = out[0].tolist()
        stats.wall_s = time.perf_counter() - start
        row = [t for t in row if t != NO_TOKEN]
        ended = bool(row) and row[-1] in self.ends.tolist()
        stats.finish_reason = "stop" if ended else "length"
        text = self.tokenizer.decode(row[:-1] if ended else row)
        if on_text is not None and len(text) > len(shown[0]):
            on_text(text[len(shown[0]) :])
        result = GenerationResult(text=text, stats=stats)
        result.local = local  # type: ignore[attr-defined]
        return result

    def _check_request(self, prompt_ids: Sequence[int], max_tokens: int, rows: int, generator: torch.Generator) -> None:
        if not prompt_ids:
            raise ConfigurationError("the prompt has no tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigurationError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        if rows < 1:
            raise ConfigurationError(f"rows must be at least 1, not {rows!r}")
        reach = getattr(self.proposer, "depth", 0) if self.proposer is not None else self.max_gamma if self.draft is not None else 0
        if len(prompt_ids) + max_tokens + reach + 1 > self.max_positions:
            raise ConfigurationError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceed the target's {self.max_positions} positions")
        if not _same_device(generator.device, self.target.device):
            raise ConfigurationError(
                f"the generator is on {generator.device} and the models on {self.target.device}; "
                f"make it with as_generator(seed, {str(self.target.device)!r})"
            )

    def sample_tokens(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator,
        rows: int = 1,
        stats: GenerationStats | None = None,
        local: LocalStats | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
        fit_costs: bool = False,
    ) -> torch.Tensor:
        """``rows`` independent samples of up to ``max_tokens`` tokens → [rows, max_tokens],
        each row cut after its first end token and padded with ``NO_TOKEN``.
        ``fit_costs`` (``--gamma auto``): fit the measured costs to the
        rounds' own times as they go; timings vary, so a seeded run that
        must replay leaves it off."""
        if self.proposer is not None:
            raise ConfigurationError("trees from heads sample one continuation at a time: use generate(), or a draft model for rows")
        self._check_request(prompt_ids, max_tokens, rows, generator)
        stats = stats if stats is not None else GenerationStats()
        local = local if local is not None else LocalStats()
        target, draft, device = self.target, self.draft, self.target.device
        gamma = self.max_gamma if draft is not None else 0
        chooser: GammaChooser | None = None
        rounds = 0
        out = torch.full((rows, max_tokens + gamma + 1), NO_TOKEN, dtype=torch.int64, device=device)
        count = torch.zeros(rows, dtype=torch.int64, device=device)
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        everyone = torch.arange(rows, device=device)

        prompt = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=device).expand(rows, -1)
        # The most positions a row reaches: prompt, output, and a round's drafts past max_tokens.
        capacity = len(prompt_ids) + max_tokens + gamma + 1
        target.reset(rows, capacity)
        target_pending, target_valid = prompt, torch.ones_like(prompt, dtype=torch.bool)  # not yet in the target's cache
        if draft is not None:
            draft.reset(rows, capacity)
            draft_pending, draft_valid = prompt, torch.ones_like(prompt, dtype=torch.bool)

        while not bool(done.all()):
            most = None if self._fixed_shapes else max_tokens - 1 - int(count[~done].min())
            # 0. γ: fixed, or (auto) chosen from the measured costs once the
            #    first round, plain, has read the prompt.  Never draft past
            #    max_tokens (the last token needs no draft), except where
            #    steps are compiled: there one verify width is one graph, and
            #    the tokens past max_tokens are dropped in step 5.
            if self.auto and draft is not None and rounds > 0 and most != 0:
                chooser = chooser or self._gamma_chooser(rows, sampling, local, fit_costs)
            wanted = chooser.next_gamma(most, max_tokens - int(count[~done].min())) if chooser is not None else 0 if self.auto else gamma
            k = wanted if most is None else min(wanted, most)
            # Rows that have ended still go through the batch (their draws keep
            # a seed's stream), but as holes: their positions stop growing.
            running = (~done).unsqueeze(1)
            # (A draft catching up on many tokens, its prompt or a plain
            # stretch, takes longer than a step: not a step's time.)
            draft_step_timed = draft is not None and draft_pending.shape[1] <= 2
            clock = time.perf_counter()

            # 1. Draft k tokens, each sampled from q (logits fitted to the target's vocabulary).
            drafted, q_rows = [], []
            for _ in range(k):
                logits = draft.forward(draft_pending, draft_valid, last=1)[:, -1]
                q_i = sampling_probs(_fit_vocabulary(logits, target.vocab_size), sampling)
                x_i = sample(q_i, generator)
                drafted.append(x_i)
                q_rows.append(q_i)
                draft_pending, draft_valid = x_i.unsqueeze(1), running.clone()
            draft_tokens = torch.stack(drafted, 1) if drafted else torch.zeros((rows, 0), dtype=torch.int64, device=device)
            if self._timed_phases:
                _synchronize(device)
            drafted_at = time.perf_counter()

            # 2. One target forward over the pending token(s) and the draft: k+1 rows of p.
            ids = torch.cat([target_pending, draft_tokens], 1)
            valid = torch.cat([target_valid, running.expand_as(draft_tokens)], 1)
            p = sampling_probs(target.forward(ids, valid, last=k + 1), sampling)

            # 3. Accept draft tokens with min(1, p/q); the first rejection is
            #    recovered from the residual, a full acceptance earns the bonus.
            q = torch.stack(q_rows, 1) if q_rows else p[:, :0]
            tokens, n = rejection_sample(draft_tokens, q, p, generator)
            n_accepted = n - 1
            last = tokens[everyone, n_accepted]

            # 4. Roll both caches back past the rejected tokens and queue what
            #    each model has not seen yet.
            target.forget_last(torch.where(running[:, 0], k - n_accepted, 0))
            target_pending, target_valid = last.unsqueeze(1), None  # valid: set below, once this round's ends are known
            if draft is not None:
                if k > 0:  # the draft saw x_1..x_{k-1}; x_k was sampled, never fed
                    draft.forget_last(torch.where(running[:, 0], (k - 1 - n_accepted).clamp_min(0), 0))
                    unseen, unseen_valid = draft_tokens[:, -1:], (n_accepted == k).unsqueeze(1)
                else:
                    unseen, unseen_valid = draft_pending, draft_valid
                draft_pending = torch.cat([unseen, last.unsqueeze(1)], 1)
                draft_valid = torch.cat([unseen_valid & running, running], 1)

            # 5. Emit: rows still running append their tokens, and stop at an
            #    end token or at max_tokens.
            live = ~done
            slots = count.unsqueeze(1) + torch.arange(k + 1, device=device)
            keep = (torch.arange(k + 1, device=device) < n.unsqueeze(1)) & live.unsqueeze(1)
            out.scatter_(1, torch.where(keep, slots, out.shape[1] - 1), torch.where(keep, tokens, out[:, -1:].expand_as(tokens)))
            ended = (torch.isin(tokens, self.ends) & keep).any(1)
            count = count + torch.where(live, n, 0)
            done = done | ended | (count >= max_tokens)
            target_valid = (~done).unsqueeze(1)
            if draft is not None:
                draft_valid = draft_valid & target_valid
                if not bool(draft_valid[:, 0].any()):  # no row feeds the first column: drop it
                    draft_pending, draft_valid = draft_pending[:, 1:], draft_valid[:, 1:]
            _synchronize(device)
            verified_at = time.perf_counter()

            examined = (torch.arange(k, device=device) <= n_accepted.unsqueeze(1)) & live.unsqueeze(1)
            local.draft_forwards += k
            local.target_forwards += 1
            local.examined_positions += int(examined.sum())
            local.rejections += int(((n_accepted < k) & live).sum())
            beta = float((expected_acceptance(p[:, :k], q) * examined).sum())
            local.beta_sum += beta
            if chooser is not None:
                chooser.observe(beta, int(examined.sum()), gamma=k, draft_s=drafted_at - clock if draft_step_timed else 0.0, verify_s=verified_at - drafted_at)
            local.round_tokens.append(int(torch.where(live, n, 0).sum()))
            rounds += 1
            stats.observe_round("local", calls=1, cancelled=0, seconds=verified_at - drafted_at)
            stats.draft_s += drafted_at - clock
            accepted = int(torch.where(live, n_accepted, 0).sum())
            emitted = int(keep.sum())
            stats.drafted_tokens += k * int(live.sum())
            stats.accepted_tokens += accepted
            stats.output_tokens += emitted
            stats.trace.append(["local", k, accepted, emitted, round(verified_at - clock, 5)])
            if on_tokens is not None and rows == 1:
                on_tokens(tokens[0, : int(n[0])].tolist())

        if chooser is not None:
            local.auto.update(chooser.summary())
            local.gamma = max(chooser.chosen, key=chooser.chosen.count)
        return _cut_after_end(out[:, :max_tokens], self.ends)

    def _gamma_chooser(self, rows: int, sampling: SamplingParams, local: LocalStats, fit_costs: bool = False) -> GammaChooser:
        """A chooser over this speculator's costs for ``rows``: given,
        measured earlier (this process or the disk), or measured now, after
        the prompt is in the target's cache."""
        from .calibrate import chain_widths

        costs = self._costs(("chain", rows), chain_widths(self.max_gamma), sampling, local)
        # The first round, plain, read the prompt; its time is the prompt's, not a step's.
        # Given costs are taken as they are (tests, benches); measured ones are fitted where asked.
        fit = fit_costs and self._timed_phases and self.costs is None
        return GammaChooser(costs, self.max_gamma, chosen=[0], times=RoundTimes() if fit else None)

    def _depth_chooser(self, nodes: int, sampling: SamplingParams, local: LocalStats, fit_costs: bool = False) -> DepthChooser:
        """A chooser of tree depths, its costs timed up to ``nodes`` + 1
        tokens (the first tree's size); with ``fit_costs`` the proposal's
        time is learnt as rounds go (a seeded run takes it as free, so that
        its cuts, and its text, replay)."""
        from .calibrate import tree_widths

        costs = self._costs(("tree", nodes), tree_widths(nodes), sampling, local)
        given = self.costs is not None
        return DepthChooser(replace(costs, verify_s=dict(costs.verify_s), draft_s=costs.draft_s if given else 0.0), learn_draft=fit_costs and not given)

    def _costs(self, kind: tuple[str, int], widths: list[int], sampling: SamplingParams, local: LocalStats) -> Costs:
        """Given, measured earlier (in this process or kept on disk), or
        measured now, once the prompt is in the caches."""
        if self.costs is not None:
            costs, source = self.costs, "given"
        elif kind in self._costs_by_kind:
            costs, source = self._costs_by_kind[kind], "measured earlier in this process"
        else:
            from .calibrate import model_name, stored_or_measured

            key = (model_name(self.target), model_name(self.draft), self.engine, self.target.device, torch.get_num_threads(), *kind)
            costs, source = stored_or_measured(key, self.costs_root, self.target, self.draft, widths, sampling, self.progress)
            self._costs_by_kind[kind] = costs
        local.auto["costs"] = source
        return costs


ENGINES = ("auto", "static", "eager")


def language_model(model: Any, engine: str = "auto", compile: bool | None = None) -> tuple["CachedLM | StaticLM", str]:
    """The model wrapped for the rounds, and what was chosen, for ``stats.local``.

    ``static`` (:mod:`.static`: a static KV cache, fixed-shape steps) serves
    Qwen2/Llama decoders; ``eager`` (transformers' forward and cache) serves
    any causal LM; ``auto`` takes static where it can.  ``compile``
    (``torch.compile``; CUDA graphs on a GPU) applies to the static path;
    None compiles on CUDA only: on this project's 2-core CPU it did not pay
    (``bench/results/local-static-cpu/``).
    """
    if engine not in ENGINES:
        raise ConfigurationError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    reason = static_unsupported(model) if engine != "eager" else "asked for"
    if reason is not None:
        if engine == "static":
            raise ConfigurationError(f"the static engine cannot run this model: {reason}; use --engine eager (or auto)")
        return CachedLM(model), f"eager ({reason})"
    device = next(model.parameters()).device
    compiled = compile if compile is not None else device.type == "cuda"
    return StaticLM(model, compile=compiled), "static+compiled" if compiled else "static"


def check_same_tokenizer(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Local mode compares token ids, so both models must number tokens alike."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differ = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise ConfigurationError(
            f"the target and draft models do not share a tokenizer ({len(target_vocab)} vs {len(draft_vocab)} tokens, "
            f"{differ} entries differ); local mode needs one tokenizer, "
            "while the API mode (--drafter hf) works on text and takes any draft model"
        )


def _fit_vocabulary(logits: torch.Tensor, size: int) -> torch.Tensor:
    """Draft logits over the target's ids: extra draft ids dropped, missing ones impossible."""
    if logits.shape[-1] >= size:
        return logits[..., :size]
    pad = torch.full((*logits.shape[:-1], size - logits.shape[-1]), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], -1)


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


def _cut_after_end(tokens: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """NO_TOKEN after each row's first end token (later tokens were sampled
    after the text had ended)."""
    is_end = torch.isin(tokens, ends).to(torch.int64)
    after_end = (torch.cumsum(is_end, 1) - is_end) > 0
    return tokens.masked_fill(after_end, NO_TOKEN)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """'cuda' (the current GPU) and 'cuda:0' may be one device."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
