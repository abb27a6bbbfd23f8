"""The `gpudiag heatmap report.ncu-rep` figure: kernels x the metrics that explain them.

Rows are kernels (grouped by name, or every launch), ordered by GPU time; columns are the
Nsight Compute numbers a reader needs to see *why* a kernel is slow; each cell is colored by
how far its value is from healthy and shows the raw value, with the kernel's full name and
ncu's own rule findings on hover. Every number comes from
`gpudiag.analyzers.kernels.metrics` (this module never reads ncu, and decides nothing the
analyzer has not: it only scores distances from the thresholds below).

Health scores (`health`) are in [0, 1]: 0 on the healthy side of a metric's threshold; past
it 0.5 + 0.5 x (distance past the threshold / distance from the threshold to `worst`),
so every marked cell is at least 0.5 (visibly marked) and reaches 1 at `worst`. NA where
the value (or a partner value the rule needs) is missing, and for metrics that have no
healthy range of their own. Thresholds (`METRICS`, REFERENCE.md B3 for ncu's numbers):

- SM throughput < 60 %, only while memory throughput is < 60 % too: ncu SOLBottleneck's
  `latency_bound_threshold` (a low SM share of a memory-bound kernel is right);
- memory throughput < 50 % (`kernel_metrics(memory_throughput_min=50)`: no memory unit half
  busy), only while SM throughput < 60 % (a compute-bound kernel rightly leaves memory idle);
- achieved occupancy: theoretical - achieved > 10 points (ncu AchievedOccupancy), worst 100;
- theoretical occupancy < 80 % (ncu TheoreticalOccupancy);
- waves per SM < 1 (ncu SOLBottleneck `waves_threshold`: Small Grid); a partial last wave
  after 1-4 full waves scores 0.5 (ncu's Tail Effect, reported from a 20 % speedup
  1/(1 + full waves), i.e. up to 4 full waves);
- L2 hit rate < 62 % (`kernel_metrics(l2_hit_rate_min=62)`, our heuristic: ncu has no
  hit-rate rule, B3 lists only the metric);
- not scored, shown as context: L1 hit rate (a streaming kernel rightly misses), DRAM
  throughput (high is the goal of a memory-bound kernel), registers and shared memory (they
  say *why* theoretical occupancy is low, which that column scores).

Columns a report did not collect (`--set basic` has no memory workload analysis; custom
section lists lack more) are dropped from the figure and named in its title, never shown
as zeros; a kernel ncu could not profile at all (every metric empty) says so across its
row. The figure is bounded: `top` rows (default 50), the rest summarized in the title.
Every string from the input is HTML-escaped before it becomes figure data (plotly renders
a subset of HTML in labels and hover text), and plotly's JSON escapes `<`, `>` and `/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.kernels import metrics as ncu_metrics
from gpudiag.errors import InputError
from gpudiag.reports.safe_text import plotly_label
from gpudiag.trace import Trace


@dataclass(frozen=True)
class Metric:
    """One heatmap column: its label and unit, and the threshold its health is scored by
    (`limit` None: shown for context, not scored)."""

    label: str
    unit: str
    limit: float | None = None
    worst: float = 0.0
    partner: str | None = None  # scored only while this column is below `partner_limit`
    partner_limit: float = 60.0


#: heatmap columns in display order (kernel_metrics column -> how it is shown and scored)
METRICS: Mapping[str, Metric] = {
    "sm_throughput_pct": Metric("SM throughput", "%", 60.0, partner="memory_throughput_pct"),
    "memory_throughput_pct": Metric("memory throughput", "%", 50.0,
                                    partner="sm_throughput_pct"),
    "achieved_occupancy_pct": Metric("achieved occupancy", "%", 10.0, worst=100.0),
    "theoretical_occupancy_pct": Metric("theoretical occupancy", "%", 80.0),
    "waves_per_sm": Metric("waves per SM", "", 1.0),
    "l1_hit_rate_pct": Metric("L1 hit rate", "%"),
    "l2_hit_rate_pct": Metric("L2 hit rate", "%", 62.0),
    "dram_throughput_pct": Metric("DRAM throughput", "%"),
    "regs_per_thread": Metric("registers", "per thread"),
    "smem_bytes": Metric("shared memory", "per block"),
}

#: score of a partial last wave after 1-4 full waves (ncu's Tail Effect): marked, mildly
TAIL_SCORE = 0.5
#: Tail Effect is reported up to this many full waves (speedup 1/(1+whole) >= 20 %)
TAIL_MAX_WHOLE = 4
#: kernel names longer than this are cut on hover (a figure must stay small)
HOVER_NAME_CHARS = 400
HOVER_WRAP = 100
COLORSCALE = [[0.0, "#d9f0d3"], [0.4999, "#d9f0d3"], [0.5, "#fee08b"],
              [0.75, "#f46d43"], [1.0, "#a50026"]]


def kernel_table(trace: Trace, *, per_launch: bool = False,
                 metrics: Sequence[str] | None = None, sort: str = "time",
                 top: int | None = None, dx: Diagnosis | None = None) -> pd.DataFrame:
    """The heatmap's rows: kernels by name (or launch) with the bottleneck metrics.

        t = kernel_table(trace, dx=gpudiag.diagnose(trace))
        t[["label", "launches", "duration_ns", "waves_per_sm", "rules"]]
        kernel_table(trace, per_launch=True, sort="l2_hit_rate_pct", top=20)

    `dx`: the trace's Diagnosis, whose `kernel_metrics` and `ncu_rules` tables are read
    (the pages pass it: nothing is computed twice); without it they are computed here.
    Columns: `label` (unique row label: short name, "×N" launches, or "#kernel_id" per
    launch), `name`, `short_name`, `kernel_id` (per launch; NA when grouped), `launches`,
    `duration_ns` (total over the launches), the `METRICS` columns (or `metrics`), and
    `rules` (titles of the rule results every page lists, the `ncu_rules` table of
    `kernels.metrics.rule_findings`, "; "-joined, "" when none).
    Grouped values are duration-weighted means over the launches that have the metric
    (plain means where no launch has a duration), so a long launch counts as much as its
    time. `sort`: "time" (total duration, largest first), "health" (worst cell first) or a
    column (numbers largest first, text A-Z). `attrs`: `missing` (metric columns the report
    did not collect), `rows_total` and `duration_total_ns` before the `top` cut.
    """
    columns = _metric_columns(metrics)
    tables = dx.tables if dx is not None and "kernel_metrics" in dx.tables else {
        "kernel_metrics": ncu_metrics.kernel_metrics(trace),
        "ncu_rules": ncu_metrics.rule_findings(trace)}  # a notebook's figure alone
    km = tables["kernel_metrics"]
    table = (_per_launch(km, columns) if per_launch else _by_name(km, columns)).astype(
        {"label": "string", "name": "string", "short_name": "string", "duration_ns": "Int64"})
    table["rules"] = _rule_text(tables["ncu_rules"], km, table, per_launch)
    table = _sorted(table, sort)
    missing = set(km.attrs.get("missing", [])) | {
        c for c in columns if len(table) and table[c].isna().all()}
    total_ns = table["duration_ns"].sum()
    out = table.head(top) if top is not None else table
    out.attrs = {"missing": [c for c in columns if c in missing], "rows_total": len(table),
                 "duration_total_ns": int(total_ns) if len(table) else 0}
    return out


def _metric_columns(metrics: Sequence[str] | None) -> list[str]:
    if metrics is None:
        return list(METRICS)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise InputError(None, f"unknown heatmap metric(s) {', '.join(unknown)}",
                         f"choose from {', '.join(METRICS)}")
    return list(dict.fromkeys(metrics))


def _per_launch(km: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """One row per profiled launch, labelled with its kernel_id (short names repeat)."""
    out = pd.DataFrame({
        "label": km["short_name"].astype(str) + " #" + km["kernel_id"].astype(str),
        "name": km["name"], "short_name": km["short_name"],
        "kernel_id": km["kernel_id"].astype("Int64"), "launches": 1,
        "duration_ns": km["duration_ns"].astype("Float64"),
    })
    for column in columns:
        out[column] = km[column].astype("Float64")
    return out.reset_index(drop=True)


def _by_name(km: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """One row per kernel name: launch count, total time, duration-weighted means."""
    key = km["name"].astype(str)
    groups = key.groupby(key, sort=False)
    weight = km["duration_ns"].astype("float64").fillna(0.0).to_numpy()
    values = km[columns].astype("float64")
    has = values.notna().to_numpy()
    weighted = pd.DataFrame(np.nan_to_num(values.to_numpy()) * weight[:, None],
                            columns=columns).groupby(key.to_numpy(), sort=False).sum()
    weights = pd.DataFrame(has * weight[:, None], columns=columns).groupby(
        key.to_numpy(), sort=False).sum()
    plain = values.groupby(key.to_numpy(), sort=False).mean()
    means = (weighted / weights.where(weights > 0)).fillna(plain)
    first = km.groupby(key.to_numpy(), sort=False)["short_name"].first()
    count = groups.size().to_numpy()
    short = first.astype(str).to_numpy()
    out = pd.DataFrame({
        "label": np.where(count > 1, short + " ×" + count.astype(str), short),
        "name": first.index.to_numpy(), "short_name": short,
        "kernel_id": pd.array([pd.NA] * len(first), dtype="Int64"), "launches": count,
        "duration_ns": km["duration_ns"].astype("Float64").groupby(
            key.to_numpy(), sort=False).sum(min_count=1).to_numpy(),
    })
    for column in columns:
        out[column] = pd.array(means[column].to_numpy(), dtype="Float64")
    return out


def _rule_text(found: pd.DataFrame, km: pd.DataFrame, table: pd.DataFrame,
               per_launch: bool) -> pd.Series:
    """Per row, the distinct titles of its rule results (`found`: the `ncu_rules` table; ""
    when none); an untitled result is named by its rule (ncu leaves many titles empty)."""
    title = found["title"].fillna(found["rule_name"]).fillna(found["rule"]).fillna("ncu rule")
    if per_launch:
        key = found["kernel_id"].astype("Int64")
        rows = table["kernel_id"]
    else:
        key = found["kernel_id"].map(km.set_index("kernel_id")["name"]).astype("string")
        rows = table["name"]
    found = pd.DataFrame({"key": key.to_numpy(), "title": title.astype(str).to_numpy()})
    found = found.dropna().drop_duplicates()
    text = found.groupby("key", sort=False)["title"].agg("; ".join)
    mapped = rows.astype(object).map(text.to_dict())
    return pd.Series(mapped.where(mapped.notna(), "").to_numpy(), index=table.index,
                     dtype="string")


def _sorted(table: pd.DataFrame, sort: str) -> pd.DataFrame:
    """Rows in display order; ties keep the longer total GPU time first."""
    by_time = table.sort_values("duration_ns", ascending=False, kind="stable",
                                na_position="last")
    if sort == "time":
        return by_time.reset_index(drop=True)
    if sort == "health":
        worst = health(by_time).max(axis=1, skipna=True).astype("float64")
        order = np.argsort(-worst.fillna(-1.0).to_numpy(), kind="stable")
        return by_time.iloc[order].reset_index(drop=True)
    if sort not in table.columns:
        raise InputError(None, f"cannot sort the heatmap by {sort!r}",
                         f"use time, health or one of {', '.join(table.columns)}")
    text = not pd.api.types.is_numeric_dtype(table[sort])
    return by_time.sort_values(sort, ascending=text, kind="stable",
                               na_position="last").reset_index(drop=True)


def health(table: pd.DataFrame) -> pd.DataFrame:
    """How far each cell of a kernel table is from healthy: 0 healthy .. 1 far off.

        t = kernel_table(trace)
        h = health(t)
        t.loc[h["waves_per_sm"] >= 0.5, ["label", "waves_per_sm"]]   # small grids, tails

    Same index as `table`, one Float64 column per `METRICS` column it has; the rules and
    thresholds are in the module docstring and `METRICS`. NA: value missing, a partner
    value the rule needs missing, or a context column that is not scored.
    """
    out = pd.DataFrame(index=table.index)
    for column, spec in METRICS.items():
        if column not in table.columns:
            continue
        x = table[column].astype("float64").to_numpy()
        if spec.limit is None:
            score = np.full(len(table), np.nan)
        elif column == "achieved_occupancy_pct":
            theoretical = _column(table, "theoretical_occupancy_pct")
            score = _past(theoretical - x, spec.limit, spec.worst)
        elif column == "waves_per_sm":
            score = _waves(x, spec.limit)
        else:
            score = _past(x, spec.limit, spec.worst)
        if spec.partner is not None:
            partner = _column(table, spec.partner)
            score = np.where(partner < spec.partner_limit, score, 0.0)
            score[np.isnan(partner) | np.isnan(x)] = np.nan
        out[column] = pd.array(score, dtype="Float64")
    return out


def _column(table: pd.DataFrame, column: str) -> np.ndarray:
    """A column as float64 (NaN where missing or not in the table)."""
    if column not in table.columns:
        return np.full(len(table), np.nan)
    return table[column].astype("float64").to_numpy()


def _past(x: np.ndarray, limit: float, worst: float) -> np.ndarray:
    """0 on the healthy side of `limit`; past it 0.5 rising linearly to 1 at `worst`
    (either direction: `worst` below `limit` means low values are unhealthy)."""
    beyond = (limit - x) if worst < limit else (x - limit)
    with np.errstate(invalid="ignore"):
        score = np.where(beyond > 0, 0.5 + 0.5 * beyond / abs(limit - worst), 0.0)
    score = np.clip(score, 0.0, 1.0)
    score[np.isnan(x)] = np.nan
    return score


def _waves(x: np.ndarray, limit: float) -> np.ndarray:
    """Small grid (< `limit` waves) as `_past`; a partial last wave after 1..4 full waves
    (ncu's Tail Effect) as `TAIL_SCORE`."""
    score = _past(x, limit, 0.0)
    whole = np.floor(x)
    with np.errstate(invalid="ignore"):
        tail = (whole >= 1) & (whole <= TAIL_MAX_WHOLE) & (x - whole > 1e-9)
    return np.where(tail, TAIL_SCORE, score)


# -- the figure ------------------------------------------------------------------------------


def figure(trace: Trace, *, per_launch: bool = False, metrics: Sequence[str] | None = None,
           sort: str = "time", top: int | None = 50, dx: Diagnosis | None = None
           ) -> go.Figure:
    """The kernel x metric heatmap of an Nsight Compute report, colored by health.

        fig = figure(gpudiag.load("report.ncu-rep"))
        fig.show()                     # or fig.write_html("heatmap.html")
        figure(trace, per_launch=True, sort="health", top=20)

    One go.Heatmap: z = `health` scores, `text` = the formatted value per cell,
    `customdata` = the raw values (kernel_metrics' numbers, NaN where missing), hover = the
    kernel's full name, launches and time, the value with its unit and verdict, and ncu's
    findings. Columns the report did not collect are dropped and named in the title; rows
    beyond `top` (None: all) are summarized there, so the figure stays small. A row ncu
    measured nothing for has blank cells and one line across it saying so (`NO_METRICS`).
    The figure is sized from its content: the title's lines and the slanted column labels
    over `ROW_PX` a row, with the health key as a horizontal bar under the rows. `dx`: as
    for `kernel_table` (the pages pass theirs).
    """
    table = kernel_table(trace, per_launch=per_launch, metrics=metrics, sort=sort, top=top,
                         dx=dx)
    shown = [c for c in _metric_columns(metrics) if c not in table.attrs["missing"]]
    values = table[shown].astype("float64").to_numpy()
    scores = health(table)[shown].astype("float64").to_numpy()
    blank = _unmeasured(table, values)
    text = _cell_text(table, shown, blank)
    heatmap = go.Heatmap(
        z=_nan_to_none(scores), x=[_column_label(c) for c in shown],
        y=[plotly_label(label) for label in table["label"].astype(str)],
        text=text, texttemplate="%{text}", customdata=_nan_to_none(values),
        hovertext=_hover(table, shown, text, scores, blank), hoverinfo="text",
        colorscale=COLORSCALE, zmin=0.0, zmax=1.0, xgap=1, ygap=1,
        colorbar={**_HEALTH_KEY, "y": _key_y(len(table))})
    fig = go.Figure(heatmap)
    title = _title(table, per_launch, sort)
    top_px = _top_margin(title, shown)
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left", "yref": "container", "y": 1.0,
               "yanchor": "top", "pad": {"t": 12, "l": 8}},
        yaxis={"autorange": "reversed", "automargin": True, "type": "category",
               "showgrid": False},
        xaxis={"side": "top", "type": "category", "tickangle": -30, "showgrid": False},
        plot_bgcolor="#e5e5e5", margin={"t": top_px, "b": _KEY_BOTTOM_PX},
        height=min(top_px + _KEY_BOTTOM_PX + ROW_PX * max(len(table), 1), 4000))
    for row in np.flatnonzero(blank):
        fig.add_annotation(text=blank[row], xref="paper", x=0.5, yref="y", y=int(row),
                           showarrow=False, font={"color": "#59636e"})
    return fig


