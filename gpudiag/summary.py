"""What a trace holds, in numbers: the data behind `gpudiag analyze` (terminal and --json).

Pure computation on a Trace; rendering lives in gpudiag/reports/.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpudiag.names import short_names
from gpudiag.trace import Trace


def summarize(trace: Trace, top: int = 10) -> dict[str, Any]:
    """Devices, time window, rows per table and the top kernels by total GPU time.

        info = summarize(gpudiag.load("trace.json.gz"))
        info["top_kernels"][0]["name"]

    Every value is JSON-serializable; times are integer nanoseconds.
    """
    window = trace.gpu_window_ns()
    return {
        "sources": trace.meta.get("sources", []),
        "ranks": _ranks(trace),
        "vendor": trace.meta.get("vendor"),
        "timeline": bool(trace.meta.get("timeline", True)),
        "devices": _devices(trace),
        "window": None if window is None else {
            "start_ns": window[0], "end_ns": window[1], "duration_ns": window[1] - window[0],
        },
        "rows": trace.row_counts(),
        "gpu_activity": trace.has_gpu_activity(),
        "top_kernels": top_kernels(trace.kernels, top),
        "warnings": dict(trace.meta.get("warnings", {})),
    }


def top_kernels(kernels: pd.DataFrame, top: int = 10) -> list[dict[str, Any]]:
    """Kernels grouped by name, ordered by total time: count, total, mean and share."""
    if kernels.empty or top <= 0:
        return []
    dur = (kernels["end_ns"] - kernels["start_ns"]).rename("dur_ns")
    grouped = dur.groupby(kernels["name"], observed=True).agg(["count", "sum", "mean"])
    grouped = grouped.sort_values("sum", ascending=False)
    total = float(dur.sum()) or 1.0
    head = grouped.head(top)
    shorts = short_names(pd.Series(head.index.astype(str), index=head.index))
    return [
        {
            "name": str(name),
            "short_name": str(shorts[name]),
            "count": int(row["count"]),
            "total_ns": int(row["sum"]),
            "mean_ns": float(row["mean"]),
            "share": float(row["sum"]) / total,
        }
        for name, row in head.iterrows()
    ]


def _devices(trace: Trace) -> list[dict[str, Any]]:
    used = set()
    for table in (trace.kernels, trace.copies):
        used |= set(table["device"].dropna().astype(int))
    devices = trace.devices.drop_duplicates(subset=["rank", "device"])
    rows = []
    for _, d in devices.iterrows():  # a handful of GPUs: no hot path
        rows.append({
            "device": int(d["device"]),
            "rank": None if pd.isna(d["rank"]) else int(d["rank"]),
            "name": None if pd.isna(d["name"]) else str(d["name"]),
            "sm_count": _int(d["sm_count"]),
            "compute_capability": None if pd.isna(d["cc_major"])
            else f"{int(d['cc_major'])}.{_int(d['cc_minor']) or 0}",
            "mem_bytes": _int(d["mem_bytes"]),
            "used": int(d["device"]) in used,
        })
    return rows


def _ranks(trace: Trace) -> list[int]:
    ranks = set(trace.meta.get("ranks", []) or [])
    if trace.meta.get("rank") is not None:
        ranks.add(int(trace.meta["rank"]))
    return sorted(ranks)


def _int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
