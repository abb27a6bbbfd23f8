"""Terminal rendering of a many-rank job's stragglers: one headline naming the rank that
held the others back, the waterfall per rank (worst first), the ranks that arrived last at
collectives and the slowest rank per step.

Reads `Diagnosis.to_dict()["stragglers"]` (`analyzers.stragglers`); nothing here computes
a diagnosis. Whatever the number of ranks, the tables stay a screen long: the worst
`MAX_ROWS` rows, then one line saying what the rest hold.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.findings import LOSS_CAUSES, format_ns
from gpudiag.reports.safe_text import terminal as safe

#: rows per table before the rest is summed up in one line
MAX_ROWS = 10
_SHORT = {"sync_stall": "sync", "launch_bound": "launch", "host_bound": "host",
          "comm_wait": "comm wait", "small_grid": "small grid"}


def print_stragglers(dx: dict[str, Any], console: Console) -> None:
    """The headline and the three tables, each where its data exists."""
    parts = dx.get("stragglers") or {}
    late = parts.get("late_arrivals") or []
    steps = parts.get("step_stragglers") or []
    line = headline(late, steps)
    if line:
        console.print(f"[bold]Straggler[/bold]: {safe(line)}", highlight=False)
    _ranks(parts.get("rank_losses") or [], console)
    _late(late, console)
    _steps(steps, console)


def headline(late: list[dict[str, Any]], steps: list[dict[str, Any]]) -> str | None:
    """'rank 3 arrived last at 80 of 80 collectives (chance: 25%) ...': the rank whose late
    arrivals cost the others the most waiting, or None without matched collectives."""
    if not late:
        return None
    caused: dict[int, int] = defaultdict(int)
    last: dict[int, int] = defaultdict(int)
    calls = {row["op"]: row["op_calls"] for row in late}
    for row in late:
        caused[row["rank"]] += row["caused_wait_ns"]
        last[row["rank"]] += row["last_calls"]
    rank = max(caused, key=lambda r: (caused[r], last[r], -r))
    total = sum(calls.values())
    ranks = max(row["ranks"] for row in late)
    text = (f"rank {rank} arrived last at {last[rank]:,} of {total:,} collectives "
            f"(chance: {1 / ranks:.0%}); the others waited {format_ns(caused[rank])} for it")
    slow = [row for row in steps if row["excess_ns"] > 0]
    if slow:
        mine = sum(row["slowest_rank"] == rank for row in slow)
        text += f"; slowest rank in {mine} of {len(slow)} steps that had one"
    return text


def _ranks(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    causes = [c for c in LOSS_CAUSES if any(row[f"{c}_share"] for row in rows)]
    table = Table(title=f"Per rank, least useful first ({len(rows):,} ranks)",
                  title_justify="left")
    for col in ("rank", "window", *(_SHORT.get(c, c) for c in causes)):
        table.add_column(col, justify="left" if col == "rank" else "right")
    for row in rows[:MAX_ROWS]:
        table.add_row(str(row["rank"]), format_ns(row["window_ns"]),
                      *(_share(row[f"{c}_share"]) for c in causes))
    console.print(table)
    if len(rows) > MAX_ROWS:
        useful = sorted(row["useful_share"] for row in rows if row["useful_share"] is not None)
        best = rows[-1]
        console.print(f"[dim]... {len(rows) - MAX_ROWS:,} more ranks; useful share median "
                      f"{_share(useful[len(useful) // 2] if useful else None)}, best rank "
                      f"{best['rank']} {_share(best['useful_share'])} (`--json` lists all)"
                      "[/dim]", highlight=False)


def _late(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    table = Table(title="Arrived last at collectives (the other ranks waited for it)",
                  title_justify="left")
    table.add_column("op", no_wrap=True)
    for col, justify in (("rank", "left"), ("last at", "right"),
                         ("skew median", "right"), ("skew max", "right"),
                         ("others waited", "right"), ("margin", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows[:MAX_ROWS]:
        table.add_row(safe(row["op"]), str(row["rank"]),
                      f"{row['last_calls']:,}/{row['op_calls']:,} ({row['share']:.0%})",
                      format_ns(row["skew_median_ns"]), format_ns(row["skew_max_ns"]),
                      format_ns(row["caused_wait_ns"]), format_ns(row["margin_ns"]))
    console.print(table)
    _more(len(rows), "(op, rank) rows", console)
    console.print("[dim]margin: how much earlier those calls would start were that rank only "
                  "as late as the next one[/dim]", highlight=False)


def _steps(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    shown = rows
    title = "Slowest rank per step"
    if len(rows) > MAX_ROWS:
        worst = sorted(rows, key=lambda row: -row["excess_ns"])[:MAX_ROWS]
        shown = sorted(worst, key=lambda row: row["index"])
        title += f" (the {MAX_ROWS} of {len(rows):,} steps with the most excess)"
    table = Table(title=title, title_justify="left")
    table.add_column("step", no_wrap=True)
    for col in ("slowest", "excess", "median", "last at calls", "others waited"):
        table.add_column(col, justify="left" if col in ("slowest", "last at calls")
                         else "right")
    for row in shown:
        last = "-" if row["last_rank"] is None else \
            f"rank {row['last_rank']} ({row['last_calls']:,})"
        slowest = f"rank {row['slowest_rank']}" if row["excess_ns"] else "- (equal)"
        table.add_row(safe(row["step"]) + (" (warm-up)" if row["warmup"] else ""),
                      slowest, format_ns(row["excess_ns"]), format_ns(row["median_ns"]), last,
                      format_ns(row["caused_wait_ns"]))
    console.print(table)


def _more(count: int, what: str, console: Console) -> None:
    if count > MAX_ROWS:
        console.print(f"[dim]... {count - MAX_ROWS:,} more {what} (`--json` lists all)[/dim]",
                      highlight=False)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