ROW_PX = 24
"""One kernel row's height in the figure (the figure is sized from its rows)."""
# The health key: a horizontal colorbar under the rows, fixed in pixels, so its three labels
# never collide (a vertical one as tall as one or two rows printed them on top of each other).
# It is placed in paper units (plotly.js misplaces container-anchored colorbars), `_key_y`.
_HEALTH_KEY = {"title": {"text": "health", "side": "right"}, "orientation": "h",
               "tickvals": [0.0, 0.5, 1.0],
               "ticktext": ["healthy", "past threshold", "far off"],
               "lenmode": "pixels", "len": 420, "thickness": 14, "x": 0.0, "xanchor": "left",
               "yanchor": "top"}
_KEY_BOTTOM_PX = 56  # the health key's bar and labels under the rows
_KEY_GAP_PX = 10


def _key_y(rows: int) -> float:
    """The key's top, in paper units (0..1 is the rows' height): a gap under the last row."""
    return -_KEY_GAP_PX / (ROW_PX * max(rows, 1))


NO_METRICS = "ncu recorded no metrics for this kernel"
"""Shown across a row whose every metric is empty (ncu could not profile that kernel)."""


def _unmeasured(table: pd.DataFrame, values: np.ndarray) -> np.ndarray:
    """Per row, why it has no value at all ("" where it has some): a row of bare 'n/a'
    cells would not say that ncu measured nothing for that kernel."""
    empty = np.isnan(values).all(axis=1) if values.shape[1] else np.zeros(len(table), bool)
    reason = NO_METRICS if "duration_ns" not in table else np.where(
        table["duration_ns"].isna().to_numpy(), NO_METRICS,
        "ncu recorded none of these metrics for this kernel")
    return np.where(empty, reason, "").astype(object)


