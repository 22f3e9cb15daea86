"""Show a bench report: a terminal table, a JSON file, PNG plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .._exceptions import ConfigurationError
from .runner import Report


def print_report(report: Report, console: Console | None = None) -> None:
    # Piped to a file or a CI log: wide enough that no column is cut.
    console = console or Console(width=None if sys.stdout.isatty() else 220)
    table = Table(title=f"bspec bench: {report.server.get('name', '')} {report.server.get('model', '')} (medians of {report.repeats})")
    columns = ("prompt", "workload", "config", "speedup", "oracle", "share", "plain s", "spec s", "tokens", "tok/round (oracle)",
               "accept", "calls/tok", "requests", "prompt tokens sent", "output generated", "bill vs plain", "same")
    for column in columns:
        table.add_column(column, justify="left" if column in ("prompt", "workload", "config") else "right")
    for r in report.rows():
        table.add_row(
            r["prompt"], r["workload"], r["config"], f"{r['speedup']:.2f}x", _x(r.get("oracle_speedup")), _pct(r.get("share_of_oracle")),
            f"{r['plain_s']:.2f}", f"{r['spec_s']:.2f}", str(r["tokens"]),
            f"{r['tokens_per_round']:.1f} ({_num(r.get('oracle_tokens_per_round'))})", f"{r['acceptance']:.0%}", f"{r['calls_per_token']:.2f}",
            str(r["requests"]), _sent(r), f"{r['output_tokens_generated']} vs {r['output_tokens_generated_plain']}", _x(r.get("bill_vs_plain")),
            "yes" if r["identical"] else ("near-tie" if not any("MISMATCH" in d for d in r["divergences"]) else "NO"),
        )
    console.print(table)
    totals = Table(title="per workload: median speedup over prompts; total = sum plain / sum spec; the copy-oracle's total beside it; "
                         f"bills at {report.price} per million tokens, {_bill_source(report)}")
    for column in ("workload", "config", "prompts", "median speedup", "total speedup", "oracle total", "least share", "prompt sent vs plain", "bill vs plain",
                   "acceptance", "identical"):
        totals.add_column(column)
    for t in report.totals().values():
        totals.add_row(t["workload"], t["config"], str(t["prompts"]), f"{t['median_speedup']:.2f}x", f"{t['total_speedup']:.2f}x",
                       _x(t.get("oracle_total_speedup")), _pct(t.get("min_share_of_oracle")), _x(t.get("prompt_tokens_sent_ratio")),
                       _x(t.get("bill_vs_plain")), f"{t['acceptance']:.0%}", _same(t))
    console.print(totals)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _sent(row: dict) -> str:
    cached = f" ({row['cached_tokens']} cached)" if row.get("cached_tokens") else ""
    return f"{row['prompt_tokens_sent']}{cached} vs {row['prompt_tokens_sent_plain']}"


def _bill_source(report: Report) -> str:
    by = {r.get("bill_by") for r in report.rows()}
    return "as the server counted them" if by == {"server"} else "as the client counted them (closed streams estimated)"


def _same(total: dict) -> str:
    if total["identical"]:
        return "yes"
    if total.get("mismatches", 1) == 0:
        return f"near-ties only ({total['near_ties']})"
    return "NO"


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")


def acceptance_by_position(report: Report, config: str, positions: int = 32, chars_per_token: float = 3.5) -> list[float | None]:
    """For draft positions 1..``positions``: the share of drafts reaching that
    position whose token there was accepted, over every round of ``config``
    (echo rounds and side-branch groups; the drafted length in tokens is
    estimated from its characters).  None where no draft reached."""
    reached = [0] * positions
    accepted = [0] * positions
    for cell in report.cells:
        if cell.config != config:
            continue
        for run in cell.runs:
            for entry in run.stats.get("trace", []):
                kind, drafted_chars, accepted_tokens = entry[0], entry[1], entry[2]
                if kind == "stream" or not drafted_chars:
                    continue
                drafted = max(1, round(drafted_chars / chars_per_token))
                for k in range(min(drafted, positions)):
                    reached[k] += 1
                    accepted[k] += accepted_tokens > k
    return [a / r if r else None for a, r in zip(accepted, reached)]


def write_plots(report: Report, folder: Path) -> list[Path]:
    """``speedup.png`` (per prompt, grouped by workload), ``acceptance.png``
    (target tokens gained per round) and ``acceptance_by_position.png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigurationError("plots need matplotlib: pip install 'blackbox-spec[bench]' (or pass --no-plots)") from None
    folder.mkdir(parents=True, exist_ok=True)
    rows = report.rows()
    configs = report.configs
    names = list(dict.fromkeys(r["prompt"] for r in rows))
    workloads = {r["prompt"]: r["workload"] for r in rows}
    written = []
    for key, ylabel, filename, reference in (
        ("speedup", "speedup over plain (median wall time)", "speedup.png", 1.0),
        ("accepted_per_round", "target tokens gained per round (median)", "acceptance.png", None),
    ):
        fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(names) * len(configs)), 4.8))
        width = 0.8 / max(1, len(configs))
        for k, config in enumerate(configs):
            values = [next((r[key] for r in rows if r["prompt"] == n and r["config"] == config), 0) for n in names]
            ax.bar([i + k * width for i in range(len(names))], values, width, label=config)
        if reference is not None:
            ax.axhline(reference, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(names))])
        ax.set_xticklabels([f"{n}\n({workloads[n]})" for n in names], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{report.server.get('name', '')} {report.server.get('model', '')}")
        ax.legend()
        fig.tight_layout()
        path = folder / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for config in configs:
        rates = acceptance_by_position(report, config)
        points = [(k + 1, r) for k, r in enumerate(rates) if r is not None]
        if points:
            ax.plot([k for k, _ in points], [r for _, r in points], marker="o", markersize=3, label=config)
    ax.set_xlabel("draft position (target tokens; drafted length estimated from characters)")
    ax.set_ylabel("share accepted, of drafts reaching it")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"acceptance per draft position: {report.server.get('name', '')} {report.server.get('model', '')}")
    ax.legend()
    fig.tight_layout()
    path = folder / "acceptance_by_position.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    written.append(_frontier_plot(report, folder, plt))
    return written


