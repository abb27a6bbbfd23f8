"""What a trace holds, in numbers: the data behind `gpudiag analyze` (terminal and --json).

Pure computation on a Trace; rendering lives in gpudiag/reports/.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from gpudiag.analyzers import run_facts
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
    `gpudiag profile` run: its program (`commands.program_name`) and process count;
    `outcome` says how it failed (`run_outcome`), None when it did not.
    """
    shown = trace if window_ns is None else window_mod.within(trace, window_ns)
    return {
        "outcome": run_outcome(trace.meta),
        "sources": trace.meta.get("sources", []),
        "run": _run_of(trace.meta),
        "ranks": _ranks_of(trace.meta),
        "vendor": trace.meta.get("vendor"),
        "timeline": bool(trace.meta.get("timeline", True)),
        "devices": _devices(trace),
        "window": _window_of(trace.gpu_window_ns(), window_mod.edges(trace)[0], window_ns,
                             window_spec),
        "rows": shown.row_counts(),
        "gpu_activity": trace.has_gpu_activity(),
        "top_kernels": top_kernels(shown.kernels, top),
        "warnings": dict(trace.meta.get("warnings", {})),
    }


def _window_of(whole: tuple[int, int] | None, first: int,
               window_ns: tuple[int, int] | None, spec: str | None) -> dict[str, Any] | None:
    """The analyzed window (the GPU window `whole` without `window_ns`), None without either.

    `start_ns`/`end_ns` are the trace's own clock; `offset_ns` is the start counted from the
    first GPU event (`first`, as `--window START:END` counts); `started_at` the start as UTC
    wall clock (ISO 8601) when the clock is the epoch's, else None; `trace_duration_ns` the
    whole GPU window; `spec` the --window text.
    """
    bounds = window_ns if window_ns is not None else whole
    if bounds is None:
        return None
    lo, hi = int(bounds[0]), int(bounds[1])
    return {"start_ns": lo, "end_ns": hi, "duration_ns": hi - lo,
            "offset_ns": lo - first, "started_at": wall_clock(lo),
            "trace_duration_ns": None if whole is None else whole[1] - whole[0],
            "spec": spec}


