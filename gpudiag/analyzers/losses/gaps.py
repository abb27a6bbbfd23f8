"""Idle GPU time, cut into gaps and each gap attributed to one cause.

For each device (a `(rank, device)` pair) the window runs from its first to its last GPU
event (kernels, copies, memsets, all streams and processes); busy is the union of those
events and a *gap* is a maximal idle interval inside the window. The GPU event that ends a
gap is the *next event*; its API call (joined through the correlation id) started at `l0`
on host thread (pid, tid). Rules, in precedence order:

1. **sync_stall** — the whole gap, when a blocking host wait (see `waits.py`) on the next
   event's process started no later than the gap's start and returned inside the gap (no
   later than `l0` when the next event was issued during the gap; `sync_tolerance_ns`
   absorbs the microsecond rounding of Kineto clocks): the host sat in a synchronize (or
   `.item()`, a synchronous copy) while the queue drained, and the GPU stayed idle until
   the host launched again.
2. **copy** — from the gap's start to the end of a memcpy API call of that process that
   was in progress when the GPU went idle (pageable staging or a synchronous copy held the
   host); the rest of the gap goes on to rules 3-5.
3. When the next event was issued before (what is left of) the gap began (`l0 <= start`),
   the work was queued: a gap shorter than `launch_gap_ns` is launch and dispatch latency,
   **launch_bound** (**copy** when the next event is a copy), HTA's "kernel wait"; a longer
   one is queued work waiting on a dependency that host progress releases (an event the
   host records later, a stream wait), **host_bound** (HTA's "other").
4. Otherwise the host had not issued the next event when the GPU went idle (HTA's "host
   wait"). The gap is split at `l0`: `[start, l0)` is **launch_bound** if shorter than
   `launch_gap_ns` (per-op host overhead between back-to-back launches, what CUDA graphs
   remove) and **host_bound** otherwise (data loading, Python, I/O); `[l0, end)` is the
   launch latency of the next event: **copy** for a copy, else **launch_bound**.
5. Without a launch call (no `api` table or no correlation): **launch_bound** below
   `launch_gap_ns`, else **host_bound**.

The output has one row per attributed *piece* (rules 2 and 4 split a gap), so the
pieces of a device tile its idle time exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals
from gpudiag.analyzers import callsites, keys
from gpudiag.analyzers.losses.waits import blocking_waits
from gpudiag.intervals import range_max
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]

#: host calls that copy memory (Async or not): rule 2 looks for one open at a gap's start
COPY_APIS = re.compile(r"^(?:cuda|hip)Memcpy|^cuMemcpy|^(?:cuda|hip)Memset|^cuMemset")

TABLE_CODES = ("kernels", "copies")
GAP_COLUMNS = ("rank", "device", "start_ns", "end_ns", "gap_start_ns", "gap_end_ns", "cause",
               "rule", "pid", "tid", "next_table", "next_row", "launch_ns", "wait_kind",
               "wait_api", "wait_start_ns", "wait_tid")
#: which rule attributed a piece (docs/analysis.md): the evidence a finding can state
RULES = ("sync", "copy_in_progress", "queued", "host_wait", "launch_latency", "no_launch")


@dataclass(frozen=True)
class DeviceEvents:
    """Kernels and copies as flat arrays grouped by device: what the loss model needs of
    10 million events in ~35 bytes each (a DataFrame with its Int64 columns and a groupby
    copy per device took ten times that). `table` is 0 for kernels, 1 for copies; `row` is
    the index label in that table; `by_device[key]` the positions of a device's events."""

    start: IntArray
    end: IntArray
    table: npt.NDArray[np.int8]
    row: IntArray
    by_device: dict[tuple[int, int], IntArray]


def device_events(trace: Trace) -> DeviceEvents:
    """The trace's GPU events by `(rank, device)` (NA -> -1), computed once per trace."""
    return trace.derived("device_events", lambda: _device_events(trace))


def _device_events(trace: Trace) -> DeviceEvents:
    frames = [trace.kernels, trace.copies]
    rank = np.concatenate([f["rank"].fillna(-1).to_numpy(np.int64) for f in frames])
    device = np.concatenate([f["device"].fillna(-1).to_numpy(np.int64) for f in frames])
    start = np.concatenate([f["start_ns"].to_numpy(np.int64) for f in frames])
    end = np.concatenate([f["end_ns"].to_numpy(np.int64) for f in frames])
    table = np.repeat(np.array([0, 1], dtype=np.int8), [len(f) for f in frames])
    row = np.concatenate([f.index.to_numpy(np.int64) for f in frames])
    valid = end >= start
    code = keys.codes(rank, device)
    order = np.argsort(code, kind="stable")
    order = order[valid[order]]
    bounds = np.flatnonzero(np.diff(code[order])) + 1
    by_device = {(int(rank[g[0]]), int(device[g[0]])): g
                 for g in np.split(order, bounds) if len(g)}  # one per device
    return DeviceEvents(start, end, table, row, dict(sorted(by_device.items())))


