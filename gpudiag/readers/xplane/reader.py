"""JAX / XLA (and TensorFlow) profiler output: XSpace `.xplane.pb` and its Chrome JSON form.

    trace = gpudiag.readers.xplane.reader.read(Path("host.xplane.pb"))

`jax.profiler.trace(dir)` writes `plugins/profile/<run>/<host>.xplane.pb`, the XSpace
protobuf that XLA's profiler collects; with `create_perfetto_trace=True` it also writes
`perfetto_trace.json.gz`, xprof's trace-viewer JSON of the same XSpace (planes as processes,
lines as threads, stats as string `args`). Both are read into the same tables by
`xplane_tables.tables()`. The protobuf is decoded by our own wire walker (`xplane_wire`), so
neither jax, tensorflow nor protobuf is needed.

Times: an event starts at its line's `timestamp_ns` plus its `offset_ps`; picoseconds are
rounded to the nearest nanosecond, as the JSON path rounds its microsecond floats.
"""

from __future__ import annotations

import re
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.devices import fill_from_compute_capability
from gpudiag.errors import InputError
from gpudiag.intervals import us_to_ns
from gpudiag.readers.chrome.structs import (
    ArgDecoder,
    Document,
    codes_of,
    column,
    decode,
    floats,
)
from gpudiag.readers.files import read_bytes
from gpudiag.readers.xplane.space import Space, parse_space
from gpudiag.readers.xplane.tables import Columns, Lane, ints, tables
from gpudiag.readers.xplane.wire import WireError
from gpudiag.trace import Trace

GPU_PLANE = re.compile(r"^/device:GPU:(\d{1,9})$")
#: XPlane stat -> devices column (clock_rate is in kHz: xprof's kDevCapClockRateKHz)
DEVICE_STATS = {"core_count": "sm_count", "compute_cap_major": "cc_major",
                "compute_cap_minor": "cc_minor", "clock_rate": "clock_khz",
                "memory_size": "mem_bytes"}
TIME_LIMIT_NS = 2**62  # clamp: keeps start + duration inside int64 for corrupt input
TIME_LIMIT_US = TIME_LIMIT_NS / 1000
EMPTY: dict[str, Any] = {}


def read(path: Path) -> Trace:
    """Read an XSpace protobuf (plain or gzipped) into a Trace."""
    try:
        space = parse_space(read_bytes(path))
    except WireError as exc:
        raise InputError(
            path, f"is not a valid XSpace protobuf or is truncated ({exc})",
            "pass the .xplane.pb that jax.profiler / tf.profiler wrote, copied completely",
        ) from exc
    if not any(plane.name.startswith(("/device:", "/host:")) for plane in space.planes):
        raise InputError(
            path, "is an XSpace protobuf with no /device: or /host: planes (nothing profiled)",
            "profile a run that executes on the GPU, e.g. inside jax.profiler.trace(dir)",
        )
    offset_ns = epoch_offset_ns(space)
    cols, repairs = _space_columns(space, offset_ns)
    planes = [(plane.name, plane.stats) for plane in space.planes]
    meta = {"format": "xplane", "hostnames": space.hostnames, "clock_offset_ns": offset_ns,
            "framework": framework_of(space)}
    trace = _build(cols, planes, meta, repairs)
    for text in space.errors + space.warnings:
        trace.warn(f"profiler reported: {text}")
    return trace


#: lines only TensorFlow's profiler writes (its op and name-scope lines of a device plane);
#: JAX's XSpace has XLA's lines and shares TF's thread names (tf_XLAEigen...), so those
#: tell nothing
_TENSORFLOW_LINES = frozenset({"TensorFlow Ops", "TensorFlow Name Scope"})


def framework_of(space: Space) -> str:
    """'tensorflow' or 'jax': which framework's profiler wrote the XSpace (the advice a
    finding gives is in its words)."""
    names = {line.name for plane in space.planes for line in plane.lines}
    return "tensorflow" if names & _TENSORFLOW_LINES else "jax"


def read_perfetto(path: Path) -> Trace:
    """Read the Chrome JSON that jax.profiler writes (`perfetto_trace.json.gz` with
    create_perfetto_trace=True, `<host>.trace.json.gz`): the registry's `jax-perfetto`
    sniff sends it here, told apart from a Kineto trace by its XLA plane names."""
    return from_perfetto(path, decode(path))


def from_perfetto(path: Path, doc: Document) -> Trace:
    """Read the Chrome JSON that jax.profiler writes (create_perfetto_trace=True), already
    decoded, into the same tables as `read` gives for the XSpace.

    `path` is the file `doc` came from; the JSON holds no plane stats, so devices carry no
    capabilities, and xprof leaves allocator events out of it, so `memory` stays empty."""
    cols, planes, repairs = _json_columns(doc)
    return _build(cols, planes, {"format": "jax-perfetto"}, repairs)


