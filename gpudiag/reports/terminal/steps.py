"""Terminal rendering of the training steps and the host-side step breakdown.

Reads the `steps` and `host` parts of `Diagnosis.to_dict()` (see `analyzers.steps` and
`analyzers.host_steps`); nothing here computes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.findings import format_ns
from gpudiag.analyzers.host.categories import CATEGORIES
from gpudiag.reports.safe_text import terminal as safe

#: per-step rows shown before the rest is summarized in one line
MAX_STEP_ROWS = 30
#: processes whose host breakdown is listed (a job of many ranks: the first ones)
MAX_PROCESSES = 4

_LABELS = {"data_loading": "data loading", "optimizer": "optimizer", "backward": "backward",
           "compile": "compile", "forward": "forward", "other_ops": "other ops",
           "ops": "framework ops", "python": "Python between ops"}


def print_steps(dx: dict[str, Any], console: Console) -> None:
    """The steps line, the host time per step by category, the top ops by self time, the
    CPU memory peak and, with `--steps`, the host time of every step."""
    steps = dx.get("steps") or {}
    if steps.get("count"):
        console.print(f"[bold]Steps[/bold]: {safe(steps_line(steps))}", highlight=False)
    host = dx.get("host") or {}
    _breakdown(host.get("breakdown") or [], console)
    _top_ops(host.get("top_ops") or [], console)
    _memory([row for row in host.get("memory") or [] if row.get("peak_bytes") is not None],
            console)
    if host.get("by_step"):
        _by_step(host["by_step"], console)


#: what the peak is: the profiler's running total of CPU tensor allocations, not the RSS
_MEMORY_TITLE = "CPU tensor memory peak (profiler)"
MEMORY_ROWS = 10


def _memory(rows: list[dict[str, Any]], console: Console) -> None:
    """One line for one process; a table naming each process for several (the largest
    first, MEMORY_ROWS of them): a line per process without its name says nothing."""
    if len(rows) == 1:
        console.print(f"[bold]{_MEMORY_TITLE}[/bold]: {_peak(rows[0])}", highlight=False)
        return
    if not rows:
        return
    rows = sorted(rows, key=lambda row: -float(row["peak_bytes"]))
    table = Table(title=f"{_MEMORY_TITLE}, per process", title_justify="left")
    for col, justify in (("process", "left"), ("peak", "right"), ("in", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows[:MEMORY_ROWS]:
        table.add_row(safe(_process(row)), _bytes(row["peak_bytes"]),
                      safe(row.get("peak_step") or ""))
    console.print(table)
    if len(rows) > MEMORY_ROWS:
        console.print(f"... and {len(rows) - MEMORY_ROWS:,} more processes", highlight=False)


def _peak(row: dict[str, Any]) -> str:
    at = f" (in {safe(row['peak_step'])})" if row.get("peak_step") else ""
    return f"{_bytes(row['peak_bytes'])}{at}"


def steps_line(steps: dict[str, Any]) -> str:
    """'20 (torch optimizer steps: Optimizer.step#Adam.step, 20 calls); median 186 ms'."""
    text = (f"{steps['count']} ({steps['method_text']}: {steps['detail']}); "
            f"median {format_ns(steps['median_ns'])}")
    if steps.get("warmup"):
        text += (f"; {steps['warmup']} warm-up step{'s' if steps['warmup'] > 1 else ''} "
                 f"({format_ns(steps['warmup_ns'])}) left out of the median")
    return text


def _breakdown(rows: list[dict[str, Any]], console: Console) -> None:
    shown = [r for r in rows if r["time_ns"] or r["warmup_ns"]]
    if not shown:
        return
    table = Table(title="Host time per step, by category (steps after warm-up)",
                  title_justify="left")
    processes = list(dict.fromkeys((r["rank"], r["pid"]) for r in shown))
    several = len(processes) > 1
    if len(processes) > MAX_PROCESSES:  # a job of many ranks: the first few
        kept = set(processes[:MAX_PROCESSES])
        shown = [r for r in shown if (r["rank"], r["pid"]) in kept]
    for col in (["process"] if several else []) + ["category", "per step", "share",
                                                     "warm-up"]:
        table.add_column(col, justify="left" if col in ("process", "category") else "right")
    for r in shown:
        cells = [safe(_label(r["category"])), format_ns(r["per_step_ns"]), _percent(r["share"]),
                 format_ns(r["warmup_ns"]) if r["warmup_ns"] else "-"]
        table.add_row(*([safe(_process(r))] if several else []), *cells)
    console.print(table)
    if len(processes) > MAX_PROCESSES:
        console.print(f"[dim]... {len(processes) - MAX_PROCESSES:,} more processes "
                      "(`--json` lists all)[/dim]", highlight=False)


def _top_ops(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    table = Table(title="Top host ops by self time (steps after warm-up)", title_justify="left")
    for col, justify in (("op", "left"), ("calls", "right"), ("self time", "right"),
                         ("share", "right")):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        table.add_row(safe(r["name"]), f"{r['calls']:,}", format_ns(r["self_ns"]),
                      _percent(r["share"]))
    console.print(table)


def _by_step(rows: list[dict[str, Any]], console: Console) -> None:
    used = [c for c in CATEGORIES if any(r.get(f"{c}_ns") for r in rows)]
    table = Table(title="Host time by step", title_justify="left")
    for col in ("step", "time", *(_label(c) for c in used)):
        table.add_column(col, justify="left" if col == "step" else "right")
    for r in rows[:MAX_STEP_ROWS]:
        name = str(r["step"]) + (" (warm-up)" if r.get("warmup") else "") + \
            ("" if r.get("profiled", True) else " (not profiled)")
        table.add_row(safe(name), format_ns(r["dur_ns"]),
                      *(format_ns(r[f"{c}_ns"]) if r[f"{c}_ns"] else "-" for c in used))
    console.print(table)
    if len(rows) > MAX_STEP_ROWS:
        console.print(f"[dim]... {len(rows) - MAX_STEP_ROWS} more steps (--json has them "
                      "all)[/dim]", highlight=False)


def _label(category: str) -> str:
    return _LABELS.get(category, category)


def _process(row: dict[str, Any]) -> str:
    rank = row.get("rank")
    pid = row.get("pid")
    return (f"r{rank} " if rank not in (None, -1) else "") + (f"pid {pid}" if pid else "?")


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _bytes(n: float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"