def idle_gaps(trace: Trace, *, launch_gap_ns: int = 50_000, sync_tolerance_ns: int = 2_000,
              window: tuple[int, int] | None = None) -> pd.DataFrame:
    """Every idle interval of every device with its cause (rules in the module docstring).

        gaps = idle_gaps(trace)
        gaps.groupby("cause")["end_ns"].count()
        (gaps.end_ns - gaps.start_ns).groupby(gaps.cause).sum()

    `launch_gap_ns` (default 50 µs, HTA's runtime cutoff) separates per-launch host
    overhead from host work; `window` = (start_ns, end_ns) limits the analysis. Computed
    once per trace and options (the sync, host and loss analyses share it): do not modify
    the result.
    """
    key = f"idle_gaps:{launch_gap_ns}:{sync_tolerance_ns}:{window}"
    return trace.derived(key, lambda: _idle_gaps(trace, launch_gap_ns, sync_tolerance_ns,
                                                 window))


def _idle_gaps(trace: Trace, launch_gap_ns: int, sync_tolerance_ns: int,
               window: tuple[int, int] | None) -> pd.DataFrame:
    ev = device_events(trace)
    frames = [_device_gaps(trace, ev, key, idx, window) for key, idx in ev.by_device.items()]
    gaps = pd.concat(frames, ignore_index=True) if frames else _empty_gaps()
    if gaps.empty:
        return _empty_gaps()
    launch = callsites.launch_calls(trace, gaps)
    gaps["tid"] = launch["tid"]
    gaps["launch_ns"] = launch["api_start_ns"]
    _attach_waits(gaps, blocking_waits(trace), sync_tolerance_ns)
    gaps["copy_until_ns"] = _copy_in_progress(gaps, trace.api)
    return _pieces(gaps, launch_gap_ns)


def _device_gaps(trace: Trace, ev: DeviceEvents, key: tuple[int, int], idx: IntArray,
                 window: tuple[int, int] | None) -> pd.DataFrame:
    start, end = ev.start[idx], ev.end[idx]
    lo, hi = int(start.min()), int(end.max())
    if window is not None:
        lo, hi = max(lo, window[0]), min(hi, window[1])
    if hi <= lo:
        return _empty_gaps()
    busy = intervals.union(start, end)
    gs, ge = intervals.complement(busy, lo, hi)
    order = np.argsort(start, kind="stable")
    nxt = order[np.minimum(np.searchsorted(start[order], ge, side="left"), len(order) - 1)]
    has_next = start[nxt] == ge
    table, row = ev.table[idx][nxt], ev.row[idx][nxt]
    pid = pd.array(np.full(len(nxt), pd.NA), dtype="Int64")
    correlation = pid.copy()
    for code, name in enumerate(TABLE_CODES):  # join each next event to its own table
        mine = table == code
        if mine.any():
            frame = getattr(trace, name).loc[row[mine], ["pid", "correlation"]]
            pid[mine] = frame["pid"].array
            correlation[mine] = frame["correlation"].array
    return pd.DataFrame({
        "rank": key[0], "device": key[1], "gap_start_ns": gs, "gap_end_ns": ge,
        "pid": pid, "correlation": correlation,
        "next_table": _table_names(table, has_next),
        "next_row": np.where(has_next, row, -1),
    })


def _table_names(table: npt.NDArray[np.int8], has_next: npt.NDArray[np.bool_]
                 ) -> npt.NDArray[np.object_]:
    names = np.array(TABLE_CODES, dtype=object)[table]
    names[~has_next] = None
    return names


def _attach_waits(gaps: pd.DataFrame, waits: pd.DataFrame, tolerance: int) -> None:
    """Mark gaps that a blocking wait on the next event's process explains (rule 1)."""
    n = len(gaps)
    found = np.full(n, -1, dtype=np.int64)
    if len(waits) and n:
        found = _find_wait(gaps, waits, tolerance)
    hit = found >= 0
    safe = np.maximum(found, 0)

    def pick(col: str, dtype: str) -> pd.Series:
        values = pd.Series(waits[col].to_numpy()[safe] if len(waits) else [pd.NA] * n,
                           index=gaps.index).astype(dtype)
        return values.where(hit)

    gaps["wait_kind"] = pick("kind", "string")
    gaps["wait_api"] = pick("api", "string")
    gaps["wait_start_ns"] = pick("start_ns", "Int64")
    gaps["wait_tid"] = pick("tid", "Int64")


