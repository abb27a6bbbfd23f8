"""What gpudiag reads from a CUPTI activity record, and the small helpers converting it.

    rows: dict[int, list[tuple]] = {}
    ignored = snapshot(records, rows)      # in the buffer callback: fields copied to tuples
    offset = measure_offset(cupti.get_timestamp).offset_ns  # CUPTI clock -> time.time_ns()

The record layouts (kinds, field tables, enum maps), `snapshot`, `measure_offset`, `demangle`
and the column helpers `CuptiConverter` (in `cupti_records`) builds its tables with. Kept
apart from the converter because this half is what changes with CUPTI releases and record
versions, while the converter's table logic follows gpudiag's schema.

Facts taken from cupti-python 13.4's type stubs and NVIDIA's samples (`cupti_common.py`)
and from cupti_activity.h (enum values, stable across CUPTI releases):
- attribute names are the C fields in snake case (`grid_x`, `static_shared_memory`,
  `correlation_id`), except marker `flags_`, device `l2cache_size`, and the marker's thread
  at `object_id.pt.thread_id`;
- timestamps are ns on CUPTI's clock (`cupti.get_timestamp()`); `offset_ns` moves them to
  `time.time_ns()` (see `measure_offset`); start = end = 0 means "not timed";
- kernel names are mangled (`_Z...`): demangled here with libstdc++'s `__cxa_demangle`;
- ids equal to 0xFFFFFFFF (CUPTI_INVALID_*) are "none".
Fields a record version lacks read as None (the slow path), never as an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from gpudiag.readers.nsys.schema import STREAM_VARIANT, VERSION_SUFFIX

# CUpti_ActivityKind (cupti_activity.h); cupti-python's ActivityKind is an IntEnum of these
MEMCPY, MEMSET, KERNEL, DRIVER, RUNTIME, DEVICE, CONTEXT = 1, 2, 3, 4, 5, 8, 9
CONCURRENT_KERNEL, MARKER, MEMCPY2, SYNCHRONIZATION, MEMORY2 = 10, 12, 22, 38, 49
KIND_NAMES = {"MEMCPY": MEMCPY, "MEMSET": MEMSET, "KERNEL": KERNEL, "DRIVER": DRIVER,
              "RUNTIME": RUNTIME, "DEVICE": DEVICE, "CONTEXT": CONTEXT,
              "CONCURRENT_KERNEL": CONCURRENT_KERNEL, "MARKER": MARKER, "MEMCPY2": MEMCPY2,
              "SYNCHRONIZATION": SYNCHRONIZATION, "MEMORY2": MEMORY2}
#: CUpti_ActivityMemcpyKind -> copies.kind (array copies are 'other')
COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
#: CUpti_ActivityMemoryKind (NOT nsys' ENUM_CUDA_MEM_KIND, which starts at pageable = 0)
MEM_KINDS = {0: "unknown", 1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed",
             6: "device", 7: "managed"}
#: CUpti_ActivitySynchronizationType
SYNC_TYPES = {0: "unknown", 1: "event", 2: "stream_wait", 3: "stream", 4: "context"}
ALLOCATION, RELEASE = 1, 2  # CUpti_ActivityMemoryOperationType
MARKER_START, MARKER_END = 1 << 1, 1 << 2  # CUpti_ActivityFlag
OBJECT_THREAD = 2  # CUpti_ActivityObjectKind
INVALID_ID = 0xFFFFFFFF

_TIMED = ("start", "end", "device_id", "context_id", "stream_id", "correlation_id")
FIELDS: dict[int, tuple[str, ...]] = {
    CONCURRENT_KERNEL: (*_TIMED, "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                        "block_z", "registers_per_thread", "static_shared_memory",
                        "dynamic_shared_memory", "shared_memory_executed"),
    MEMCPY: (*_TIMED, "copy_kind", "src_kind", "dst_kind", "bytes"),
    MEMSET: (*_TIMED, "memory_kind", "bytes"),
    RUNTIME: ("start", "end", "cbid", "thread_id", "correlation_id"),
    SYNCHRONIZATION: ("start", "end", "type", "context_id", "stream_id", "correlation_id",
                      "cuda_event_id", "cuda_event_sync_id"),
    MEMORY2: ("timestamp", "memory_operation_type", "memory_kind", "address", "bytes",
              "device_id", "stream_id", "correlation_id"),
    MARKER: ("timestamp", "flags_", "id", "name", "domain", "object_kind",
             "object_id.pt.thread_id"),
    DEVICE: ("id", "name", "num_multiprocessors", "compute_capability_major",
             "compute_capability_minor", "max_warps_per_multiprocessor",
             "max_blocks_per_multiprocessor", "max_threads_per_block",
             "max_registers_per_multiprocessor", "max_registers_per_block",
             "max_shared_memory_per_multiprocessor", "max_shared_memory_per_block",
             "num_threads_per_warp", "global_memory_size", "l2cache_size", "core_clock_rate",
             "global_memory_bandwidth"),
    CONTEXT: ("context_id", "device_id"),
}
FIELDS.update({KERNEL: FIELDS[CONCURRENT_KERNEL], MEMCPY2: FIELDS[MEMCPY],
               DRIVER: FIELDS[RUNTIME]})
#: other spellings of a field (dict records, other cupti-python releases)
ALIASES = {"flags_": ("flags",), "object_id.pt.thread_id": ("thread_id",),
           "l2cache_size": ("l2_cache_size",)}
#: the DataFrame column a field lands in
COLUMN = {"flags_": "flags", "object_id.pt.thread_id": "thread_id"}


class CallSite(NamedTuple):
    """User Python frames open around one blocking CUDA call, captured in its API callback.

    Times are `time.time_ns()`; frames are (file, line, function, stack depth), innermost
    first, depth counted from the outermost frame of the thread (0).
    """

    tid: int
    correlation: int
    enter_ns: int
    exit_ns: int
    frames: tuple[tuple[str, int, str, int], ...]


class ClockOffset(NamedTuple):
    offset_ns: int  # time.time_ns() - CUPTI timestamp
    uncertainty_ns: int  # width of the tightest wall-clock bracket around a CUPTI reading


def measure_offset(cupti_clock: Callable[[], int],
                   wall_clock: Callable[[], int] = time.time_ns,
                   samples: int = 9) -> ClockOffset:
    """Offset from CUPTI's clock to the epoch clock: CUPTI read between two wall reads, the
    tightest of `samples` brackets wins (a preempted read gives a wide one)."""
    best: tuple[int, int] | None = None
    for _ in range(samples):
        before = wall_clock()
        cupti = int(cupti_clock())
        after = wall_clock()
        width = after - before
        if best is None or width < best[1]:
            best = ((before + after) // 2 - cupti, width)
    assert best is not None, "samples must be positive"
    return ClockOffset(*best)


# -- snapshot: records -> tuples -----------------------------------------------------------


def snapshot(records: Iterable[Any], into: dict[int, list[tuple[Any, ...]]]) -> int:
    """Append each record's fields (FIELDS[kind] order) to `into[kind]`; returns how many
    records were of a kind gpudiag does not read."""
    ignored = 0
    for record in records:
        kind = _kind_of(record)
        getter = _GETTERS.get(kind)
        if getter is None:
            ignored += 1
            continue
        into.setdefault(kind, []).append(getter(record))
    return ignored


def _kind_of(record: Any) -> int:
    kind = record.get("kind") if isinstance(record, Mapping) else getattr(record, "kind", None)
    if isinstance(kind, str):
        return KIND_NAMES.get(kind.upper().removeprefix("CUPTI_ACTIVITY_KIND_"), -1)
    return -1 if kind is None else int(kind)


def _getter(fields: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    fast = attrgetter(*fields)

    def get(record: Any) -> tuple[Any, ...]:
        if isinstance(record, Mapping):
            return tuple(_from_dict(record, field) for field in fields)
        try:
            return fast(record)
        except AttributeError:  # an older record version: read field by field
            return tuple(_from_object(record, field) for field in fields)

    return get


def _from_object(record: Any, field: str) -> Any:
    for path in (field, *ALIASES.get(field, ())):
        try:
            return attrgetter(path)(record)
        except AttributeError:
            continue
    return None


def _from_dict(record: Mapping[str, Any], field: str) -> Any:
    for key in (field, *ALIASES.get(field, ())):
        if key in record:
            return record[key]
    return None


_GETTERS = {kind: _getter(fields) for kind, fields in FIELDS.items()}


# -- small vectorized helpers --------------------------------------------------------------

#: fields holding text; every other field is an integer
TEXT = frozenset({"name", "domain"})
INT64_MAX = np.iinfo(np.int64).max


def records_frame(rows: Mapping[int, Sequence[tuple[Any, ...]]], kinds: tuple[int, ...]
                  ) -> pd.DataFrame:
    """The rows of `kinds` (one FIELDS layout) column by column, integers as exact Int64
    (never through float64, which would round epoch nanoseconds), plus `record_kind`."""
    fields = FIELDS[kinds[0]]
    present = [rows[kind] for kind in kinds if rows.get(kind)]
    records = present[0] if len(present) == 1 else [record for part in present for record in part]
    columns = list(zip(*records, strict=True)) if records else [()] * len(fields)
    data: dict[str, Any] = {
        COLUMN.get(field, field): (pd.Series(list(column), dtype=object) if field in TEXT
                                   else _int_array(column))
        for field, column in zip(fields, columns, strict=True)}
    data["record_kind"] = np.repeat(np.array(kinds, dtype=np.int64),
                                    [len(rows.get(kind, ())) for kind in kinds])
    return pd.DataFrame(data)


def _int_array(values: Sequence[Any]) -> Any:
    """Exact nullable int64: numpy's C loop when every value is an int, else value by value."""
    try:
        array = np.array(values, dtype=np.int64)
        return pd.arrays.IntegerArray(array, np.zeros(len(array), dtype=bool))
    except (TypeError, ValueError, OverflowError):  # None, or a value beyond int64
        return pd.array([_as_int(value) for value in values], dtype="Int64")


