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
from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS
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
    the index label in that table; `by_device[key]` the positions of a device's events,
    keyed by (rank, device) as ints, `keys.MISSING` where NA (`waterfall.DeviceKey`)."""

    start: IntArray
    end: IntArray
    table: npt.NDArray[np.int8]
    row: IntArray
    by_device: dict[tuple[int, int], IntArray]


def device_events(trace: Trace) -> DeviceEvents:
    """The trace's GPU events by `(rank, device)` (NA -> `keys.MISSING`), computed once per
    trace."""
    return trace.derived("device_events", lambda: _device_events(trace))


def _device_events(trace: Trace) -> DeviceEvents:
    frames = [trace.kernels, trace.copies]
    rank = np.concatenate([keys.key_array(frame["rank"]) for frame in frames])
    device = np.concatenate([keys.key_array(frame["device"]) for frame in frames])
    start = np.concatenate([frame["start_ns"].to_numpy(np.int64) for frame in frames])
    end = np.concatenate([frame["end_ns"].to_numpy(np.int64) for frame in frames])
    table = np.repeat(np.array([0, 1], dtype=np.int8), [len(frame) for frame in frames])
    row = np.concatenate([frame.index.to_numpy(np.int64) for frame in frames])
    valid = end >= start
    code = keys.codes(rank, device)
    order = np.argsort(code, kind="stable")
    order = order[valid[order]]
    bounds = np.flatnonzero(np.diff(code[order])) + 1
    by_device = {(int(rank[group[0]]), int(device[group[0]])): group
                 for group in np.split(order, bounds) if len(group)}  # one per device
    return DeviceEvents(start, end, table, row, dict(sorted(by_device.items())))


def idle_gaps(trace: Trace, *, launch_gap_ns: int = LAUNCH_GAP_NS,
              sync_tolerance_ns: int = SYNC_TOLERANCE_NS,
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
    events = device_events(trace)
    found = [_device_gaps(events, key, idx, window) for key, idx in events.by_device.items()]
    windowed = [piece for piece in found if piece is not None]
    if not windowed:
        return empty_gaps()
    gaps = _gap_frame(trace, events, windowed)
    if len(windowed) < len(found):  # dtypes as a concat with an empty device's frame gave
        gaps = pd.concat([gaps, empty_gaps()], ignore_index=True)
    if gaps.empty:
        return empty_gaps()
    gaps["rank"] = keys.key_column(gaps["rank"])  # NA again while joined (launch_calls)
    gaps["device"] = keys.key_column(gaps["device"])
    launch = callsites.launch_calls(trace, gaps)
    gaps["tid"] = launch["tid"]
    gaps["launch_ns"] = launch["api_start_ns"]
    _attach_waits(gaps, blocking_waits(trace), sync_tolerance_ns)
    gaps["copy_until_ns"] = _copy_in_progress(gaps, trace.api)
    return _pieces(gaps, launch_gap_ns)


#: one device's gaps: its key, each gap's start and end, the position (in `DeviceEvents`)
#: of the event that follows it, and whether one starts right at the gap's end
DeviceGaps = tuple[tuple[int, int], IntArray, IntArray, IntArray, npt.NDArray[np.bool_]]


def _device_gaps(events: DeviceEvents, key: tuple[int, int], idx: IntArray,
                 window: tuple[int, int] | None) -> DeviceGaps | None:
    """The idle intervals of one device's window (None: the window is empty)."""
    start, end = events.start[idx], events.end[idx]
    first, last = int(start.min()), int(end.max())
    if window is not None:
        first, last = max(first, window[0]), min(last, window[1])
    if last <= first:
        return None
    busy = intervals.union(start, end)
    gap_start, gap_end = intervals.complement(busy, first, last)
    order = np.argsort(start, kind="stable")
    following = order[np.minimum(np.searchsorted(start[order], gap_end, side="left"),
                                 len(order) - 1)]
    return key, gap_start, gap_end, idx[following], start[following] == gap_end


