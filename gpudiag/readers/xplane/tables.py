"""XLA profiler events into the Trace tables: one classification for both file forms.

An XSpace (`.xplane.pb`) and the Chrome JSON that jax.profiler writes from it
(`perfetto_trace.json.gz`) hold the same events: planes become processes, lines threads,
stats `args`. Both readers reduce their input to `Columns` (one row per event, with the
plane and line it sits on) and call `tables()`, so the two forms give the same Trace.

How XLA lays a profile out, and what each part becomes:
- `/device:GPU:N` planes: lines `Stream #S(...)` are what the GPU executed (CUPTI/roctracer
  activity): kernels, or copies when the event is a memcpy/memset. Every other line on a
  device plane (`XLA Ops`, `XLA Modules`, `TensorFlow Ops`, `Steps`, ...) is derived by the
  profiler from those same kernels, so it becomes `ranges` (source device_op / step) and
  never kernels, or GPU time would count twice.
- `/host:...` planes: one line per thread (`tid` is the number ending the line name, as in
  `Host Threads/583`, else the line id). Events are host ranges (source `python` for the
  Python tracer's `$file:line function` events), except allocator events
  (MemoryAllocation / MemoryDeallocation -> `memory`) and the host side of GPU work, which
  carries a `correlation_id` (-> `api`).
- Other planes (`Task Environment`, `Host CPUs`, ...) describe the session, not GPU time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import pandas as pd

from gpudiag.intervals import nesting_depth
from gpudiag.readers.chrome.structs import categorical, codes_of, floats

DEVICE_PLANE = re.compile(r"^/device:[A-Za-z_]+:(\d{1,9})$")
STREAM_LINE = re.compile(r"^Stream #(\d+)")
THREAD_SUFFIX = re.compile(r"/(-?\d{1,19})$")
ALLOCATOR_DEVICE = re.compile(r"^gpu_(\d+)_", re.IGNORECASE)
API_NAME = re.compile(r"^(cuda|cu|hip)[A-Z]")
API_VERSION = re.compile(r"_v\d+$")
#: xprof leaves async op spans out of its trace viewer (they duplicate XLA Ops); counter
#: lines hold sampled values, not time ranges
SKIPPED_LINES = frozenset({"Async XLA Ops", "_counters_"})
STEP_LINE = "Steps"
MEMORY_EVENTS = {"MemoryAllocation": "alloc", "MemoryDeallocation": "free"}
#: CUPTI/roctracer activity names of copies (xprof's CuptiTracerEventType names)
COPY_NAMES = {"memcpyh2d": "HtoD", "memcpyd2h": "DtoH", "memcpyd2d": "DtoD",
              "memcpyp2p": "PtoP", "memcpyh2h": "HtoH"}
COPY_KINDS = frozenset({"HtoD", "DtoH", "DtoD", "HtoH", "PtoP"})
#: kernel_details keys -> kernels columns. CUDA writes `regs static_shared dynamic_shared
#: grid block`, TF's older tracer `regs shm grid block` (shm = static), ROCm `grid block
#: private_mem group_mem` (group_mem = the whole LDS of a workgroup).
DETAIL_COLUMNS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                  "regs_per_thread", "smem_bytes", "smem_static_bytes", "smem_dynamic_bytes")
LIMIT = 2.0**53  # beyond this a float64 (and a JSON number) is no longer an exact integer

SKIP, STREAM, DEVICE_LINE, STEPS, HOST = range(5)


class StatSource(Protocol):
    """The stats of every event; `get` pulls one stat for chosen events (None: absent)."""

    def get(self, idx: np.ndarray, key: str) -> list[Any]: ...


@dataclass(frozen=True)
class Lane:
    """One line of one plane: a host thread, a GPU stream or a derived device timeline.

    `tid` is the line's numeric id as the source gives it (XLine id, Chrome `tid`)."""

    plane: str
    line: str
    tid: int | None


@dataclass
class Columns:
    """Every timed event of a profile as parallel columns, what both readers produce."""

    lanes: list[Lane]
    lane: np.ndarray  # index into lanes, per event
    name: list[Any]
    start_ns: np.ndarray
    dur_ns: np.ndarray
    stats: StatSource