def _frontier_plot(report: Report, folder: Path, plt) -> Path:
    """``frontier.png``: total speedup against the bill, both over plain,
    one point per configuration (``--max-cost``) and workload, the
    copy-oracle under the same limit beside each."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    totals = [t for t in report.totals().values() if t["workload"] != "all" and t.get("bill_vs_plain")]
    for workload in dict.fromkeys(t["workload"] for t in totals):
        points = sorted((t["bill_vs_plain"], t["total_speedup"], t["config"], t.get("oracle_total_speedup")) for t in totals if t["workload"] == workload)
        line = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"bspec, {workload}")[0]
        for bill, speed, config, _ in points:
            ax.annotate(config.split(" ", 1)[-1], (bill, speed), fontsize=7, xytext=(3, 3), textcoords="offset points")
        oracle = [(p[0], p[3]) for p in points if p[3]]
        if oracle:
            ax.plot([o[0] for o in oracle], [o[1] for o in oracle], linestyle=":", marker="x", color=line.get_color(), label=f"copy-oracle at the same limit, {workload}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"bill over plain's (at {report.price} per million tokens)")
    ax.set_ylabel("total speedup over plain")
    ax.set_title(f"speed against bill: {report.server.get('name', '')} {report.server.get('model', '')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = folder / "frontier.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_report(path: Path) -> dict:
    """A saved ``bench.json`` (a folder holding one will do), or a one-line error."""
    path = path / "bench.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"no bench report at {path}") from None
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read bench report {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigurationError(f"{path} is not a bench report (no rows)")
    return data


def compare_reports(before: dict, after: dict, console: Console | None = None, names: tuple[str, str] = ("A", "B")) -> list[dict]:
    """Speedups of the prompts and configurations both reports ran, side by
    side; prints a table and returns its rows."""
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    index = {(r["prompt"], r["config"]): r for r in before["rows"]}
    rows = []
    for r in after["rows"]:
        old = index.get((r["prompt"], r["config"]))
        if old is None:
            continue
        rows.append({"prompt": r["prompt"], "workload": r["workload"], "config": r["config"],
                     "before": old["speedup"], "after": r["speedup"], "change": round(r["speedup"] / old["speedup"], 3) if old["speedup"] else None,
                     "identical": bool(old["identical"] and r["identical"])})
    if not rows:
        raise ConfigurationError("the two reports share no prompt and configuration to compare")
    a, b = names
    table = Table(title=f"bspec bench --compare: speedup over plain (each against plain in its own run)\nbefore: {a}\nafter: {b}")
    for column in ("prompt", "workload", "config", "before", "after", "change", "same text"):
        table.add_column(column, justify="left" if column in ("prompt", "workload", "config") else "right")
    for row in rows:
        change = "" if row["change"] is None else f"{row['change']:.2f}x"
        table.add_row(row["prompt"], row["workload"], row["config"], f"{row['before']:.2f}x", f"{row['after']:.2f}x", change, "yes" if row["identical"] else "NO")
    import statistics

    ratios = [row["change"] for row in rows if row["change"]]
    table.caption = f"{len(rows)} rows; median change {statistics.median(ratios):.2f}x" if ratios else f"{len(rows)} rows"
    console.print(table)
    return rows