def _top_margin(title: str, shown: list[str]) -> int:
    """Pixels over the rows: the title's lines, then the column labels slanted at 30
    degrees (about 7 px a character at plotly's 12 px font, half of it upward)."""
    lines = 1 + title.count("<br>")
    longest = max((len(_column_label(c)) for c in shown), default=0)
    return 20 + 22 * lines + int(3.5 * longest)


def _nan_to_none(a: np.ndarray) -> list[list[float | None]]:
    """A float matrix as nested lists with None for NaN (JSON null, a blank cell)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in a]


def _column_label(column: str) -> str:
    """"L2 hit rate (%)", "registers (per thread)", "waves per SM"."""
    spec = METRICS[column]
    return f"{spec.label} ({spec.unit})" if spec.unit else spec.label


def _format(column: str, value: float) -> str:
    """A cell's short display form: one decimal for %, 3 digits for waves, KiB for bytes."""
    if np.isnan(value):
        return "n/a"
    unit = METRICS[column].unit
    if unit == "%":
        return f"{value:.1f}%"
    if column == "smem_bytes":
        return f"{value / 1024:.3g} KiB" if value >= 1024 else f"{value:.0f} B"
    if column == "waves_per_sm":
        return f"{value:.3g}"
    return f"{value:.0f}"


