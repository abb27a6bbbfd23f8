"""A `Comparison` in words: the tables `gpudiag compare` prints and its page shows, as rows of
formatted text, so the terminal and the HTML read the same.

Each table shows the runs' values, then one "B vs A" column per later run with the change;
a change carries a verdict, worse (slower, more memory, more lost time, fewer samples/s or
less useful time) or better, which the terminal colors red or green and the page marks the
same way. A value a run cannot have (a waterfall without a timeline) is "n/a", its reason in
the notes; nothing shows as nan or in scientific notation. Runs are headed by letter (the
legend names them): two long file names cut to a narrow terminal would read the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from gpudiag.analyzers.compare import Comparison
from gpudiag.reports.formats import format_bytes, format_ns

SUMMARY_NAMES = {"wall_time_ns": "wall time (GPU window)",
                 "process_time_ns": "process wall time",
                 "step_time_ns": "step time (median, after warm-up)",
                 "steps": "steps", "warmup_steps": "warm-up steps", "samples_per_s": "samples/s",
                 "peak_reserved_bytes": "peak reserved GPU memory",
                 "peak_allocated_bytes": "peak allocated GPU memory",
                 "peak_cpu_bytes": "peak CPU tensor memory (profiler)",
                 "peak_rss_bytes": "peak resident memory (program)",
                 "kernel_time_ns": "kernel time", "kernels": "kernel launches"}
#: rows where a rise is an improvement (+1), a regression (-1), or neither (0)
BETTER_UP = {"samples_per_s": 1, "steps": 0, "warmup_steps": 0, "kernels": 0, "useful": 1,
             "count": 0}

Format = Callable[[float], str]


@dataclass(frozen=True)
class Cell:
    """One cell's text and its verdict: +1 better than the baseline, -1 worse, 0 neither."""

    text: str
    verdict: int = 0


@dataclass(frozen=True)
class TextTable:
    """A titled table of text cells; `footer` is a line said under it."""

    title: str
    header: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    footer: str | None = None
    wide: frozenset[int] = frozenset()  # columns of long text (wrap, left-aligned)
    hover: list[str] | None = None  # the first column's full text per row (kernel names)


def letter(i: int) -> str:
    """A run's column head: A, B, ... Z, then R27, R28, ..."""
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def legend(cmp: Comparison) -> str:
    """'A = fp32, B = bf16' (the baseline is A)."""
    return ", ".join(f"{letter(i)} = {label}" for i, label in enumerate(cmp.labels))


def tables(cmp: Comparison, top: int = 15) -> list[TextTable]:
    """Every table of the comparison, in the order both outputs show them; empty ones are
    left out."""
    found = [summary(cmp), *predicted(cmp), waterfall(cmp), kernels(cmp, top),
             counted("Collectives per op", "op", cmp.collectives, cmp.labels),
             counted("Sync points per kind", "kind", cmp.syncs, cmp.labels)]
    return [table for table in found if table is not None and table.rows]


def summary(cmp: Comparison) -> TextTable:
    table = TextTable("Runs", _header("metric", cmp.labels))
    for row, values in cmp.summary.iterrows():
        name = str(row)
        table.rows.append([Cell(SUMMARY_NAMES.get(name, name)),
                           *_cells(values, cmp.labels, _format_of(name),
                                   BETTER_UP.get(name, -1))])
    return table


def predicted(cmp: Comparison) -> list[TextTable]:
    """The baseline's findings a later run fixed, the saving each predicted, and what the
    run measured (per step when both runs have steps, else of the GPU window)."""
    out = []
    for run, rows in cmp.predicted.groupby("run", sort=False):
        steps = bool(rows["predicted_step_ns"].notna().all()
                     and rows["measured_step_ns"].notna().all())
        unit = "per step" if steps else "of the window"
        column = "predicted_step_ns" if steps else "predicted_ns"
        table = TextTable(f"Predicted vs measured: {cmp.baseline}'s findings fixed in {run} "
                          f"(saving {unit})",
                          ["cause", "where", "fix replayed", "lost before", "predicted"],
                          wide=frozenset({1, 2}))
        for row in rows.itertuples():
            table.rows.append([Cell(str(row.cause)), Cell(str(row.where)), Cell(str(row.fix)),
                               Cell(format_ns(row.lost_ns)),
                               Cell(na(getattr(row, column), format_ns))])
        measured = rows["measured_step_ns" if steps else "measured_wall_ns"].iloc[0]
        out.append(_with_footer(table, _measured(float(rows[column].sum()), measured, unit)))
    return out