def wall_clock(ns: int) -> str | None:
    """'2023-09-27T17:26:12.943Z' for epoch nanoseconds, None for a session clock."""
    if not _EPOCH_NS[0] <= ns < _EPOCH_NS[1]:
        return None
    when = datetime.fromtimestamp(ns // 1_000_000 / 1e3, tz=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _run_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A `gpudiag profile` run (its meta has the command): program, command, processes."""
    command = meta.get("command")
    if not isinstance(command, list) or not command:
        return None
    return {"program": program_name([str(c) for c in command]),
            "command": [str(c) for c in command],
            "processes": len(meta.get("processes") or [])}


def top_kernels(kernels: pd.DataFrame, top: int = 10) -> list[dict[str, Any]]:
    """Kernels grouped by name, ordered by total time: count, total, mean and share."""
    if kernels.empty or top <= 0:
        return []
    dur = (kernels["end_ns"] - kernels["start_ns"]).rename("dur_ns")
    grouped = dur.groupby(kernels["name"], observed=True).agg(["count", "sum", "mean"])
    return _top_rows(grouped, float(dur.sum()) or 1.0, top)


def _top_rows(grouped: pd.DataFrame, total: float, top: int) -> list[dict[str, Any]]:
    """The `top` names of a per-name count/sum/mean table, most time first."""
    grouped = grouped.sort_values("sum", ascending=False)
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
    return _device_rows(trace.devices, frozenset(used))


def _device_rows(devices: pd.DataFrame, used: frozenset[int]) -> list[dict[str, Any]]:
    devices = devices.drop_duplicates(subset=["rank", "device"])
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


def _ranks_of(meta: dict[str, Any]) -> list[int]:
    ranks = set(meta.get("ranks", []) or [])
    if meta.get("rank") is not None:
        ranks.add(int(meta["rank"]))
    return sorted(ranks)


def _int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's summary: its devices and the device indices its events
    ran on, its windows (GPU, and all events), its rows (in the analyzed window), its
    kernels' count and time by name (with the name order of its categories), and the span
    of its host events (`run_facts.host_span`, what `compare` measures a run without GPU
    activity by)."""

    devices: pd.DataFrame
    used: frozenset[int]
    gpu_window: tuple[int, int] | None
    edges: tuple[int, int]
    rows: dict[str, int]
    kernels: pd.DataFrame  # index name: count, sum (ns)
    names: tuple[str, ...]
    host_span: tuple[int, int] | None = None
    range_sources: dict[str, int] = field(default_factory=dict)  # ranges rows by source


def part(trace: Trace, *, window_ns: tuple[int, int] | None = None) -> Part:
    """This rank's share of `summarize` (see `Part`).

        parts = [summary.part(rank) for rank in ranks]
        info = summary.combine(parts, merged_meta)      # == summarize(merged trace)
        info["top_kernels"][0]["name"]
    """
    shown = trace if window_ns is None else window_mod.within(trace, window_ns)
    used = {int(device) for table in (trace.kernels, trace.copies)
            for device in table["device"].dropna()}
    kernels = shown.kernels
    dur = (kernels["end_ns"] - kernels["start_ns"]).rename("dur_ns")
    grouped = dur.groupby(kernels["name"].astype(str)).agg(["count", "sum"]) if len(kernels) \
        else pd.DataFrame({"count": [], "sum": []})
    names = tuple(str(c) for c in kernels["name"].astype("category").cat.categories)
    sources = shown.ranges["source"].value_counts()
    return Part(trace.devices, frozenset(used), trace.gpu_window_ns(), window_mod.edges(trace),
                shown.row_counts(), grouped, names, run_facts.host_span(trace),
                {str(source): int(count) for source, count in sources.items() if count})


def combine(parts: list[Part], meta: dict[str, Any], top: int = 10, *,
            window_ns: tuple[int, int] | None = None,
            window_spec: str | None = None) -> dict[str, Any]:
    """`summarize` of the job whose ranks' parts these are (in file order), with the
    merged job's `meta`.

        info = summary.combine([summary.part(rank) for rank in ranks], merged_meta)
        info["rows"]["kernels"]                          # every rank's
        info["window"]["duration_ns"]
    """
    used = frozenset().union(*(piece.used for piece in parts))
    devices = pd.concat([piece.devices for piece in parts], ignore_index=True)
    windows = [piece.gpu_window for piece in parts if piece.gpu_window is not None]
    whole = (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None
    spans = [piece.edges for piece in parts if piece.edges != (0, 0)]
    first = whole[0] if whole else (min(s[0] for s in spans) if spans else 0)
    rows = {name: sum(piece.rows.get(name, 0) for piece in parts) for name in parts[0].rows}
    return {
        "outcome": run_outcome(meta),
        "sources": meta.get("sources", []),
        "run": _run_of(meta),
        "ranks": _ranks_of(meta),
        "vendor": meta.get("vendor"),
        "timeline": bool(meta.get("timeline", True)),
        "devices": _device_rows(devices, used),
        "window": _window_of(whole, first, window_ns, window_spec),
        "rows": rows,
        "gpu_activity": bool(rows.get("kernels") or rows.get("copies")),
        "top_kernels": _top_of(parts, top),
        "warnings": dict(meta.get("warnings", {})),
    }


def _top_of(parts: list[Part], top: int) -> list[dict[str, Any]]:
    """`top_kernels` from the ranks' per-name sums, in the merged trace's name order."""
    frames = [piece.kernels for piece in parts if len(piece.kernels)]
    if not frames or top <= 0:
        return []
    sums = pd.concat(frames).groupby(level=0).sum()
    same = all(piece.names == parts[0].names for piece in parts)
    order = [name for name in (parts[0].names if same else sorted(sums.index))
             if name in sums.index]
    grouped = sums.reindex(order).astype({"count": "int64", "sum": "int64"})
    grouped["mean"] = grouped["sum"] / grouped["count"]
    return _top_rows(grouped, float(grouped["sum"].sum()) or 1.0, top)


#: processes named one by one in the headline; the rest are counted
NAMED = 4


def run_outcome(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Whether a `gpudiag profile` run failed and which processes died of what, or None
    when nothing failed: the first thing the diagnosis says (a crash is the finding).

    The session records the command's exit status and signal (`meta["run"]`); each process
    its uncaught exception (`profiler/process_facts.py`), the SIGTERM that ended it (whose
    handler wrote its last flush: `ended_by`) and, at its final flush, `end_ns`.
    A process without `end_ns` never finished Python's exit: it was killed (SIGKILL, the
    OOM killer), crashed (SIGSEGV) or left through `os._exit`.

        said = run_outcome(trace.meta)
        said["headline"]   # 'The run failed: exit status 1; rank 1 (pid 41) raised ...'


    `what`: the headline without what it means for the findings; `failed`: the command's
    exit status was not 0 (or a signal ended it); `processes`: one
    row per process that raised or never finished (pid, rank, how), which alone do not make
    the run failed (a helper killed by its parent is not a failure of the run)."""
    run = meta.get("run") or {}
    exit_code, signum = run.get("exit_code"), run.get("signal")
    died = [row for row in map(_death, meta.get("processes") or []) if row is not None]
    failed = bool(exit_code) or signum is not None
    if not failed and not died:
        return None
    what = _what_ended(failed, exit_code, signum, died)
    tail = ": what follows covers what was recorded before" if failed else ""
    return {"failed": failed, "exit_code": exit_code, "signal": signum,
            "signal_name": _signal_name(signum), "processes": died, "what": what,
            "headline": what + tail}


def _death(process: dict[str, Any]) -> dict[str, Any] | None:
    exception = process.get("exception")
    if exception:
        how = f"raised {exception}"
    elif process.get("ended_by"):  # a rank its launcher stopped when another one failed
        how = f"was ended by {process['ended_by']}"
    elif process.get("crash"):  # the fatal signal and the frame faulthandler wrote
        how = f"crashed: {process['crash']}"
    elif process.get("end_ns") is None:
        how = "ended without exiting Python (killed, crashed or os._exit)"
    else:
        return None
    return {"pid": process.get("pid"), "rank": process.get("rank"), "how": how}


def _signal_name(signum: Any) -> str | None:
    try:
        return signal.Signals(int(signum)).name
    except (TypeError, ValueError):
        return None


def _what_ended(failed: bool, exit_code: Any, signum: Any, died: list[dict[str, Any]]
                ) -> str:
    parts = []
    if failed:
        name = _signal_name(signum)
        parts.append(f"killed by {name or f'signal {signum}'}" if signum is not None
                     else f"exit status {exit_code}")
    for row in died[:NAMED]:
        who = (f"rank {row['rank']} (pid {row['pid']})" if row["rank"] is not None
               else f"pid {row['pid']}")
        parts.append(f"{who} {row['how']}")
    if len(died) > NAMED:
        parts.append(f"{len(died) - NAMED} more processes as well")
    lead = "The run failed" if failed else "The run ended, but not every process did"
    return f"{lead}: {'; '.join(parts)}"
