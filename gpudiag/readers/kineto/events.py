"""The events of a Kineto trace as compact columns, built piece by piece.

`Events.read(path)` streams the trace (gpudiag.readers.chrome.stream) and, for each piece of
decoded events, keeps only what the tables need: group, name code, times, pid, tid, and the
`args` fields of each group decoded into that group's small struct. The piece's text and
objects are then dropped, so memory follows the columns, not the file.

Kineto's category names changed in 2022 (`Kernel` -> `kernel`, `Runtime` -> `cuda_runtime`,
`Operator` -> `cpu_op`, `external id` -> `External id`); both spellings map to one group here.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.concat import categories_joined
from gpudiag.intervals import us_to_ns
from gpudiag.readers.chrome.stream import ChromeTraceStream
from gpudiag.readers.chrome.structs import (
    NAN,
    ArgDecoder,
    Document,
    Event,
    Num,
    categorical,
    category_index,
    column,
    floats,
    integers,
    objects,
    take,
)
from gpudiag.readers.files import budget

#: Kineto category (both schemas) -> event group
GROUPS = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cuda_runtime": "runtime", "Runtime": "runtime",
    "cuda_driver": "driver", "Driver": "driver",
    "cuda_sync": "sync",
    "cpu_op": "op", "Operator": "op", "operator": "op",
    "user_annotation": "annotation", "User annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python", "Python": "python",
}


class IdArgs(msgspec.Struct, gc=False):
    """What every table reads: the op id (both spellings) and the CUPTI correlation."""

    external_id: Num = msgspec.field(default=NAN, name="External id")
    external_id_legacy: Num = msgspec.field(default=NAN, name="external id")
    correlation: Num = NAN


class GpuArgs(IdArgs, gc=False):
    device: Num = NAN
    stream: Num = NAN


class KernelArgs(GpuArgs, gc=False):
    grid: Any = None
    block: Any = None
    regs: Num = msgspec.field(default=NAN, name="registers per thread")
    smem: Num = msgspec.field(default=NAN, name="shared memory")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Num = msgspec.field(default=NAN, name="In msg nelems")
    out_nelems: Num = msgspec.field(default=NAN, name="Out msg nelems")
    group_size: Num = msgspec.field(default=NAN, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")


class CopyArgs(GpuArgs, gc=False):
    bytes: Num = NAN
    kind: Any = None  # ROCm memcpy direction ('HtoD')


class SyncArgs(GpuArgs, gc=False):
    sync_kind: Any = msgspec.field(default=None, name="cuda_sync_kind")
    wait_event: Num = msgspec.field(default=NAN, name="wait_on_cuda_event_id")
    record_correlation: Num = msgspec.field(default=NAN,
                                            name="wait_on_cuda_event_record_corr_id")
    record_stream: Num = msgspec.field(default=NAN, name="wait_on_stream")


class AnnotationArgs(IdArgs, gc=False):
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


class MemoryArgs(msgspec.Struct, gc=False):
    device_type: Num = msgspec.field(default=NAN, name="Device Type")
    device_id: Num = msgspec.field(default=NAN, name="Device Id")
    addr: Num = msgspec.field(default=NAN, name="Addr")
    mem_bytes: Num = msgspec.field(default=NAN, name="Bytes")
    total_allocated: Num = msgspec.field(default=NAN, name="Total Allocated")
    total_reserved: Num = msgspec.field(default=NAN, name="Total Reserved")


class LabelArgs(msgspec.Struct, gc=False):
    """process_name / thread_name metadata events."""

    name: Any = None


#: group -> the struct its args decode into (None: its args are not read)
ARGS: dict[str, type[msgspec.Struct] | None] = {
    "kernel": KernelArgs, "memcpy": CopyArgs, "memset": CopyArgs, "runtime": IdArgs,
    "driver": IdArgs, "sync": SyncArgs, "op": IdArgs, "annotation": AnnotationArgs,
    "gpu_annotation": GpuArgs, "python": None, "memory": MemoryArgs, "meta": LabelArgs,
}
GROUP_IDS = {name: i for i, name in enumerate(["", *ARGS])}
GROUP_NAMES = np.array(list(GROUP_IDS), dtype=object)
DECODERS = {struct: ArgDecoder(struct) for struct in set(ARGS.values()) if struct is not None}
#: timestamps beyond ±2**52 µs (year 2112 after the epoch) cannot be real: treated as missing
MAX_US = float(2**52)
#: the longest plausible event, µs: one day (GPUDIAG_MAX_EVENT_SECONDS raises it)
MAX_DUR_US = 86400e6


def max_dur_us() -> float:
    return budget("GPUDIAG_MAX_EVENT_SECONDS", int(MAX_DUR_US / 1e6)) * 1e6


class Interner:
    """Codes for the distinct values of a column, stable across pieces of a trace.

    `dict.fromkeys` and `map(dict.__getitem__)` run in C and beat pandas.factorize on lists
    of fresh Python strings by about 2x; the Python loop runs once per distinct value.
    """

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def codes(self, values: list[Any]) -> np.ndarray:
        """int64 codes of `values`, -1 for None; unhashable values count as their text."""
        try:
            seen = dict.fromkeys(values)
        except TypeError:
            return self.codes([value if value is None or _hashable(value) else str(value)
                               for value in values])
        index = self.index
        for key in seen:
            if key is not None and key not in index:
                index[key] = len(index)
        index[None] = -1
        try:
            return np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
        finally:
            del index[None]

    def values(self) -> np.ndarray:
        out = np.empty(len(self.index), dtype=object)
        out[:] = list(self.index)
        return out


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class Events:
    """The events of one trace as columns: what the Kineto table builders read."""

    def __init__(self, path: Path) -> None:
        stream = ChromeTraceStream(path)
        self._names, self._ids, self._categories, self._phases = (
            Interner(), Interner(), Interner(), Interner())
        parts: dict[str, list[np.ndarray]] = {name: [] for name in (
            "group", "name", "ts", "dur", "pid", "tid")}
        self._arg_parts: dict[str, dict[str, list[Any]]] = {group: {} for group in ARGS}
        for events in stream.pieces():
            for key, values in self._piece(events).items():
                parts[key].append(values)
        self.header: Document = stream.header
        #: the file of each row, for events joined from several files (`joined`)
        self.file: np.ndarray | None = None
        self.parts: list[Events] = []
        self._finish({name: np.concatenate(chunks) if chunks else np.zeros(0)
                      for name, chunks in parts.items()})

    @classmethod
    def joined(cls, parts: list[Events]) -> Events:
        """The events of several files, one after another, as one set of columns: each
        row keeps its file (`file`), names are coded over all files (with their raw
        values: 1 and "1" stay apart), args rows are offset per group. `where` orders rows
        by file, then time; `names` builds each file's categories as reading it alone
        does and joins them as a merge of the files' tables does."""
        out = cls.__new__(cls)
        out.parts = parts
        out.header = parts[0].header
        out.file = np.repeat(np.arange(len(parts)), [len(part.group_code) for part in parts])
        index: dict[tuple[type, Any], int] = {}
        codes = []
        for part in parts:
            remap = np.array([index.setdefault((type(value), value), len(index))
                              for value in part.name_uniques] + [-1], dtype=np.int64)
            codes.append(remap[part.name_codes])
        out.name_codes = np.concatenate(codes)
        out.name_uniques = objects([value for _, value in index])
        out._name_index = None
        for name in ("group_code", "start", "dur", "pid", "tid", "valid_ts", "bad_dur",
                     "usable"):
            setattr(out, name, np.concatenate([getattr(part, name) for part in parts]))
        out._args = _joined_args([part._args for part in parts], [part.group_code
                                                                  for part in parts])
        return out

    def _piece(self, events: list[Event]) -> dict[str, np.ndarray]:
        """Columns of the events that matter in one piece; their args go to `_arg_parts`."""
        group = self._groups(events)
        kept = list(compress(events, group > 0))
        group = group[group > 0]
        names = self._names.codes(column(kept, "name"))
        memory = self._names.index.get("[memory]", -2)
        instant = group == GROUP_IDS["memory"]
        group[instant & (names != memory)] = 0  # instants other than allocator events
        for group_id in np.unique(group[group > 0]):
            self._add_args(GROUP_NAMES[group_id], list(compress(kept, group == group_id)))
        return {
            "group": group, "name": names,
            "ts": _float_column(kept, "ts"), "dur": _float_column(kept, "dur"),
            "pid": self._ids.codes(column(kept, "pid")),
            "tid": self._ids.codes(column(kept, "tid")),
        }

    def _groups(self, events: list[Event]) -> np.ndarray:
        """Group id per event: a Kineto category for complete ('X') events, 'memory' for
        instants (narrowed to allocator events later), 'meta' for metadata; else 0."""
        cats = self._categories.codes(column(events, "cat"))
        phases = self._phases.codes(column(events, "ph"))
        by_cat = np.array([GROUP_IDS[GROUPS.get(category, "")] if isinstance(category, str) else 0
                           for category in self._categories.index] + [0], dtype=np.int8)
        # group of a (phase code): 'X' takes the category's group, 'i' and 'M' their own
        by_phase = np.array(
            [{"X": -1, "i": GROUP_IDS["memory"], "M": GROUP_IDS["meta"]}.get(phase, 0)
             if isinstance(phase, str) else 0 for phase in self._phases.index] + [0],
            dtype=np.int8)
        group = by_phase[phases]
        complete = group == -1
        group[complete] = by_cat[cats[complete]]
        return group

    def _add_args(self, group: str, events: list[Event]) -> None:
        struct = ARGS[group]
        if struct is None:
            return
        decoded = DECODERS[struct].decode(column(events, "args"))
        fields = self._arg_parts[group]
        for field in struct.__struct_fields__:
            values = column(decoded, field)
            default = getattr(struct(), field)
            fields.setdefault(field, []).append(
                floats(values) if isinstance(default, float) else objects(values))

    def _finish(self, cols: dict[str, np.ndarray]) -> None:
        keep = cols["group"] > 0
        self.group_code = cols["group"][keep].astype(np.int8)
        self.name_codes = cols["name"][keep].astype(np.int64)
        self.name_uniques = self._names.values()
        self._name_index: pd.Index | None = None
        base = int(self.header.baseTimeNanoseconds or 0)
        self.bad_base = not 0 <= base < MAX_US * 1000
        timestamps = cols["ts"][keep]
        raw_dur = cols["dur"][keep]
        self.valid_ts = np.isfinite(timestamps) & (np.abs(timestamps) < MAX_US)
        # a duration that is not a number, infinite or over MAX_DUR_US (1e300 was once read
        # as 142 years of kernel, and the diagnosis called the GPU 99.99999% busy): dropped
        self.bad_dur = self.valid_ts & ~(np.abs(raw_dur) <= max_dur_us())
        self.usable = self.valid_ts & ~self.bad_dur
        dur = np.where(self.usable, raw_dur, 0.0)
        self.start = (us_to_ns(np.where(self.valid_ts, timestamps, 0.0))
                      + (0 if self.bad_base else base))
        self.dur = us_to_ns(dur)
        self.negative_dur = int((self.dur < 0).sum())
        self.dur = np.maximum(self.dur, 0)
        numbers = floats(list(self._ids.values()))
        self.pid = take(numbers, cols["pid"][keep].astype(np.int64), np.nan)
        self.tid = take(numbers, cols["tid"][keep].astype(np.int64), np.nan)
        # a pid or tid past 2**53 (2**70 in a fuzzed file) names no process: missing, counted
        self.huge_ids = 0
        for ids in (self.pid, self.tid):
            huge = np.abs(ids) > 2.0**53
            self.huge_ids += int(huge.sum())
            ids[huge] = np.nan
        self._args = _arg_table(self._arg_parts, self.group_code, keep, cols["group"])

    # -- what the table builders use -------------------------------------------------------

    def where(self, *groups: str) -> np.ndarray:
        """Rows of the given groups (with a usable timestamp and duration), in time order."""
        wanted = [GROUP_IDS[group] for group in groups]
        idx = np.flatnonzero(np.isin(self.group_code, wanted) & self.usable)
        if self.file is not None:  # joined files: each file's rows together, in file order
            return idx[np.lexsort((self.start[idx], self.file[idx]))]
        return idx[np.argsort(self.start[idx], kind="stable")]

    def file_of(self, idx: np.ndarray) -> np.ndarray | None:
        """The file of each row (None: the events of one file)."""
        return None if self.file is None else self.file[idx]

    def args(self, idx: np.ndarray) -> ArgColumns:
        return ArgColumns(self._args, self.group_code[idx], self._arg_row[idx])

    @property
    def _arg_row(self) -> np.ndarray:
        return self._args["_row"]

    def is_group(self, idx: np.ndarray, group: str) -> np.ndarray:
        return self.group_code[idx] == GROUP_IDS[group]

    def name_values(self, idx: np.ndarray) -> np.ndarray:
        """Names of the rows `idx` as an object array (None where absent)."""
        return take(self.name_uniques, self.name_codes[idx])

    def names(self, idx: np.ndarray) -> pd.Series:
        if self.file is not None:
            return self._joined_names(idx)
        if self._name_index is None:  # every table's names are picked from one index
            self._name_index = category_index(self.name_uniques)
        return categorical(self.name_codes[idx], self._name_index)

    def _joined_names(self, idx: np.ndarray) -> pd.Series:
        """Each file's names as reading it alone makes them (its categories in its own
        code order), joined as concatenating the files' tables joins them."""
        assert self.file is not None
        files = self.file[idx]
        offsets = np.r_[0, np.cumsum([len(part.group_code) for part in self.parts])]
        pieces = []
        for file in np.unique(files):
            part = self.parts[file]
            pieces.append(part.names(idx[files == file] - offsets[file]).array)
        if not pieces:
            return self.parts[0].names(idx)
        return pd.Series(categories_joined(pieces), copy=False)

    def name_test(self, idx: np.ndarray, test: Callable[[str], bool]) -> np.ndarray:
        """`test(name)` of each row of `idx` (False without a name), called once per
        distinct name: a pandas string method costs ~1 ms per call whatever the size."""
        codes = self.name_codes[idx]
        used, position = np.unique(codes, return_inverse=True)
        hits = np.array([code >= 0 and bool(test(str(self.name_uniques[code])))
                         for code in used], dtype=bool)
        return hits[position.reshape(-1)] if len(codes) else np.zeros(0, dtype=bool)

    def times(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"start_ns": self.start[idx], "end_ns": self.start[idx] + self.dur[idx]}

    def pids(self, idx: np.ndarray) -> pd.Series:
        return integers(self.pid[idx])

    def tids(self, idx: np.ndarray) -> pd.Series:
        return integers(self.tid[idx])

    def host(self, idx: np.ndarray) -> dict[str, pd.Series]:
        return {"pid": self.pids(idx), "tid": self.tids(idx)}