@dataclass
class LaneInfo:
    """Per lane: what it is (SKIP, STREAM, ...), its device, stream and host thread id.

    `tid` is kept as exact Int64: XLA names some threads by 64-bit hashes, which a float64
    column would round."""

    kind: np.ndarray
    device: np.ndarray  # float64, NaN where none
    stream: np.ndarray
    tid: pd.api.extensions.ExtensionArray

    @classmethod
    def of(cls, lanes: list[Lane]) -> LaneInfo:
        parsed = [_classify(lane) for lane in lanes]
        return cls(np.array([entry[0] for entry in parsed], dtype=np.int8),
                   np.array([entry[1] for entry in parsed], dtype=np.float64),
                   np.array([entry[2] for entry in parsed], dtype=np.float64),
                   pd.array([entry[3] for entry in parsed], dtype="Int64"))

    def tids(self, lane: np.ndarray) -> pd.Series:
        return pd.Series(self.tid.take(lane))


def _classify(lane: Lane) -> tuple[int, float, float, int | None]:
    """(kind, device, stream, tid) of one lane, from its plane and line names."""
    nan = float("nan")
    device = DEVICE_PLANE.match(lane.plane)
    if device:
        if lane.line in SKIPPED_LINES:
            return SKIP, nan, nan, None
        stream = STREAM_LINE.match(lane.line)
        if stream:
            return STREAM, float(device[1]), float(stream[1]), None
        return (STEPS if lane.line == STEP_LINE else DEVICE_LINE), float(device[1]), nan, None
    if lane.plane.startswith("/host:"):
        suffix = THREAD_SUFFIX.search(lane.line)
        tid = int(suffix[1]) if suffix else lane.tid
        return HOST, nan, nan, tid if tid is not None and abs(tid) < 2**63 else None
    return SKIP, nan, nan, None


def tables(cols: Columns) -> dict[str, pd.DataFrame]:
    """kernels, copies, api, memory and ranges from the events of a profile."""
    info = LaneInfo.of(cols.lanes)
    kind = info.kind[cols.lane] if len(cols.lanes) else np.zeros(0, dtype=np.int8)
    names = _NameFlags(cols.name)
    stream_idx = _ordered(cols, kind == STREAM)
    is_copy = names.is_copy[stream_idx] | _present(cols.stats.get(stream_idx, "memcpy_details"))
    host_idx = _ordered(cols, kind == HOST)
    is_memory = names.memory_action[host_idx] != None  # noqa: E711 (elementwise on objects)
    is_api = ~is_memory & _is_api(cols, host_idx, names)
    in_ranges = (kind == DEVICE_LINE) | (kind == STEPS)
    in_ranges[host_idx[~is_memory & ~is_api]] = True
    return {
        "kernels": _kernels(cols, info, names, stream_idx[~is_copy]),
        "copies": _copies(cols, info, names, stream_idx[is_copy]),
        "api": _api(cols, info, names, host_idx[is_api]),
        "memory": _memory(cols, names, host_idx[is_memory]),
        "ranges": _ranges(cols, info, names, _ordered(cols, in_ranges)),
    }


def _ordered(cols: Columns, mask: np.ndarray) -> np.ndarray:
    """Indices of the rows in `mask`, by start time (stable: source order breaks ties)."""
    idx = np.flatnonzero(mask)
    return idx[np.argsort(cols.start_ns[idx], kind="stable")]


def _present(values: list[Any]) -> np.ndarray:
    return np.fromiter((value is not None for value in values), dtype=bool, count=len(values))


def _times(cols: Columns, idx: np.ndarray) -> dict[str, np.ndarray]:
    start = cols.start_ns[idx]
    return {"start_ns": start, "end_ns": start + cols.dur_ns[idx]}


def _gpu(cols: Columns, info: LaneInfo, idx: np.ndarray) -> dict[str, Any]:
    lane = cols.lane[idx]
    return {"device": ints(info.device[lane]), "stream": ints(info.stream[lane]),
            "correlation": ints(cols.stats.get(idx, "correlation_id"))}