def _gap_frame(trace: Trace, events: DeviceEvents, found: list[DeviceGaps]) -> pd.DataFrame:
    """Every device's gaps in one frame (`found`: at least one device), each joined to its
    next event's pid and correlation (one lookup per table for all devices)."""
    counts = [len(piece[1]) for piece in found]
    following = np.concatenate([piece[3] for piece in found])
    has_next = np.concatenate([piece[4] for piece in found])
    table, row = events.table[following], events.row[following]
    pid = pd.array(np.full(len(following), pd.NA), dtype="Int64")
    correlation = pid.copy()
    for code, name in enumerate(TABLE_CODES):  # join each next event to its own table
        mine = table == code
        if mine.any():
            frame = getattr(trace, name)
            at = frame.index.get_indexer(row[mine])
            pid[mine] = frame["pid"].array[at]
            correlation[mine] = frame["correlation"].array[at]
    return pd.DataFrame({
        "rank": np.repeat([piece[0][0] for piece in found], counts).astype(np.int64),
        "device": np.repeat([piece[0][1] for piece in found], counts).astype(np.int64),
        "gap_start_ns": np.concatenate([piece[1] for piece in found]),
        "gap_end_ns": np.concatenate([piece[2] for piece in found]),
        "pid": pid, "correlation": correlation,
        "next_table": _table_names(table, has_next),
        "next_row": keys.key_column(np.where(has_next, row, keys.MISSING)).array,
    })


def _table_names(table: npt.NDArray[np.int8], has_next: npt.NDArray[np.bool_]
                 ) -> npt.NDArray[np.object_]:
    names = np.array(TABLE_CODES, dtype=object)[table]
    names[~has_next] = None
    return names