class ArgColumns:
    """Args fields of chosen rows, gathered from the per-group columns."""

    def __init__(self, table: dict[str, Any], groups: np.ndarray, rows: np.ndarray) -> None:
        self._table, self._groups, self._rows = table, groups, rows

    def values(self, field: str) -> list[Any]:
        return list(self._gather(field, object))

    def floats(self, field: str) -> np.ndarray:
        """A numeric arg as float64 (NaN where absent)."""
        return self._gather(field, float)

    def num(self, field: str) -> pd.Series:
        """A numeric arg as nullable Int64 (NA where absent or not an integer)."""
        return integers(self._gather(field, float))

    def _gather(self, field: str, kind: type) -> np.ndarray:
        out: np.ndarray = np.full(len(self._rows), np.nan if kind is float else None, dtype=kind)
        for group_id in np.unique(self._groups):
            column = self._table.get(GROUP_NAMES[group_id], {}).get(field)
            if column is not None:
                mask = self._groups == group_id
                out[mask] = column[self._rows[mask]]
        return out


def _joined_args(tables: list[dict[str, Any]], groups: list[np.ndarray]) -> dict[str, Any]:
    """The arg columns of several files, each group's rows one file after another, with
    each event's `_row` offset by the rows of its group in the files before it."""
    out: dict[str, Any] = {}
    for group in ARGS:
        names = dict.fromkeys(field for table in tables for field in table.get(group, {}))
        out[group] = {field: np.concatenate([table[group][field] for table in tables
                                             if field in table.get(group, {})])
                      for field in names}
    rows = []
    seen = np.zeros(len(GROUP_IDS), dtype=np.int64)  # arg rows of each group so far
    for table, codes in zip(tables, groups, strict=True):
        rows.append(table["_row"] + seen[codes])
        for group, group_id in GROUP_IDS.items():
            columns = table.get(group) or {}
            if columns:
                seen[group_id] += len(next(iter(columns.values())))
    out["_row"] = np.concatenate(rows)
    return out