def _cell_text(table: pd.DataFrame, shown: list[str], blank: np.ndarray) -> list[list[str]]:
    """Each cell's value as shown; rows without any value are left blank (the row's
    annotation says why instead of repeating 'n/a')."""
    columns = [table[c].astype("float64").map(lambda v, c=c: _format(c, v)).tolist()
               for c in shown]
    rows = [list(row) for row in zip(*columns, strict=True)] if shown else [
        [] for _ in range(len(table))]
    return [[""] * len(row) if why else row for row, why in zip(rows, blank, strict=True)]


def _hover(table: pd.DataFrame, shown: list[str], text: list[list[str]],
           scores: np.ndarray, blank: np.ndarray) -> list[list[str]]:
    """Per cell: the row's name, launches, time and findings, then the cell's value."""
    rows = table[["name", "launches", "duration_ns", "rules"]].to_dict("records")
    heads = [_row_hover(row) for row in rows]  # one per shown row: bounded by `top`
    cells = []
    for i, head in enumerate(heads):
        if blank[i]:
            cells.append([f"{head}<b>{blank[i]}</b>"] * len(shown))
            continue
        cells.append([f"{head}<b>{_column_label(c)}: {text[i][j]}</b> - "
                      + _verdict(c, scores[i, j], text[i][j]) for j, c in enumerate(shown)])
    return cells


