"""Terminal rendering (rich) of a `gpudiag.analyzers.compare.Comparison`. Colors only on a terminal.

Each table shows the runs' values, then one "vs <baseline>" column per later run with the
change; a change is red when it is worse (slower, more memory, more lost time, fewer
samples/s or less useful time) and green when better, so a reviewer sees the verdict
before reading the numbers. A value a run cannot have (a waterfall without a timeline) is
"n/a", its reason in the notes below the tables; nothing prints as nan.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.compare import Comparison
from gpudiag.reports.formats import format_bytes, format_ns
from gpudiag.reports.safe_text import terminal as safe

_SUMMARY_NAMES = {"wall_time_ns": "wall time (GPU window)",
                  "process_time_ns": "process wall time",
                  "step_time_ns": "step time (median, after warm-up)",
                  "steps": "steps", "warmup_steps": "warm-up steps", "samples_per_s": "samples/s",
                  "peak_reserved_bytes": "peak reserved memory",
                  "peak_allocated_bytes": "peak allocated memory",
                  "peak_cpu_bytes": "peak CPU memory",
                  "kernel_time_ns": "kernel time", "kernels": "kernel launches"}
#: rows where a rise is an improvement (+1), a regression (-1), or neither (0)
_BETTER_UP = {"samples_per_s": 1, "steps": 0, "warmup_steps": 0, "kernels": 0, "useful": 1,
              "count": 0}

Format = Callable[[float], str]


def print_comparison(comparison: Comparison, console: Console, top: int = 15) -> None:
    """Print a comparison as a few compact tables, the baseline first.

        from rich.console import Console
        cmp = gpudiag.analyzers.compare.compare([a, b], ["before", "after"])
        print_comparison(cmp, Console())
    """
    labels = comparison.labels
    legend = ", ".join(f"{_letter(i)} = {safe(label)}" for i, label in enumerate(labels))
    console.print(f"[bold]Runs[/bold] (baseline {_letter(0)}): {legend}", highlight=False)
    _summary(comparison, console)
    _predicted(comparison, console)
    _waterfall(comparison, console)
    _kernels(comparison, console, top)
    for title, table in (("Collectives per op", comparison.collectives),
                         ("Sync points per kind", comparison.syncs)):
        _counted(title, table, labels, console)
    for note in comparison.notes:
        console.print(f"[dim]note[/dim]: {safe(note)}", highlight=False)


def _summary(comparison: Comparison, console: Console) -> None:
    table = _table("Runs", "metric", comparison.labels)
    for row, values in comparison.summary.iterrows():
        name = str(row)
        fmt = _format_of(name)
        table.add_row(safe(_SUMMARY_NAMES.get(name, name)), *_cells(values, comparison.labels, fmt,
                                                               _BETTER_UP.get(name, -1)))
    console.print(table)


def _predicted(comparison: Comparison, console: Console) -> None:
    """The baseline's findings a later run fixed, the saving each predicted, and what the
    run measured (per step when both runs have steps, else of the GPU window)."""
    found = comparison.predicted
    if found.empty:
        return
    for run, rows in found.groupby("run", sort=False):
        steps = bool(rows["predicted_step_ns"].notna().all()
                     and rows["measured_step_ns"].notna().all())
        unit = "per step" if steps else "of the window"
        table = Table(title=f"Predicted vs measured: {safe(comparison.baseline)}'s findings "
                            f"fixed in {safe(str(run))} (saving {unit})",
                      title_justify="left")
        for col, justify in (("cause", "left"), ("where", "left"), ("fix replayed", "left"),
                             ("lost before", "right"), ("predicted", "right")):
            table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
        column = "predicted_step_ns" if steps else "predicted_ns"
        for row in rows.itertuples():
            table.add_row(safe(str(row.cause)), safe(str(row.where)), safe(str(row.fix)),
                          format_ns(row.lost_ns), format_ns(getattr(row, column)))
        console.print(table)
        measured = rows["measured_step_ns" if steps else "measured_wall_ns"].iloc[0]
        total = float(rows[column].sum())
        ratio = (f"; predicted / measured {total / measured:.2f}" if measured and
                 not math.isnan(measured) and measured > 0 else "")
        change = "n/a" if math.isnan(measured) else \
            f"{format_ns(abs(measured))} {unit} {'faster' if measured >= 0 else 'slower'}"
        console.print(f"measured: {change} (predicted at most {format_ns(total)}{ratio})",
                      highlight=False)


def _waterfall(comparison: Comparison, console: Console) -> None:
    """Lost time and share per cause; the change is shown in percentage points."""
    labels = comparison.labels
    if comparison.losses[labels].isna().all().all():
        return
    table = _table("Where the GPU time went (summed over devices)", "cause", labels)
    for cause, lost in comparison.losses.iterrows():
        share = comparison.shares.loc[cause]
        if not (lost[labels].fillna(0) > 0).any():
            continue
        runs = [_na(lost[x], format_ns) + ("" if pd.isna(share[x])
                                           else f" ({100 * share[x]:.1f}%)") for x in labels]
        better = _BETTER_UP.get(str(cause), -1)
        moves = [_colored(_pp(share[f"pp:{x}"], lost[f"delta:{x}"]), share[f"pp:{x}"], better)
                 for x in labels[1:]]
        table.add_row(safe(cause), *runs, *moves)
    console.print(table)


def _kernels(comparison: Comparison, console: Console, top: int) -> None:
    frame = comparison.kernels.head(top)
    if frame.empty:
        return
    table = _table("Kernels with the largest time change (matched by name)", "kernel",
                   comparison.labels)
    for _, values in frame.iterrows():
        table.add_row(safe(values["short_name"]), *_cells(values, comparison.labels, format_ns,
                                                         -1))
    console.print(table)


def _counted(title: str, frame: pd.DataFrame, labels: list[str], console: Console) -> None:
    """Collectives or syncs: '<count> / <time>' per key."""
    if frame.empty:
        return
    table = _table(title, safe(frame.index.names[0]), labels)
    for key in frame.index.get_level_values(0).unique():
        rows = frame.loc[key]
        count, time = rows.loc["count"], rows.drop("count").iloc[0]  # the other: a time
        runs = [f"{_na(count[x], _count)} / {format_ns(time[x])}" for x in labels]
        moves = [_colored(_na(count[f"delta:{x}"], _signed(_count)) + " / "
                          + _na(time[f"delta:{x}"], _signed(format_ns)),
                          time[f"delta:{x}"], -1) for x in labels[1:]]
        table.add_row(safe(key), *runs, *moves)
    console.print(table)


# -- cells ----------------------------------------------------------------------------------


def _table(title: str, first: str, labels: list[str]) -> Table:
    """Runs are headed by letter (legend above): cut to a narrow terminal, two long file
    names would otherwise read the same."""
    table = Table(title=title, title_justify="left")
    table.add_column(first, overflow="fold")
    for i in range(len(labels)):
        table.add_column(_letter(i), justify="right")
    for i in range(1, len(labels)):
        table.add_column(f"{_letter(i)} vs {_letter(0)}", justify="right")
    return table


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def _cells(values: pd.Series, labels: list[str], fmt: Format, better_up: int) -> list[str]:
    """The runs' values, then each later run's change: absolute (relative)."""
    runs = [_na(values[x], fmt) for x in labels]
    moves = []
    for x in labels[1:]:
        rel = values[f"rel:{x}"]
        text = _na(values[f"delta:{x}"], _signed(fmt))
        if not pd.isna(rel) and math.isfinite(rel) and rel != 0:
            text += f" ({100 * rel:+.1f}%)"
        moves.append(_colored(text, values[f"delta:{x}"], better_up))
    return runs + moves


def _colored(text: str, change: float, better_up: int) -> str:
    if pd.isna(change) or change == 0 or better_up == 0:
        return text
    good = (change > 0) == (better_up > 0)
    return f"[{'green' if good else 'red'}]{text}[/]"


def _format_of(row: str) -> Format:
    if row.endswith("_ns"):
        return format_ns
    if row.endswith("_bytes"):
        return lambda v: format_bytes(int(v))
    if row == "samples_per_s":
        return lambda v: f"{v:,.1f}"
    return _count


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _signed(fmt: Format) -> Format:
    """'+1.2 ms' / '-3 GiB': the formatters print magnitudes, so the sign goes in front."""
    return lambda v: "0" if v == 0 else ("+" if v > 0 else "-") + fmt(abs(v))


def _pp(points: float, delta: float) -> str:
    """'+1.2 pp, +3 ms': a share's change in percentage points and the time's; 'n/a' when
    either run has no waterfall."""
    if pd.isna(points):
        return "n/a"
    return f"{points:+.1f} pp, " + _na(delta, _signed(format_ns))


def _na(value: float, fmt: Format) -> str:
    return "n/a" if pd.isna(value) else fmt(value)