def _attach_waits(gaps: pd.DataFrame, waits: pd.DataFrame, tolerance: int) -> None:
    """Mark gaps that a blocking wait on the next event's process explains (rule 1)."""
    count = len(gaps)
    found = np.full(count, -1, dtype=np.int64)
    if len(waits) and count:
        found = _find_wait(gaps, waits, tolerance)
    hit = found >= 0
    safe = np.maximum(found, 0)

    def pick(col: str, dtype: str) -> pd.Series:
        values = pd.Series(waits[col].to_numpy()[safe] if len(waits) else [pd.NA] * count,
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
    gap_start = gaps["gap_start_ns"].to_numpy(np.int64)
    upper = gaps["gap_end_ns"].to_numpy(np.int64)
    known = gaps["launch_ns"].notna().to_numpy(bool)
    launch = gaps["launch_ns"].to_numpy(np.int64, na_value=0)
    upper = np.where(known & (launch > gap_start), np.minimum(upper, launch), upper)
    (wkey, lo_key, hi_key), _ = keys.time_keys(
        [wcode, gcode, gcode], [waits["end_ns"].to_numpy(np.int64), gap_start - tolerance,
                                upper + tolerance])
    order = np.argsort(wkey, kind="stable")
    wkey = wkey[order]
    starts = waits["start_ns"].to_numpy(np.int64)[order]
    count = np.int64(len(starts))
    # one int64 holds (earliness rank, position): the range maximum names the wait too
    earliness = count - 1 - np.argsort(np.argsort(starts, kind="stable"), kind="stable")
    packed = earliness.astype(np.int64) * count + np.arange(count, dtype=np.int64)
    first = np.searchsorted(wkey, lo_key, side="left")  # the candidates: [first, after)
    after = np.searchsorted(wkey, hi_key, side="right")
    valid = (gcode >= 0) & (after > first)
    best = range_max(packed, np.where(valid, first, 0), np.where(valid, after, 1))
    pos = best % count
    hit = valid & (starts[pos] <= gap_start + tolerance)
    return np.where(hit, order[pos], -1)


def _copy_in_progress(gaps: pd.DataFrame, api: pd.DataFrame) -> npt.NDArray[np.int64]:
    """For each gap, the end of a memcpy API call of its process open at the gap's start
    (clipped to the gap), or the gap's start when there is none (rule 2)."""
    gap_start = gaps["gap_start_ns"].to_numpy(np.int64)
    gap_end = gaps["gap_end_ns"].to_numpy(np.int64)
    copies = api[api["name"].isin([name for name in api["name"].cat.categories
                                   if COPY_APIS.search(name)])]
    if copies.empty:
        return gap_start
    ccode, gcode = keys.process_codes(copies, gaps)
    (skey, ekey, qkey), times = keys.time_keys(
        [ccode, ccode, gcode], [copies["start_ns"].to_numpy(np.int64),
                                copies["end_ns"].to_numpy(np.int64), gap_start])
    order = np.argsort(skey, kind="stable")
    reach = np.maximum.accumulate(ekey[order])  # latest end among calls begun, per process
    last_begun = np.searchsorted(skey[order], qkey, side="right") - 1
    best = reach[np.maximum(last_begun, 0)]
    count = np.int64(len(times))
    same = (best // count) == gcode
    end = times[best % count]
    open_at_start = (gcode >= 0) & (last_begun >= 0) & same & (end > gap_start)
    return np.where(open_at_start, np.minimum(end, gap_end), gap_start)


def _pieces(gaps: pd.DataFrame, launch_gap_ns: int) -> pd.DataFrame:
    """Apply rules 1-5: one row per attributed piece."""
    gap_start = gaps["gap_start_ns"].to_numpy(np.int64)
    gap_end = gaps["gap_end_ns"].to_numpy(np.int64)
    sync = gaps["wait_kind"].notna().to_numpy()
    copy_end = np.where(sync, gap_start, gaps["copy_until_ns"].to_numpy(np.int64))
    known = gaps["launch_ns"].notna().to_numpy(bool)
    # int64: epoch ns lose bits in float
    launch = gaps["launch_ns"].to_numpy(np.int64, na_value=0)
    is_copy = (gaps["next_table"] == "copies").to_numpy()
    rest = ~sync & (copy_end < gap_end)
    queued = known & (launch <= copy_end)
    host_wait = known & (launch > copy_end)
    split = np.where(host_wait, np.minimum(launch, gap_end), gap_end)
    short = (split - copy_end) < launch_gap_ns
    middle = np.select([queued & short & is_copy, short], ["copy", "launch_bound"], "host_bound")
    middle_rule = np.select([queued, host_wait], ["queued", "host_wait"], "no_launch")
    tail = host_wait & (split < gap_end) & rest
    parts = [
        gaps[sync].assign(start_ns=gap_start[sync], end_ns=gap_end[sync], cause="sync_stall",
                          rule="sync"),
        gaps.assign(start_ns=gap_start, end_ns=copy_end, cause="copy",
                    rule="copy_in_progress")[~sync],
        gaps.assign(start_ns=copy_end, end_ns=split, cause=middle, rule=middle_rule)[rest],
        gaps.assign(start_ns=split, end_ns=gap_end,
                    cause=np.where(is_copy, "copy", "launch_bound"), rule="launch_latency")[tail],
    ]
    out = pd.concat(parts, ignore_index=True)
    out = out[out["end_ns"] > out["start_ns"]]
    out = out.sort_values(["rank", "device", "start_ns"], kind="stable", ignore_index=True,
                          na_position="first")
    return out.loc[:, list(GAP_COLUMNS)].astype({"cause": "string", "rule": "string"})


def empty_gaps() -> pd.DataFrame:
    """`idle_gaps`' columns without rows (a trace or window with no idle time)."""
    return pd.DataFrame({col: pd.Series(dtype="Int64") for col in GAP_COLUMNS}).astype(
        {"cause": "string", "rule": "string", "next_table": "object", "wait_kind": "string",
         "wait_api": "string"})