def _build(cols: Columns, planes: list[tuple[str, dict[str, Any]]], meta: dict[str, Any],
           repairs: dict[str, int]) -> Trace:
    parts = tables(cols)
    vendor = _vendor(planes, parts)
    trace = Trace(meta={**meta, "vendor": vendor, "timeline": True},
                  devices=_devices(planes, vendor), **parts)
    for kind, count in repairs.items():
        trace.warn(kind, count)
    return trace


# -- XSpace -------------------------------------------------------------------------------


def epoch_offset_ns(space: Space) -> int:
    """What to add to line timestamps to put them on the Unix-epoch clock (0: already there).

    The profiler normalizes an XSpace to its session start before writing it (line
    timestamps count from `profile_start_time`, which the `Task Environment` plane keeps in
    epoch ns). Adding it back lines JAX up with Kineto and with `gpudiag profile`'s own host
    markers. Older XSpaces without that stat stay relative (offset 0), as do lines already
    epoch-based (a timestamp beyond a day's worth of ns cannot be session-relative).
    """
    day_ns = 86_400 * 10**9
    starts = [line.timestamp_ns for plane in space.planes for line in plane.lines]
    if starts and max(starts) > day_ns:
        return 0
    for plane in space.planes:
        if plane.name == "Task Environment":
            start = plane.stats.get("profile_start_time")
            if isinstance(start, int) and start > day_ns:
                return start
    return 0


def _space_columns(space: Space, offset_ns: int = 0) -> tuple[Columns, dict[str, int]]:
    """Flatten every line of every plane into event columns (lists, then numpy once)."""
    lanes: list[Lane] = []
    counts: list[int] = []
    line_ts: list[int] = []
    names: list[Any] = []
    stats: list[Any] = []
    offsets: list[int] = []
    durations: list[int] = []
    skipped = 0
    for plane in space.planes:
        labels = {key: meta.label for key, meta in plane.event_metadata.items()}
        shared = {key: meta.stats for key, meta in plane.event_metadata.items() if meta.stats}
        for line in plane.lines:
            skipped += line.aggregated
            lanes.append(Lane(plane.name, line.label, (line.display_id or line.id) & 0xFFFFFFFF))
            counts.append(len(line.metadata_ids))
            line_ts.append(line.timestamp_ns + offset_ns)
            names += map(labels.get, line.metadata_ids)
            stats += _merge_stats(line.metadata_ids, line.stats, shared) if shared else line.stats
            offsets += line.offsets_ps
            durations += line.durations_ps
    start, dur, clipped = _event_times(line_ts, counts, offsets, durations)
    lane = np.repeat(np.arange(len(lanes), dtype=np.int64), counts)
    repairs = {"events with negative duration clipped to 0": clipped,
               "aggregated events without a timestamp skipped": skipped}
    return Columns(lanes, lane, names, start, dur, DictStats(stats)), repairs


def _merge_stats(ids: list[int], own: list[Any], shared: dict[int, dict[str, Any]]) -> list[Any]:
    """Event stats over its metadata's stats (the order xprof applies them in)."""
    return [{**shared[meta_id], **(event_stats or EMPTY)} if meta_id in shared else event_stats
            for meta_id, event_stats in zip(ids, own, strict=True)]