def _as_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if -INT64_MAX - 1 <= number <= INT64_MAX else None


def valid_ids(column: pd.Series) -> pd.Series:
    """CUPTI's 0xFFFFFFFF ('invalid id') as NA."""
    return column.mask(column == INVALID_ID)


def mapped_names(codes: pd.Series, table: Mapping[int, str], default: str) -> pd.Series:
    return codes.astype(object).map(table).fillna(default).astype(object)


def renamed_names(names: pd.Series, rename: Callable[[str], str]) -> pd.Series:
    """A categorical of `rename(name)`, called once per distinct name (a trace repeats a
    few hundred names)."""
    codes, uniques = pd.factorize(names.to_numpy(dtype=object))
    new, labels = pd.factorize(pd.Index([rename(str(unique)) for unique in uniques], dtype=object))
    mapped = new[codes] if len(new) else np.full(len(codes), -1)
    return pd.Series(pd.Categorical.from_codes(np.where(codes >= 0, mapped, -1),
                                               categories=labels.astype(str)),
                     index=names.index)


def base_api_name(name: str) -> str:
    """`cudaStreamSynchronize_ptsz_v7000` -> `cudaStreamSynchronize` (for kind lookups)."""
    return re.sub(STREAM_VARIANT, "", re.sub(VERSION_SUFFIX, "", name))


@cache
def _cxa_demangle() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """libstdc++'s demangler and libc's free (its result is malloc'ed), or None."""
    try:
        demangler = ctypes.CDLL(
            ctypes.util.find_library("stdc++") or "libstdc++.so.6").__cxa_demangle
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    demangler.restype = ctypes.c_void_p
    demangler.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return demangler, free


def demangle(name: str) -> str:
    """A C++ mangled name (`_Z...`) demangled by libstdc++; other names unchanged."""
    lib = _cxa_demangle()
    if lib is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(-1)
    out = lib[0](name.encode(), None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        text = ctypes.string_at(out).decode(errors="replace")
    finally:
        lib[1](out)
    return text if status.value == 0 else name

