"""PyTorch CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot`).

    trace = gpudiag.readers.torch_memory.reader.read_snapshot(Path("snapshot.pickle"))
    trace.memory_blocks.groupby("state", observed=True)["bytes"].sum()

A snapshot is a pickle of plain data (`torch/csrc/cuda/memory_snapshot.cpp`):
`{"segments": [segment...], "device_traces": [[entry...] per device], "allocator_settings"}`.
It comes from strangers, so it is opened only with the restricted unpickler of
`torch_memory_pickle` (no code, no objects). Two tables come out of it:

- `memory`, one row per trace entry (the allocator history): `ts_ns` = time_us * 1000;
  `delta_bytes` is +size for `alloc` and -size for `free_completed` (and the single `free`
  of torch 2.0), NA for every other action: `free_requested` only marks the block until
  its stream work completes, and segment actions change reserved, not allocated, bytes.
  So the sum of `delta_bytes` is the change of allocated bytes over the recorded window.
- `memory_blocks`, one row per block of every segment at dump time.

`site` is the call site "file:line (function)" of the innermost Python frame outside torch
and installed packages (the user's line that allocated), else the innermost Python frame,
else the innermost frame with a file name. Frames are innermost first; each distinct frame
and frame list (the pickle shares them) is judged once.

Older snapshots are read too: without `time_us` (torch < 2.1) `ts_ns` is the entry's order
and `meta["timeline"]` is False; blocks without `address` get segment address + the sizes
before them; block frames under `history` (torch 2.0) are used. Anything odd inside the
lists (a non-dict entry, an unknown action or state, a missing size) is kept as NA or
skipped, and counted in `meta["warnings"]`.

A pickle shares objects through its memo, so a small file can name one list many times:
160 KB can describe 1.6e9 blocks that are the same block. Before walking anything the reader
adds up how many trace entries and blocks it would visit (one `len` per list) and refuses a
snapshot past `max_rows` (default `DEFAULT_MAX_ROWS`, or the GPUDIAG_MAX_SNAPSHOT_ROWS
environment variable), so the work stays proportional to what it will keep.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.inputs.text import valid_categorical
from gpudiag.readers.files import budget
from gpudiag.readers.torch_memory.sites import Sites
from gpudiag.readers.torch_memory.timeline import read_timeline
from gpudiag.readers.torch_memory.unpickler import HOW_TO_DUMP, load_plain, plain_json
from gpudiag.trace import Trace

__all__ = ["read_snapshot", "read_timeline"]

ACTIONS = frozenset({
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "oom", "snapshot", "free",
})
DELTA_SIGN = {"alloc": 1, "free_completed": -1, "free": -1}
STATES = {
    "active_allocated": "allocated", "inactive": "inactive",
    "active_pending_free": "awaiting_free",  # what memory_snapshot.cpp writes
    "active_awaiting_free": "awaiting_free",  # the name torch's TypedDict docs use
}
POOLS = frozenset({"large", "small"})
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: trace entries + blocks a snapshot may hold; a real one with max_entries=100000 on 8 GPUs
#: and a million blocks is under 2e6, and 1e7 rows take a few GB of memory while read
DEFAULT_MAX_ROWS = 10_000_000
MAX_ROWS_ENV = "GPUDIAG_MAX_SNAPSHOT_ROWS"


def read_snapshot(path: Path, max_rows: int | None = None) -> Trace:
    """Read a `_dump_snapshot` pickle (plain or gzipped) into `memory` and `memory_blocks`.

    `max_rows` bounds the trace entries plus blocks (see `row_budget`); past it, InputError.
    """
    data = load_plain(path)
    segments, device_traces = _parts(path, data)
    _check_size(path, segments, device_traces, row_budget(path, max_rows))
    warnings: Counter[str] = Counter()
    sites = Sites()
    memory, timeline = _entries(device_traces, sites, warnings)
    blocks = _blocks(segments, sites, warnings)
    meta: dict[str, Any] = {
        "format": "torch-memory-snapshot", "vendor": "nvidia", "timeline": timeline,
    }
    if "allocator_settings" in data:
        meta["allocator_settings"] = plain_json(data["allocator_settings"])
    trace = Trace(meta=meta, memory=memory, memory_blocks=blocks)
    for kind, count in warnings.items():
        trace.warn(kind, count)
    return trace


def _parts(path: Path, data: Any) -> tuple[list[Any], list[list[Any]]]:
    """(segments, device_traces) of a snapshot, or InputError when `data` is not one."""
    segments = data.get("segments", []) if isinstance(data, dict) else None
    traces = data.get("device_traces", []) if isinstance(data, dict) else None
    keyed = isinstance(data, dict) and ("segments" in data or "device_traces" in data)
    if not keyed or not isinstance(segments, list) or not isinstance(traces, list) or any(
        not isinstance(device_trace, list) for device_trace in traces
    ):
        what = type(data).__name__ if not isinstance(data, dict) else (
            "a dict without a 'segments' list or 'device_traces' list of lists")
        raise InputError(
            path, f"is a pickle but not a torch memory snapshot (it holds {what})", HOW_TO_DUMP)
    return segments, traces


def row_budget(path: Path, max_rows: int | None = None) -> int:
    """`max_rows`, else GPUDIAG_MAX_SNAPSHOT_ROWS, else DEFAULT_MAX_ROWS."""
    return max_rows if max_rows is not None else budget(MAX_ROWS_ENV, DEFAULT_MAX_ROWS)


def _check_size(path: Path, segments: list[Any], traces: list[list[Any]], budget: int) -> None:
    """InputError when the entries and blocks to walk exceed `budget` (counted, not walked)."""
    rows = sum(len(device_trace) for device_trace in traces)
    for seg in segments:
        blocks = seg.get("blocks") if type(seg) is dict else None
        rows += len(blocks) if type(blocks) is list else 0
        if rows > budget:
            break
    if rows > budget:
        raise InputError(
            path, f"holds more than {budget:,} trace entries and blocks (the pickle repeats "
            "shared lists, or the snapshot is very large)",
            f"if the snapshot is genuine, raise the budget: {MAX_ROWS_ENV}=<rows> or "
            "read_snapshot(path, max_rows=...)",
        )


def _int(value: Any) -> int | None:
    """`value` when it is an int64 (not a bool), else None: strangers' ints may be anything."""
    return value if type(value) is int and INT64_MIN <= value <= INT64_MAX else None


