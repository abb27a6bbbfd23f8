"""Nsight Compute's rule results as the pages list them: one row per kernel and rule, not
per launch. ncu runs its rules on every launch it profiled, so a kernel launched 105 times
gives 105 copies of each rule's verdict, differing only in their numbers; a reader wants
each verdict once, with how many launches it held for and the strongest estimate."""

from __future__ import annotations

import pandas as pd

from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.reports.html_tables import Table

RULE_ROWS = 100
"""Rule rows shown, most estimated speedup first (a kernel has a few; a long report many)."""

#: what makes two launches' results the same row
_SAME = ["name", "rule", "title", "type", "speedup_type"]
_HEADERS = {"launches": "launches", "ids": "ids", "short_name": "kernel", "rule": "rule",
            "title": "title", "type": "type", "speedup_type": "speedup of",
            "speedup_pct": "speedup", "message": "message"}
_IDS_SHOWN = 5


def grouped_rules(found: pd.DataFrame) -> pd.DataFrame:
    """`ncu_rules` (one row per launch and rule, most speedup first) with one row per
    kernel, rule, title, type and speedup kind, in the order of each group's first row:
    `launches` (how many), `ids` (the first launch ids, then '+N'), the first row's
    `speedup_pct` (the largest, by the table's order) and `message`.

        grouped_rules(dx.tables["ncu_rules"])
    """
    keys = found[_SAME].astype(object).where(found[_SAME].notna(), "")
    group = keys.groupby(_SAME, sort=False).ngroup()
    first = found.groupby(group, sort=False).head(1).copy()
    ids = found.groupby(group, sort=False)["kernel_id"].agg(_ids)
    first["launches"] = group.value_counts(sort=False).reindex(group[first.index]).to_numpy()
    first["ids"] = ids.reindex(group[first.index]).to_numpy()
    return first.reset_index(drop=True)


def _ids(values: pd.Series) -> str:
    shown = ", ".join(f"{int(v):,}" for v in values.head(_IDS_SHOWN))
    more = len(values) - _IDS_SHOWN
    return f"{shown}, +{more:,}" if more > 0 else shown


def rule_table(dx: Diagnosis, notes: list[str]) -> Table | None:
    """The Diagnosis' ncu rule findings (`dx.tables["ncu_rules"]`, made by
    `kernels.metrics.rule_findings`) as every page shows them, so `gpudiag report` and
    `gpudiag heatmap` list the same rows: one per kernel and rule (`grouped_rules`), its
    launches, the kernel's short name (the full demangled one on hover: a template-heavy
    name fills a cell 40 lines tall), rule, title, type, ncu's estimated speedup and its
    message. The first RULE_ROWS rows (most speedup first), the cut said in `notes`;
    title and speedup columns that no row fills are left out. None when ncu named no
    problem (or the Diagnosis has no table).
    """
    found = dx.tables.get("ncu_rules")
    if found is None or found.empty:
        return None
    rows = grouped_rules(found)
    if len(rows) > RULE_ROWS:  # the whole table is an export away, not an analyze --json
        notes.append(f"showing the top {RULE_ROWS} of {len(rows):,} rule results; "
                     "`gpudiag export PATH --format csv --tables ncu_rules` writes all, "
                     "launch by launch")
    top = rows.head(RULE_ROWS)
    frame = top[list(_HEADERS)].rename(columns=_HEADERS)
    empty = [c for c in ("title", "speedup of", "speedup") if frame[c].isna().all()]
    return Table(frame.drop(columns=empty), {"speedup": "pct"},
                 caption="Nsight Compute rule results (warnings, optimization hints, errors), "
                         "by kernel and rule",
                 titles={"kernel": top["name"].fillna("").astype(str).tolist()})