def _find_wait(gaps: pd.DataFrame, waits: pd.DataFrame, tolerance: int) -> npt.NDArray[np.int64]:
    """Index into `waits` of a wait on the gap's process that began by the gap's start and
    returned inside [start - tolerance, min(end, l0)], else -1.

    Waits of a process are keyed (process code, end time) and sorted; for each gap the
    candidates form one contiguous run of that order, and the earliest-starting of them is
    found with one range maximum over all gaps at once, no loop per gap.
    """
    wcode, gcode = keys.process_codes(waits, gaps)
    g0 = gaps["gap_start_ns"].to_numpy(np.int64)
    upper = gaps["gap_end_ns"].to_numpy(np.int64)
    known = gaps["launch_ns"].notna().to_numpy(bool)
    l0 = gaps["launch_ns"].to_numpy(np.int64, na_value=0)
    upper = np.where(known & (l0 > g0), np.minimum(upper, l0), upper)
    (wkey, lo_key, hi_key), _ = keys.time_keys(
        [wcode, gcode, gcode], [waits["end_ns"].to_numpy(np.int64), g0 - tolerance,
                                upper + tolerance])
    order = np.argsort(wkey, kind="stable")
    wkey = wkey[order]
    starts = waits["start_ns"].to_numpy(np.int64)[order]
    n = np.int64(len(starts))
    # one int64 holds (earliness rank, position): the range maximum names the wait too
    earliness = n - 1 - np.argsort(np.argsort(starts, kind="stable"), kind="stable")
    packed = earliness.astype(np.int64) * n + np.arange(n, dtype=np.int64)
    lo = np.searchsorted(wkey, lo_key, side="left")
    hi = np.searchsorted(wkey, hi_key, side="right")
    valid = (gcode >= 0) & (hi > lo)
    best = range_max(packed, np.where(valid, lo, 0), np.where(valid, hi, 1))
    pos = best % n
    ok = valid & (starts[pos] <= g0 + tolerance)
    return np.where(ok, order[pos], -1)


def _copy_in_progress(gaps: pd.DataFrame, api: pd.DataFrame) -> npt.NDArray[np.int64]:
    """For each gap, the end of a memcpy API call of its process open at the gap's start
    (clipped to the gap), or the gap's start when there is none (rule 2)."""
    g0 = gaps["gap_start_ns"].to_numpy(np.int64)
    g1 = gaps["gap_end_ns"].to_numpy(np.int64)
    copies = api[api["name"].isin([n for n in api["name"].cat.categories
                                   if COPY_APIS.search(n)])]
    if copies.empty:
        return g0
    ccode, gcode = keys.process_codes(copies, gaps)
    (skey, ekey, qkey), times = keys.time_keys(
        [ccode, ccode, gcode], [copies["start_ns"].to_numpy(np.int64),
                                copies["end_ns"].to_numpy(np.int64), g0])
    order = np.argsort(skey, kind="stable")
    reach = np.maximum.accumulate(ekey[order])  # latest end among calls begun, per process
    i = np.searchsorted(skey[order], qkey, side="right") - 1
    best = reach[np.maximum(i, 0)]
    n = np.int64(len(times))
    same = (best // n) == gcode
    end = times[best % n]
    open_at_start = (gcode >= 0) & (i >= 0) & same & (end > g0)
    return np.where(open_at_start, np.minimum(end, g1), g0)


def _pieces(gaps: pd.DataFrame, launch_gap_ns: int) -> pd.DataFrame:
    """Apply rules 1-5: one row per attributed piece."""
    g0 = gaps["gap_start_ns"].to_numpy(np.int64)
    g1 = gaps["gap_end_ns"].to_numpy(np.int64)
    sync = gaps["wait_kind"].notna().to_numpy()
    copy_end = np.where(sync, g0, gaps["copy_until_ns"].to_numpy(np.int64))
    known = gaps["launch_ns"].notna().to_numpy(bool)
    l0 = gaps["launch_ns"].to_numpy(np.int64, na_value=0)  # int64: epoch ns lose bits in float
    is_copy = (gaps["next_table"] == "copies").to_numpy()
    rest = ~sync & (copy_end < g1)
    queued = known & (l0 <= copy_end)
    host_wait = known & (l0 > copy_end)
    split = np.where(host_wait, np.minimum(l0, g1), g1)
    short = (split - copy_end) < launch_gap_ns
    middle = np.select([queued & short & is_copy, short], ["copy", "launch_bound"], "host_bound")
    middle_rule = np.select([queued, host_wait], ["queued", "host_wait"], "no_launch")
    tail = host_wait & (split < g1) & rest
    parts = [
        gaps[sync].assign(start_ns=g0[sync], end_ns=g1[sync], cause="sync_stall", rule="sync"),
        gaps.assign(start_ns=g0, end_ns=copy_end, cause="copy", rule="copy_in_progress")[~sync],
        gaps.assign(start_ns=copy_end, end_ns=split, cause=middle, rule=middle_rule)[rest],
        gaps.assign(start_ns=split, end_ns=g1, cause=np.where(is_copy, "copy", "launch_bound"),
                    rule="launch_latency")[tail],
    ]
    out = pd.concat(parts, ignore_index=True)
    out = out[out["end_ns"] > out["start_ns"]]
    out = out.sort_values(["rank", "device", "start_ns"], kind="stable", ignore_index=True)
    return out.loc[:, list(GAP_COLUMNS)].astype({"cause": "string", "rule": "string"})


def _empty_gaps() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="Int64") for c in GAP_COLUMNS}).astype(
        {"cause": "string", "rule": "string", "next_table": "object", "wait_kind": "string",
         "wait_api": "string"})