def _arg_table(parts: dict[str, dict[str, list[Any]]], kept_groups: np.ndarray,
               keep: np.ndarray, all_groups: np.ndarray) -> dict[str, Any]:
    """Concatenate each group's arg columns; `_row` maps an event to its row in them."""
    table: dict[str, Any] = {}
    for group, fields in parts.items():
        table[group] = {field: np.concatenate(chunks) for field, chunks in fields.items()}
    # rows within each group, counted over every event that had args decoded (kept or not)
    row_all = np.zeros(len(all_groups), dtype=np.int64)
    for group_id in np.unique(all_groups[all_groups > 0]):
        mask = all_groups == group_id
        row_all[mask] = np.arange(int(mask.sum()))
    table["_row"] = row_all[keep]
    return table


def _float_column(events: list[Any], field: str) -> np.ndarray:
    """A numeric field as float64 in one C pass; odd values (strings, null) take the slow way."""
    try:
        return np.fromiter(map(attrgetter(field), events), dtype=np.float64, count=len(events))
    except (TypeError, ValueError):
        return floats(column(events, field))


def external_id(args: ArgColumns) -> pd.Series:
    return args.num("external_id").fillna(args.num("external_id_legacy"))


def device_of(ev: Events, idx: np.ndarray, args: ArgColumns) -> pd.Series:
    """args.device, else the event's pid (Kineto draws each GPU as a process)."""
    return args.num("device").fillna(ev.pids(idx))


def stream_of(ev: Events, idx: np.ndarray, args: ArgColumns) -> pd.Series:
    """args.stream, else the event's tid (each stream is drawn as a thread)."""
    return args.num("stream").fillna(ev.tids(idx))
