"""What a trace holds, in numbers: the data behind `gpudiag analyze` (terminal and --json).

Pure computation on a Trace; rendering lives in gpudiag/reports/.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pandas as pd

from gpudiag.analyzers import window as window_mod
from gpudiag.commands import program_name
from gpudiag.names import short_names
from gpudiag.trace import Trace

#: epoch nanoseconds from 2001-09-09 to 2096: a clock that reads this is a wall clock (Kineto,
#: CUPTI as gpudiag records it, XSpace); smaller values count from a session start (nsys)
_EPOCH_NS = (10**18, 4 * 10**18)


def summarize(trace: Trace, top: int = 10, *, window_ns: tuple[int, int] | None = None,
              window_spec: str | None = None) -> dict[str, Any]:
    """Devices, time window, rows per table and the top kernels by total GPU time.

        info = summarize(gpudiag.load("trace.json.gz"))
        info["top_kernels"][0]["name"]
        info = summarize(trace, window_ns=dx.window_ns, window_spec="ProfilerStep#3")

    Every value is JSON-serializable; times are integer nanoseconds. `window_ns` (the
    analyzed window, `Diagnosis.window_ns`) restricts the rows and top kernels to what
    overlaps it; `window` then describes it (see `_window`). `run` is set for a
    `gpudiag profile` run: its program (`commands.program_name`) and process count.
    """
    shown = trace if window_ns is None else window_mod.within(trace, window_ns)
    return {
        "sources": trace.meta.get("sources", []),
        "run": _run(trace),
        "ranks": _ranks(trace),
        "vendor": trace.meta.get("vendor"),
        "timeline": bool(trace.meta.get("timeline", True)),
        "devices": _devices(trace),
        "window": _window(trace, window_ns, window_spec),
        "rows": shown.row_counts(),
        "gpu_activity": trace.has_gpu_activity(),
        "top_kernels": top_kernels(shown.kernels, top),
        "warnings": dict(trace.meta.get("warnings", {})),
    }


def _window(trace: Trace, window_ns: tuple[int, int] | None,
            spec: str | None) -> dict[str, Any] | None:
    """The analyzed window (the GPU window without `window_ns`), None without either.

    `start_ns`/`end_ns` are the trace's own clock; `offset_ns` is the start counted from the
    first GPU event (as `--window START:END` counts); `started_at` the start as UTC wall
    clock (ISO 8601) when the clock is the epoch's, else None; `trace_duration_ns` the whole
    GPU window; `spec` the --window text.
    """
    whole = trace.gpu_window_ns()
    bounds = window_ns if window_ns is not None else whole
    if bounds is None:
        return None
    lo, hi = int(bounds[0]), int(bounds[1])
    return {"start_ns": lo, "end_ns": hi, "duration_ns": hi - lo,
            "offset_ns": lo - window_mod.edges(trace)[0], "started_at": wall_clock(lo),
            "trace_duration_ns": None if whole is None else whole[1] - whole[0],
            "spec": spec}


def wall_clock(ns: int) -> str | None:
    """'2023-09-27T17:26:12.943Z' for epoch nanoseconds, None for a session clock."""
    if not _EPOCH_NS[0] <= ns < _EPOCH_NS[1]:
        return None
    when = datetime.fromtimestamp(ns // 1_000_000 / 1e3, tz=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _run(trace: Trace) -> dict[str, Any] | None:
    """A `gpudiag profile` run (its meta has the command): program, command, processes."""
    command = trace.meta.get("command")
    if not isinstance(command, list) or not command:
        return None
    return {"program": program_name([str(c) for c in command]),
            "command": [str(c) for c in command],
            "processes": len(trace.meta.get("processes") or [])}


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
