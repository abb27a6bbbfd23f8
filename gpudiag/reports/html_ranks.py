"""The report's "Stragglers" section: a job's ranks side by side (`analyzers.stragglers`).

The rank x cause heatmap (`figures_ranks.rank_causes`, binned past its row limit), who
arrived last at the collectives, the slowest rank per step, and the per-rank waterfall
table; long tables are cut to their first `TOP_ROWS` rows with a note, as elsewhere on the
page. Nothing here computes a diagnosis: the tables are the Diagnosis' own.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.reports.html import Section
from gpudiag.reports.html_tables import Table
from gpudiag.reports.terminal.ranks import headline

TOP_ROWS = 50


def stragglers(dx: Diagnosis, figs: list[Any]) -> Section | None:
    """The section, or None for a job of one rank."""
    late, steps = dx.tables.get("late_arrivals"), dx.tables.get("step_stragglers")
    ranks = dx.tables.get("rank_losses")
    if late is None and steps is None and ranks is None and not figs:
        return None
    notes: list[str] = []
    tables = [table for table in (_late(late, notes), _steps(steps, notes),
                                  _ranks(ranks, notes)) if table is not None]
    line = headline(_records(late), _records(steps))
    return Section("Stragglers: which rank holds the others back", text=line, notes=notes,
                   figures=figs, tables=tables)


def _records(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    return [] if frame is None else frame.to_dict("records")


def _cut(frame: pd.DataFrame, notes: list[str], what: str) -> pd.DataFrame:
    if len(frame) > TOP_ROWS:
        notes.append(f"{what}: the first {TOP_ROWS} of {len(frame):,} rows; `gpudiag analyze "
                     "--json` lists all")
    return frame.head(TOP_ROWS).reset_index(drop=True)


def _late(late: pd.DataFrame | None, notes: list[str]) -> Table | None:
    if late is None:
        return None
    frame = _cut(late, notes, "last arrivals")[[
        "op", "rank", "last_calls", "op_calls", "share", "skew_median_ns", "skew_max_ns",
        "caused_wait_ns", "margin_ns"]]
    frame.columns = ["op", "rank", "last at", "calls", "share", "skew median", "skew max",
                     "others waited", "margin"]
    fmt = dict.fromkeys(["skew median", "skew max", "others waited", "margin"], "ns")
    return Table(frame, {**fmt, "share": "share"},
                 caption="Arrived last at collectives (margin: how much earlier those calls "
                         "would start were that rank only as late as the next one)")


def _steps(steps: pd.DataFrame | None, notes: list[str]) -> Table | None:
    if steps is None:
        return None
    frame = _cut(steps, notes, "steps")[[
        "step", "warmup", "ranks", "slowest_rank", "slowest_ns", "median_ns", "excess_ns",
        "last_rank", "last_calls", "caused_wait_ns"]]
    frame.columns = ["step", "warm-up", "ranks", "slowest rank", "its time", "median",
                     "excess", "last at calls", "calls", "others waited"]
    fmt = dict.fromkeys(["its time", "median", "excess", "others waited"], "ns")
    return Table(frame, fmt, caption="Slowest rank per step")


def _ranks(ranks: pd.DataFrame | None, notes: list[str]) -> Table | None:
    if ranks is None:
        return None
    frame = _cut(ranks, notes, "ranks")
    shares = {f"{cause}_share": cause for cause in LOSS_CAUSES}
    frame = frame.rename(columns={"window_ns": "window", **shares})
    return Table(frame, {"window": "ns", **dict.fromkeys(shares.values(), "share")},
                 caption="Loss waterfall per rank, least useful first")
