"""Findings for idle time the host caused without a sync: launch-bound and host-bound gaps.

The gaps come attributed from `gaps.idle_gaps`; this module says *where*: for a
launch_bound piece, the call site that issued the next launch (the op the host was slowly
launching); for a host_bound piece, the innermost user frame the launching thread was in at
the middle of the piece (what the host was busy with while the GPU waited: a DataLoader
`__next__`, a logging call, a Python loop).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analyzers import callsites
from gpudiag.analyzers.findings import ADVICE, frame
from gpudiag.analyzers.gaps import idle_gaps
from gpudiag.names import short_names
from gpudiag.trace import Trace


def host_gaps(trace: Trace, gaps: pd.DataFrame | None = None, **gap_options: Any
              ) -> pd.DataFrame:
    """launch_bound and host_bound gap pieces with `where` (call site, else the next
    kernel's short name).

        pieces = host_gaps(trace)
        pieces.groupby(["cause", "where"]).size()
    """
    gaps = idle_gaps(trace, **gap_options) if gaps is None else gaps
    pieces = gaps[gaps["cause"].isin(["launch_bound", "host_bound"])].copy()
    if pieces.empty:
        return pieces.assign(where=pd.Series(dtype="string"))
    at = np.where(pieces["cause"] == "host_bound",
                  (pieces["start_ns"] + pieces["end_ns"]) // 2,
                  pieces["start_ns"]).astype(np.int64)
    where = callsites.where_at(trace, pieces["pid"], pieces["tid"], at)
    pieces["where"] = pd.array(np.where(pd.isna(where), _next_names(trace, pieces), where),
                               dtype="string")
    return pieces


def _next_names(trace: Trace, pieces: pd.DataFrame) -> np.ndarray:
    """The short name of the GPU event after each piece ('(end of window)' if none)."""
    out = np.full(len(pieces), "(unknown launch)", dtype=object)
    for table in ("kernels", "copies"):
        mine = (pieces["next_table"] == table).to_numpy()
        if not mine.any():
            continue
        rows = getattr(trace, table).loc[pieces["next_row"].to_numpy()[mine].astype(np.int64)]
        label = (short_names(rows["name"]) if table == "kernels"
                 else "copy " + rows["kind"].astype(str))
        out[mine] = np.asarray(label, dtype=object)
    return out


def findings(trace: Trace, gaps: pd.DataFrame | None = None, *, top: int = 20,
             python_gap_ns: int = 1_000_000, **gap_options: Any) -> pd.DataFrame:
    """launch_bound and host_bound findings, one per (cause, where), the `top` largest of
    each cause.

        findings(trace).head()

    Host-bound advice depends on what the host was doing: data loading when the frame says
    so (DATA_FRAMES), Python between launches when the median gap is below `python_gap_ns`
    (1 ms: eager per-op overhead), else host work in the step in general.
    """
    pieces = host_gaps(trace, gaps, **gap_options)
    if pieces.empty:
        return frame()
    pieces["length"] = pieces["end_ns"] - pieces["start_ns"]
    grouped = pieces.groupby(["cause", "where"], observed=True)["length"].agg(
        ["sum", "size", "median"]).reset_index()
    grouped = grouped.sort_values("sum", ascending=False).groupby("cause").head(top)
    rows = [{
        "cause": g.cause, "lost_ns": g.sum, "where": g.where, "count": g.size,
        "evidence": (f"{g.size} idle gaps before launches from here, median "
                     f"{g.median / 1e3:.1f} µs, {g.sum / 1e6:.2f} ms in all"
                     if g.cause == "launch_bound" else
                     f"GPU idle {g.sum / 1e6:.2f} ms in {g.size} gaps while the host ran "
                     f"this (median gap {g.median / 1e3:.1f} µs) with no CUDA work queued"),
        "advice": ADVICE[_advice_key(str(g.cause), str(g.where), float(g.median),
                                     python_gap_ns)],
    } for g in grouped.itertuples()]  # one per call site, bounded by `top`
    return frame(rows)


#: frames that load data: a host-bound gap spent there wants a faster input pipeline
DATA_FRAMES = re.compile(r"dataloader|dataset|__next__|collate|fetch|prefetch|read|decode|"
                         r"load_batch|get_batch|next_batch", re.IGNORECASE)


def _advice_key(cause: str, where: str, median_ns: float, python_gap_ns: int) -> str:
    """Which advice fits: data loading by the frame's name; Python between launches when
    the typical gap is short (eager per-op overhead, not one long host task)."""
    if cause != "host_bound":
        return cause
    if DATA_FRAMES.search(where):
        return "host_data"
    return "host_python" if median_ns < python_gap_ns else "host_bound"
