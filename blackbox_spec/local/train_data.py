"""The data heads train on, from the target itself (steps 1 and 2 of
:mod:`.train_heads`): its own greedy continuations of the prompts, and one
teacher-forced forward per text for the last hidden state after every token."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .._exceptions import ConfigurationError

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