def _kernels(cols: Columns, info: LaneInfo, names: _NameFlags, idx: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({
        **_times(cols, idx), **_gpu(cols, info, idx),
        "name": names.labels(idx),
        "kernel_id": np.arange(len(idx), dtype=np.int64),
        **kernel_details(cols.stats.get(idx, "kernel_details")),
    })


def _copies(cols: Columns, info: LaneInfo, names: _NameFlags, idx: np.ndarray) -> pd.DataFrame:
    """Copies; the direction comes from the activity name ('MemcpyH2D'), else from a
    `kind:` in memcpy_details (ROCm), else it is 'other'."""
    details = [_fields(text) for text in cols.stats.get(idx, "memcpy_details")]
    kind = names.copy_kind[idx]
    stated = np.array([fields.get("kind") for fields in details] + [None], dtype=object)[:-1]
    unknown = (kind == None) | (kind == "other")  # noqa: E711
    kind = np.where(unknown, np.where(np.isin(stated, list(COPY_KINDS)), stated, "other"), kind)
    return pd.DataFrame({
        **_times(cols, idx), **_gpu(cols, info, idx),
        "kind": kind,
        "bytes": ints([fields.get("size") for fields in details]),
    })


def _is_api(cols: Columns, idx: np.ndarray, names: _NameFlags) -> np.ndarray:
    """Host events that are the host side of GPU work: they carry a correlation id and are
    a CUDA/HIP API call, or (TF's CUPTI tracer) a launch record named after the kernel."""
    out = _present(cols.stats.get(idx, "correlation_id"))
    linked = np.flatnonzero(out)  # few host events carry one: look further only at those
    is_call = names.api_name[idx[linked]] != None  # noqa: E711 (elementwise on objects)
    launch = _present(cols.stats.get(idx[linked], "kernel_details"))
    copy = _present(cols.stats.get(idx[linked], "memcpy_details"))
    out[linked] = is_call | launch | copy
    return out


def _api(cols: Columns, info: LaneInfo, names: _NameFlags, idx: np.ndarray) -> pd.DataFrame:
    """API rows. A launch record named after its kernel or copy (TF) is named for the
    driver call it records, so `api.name` always names an API function."""
    name = names.api_name[idx]
    details = cols.stats.get(idx, "memcpy_details")
    for row in np.flatnonzero(name == None):  # noqa: E711 (TF launch records only)
        copy = details[row] is not None or names.is_copy[idx[row]]
        name[row] = (_copy_call(names.copy_kind[idx[row]], details[row]) if copy
                     else "cuLaunchKernel")
    driver = np.array([call.startswith("cu") and not call.startswith("cuda") for call in name],
                      dtype=bool)
    return pd.DataFrame({
        **_times(cols, idx),
        "tid": info.tids(cols.lane[idx]),
        "name": name,
        "kind": np.where(driver, "driver", "runtime"),
        "correlation": ints(cols.stats.get(idx, "correlation_id")),
    })


def _copy_call(kind: str | None, details: Any) -> str:
    """The driver call behind a copy launch record: cuMemcpyHtoDAsync, cuMemset, ..."""
    if kind == "memset":
        return "cuMemset"
    asynchronous = _fields(details).get("async") == "1"
    direction = kind if kind in COPY_KINDS - {"PtoP"} else ""
    return f"cuMemcpy{direction}{'Async' if asynchronous else ''}"


def _memory(cols: Columns, names: _NameFlags, idx: np.ndarray) -> pd.DataFrame:
    action = names.memory_action[idx]
    size = ints(cols.stats.get(idx, "allocation_bytes"))
    sign = np.where(action == "free", -1, 1)
    return pd.DataFrame({
        "device": ints([_allocator_device(allocator)
                        for allocator in cols.stats.get(idx, "allocator_name")]),
        "ts_ns": cols.start_ns[idx],
        "action": action,
        "addr": ints(cols.stats.get(idx, "addr")),
        "bytes": size,
        "delta_bytes": size * sign,
        "total_allocated_bytes": ints(cols.stats.get(idx, "bytes_allocated")),
    })


@lru_cache(maxsize=256)
def _allocator_device_cached(name: str) -> float:
    match = ALLOCATOR_DEVICE.match(name)
    if match:
        return float(match[1])
    lowered = name.lower()
    return -1.0 if "host" in lowered or lowered.startswith("cpu") else float("nan")


def _allocator_device(name: Any) -> float:
    """Device of an allocator: 'GPU_0_bfc' -> 0; host allocators ('gpu_host_bfc', 'cpu')
    -> -1, the memory table's host device; anything else unknown."""
    return _allocator_device_cached(name) if isinstance(name, str) else float("nan")


def _ranges(cols: Columns, info: LaneInfo, names: _NameFlags, idx: np.ndarray) -> pd.DataFrame:
    lane = cols.lane[idx]
    kind = info.kind[lane]
    on_device = kind != HOST
    steps = np.flatnonzero(kind == STEPS)
    step_names = cols.stats.get(idx[steps], "step_name")
    label = names.labels(idx, {int(position): str(step_name)
                               for position, step_name in zip(steps, step_names, strict=True)
                               if step_name is not None})
    source = np.where(on_device, np.where(kind == STEPS, "step", "device_op"),
                      np.where(names.python[idx], "python", "host"))
    lines = np.array([lane_entry.line for lane_entry in cols.lanes], dtype=object)
    frame = pd.DataFrame({
        "tid": info.tids(lane), "device": ints(info.device[lane]),
        **_times(cols, idx), "name": label, "source": source,
        "domain": categorical(np.where(on_device, lane, -1), lines),  # the device line
    })
    frame["depth"] = nesting_depth(lane, frame["start_ns"], frame["end_ns"])
    return frame


class _NameFlags:
    """What each event's name says, worked out once per distinct name and spread to the
    events through factorized codes (no per-event string work)."""

    def __init__(self, names: list[Any]) -> None:
        codes, uniques = codes_of(names)
        text = [unique if isinstance(unique, str) else str(unique) for unique in uniques]
        self.codes = codes
        self.text = text

        def spread(values: list[Any], missing: Any, dtype: Any = object) -> np.ndarray:
            return np.array([*values, missing], dtype=dtype)[codes]

        kinds = [_copy_kind(name) for name in text]
        self.is_copy = spread([kind is not None for kind in kinds], False, bool)
        self.copy_kind = spread(kinds, None)
        self.memory_action = spread([MEMORY_EVENTS.get(name) for name in text], None)
        self.api_name = spread([_api_name(name) for name in text], None)
        self.python = spread([name.startswith("$") for name in text], False, bool)

    def labels(self, idx: np.ndarray, replace: dict[int, str] | None = None) -> pd.Series:
        """Names of rows `idx` as a category column, straight from the factorized codes
        (building it from strings would re-hash every name); `replace` maps positions in
        `idx` to other names (a step's step_name)."""
        codes = self.codes[idx]
        categories = list(self.text)
        if replace:
            extra = {name: len(categories) + offset for offset, name in enumerate(dict.fromkeys(
                replace.values()))}
            categories += list(extra)
            codes[list(replace)] = [extra[name] for name in replace.values()]
        return categorical(codes, np.array(categories, dtype=object))


def _copy_kind(name: str) -> str | None:
    """Copy direction from an activity name ('MemcpyH2D' -> HtoD), None for a non-copy."""
    lowered = name.lower()
    if lowered.startswith("memset"):
        return "memset"
    if lowered.startswith("memcpy"):
        return COPY_NAMES.get(lowered[:9], "other")
    return None


def _api_name(name: str) -> str | None:
    """'cuLaunchKernel_v2' -> 'cuLaunchKernel'; None when the name is no CUDA/HIP call."""
    return API_VERSION.sub("", name) if API_NAME.match(name) else None


def ints(values: Any) -> pd.Series:
    """Nullable Int64 from numbers or numeric strings (stats arrive as either); NaN,
    non-integers and values too large to be real become NA."""
    arr = values if isinstance(values, np.ndarray) and values.dtype.kind == "f" else floats(
        list(values))
    valid = np.isfinite(arr) & (np.abs(arr) < LIMIT) & (arr == np.floor(arr))
    return pd.Series(np.where(valid, arr, np.nan)).astype("Int64")


def _fields(details: Any) -> dict[str, str]:
    """'size:4 dest:1 async:1' -> {'size': '4', 'dest': '1', 'async': '1'}."""
    if not isinstance(details, str):
        return {}
    return dict(item.split(":", 1) for item in details.split() if ":" in item)


def kernel_details(values: list[Any]) -> dict[str, pd.Series]:
    """Launch geometry, registers and shared memory from `kernel_details` strings, parsed
    once per distinct string (a few launch shapes repeat across thousands of kernels)."""
    codes, uniques = codes_of(values)
    parsed = np.array([_kernel_detail_row(unique) for unique in uniques]
                      + [[np.nan] * len(DETAIL_COLUMNS)], dtype=np.float64)
    rows = parsed[codes]
    return {col: ints(rows[:, position]) for position, col in enumerate(DETAIL_COLUMNS)}


def _kernel_detail_row(text: Any) -> list[float]:
    fields = _fields(text)
    grid = _triple(fields.get("grid"))
    block = _triple(fields.get("block"))
    static = _num(fields.get("static_shared", fields.get("shm")))
    dynamic = _num(fields.get("dynamic_shared"))
    total = _num(fields.get("group_mem"))
    if np.isnan(total):
        total = static + dynamic  # NaN unless the source splits both
    return [*grid, *block, _num(fields.get("regs")), total, static, dynamic]


def _triple(text: str | None) -> list[float]:
    parts = text.split(",") if text else []
    return [_num(part) for part in parts] if len(parts) == 3 else [np.nan] * 3


def _num(text: str | None) -> float:
    if text is None or not (text.isascii() and text.isdigit()):
        return np.nan
    value = float(text)
    return value if value < LIMIT else np.nan
