"""Local target mode: target and draft are transformers models on this machine.

Unlike the black-box mode, both distributions are visible here, so the whole
algorithm of the paper runs: sampling at any temperature, with the output
distributed exactly as the target alone would sample it
(:mod:`.sampling`).  Each round costs k draft forwards of one token and
**one** target forward over the pending token and the k draft tokens.

Both models keep a KV cache across rounds.  Rows of a batch (n samples of
one prompt) accept different numbers of tokens, so rejected tokens become
*holes* in the shared cache (:mod:`.eager` says how).

The layers, each importing only the ones below it: :mod:`.engine` (this
module: requests, γ, the round loop) over :mod:`.chain` (a chain round's
steps) and :mod:`.tree_engine` (tree rounds), over :mod:`.models` (loading,
choosing the engine), :mod:`.eager` and :mod:`.static` (the models and
their caches), and :mod:`.stats`.
"""

from __future__ import annotations

import time
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable, Sequence

from .._exceptions import ConfigurationError
from .._stats import GenerationResult, GenerationStats
from ..drafters.hf import import_hf, end_tokens
from ..profile import profiles_dir
from .chain import ChainRound, account, cut_after_end, draft_tokens, emit, roll_back, start_batch, synchronize, verify
from .costs import MAX_GAMMA, Costs, DepthChooser, GammaChooser, RoundTimes
from .eager import CachedLM, _cache_tensors  # noqa: F401  (_cache_tensors: re-exported, it lived here)
from .models import ENGINES, check_same_tokenizer, language_model, load_models  # noqa: F401  (re-exported)
from .sampling import NO_TOKEN, SamplingParams, as_generator, rejection_sample
from .stats import LocalStats
from .tree_engine import speculate_tree

torch, _ = import_hf("local target mode (--local)")

# γ is chosen each round from this machine's measured costs and the
# acceptance seen so far (.costs): on 2 CPU cores a target forward of 5
# tokens cost 2-2.7x one of 1 token and a fixed γ = 4 ran at half the plain
# speed; on a GPU wider steps cost about the same and a larger γ pays.
DEFAULT_GAMMA = "auto"


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
        target, draft, tokenizer, proposer = load_models(target_path, draft_path, device=device, dtype=dtype, heads_path=heads_path, heads_kind=heads_kind)
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

    def sample_tokens(self, prompt_ids: Sequence[int], *, max_tokens: int, sampling: SamplingParams, generator: torch.Generator, rows: int = 1,
                      stats: GenerationStats | None = None, local: LocalStats | None = None,
                      on_tokens: Callable[[list[int]], None] | None = None, fit_costs: bool = False) -> torch.Tensor:
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
        target, draft = self.target, self.draft
        gamma = self.max_gamma if draft is not None else 0
        chooser: GammaChooser | None = None
        batch = start_batch(target, draft, prompt_ids, rows, max_tokens, gamma)
        rounds = 0
        while not bool(batch.done.all()):
            # 0. γ: fixed, or (auto) chosen from the measured costs once the
            #    first round, plain, has read the prompt.  Never draft past
            #    max_tokens (the last token needs no draft), except where
            #    steps are compiled: there one verify width is one graph, and
            #    the tokens past max_tokens are dropped in step 5.
            most = None if self._fixed_shapes else batch.room(max_tokens) - 1
            if self.auto and draft is not None and rounds > 0 and most != 0:
                chooser = chooser or self._gamma_chooser(rows, sampling, local, fit_costs)
            wanted = chooser.next_gamma(most, batch.room(max_tokens)) if chooser is not None else 0 if self.auto else gamma
            k = wanted if most is None else min(wanted, most)
            # (A draft catching up on many tokens, its prompt or a plain
            # stretch, takes longer than a step: not a step's time.)
            draft_step_timed = draft is not None and batch.draft_pending.shape[1] <= 2
            live, clock = ~batch.done, time.perf_counter()
            # 1. Draft k tokens per row (see the steps in .chain).
            drafted, q_rows = draft_tokens(draft, batch, k, sampling, generator, target.vocab_size)
            if self._timed_phases:
                synchronize(target.device)
            drafted_at = time.perf_counter()
            # 2. One target forward over the pending token(s) and the draft: k+1 rows of p.
            p = verify(target, batch, drafted, sampling)
            # 3. Accept draft tokens with min(1, p/q); the first rejection is
            #    recovered from the residual, a full acceptance earns the bonus.
            q = torch.stack(q_rows, 1) if q_rows else p[:, :0]
            tokens, n = rejection_sample(drafted, q, p, generator)
            # 4. Roll both caches back past the rejected tokens.
            roll_back(target, draft, batch, drafted, tokens, n)
            # 5. Emit; rows stop at an end token or at max_tokens.
            emitted = emit(batch, tokens, n, self.ends, max_tokens)
            synchronize(target.device)
            verified_at = time.perf_counter()
            # 6. Account, and tell the γ chooser what acceptance and times it saw.
            account(stats, local, chooser, ChainRound(k, tokens, n, p, q, live, emitted), (clock, drafted_at, verified_at), draft_step_timed)
            rounds += 1
            if on_tokens is not None and rows == 1:
                on_tokens(tokens[0, : int(n[0])].tolist())
        if chooser is not None:
            local.auto.update(chooser.summary())
            local.gamma = max(chooser.chosen, key=chooser.chosen.count)
        return cut_after_end(batch.out[:, :max_tokens], self.ends)

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


def _same_device(a: torch.device, b: torch.device) -> bool:
    """'cuda' (the current GPU) and 'cuda:0' may be one device."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