def _event_times(line_ts: list[int], counts: list[int], offsets: list[int],
                 durations: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """(start_ns, dur_ns, negative durations clipped), ps rounded to the nearest ns."""
    base = np.clip(np.array(line_ts, dtype=np.int64), -TIME_LIMIT_NS, TIME_LIMIT_NS)
    base_ns = np.repeat(base, counts)
    off = np.array(offsets, dtype=np.uint64).view(np.int64)
    dur = np.array(durations, dtype=np.uint64).view(np.int64)
    clipped = int((dur < 0).sum())
    dur = np.maximum(dur, 0)
    start = base_ns + _ps_to_ns(off)
    return start, _ps_to_ns(dur), clipped


def _ps_to_ns(picoseconds: np.ndarray) -> np.ndarray:
    whole, rest = np.divmod(picoseconds, 1000)
    return whole + (rest >= 500)


class DictStats:
    """Stats of XSpace events: one dict (or None) per event."""

    def __init__(self, rows: list[dict[str, Any] | None]) -> None:
        self.rows = rows

    def get(self, idx: np.ndarray, key: str) -> list[Any]:
        rows = self.rows
        return [(row.get(key) if row else None) for row in map(rows.__getitem__, idx.tolist())]

# -- Chrome JSON (perfetto_trace.json.gz) -------------------------------------------------


class _Label(msgspec.Struct, gc=False):
    """args of process_name / thread_name metadata events."""

    name: Any = None


class _Stats(msgspec.Struct, gc=False):
    """The stats gpudiag reads, from an event's `args` (xprof writes every value as a
    string; the table builders parse numbers from either form)."""

    correlation_id: Any = None
    kernel_details: Any = None
    memcpy_details: Any = None
    allocator_name: Any = None
    allocation_bytes: Any = None
    bytes_allocated: Any = None
    addr: Any = None
    step_name: Any = None


_LABELS = ArgDecoder(_Label)
_STATS = ArgDecoder(_Stats)


class StructStats:
    """Stats of JSON events: one decoded `_Stats` per event."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def get(self, idx: np.ndarray, key: str) -> list[Any]:
        rows = self.rows
        return list(map(attrgetter(key), map(rows.__getitem__, idx.tolist())))


def _json_columns(doc: Document) -> tuple[Columns, list[tuple[str, Any]], dict[str, int]]:
    """Event columns of a trace-viewer JSON: process names are planes, thread names lines."""
    events = doc.traceEvents or []
    phases = column(events, "ph")
    processes, threads = _labels([event for event, phase in zip(events, phases, strict=True)
                                  if phase == "M"])
    complete = [event for event, phase in zip(events, phases, strict=True) if phase == "X"]
    timestamps = floats(column(complete, "ts"))
    valid = np.abs(timestamps) < TIME_LIMIT_US  # False for NaN too
    kept = [event for event, keep in zip(complete, valid.tolist(), strict=True) if keep]
    keys = list(zip(map(_hashable, column(kept, "pid")), map(_hashable, column(kept, "tid")),
                    strict=True))
    lane, uniques = codes_of(keys)
    lanes = [Lane(str(processes.get(pid, "")), str(threads.get((pid, tid), "")),
                  tid if isinstance(tid, int) else None) for pid, tid in uniques]
    dur = np.nan_to_num(floats(column(kept, "dur")), nan=0.0)
    cols = Columns(
        lanes, lane, column(kept, "name"), us_to_ns(timestamps[valid]),
        us_to_ns(np.clip(dur, 0, TIME_LIMIT_US)),
        StructStats(_STATS.decode(column(kept, "args"))),
    )
    planes = [(name, EMPTY) for name in dict.fromkeys(map(str, processes.values()))]
    repairs = {"events without a timestamp skipped": int((~valid).sum()),
               "events with negative duration clipped to 0": int((dur < 0).sum())}
    return cols, planes, repairs


def _labels(meta: list[Any]) -> tuple[dict[Any, Any], dict[tuple[Any, Any], Any]]:
    """pid -> process name and (pid, tid) -> thread name, from the metadata events."""
    names = column(meta, "name")
    labels = [args.name for args in _LABELS.decode(column(meta, "args"))]
    processes: dict[Any, Any] = {}
    threads: dict[tuple[Any, Any], Any] = {}
    for event, kind, label in zip(meta, names, labels, strict=True):
        if kind == "process_name":
            processes[_hashable(event.pid)] = label
        elif kind == "thread_name":
            threads[(_hashable(event.pid), _hashable(event.tid))] = label
    return processes, threads


def _hashable(value: Any) -> Any:
    """A pid/tid usable as a dict key: JSON gives numbers, strings, or (broken) lists."""
    return value if value is None or isinstance(value, int | float | str) else str(value)


# -- devices and vendor -------------------------------------------------------------------


def _devices(planes: list[tuple[str, dict[str, Any]]], vendor: str) -> pd.DataFrame:
    """One row per /device:GPU:N plane, with the capabilities XLA records as plane stats."""
    rows = [(int(match[1]), stats) for name, stats in planes if (match := GPU_PLANE.match(name))]
    frame = pd.DataFrame({
        "device": np.array([device for device, _ in rows], dtype=np.int64),
        "vendor": [_plane_vendor(props.get("device_vendor")) or vendor for _, props in rows],
        **{col: ints([props.get(stat) for _, props in rows]) for stat, col in DEVICE_STATS.items()},
        "mem_bandwidth_bytes_per_s": floats([props.get("memory_bandwidth") for _, props in rows]),
    })
    return fill_from_compute_capability(frame.drop_duplicates("device"))


def _plane_vendor(value: Any) -> str | None:
    text = str(value or "").lower()
    return "amd" if "amd" in text else "nvidia" if "nvidia" in text else None


def _vendor(planes: list[tuple[str, dict[str, Any]]], parts: dict[str, pd.DataFrame]) -> str:
    """amd when a device plane says so or the host calls HIP; else nvidia for GPU planes
    (XLA's CUDA planes carry no vendor stat); unknown without GPU planes."""
    said = {_plane_vendor(stats.get("device_vendor")) for _, stats in planes} - {None}
    hip = parts["api"]["name"].astype(str).str.startswith("hip").any()
    if said == {"amd"} or (not said and hip):
        return "amd"
    if said == {"nvidia"} or any(GPU_PLANE.match(name) for name, _ in planes):
        return "nvidia" if "amd" not in said else "unknown"
    return "unknown"