def _time_ns(value: Any) -> int | None:
    """time_us (int or float microseconds) as int64 nanoseconds, None when unusable."""
    if type(value) is float:
        value = int(value) if math.isfinite(value) else None
    if type(value) is int and abs(value) <= INT64_MAX // 1000:
        return value * 1000
    return None


def _entries(
    device_traces: list[list[Any]], sites: Sites, warnings: Counter[str]
) -> tuple[dict[str, Any], bool]:
    """`memory` columns from every trace entry, and whether times are real."""
    cols: dict[str, list[Any]] = {key: [] for key in (
        "device", "ts_ns", "action", "addr", "bytes", "delta_bytes", "stream", "site",
        "device_free_bytes")}
    device, times, action, addr, size, delta, stream, site, free = cols.values()
    timed = untimed = 0
    for position, entries in enumerate(device_traces):
        first = len(times)
        for entry in entries:
            if type(entry) is not dict:
                warnings["trace entries that are not dicts skipped"] += 1
                continue
            name = entry.get("action")
            if type(name) is not str or name not in ACTIONS:
                warnings["trace entries with an unknown action kept without one"] += 1
                name = None
            nbytes = _int(entry.get("size"))
            sign = DELTA_SIGN.get(name) if name and nbytes is not None else None
            device.append(_int(entry.get("device", position)))
            times.append(_time_ns(entry.get("time_us")))
            action.append(name)
            addr.append(_int(entry.get("addr")))
            size.append(nbytes)
            delta.append(sign * nbytes if sign and nbytes is not None else None)
            stream.append(_int(entry.get("stream")))
            site.append(sites.of(entry.get("frames")))
            free.append(_int(entry.get("device_free")))
        missing = times[first:].count(None)
        timed += len(times) - first - missing
        untimed += missing
        times[first:] = _fill_times(times[first:])
    return _columns(cols), _time_warnings(timed, untimed, warnings)