def _measured(total: float, measured: float, unit: str) -> str:
    ratio = (f"; predicted / measured {total / measured:.2f}"
             if not math.isnan(measured) and measured > 0 else "")
    change = "n/a" if math.isnan(measured) else \
        f"{format_ns(abs(measured))} {unit} {'faster' if measured >= 0 else 'slower'}"
    return f"measured: {change} (predicted at most {format_ns(total)}{ratio})"


def _with_footer(table: TextTable, footer: str) -> TextTable:
    return TextTable(table.title, table.header, table.rows, footer, table.wide, table.hover)


def waterfall(cmp: Comparison) -> TextTable | None:
    """Lost time and share per cause; the change is shown in percentage points."""
    labels = cmp.labels
    if cmp.losses[labels].isna().all().all():
        return None
    table = TextTable("Where the GPU time went (summed over devices)",
                      _header("cause", labels))
    for cause, lost in cmp.losses.iterrows():
        share = cmp.shares.loc[cause]
        if not (lost[labels].fillna(0) > 0).any():
            continue
        runs = [Cell(na(lost[x], format_ns) + ("" if pd.isna(share[x])
                                               else f" ({100 * share[x]:.1f}%)"))
                for x in labels]
        better = BETTER_UP.get(str(cause), -1)
        moves = [Cell(_pp(share[f"pp:{x}"], lost[f"delta:{x}"]),
                      _verdict(share[f"pp:{x}"], better)) for x in labels[1:]]
        table.rows.append([Cell(str(cause)), *runs, *moves])
    return table


def kernels(cmp: Comparison, top: int) -> TextTable:
    shown = cmp.kernels.head(top)
    table = TextTable("Kernels with the largest time change (matched by name)",
                      _header("kernel", cmp.labels), wide=frozenset({0}),
                      hover=[str(name) for name in shown.index])
    for _, values in shown.iterrows():
        table.rows.append([Cell(str(values["short_name"])),
                           *_cells(values, cmp.labels, format_ns, -1)])
    return table


def counted(title: str, first: str, frame: pd.DataFrame, labels: list[str]) -> TextTable:
    """Collectives or syncs: '<count> / <time>' per key."""
    table = TextTable(title, _header(first, labels))
    if frame.empty:
        return table
    for key in frame.index.get_level_values(0).unique():
        rows = frame.loc[key]
        count, time = rows.loc["count"], rows.drop("count").iloc[0]  # the other: a time
        runs = [Cell(f"{na(count[x], _count)} / {format_ns(time[x])}") for x in labels]
        moves = [Cell(na(count[f"delta:{x}"], _signed(_count)) + " / "
                      + na(time[f"delta:{x}"], _signed(format_ns)),
                      _verdict(time[f"delta:{x}"], -1)) for x in labels[1:]]
        table.rows.append([Cell(str(key)), *runs, *moves])
    return table


# -- cells ----------------------------------------------------------------------------------


def _header(first: str, labels: list[str]) -> list[str]:
    return [first, *(letter(i) for i in range(len(labels))),
            *(f"{letter(i)} vs {letter(0)}" for i in range(1, len(labels)))]


def _cells(values: pd.Series, labels: list[str], fmt: Format, better_up: int) -> list[Cell]:
    """The runs' values, then each later run's change: absolute (relative)."""
    runs = [Cell(na(values[x], fmt)) for x in labels]
    moves = []
    for x in labels[1:]:
        rel = values[f"rel:{x}"]
        text = na(values[f"delta:{x}"], _signed(fmt))
        if not pd.isna(rel) and math.isfinite(rel) and rel != 0:
            text += f" ({100 * rel:+.1f}%)"
        moves.append(Cell(text, _verdict(values[f"delta:{x}"], better_up)))
    return runs + moves


def _verdict(change: float, better_up: int) -> int:
    if pd.isna(change) or change == 0 or better_up == 0:
        return 0
    return 1 if (change > 0) == (better_up > 0) else -1


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
    return f"{points:+.1f} pp, " + na(delta, _signed(format_ns))


def na(value: float, fmt: Format) -> str:
    """`fmt(value)`, or 'n/a' for a value the run does not have."""
    return "n/a" if pd.isna(value) else fmt(value)