def _row_hover(row: Mapping[str, Any]) -> str:
    """The row's part of every hover: full name (cut, wrapped, escaped), launches, findings."""
    name = str(row["name"])
    if len(name) > HOVER_NAME_CHARS:
        name = name[:HOVER_NAME_CHARS - 1] + "…"
    lines = [plotly_label(name[i:i + HOVER_WRAP]) for i in range(0, len(name), HOVER_WRAP)]
    duration = row["duration_ns"]
    time = "n/a" if pd.isna(duration) else f"{float(duration) / 1e3:,.1f} µs"
    lines.append(f"{row['launches']} launch(es), {time} GPU time")
    found = str(row["rules"])
    if found:
        lines.append("ncu: " + plotly_label(found[:HOVER_NAME_CHARS]))
    return "<br>".join(lines) + "<br>"


def _verdict(column: str, score: float, text: str) -> str:
    if text == "n/a":
        return "not collected for this kernel"
    if np.isnan(score):
        return "not scored" if METRICS[column].limit is None else "not judged (input missing)"
    return "healthy" if score == 0 else f"unhealthy (score {score:.2f})"


def _title(table: pd.DataFrame, per_launch: bool, sort: str = "time") -> str:
    """What the figure shows, which rows it leaves out and which columns are missing
    (all text ours: no input string goes into the layout)."""
    total = table.attrs["rows_total"]
    one, many = ("launch", "launches") if per_launch else ("kernel name", "kernel names")
    what = one if total == 1 else many
    if not total:
        return "No Nsight Compute kernel metrics in this trace"
    order = {"time": "GPU time", "health": "health (worst first)"}.get(sort, plotly_label(sort))
    head = f"Nsight Compute kernels by {order}: {total:,} {what}"
    notes = []
    if len(table) < total:
        shown_ns = float(table["duration_ns"].sum())
        all_ns = float(table.attrs["duration_total_ns"]) or 1.0
        notes.append(f"top {len(table):,} shown; {total - len(table):,} more hold "
                     f"{100 * (1 - shown_ns / all_ns):.1f}% of GPU time")
    if table.attrs["missing"]:
        labels = ", ".join(METRICS[c].label for c in table.attrs["missing"])
        notes.append(f"not in this report (not collected, columns dropped): {labels}")
    return head + "".join(f"<br><sup>{n}</sup>" for n in notes)