def _fill_times(times: list[int | None]) -> list[int]:
    """One device's times with gaps filled, so rows stay in order on one clock.

    An entry without a time takes the time of the entry before it (the first ones, of the
    first timed entry); when no entry has a time (torch < 2.1), times are the entry order.
    """
    if None not in times:
        return times  # type: ignore[return-value]
    known = [time for time in times if time is not None]
    if not known:
        return list(range(len(times)))
    last = known[0]
    filled = []
    for time in times:
        last = last if time is None else time
        filled.append(last)
    return filled


def _time_warnings(timed: int, untimed: int, warnings: Counter[str]) -> bool:
    """Count entries without a time; True when `ts_ns` is a real timeline."""
    if untimed and not timed:
        warnings["trace entries without time_us (torch < 2.1): ts_ns is their order"] += untimed
        return False
    if untimed:
        warnings["trace entries without a usable time_us given the time of the one before"] += (
            untimed)
    return True


def _columns(cols: dict[str, list[Any]]) -> dict[str, Any]:
    """Python lists to typed columns, built once per column (no per-row pandas work)."""
    out: dict[str, Any] = {}
    for name, values in cols.items():
        if name in ("action", "site", "pool", "state"):  # a pickle's text may hold surrogates
            out[name] = valid_categorical(values)
        elif name == "expandable":
            out[name] = pd.array(values, dtype="boolean")
        elif name == "ts_ns":
            out[name] = np.array(values, dtype=np.int64)
        else:
            out[name] = pd.array(values, dtype="Int64")
    return out


def _blocks(segments: list[Any], sites: Sites, warnings: Counter[str]) -> dict[str, Any]:
    """`memory_blocks` columns: one row per block of every segment."""
    cols: dict[str, list[Any]] = {key: [] for key in (
        "device", "pool", "segment_addr", "segment_bytes", "addr", "bytes",
        "requested_bytes", "state", "stream", "expandable", "site")}
    for seg in segments:
        blocks = seg.get("blocks") if type(seg) is dict else None
        if type(blocks) is not list:
            warnings["segments without a blocks list skipped"] += 1
            continue
        _segment_blocks(seg, blocks, cols, sites, warnings)
    return _columns(cols)


def _segment_blocks(
    seg: dict[str, Any], blocks: list[Any], cols: dict[str, list[Any]], sites: Sites,
    warnings: Counter[str],
) -> None:
    """Append the rows of one segment's blocks to `cols`."""
    device, pool, seg_addr, seg_bytes, addr, size, requested, state, stream, expandable, site = (
        cols.values())
    segment = (
        _int(seg.get("device")), _pool(seg.get("segment_type"), warnings),
        _int(seg.get("address")), _int(seg.get("total_size")), _int(seg.get("stream")),
        seg.get("is_expandable") if type(seg.get("is_expandable")) is bool else None,
    )
    cursor = segment[2]  # blocks tile the segment: each starts where the one before ended
    for block in blocks:
        if type(block) is not dict:
            warnings["blocks that are not dicts skipped"] += 1
            continue
        nbytes, start = _int(block.get("size")), _int(block.get("address"))
        if start is None and cursor is not None:
            start = cursor
            warnings["block addresses computed from the segment address (older snapshot)"] += 1
        cursor = _int(start + nbytes) if start is not None and nbytes is not None else None
        frames, asked = _block_extra(block)
        for column, value in zip(
            (device, pool, seg_addr, seg_bytes, stream, expandable), segment, strict=True):
            column.append(value)
        addr.append(start)
        size.append(nbytes)
        requested.append(asked)
        state.append(_state(block.get("state"), warnings))
        site.append(sites.of(frames))


def _block_extra(block: dict[str, Any]) -> tuple[Any, int | None]:
    """(frames, requested bytes) of a block; torch 2.0 kept both in `history[0]`."""
    if "frames" in block or "history" not in block:
        return block.get("frames"), _int(block.get("requested_size"))
    history = block["history"]
    first = history[0] if type(history) is list and history else None
    if type(first) is not dict:
        return None, _int(block.get("requested_size"))
    return first.get("frames"), _int(first.get("real_size"))


def _pool(value: Any, warnings: Counter[str]) -> str | None:
    if type(value) is str and value in POOLS:
        return value
    warnings["segments with an unknown segment_type kept without a pool"] += 1
    return None


def _state(value: Any, warnings: Counter[str]) -> str | None:
    if type(value) is str and value in STATES:
        return STATES[value]
    warnings["blocks with an unknown state kept without one"] += 1
    return None
