"""``bspec run`` over several prompt files or a .jsonl file: a batch that
prints one JSON line per prompt, in input order."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from typing import Sequence

from .._exceptions import BlackboxSpecError, PromptError
from .._stats import GenerationResult, GenerationStats
from ..client import SpecClient
from .api_client import _client, _load_drafter
from .common import EXIT_ERROR, _log, read_prompt
from .output import _json_object


@dataclass
class BatchItem:
    """One prompt of a batch, and where it came from."""

    source: str  # the file, or file:line for a .jsonl line
    prompt: str
    id: object = None
    max_tokens: int | None = None
    stop: list[str] | None = None


def read_batch(paths: Sequence[str]) -> list[BatchItem]:
    """Every prompt of ``paths``: a text file is one prompt, a .jsonl file
    one per line.  Any bad line is a :class:`PromptError` before anything runs."""
    items: list[BatchItem] = []
    for path in paths:
        if not path.endswith(".jsonl"):
            items.append(BatchItem(path, read_prompt(path)))
            continue
        text = read_prompt(path)
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                items.append(_batch_line(f"{path}:{number}", line))
    return items


def _batch_line(where: str, line: str) -> BatchItem:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise PromptError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("prompt"), str) or not data["prompt"]:
        raise PromptError(f'{where}: expected an object with a non-empty "prompt" string')
    unknown = set(data) - {"prompt", "id", "max_tokens", "stop"}
    if unknown:
        raise PromptError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: prompt, id, max_tokens, stop")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise PromptError(f"{where}: max_tokens must be a whole number >= 1")
    stop = data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop)):
        raise PromptError(f"{where}: stop must be a string or a list of non-empty strings")
    return BatchItem(where, data["prompt"], data.get("id"), max_tokens, stop)


@dataclass
class _Batch:
    """A batch under way: each prompt's outcome, and how many lines, in
    input order, are printed already."""

    args: argparse.Namespace
    items: list[BatchItem]
    outcomes: dict[int, GenerationResult | BlackboxSpecError] = field(default_factory=dict)
    streams: dict[int, GenerationResult] = field(default_factory=dict)  # started, finished or not
    printed: int = 0
    failed: int = 0

    def line(self, index: int, model: str | None) -> str:
        """The JSON line of prompt ``index``: its text and stats, or its error and the partial text."""
        item, outcome = self.items[index], self.outcomes[index]
        if isinstance(outcome, BlackboxSpecError):
            partial = outcome.partial if isinstance(outcome.partial, GenerationResult) else GenerationResult("", GenerationStats())
            data = _json_object(partial, model, outcome.message)
        else:
            data = _json_object(outcome, model)
        head = {"index": index, "source": item.source} | ({"id": item.id} if item.id is not None else {})
        return json.dumps(head | data, ensure_ascii=False)

    def flush(self, model: str | None) -> None:
        """Print every line whose prompts before it are done."""
        while self.printed in self.outcomes:
            print(self.line(self.printed, model), flush=True)
            self.printed += 1

    async def one(self, client: SpecClient, gate: asyncio.Semaphore, index: int, item: BatchItem) -> None:
        async with gate:
            stream = client.stream(item.prompt, max_tokens=item.max_tokens or self.args.max_tokens, stop=item.stop or self.args.stop)
            self.streams[index] = stream.result
            try:
                async for _ in stream:
                    pass
                self.outcomes[index] = stream.result
            except BlackboxSpecError as exc:
                self.outcomes[index] = exc
                self.failed += 1
        if not self.args.quiet:
            outcome = self.outcomes[index]
            how = f"failed: {outcome}" if isinstance(outcome, BlackboxSpecError) else f"{outcome.stats.output_tokens} tokens in {outcome.stats.wall_s:.1f}s"
            _log(f"{len(self.outcomes)}/{len(self.items)} {item.source}: {how}")
        self.flush(client.model)

    def print_rest(self, model: str | None) -> None:
        """Interrupted: the lines not printed yet, of prompts finished or
        under way (partial, marked interrupted); none of those not started."""
        for index, result in self.streams.items():
            if index not in self.outcomes:
                result.stats.interrupted = True
                self.outcomes[index] = result
        for index in sorted(i for i in self.outcomes if i >= self.printed):
            print(self.line(index, model), flush=True)


async def _run_batch(args: argparse.Namespace) -> int:
    """Every prompt, ``--concurrency`` at a time; one JSON line each, in input
    order, printed as soon as the prompts before it are done."""
    batch = _Batch(args, read_batch(args.prompt_files))
    async with _client(args) as client:
        await _load_drafter(args, client)
        gate = asyncio.Semaphore(args.concurrency)
        try:
            await asyncio.gather(*(batch.one(client, gate, i, item) for i, item in enumerate(batch.items)))
        finally:
            batch.print_rest(client.model)
    if not args.quiet:
        ok = len(batch.items) - batch.failed
        _log(f"batch: {ok} of {len(batch.items)} prompts completed" + (f", {batch.failed} failed (their lines carry an error)" if batch.failed else ""))
    return EXIT_ERROR if batch.failed else 0
