"""Training Medusa heads by self-distillation, on the CPU if need be.

1. Texts: the target's own greedy continuations of a prompt corpus (what
   the heads must guess is what *this* target writes, not what a dataset
   says).
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


def distill(model: Any, tokenizer: Any, prompts: Sequence[str], continuations: Sequence[Sequence[int]], heads: int, progress: Progress | None = None) -> Distilled:
    """Hidden states and following tokens at every position of each
    continuation (the prompt's last token included: it starts the answer)."""
    hidden_rows, following_rows = [], []
    device = next(model.parameters()).device
    for i, (prompt, answer_ids) in enumerate(zip(prompts, continuations)):
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = torch.tensor([list(prompt_ids) + list(answer_ids)], device=device)
        with torch.inference_mode():
            states = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0].float().cpu()
        tokens = ids[0].cpu()
        start, length = len(prompt_ids) - 1, len(tokens)
        positions = torch.arange(start, length - 1)
        ahead = positions.unsqueeze(1) + torch.arange(1, heads + 2)
        following = torch.where(ahead < length, tokens[ahead.clamp(max=length - 1)], -1)
        hidden_rows.append(states[positions])
        following_rows.append(following)
        if progress is not None:
            progress("hidden states", i + 1, len(prompts))
    return Distilled(torch.cat(hidden_rows), torch.cat(following_rows))


@dataclass
class HeadAccuracy:
    top1: list[float] = field(default_factory=list)  # per head
    topk: list[float] = field(default_factory=list)
    k: int = 5
    lm_head_top1: float = 0.0  # the LM head's own next-token accuracy: a check of the data


def accuracy(heads: MedusaHeads, data: Distilled, k: int = 5, batch: int = 512) -> HeadAccuracy:
    """Top-1 and top-k accuracy of each head on ``data`` (positions whose
    target lies past a text's end are left out)."""
    K = len(heads.blocks)
    hits1, hitsk, seen = torch.zeros(K), torch.zeros(K), torch.zeros(K)
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
                hits1[j] += float((top[j, :, 0] == want)[valid].sum())
                hitsk[j] += float((top[j] == want.unsqueeze(-1)).any(-1)[valid].sum())
                seen[j] += float(valid.sum())
    seen = seen.clamp_min(1)
    return HeadAccuracy((hits1 / seen).tolist(), (hitsk / seen).tolist(), k, lm_hits / max(1, lm_seen))


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
    steps = (len(train) + batch - 1) // batch
    for epoch in range(first_epoch, epochs):
        started = time.perf_counter()
        order = torch.randperm(len(train), generator=generator)
        for step in range(steps):
            pick = order[step * batch : (step + 1) * batch]
            logits = medusa(train.hidden[pick].to(dtype))  # [K, B, V]
            want = train.following[pick][:, 1 : heads + 1].T  # [K, B]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), want.reshape(-1), ignore_index=-1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None:
                progress(f"epoch {epoch + 1}/{epochs}", step + 1, steps)
        spent += time.perf_counter() - started
        torch.save({"blocks": medusa.blocks.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                    "seconds": spent, "fingerprint": fingerprint, "heads": heads}, checkpoint)
    scores = accuracy(medusa.eval(), held_out)
    details = {"hidden": hidden_size, "heads": heads, "epochs": epochs, "train_positions": len(train), "held_out_positions": len(held_out),
               "train_seconds": round(spent, 1), "held_out_top1": [round(a, 4) for a in scores.top1],
               f"held_out_top{scores.k}": [round(a, 4) for a in scores.topk], "lm_head_top1": round(scores.lm_head_top1, 4)}
    save_heads(out, medusa, "medusa", target_identity(model.config, tokenizer), **details)
    (out / "training.json").write_text(json.dumps(details, indent=1))
    return details


def offline_corpus(count: int, *, lines: int = 30) -> list[str]:
    """Prompts that exist on every machine, in a fixed order: the bench
    workloads' prompts, then the openings of Python's own standard-library
    modules (``lines`` lines each)."""
    import sysconfig

    from ..bench.workloads import WORKLOADS, prompts

    corpus = [p.text for p in prompts(list(WORKLOADS), None)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        if len(corpus) >= count:
            break
        try:
            text = "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines])
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            corpus.append(text)
    return corpus[:count]
