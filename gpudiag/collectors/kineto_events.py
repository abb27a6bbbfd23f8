"""The events of a Kineto trace as columns, and the `args` structs each table decodes.

Kineto's category names changed in 2022 (`Kernel` -> `kernel`, `Runtime` -> `cuda_runtime`,
`Operator` -> `cpu_op`, `external id` -> `External id`); both spellings map to one group here.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.collectors.chrome_json import (
    NAN,
    ArgDecoder,
    ArgRows,
    Document,
    Num,
    categorical,
    codes_of,
    column,
    floats,
    integers,
    take,
)
from gpudiag.collectors.intervals import us_to_ns

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


#: timestamps beyond ±2**52 µs (year 2112 after the epoch) cannot be real: treated as missing
MAX_US = float(2**52)

GROUP_IDS = {name: i for i, name in enumerate(["", *dict.fromkeys(GROUPS.values())])}
PHASES = {"X": 1, "i": 2, "M": 3}

DECODERS = {
    struct: ArgDecoder(struct)
    for struct in (IdArgs, GpuArgs, KernelArgs, CopyArgs, SyncArgs, AnnotationArgs, MemoryArgs,
                   LabelArgs)
}


class Events:
    """The events of one trace as columns.

    Low-cardinality columns (category, phase, pid, tid, name) are factorized once; a table
    takes its rows' codes. `args` are decoded only for the rows a table uses.
    """

    def __init__(self, doc: Document) -> None:
        events = doc.traceEvents or []
        cat_codes, cats = codes_of(column(events, "cat"))
        to_group = np.array([GROUP_IDS[GROUPS.get(c, "")] if isinstance(c, str) else 0
                             for c in cats] + [0], dtype=np.int8)
        group = to_group[cat_codes]  # code -1 (no category) picks the trailing 0
        ph_codes, phs = codes_of(column(events, "ph"))
        to_ph = np.array([PHASES.get(p, 0) if isinstance(p, str) else 0 for p in phs] + [0],
                         dtype=np.int8)
        ph = to_ph[ph_codes]
        # Only complete events of known groups, instants and metadata matter: flow arrows
        # ('s'/'f', a third of a typical trace) are dropped before any other column is built.
        keep = np.flatnonzero(((group > 0) & (ph == PHASES["X"])) | (ph == PHASES["i"])
                              | (ph == PHASES["M"]))
        structs = np.empty(len(events), dtype=object)
        structs[:] = events
        self.structs = structs[keep]
        self.group_code, self.ph_code = group[keep], ph[keep]
        kept = self.structs.tolist()
        self.name_codes, self.name_uniques = codes_of(column(kept, "name"))
        base = int(doc.baseTimeNanoseconds or 0)
        self.bad_base = not 0 <= base < MAX_US * 1000
        base = 0 if self.bad_base else base
        ts = _float_column(kept, "ts")
        dur = np.clip(np.nan_to_num(_float_column(kept, "dur"), nan=0.0), -MAX_US, MAX_US)
        self.valid_ts = np.isfinite(ts) & (np.abs(ts) < MAX_US)
        self.start = us_to_ns(np.where(self.valid_ts, ts, 0.0)) + base
        self.dur = us_to_ns(dur)
        self.negative_dur = int((self.dur < 0).sum())
        self.dur = np.maximum(self.dur, 0)
        self.pid = _ids(column(kept, "pid"))  # float64, NaN where not numeric
        self.tid = _ids(column(kept, "tid"))

    def is_group(self, idx: np.ndarray, group: str) -> np.ndarray:
        return self.group_code[idx] == GROUP_IDS[group]

    def phase(self, ph: str) -> np.ndarray:
        return self.ph_code == PHASES[ph]

    def where(self, *groups: str, ph: str = "X") -> np.ndarray:
        """Rows of the given groups and phase, in time order (stable)."""
        wanted = [GROUP_IDS[g] for g in groups]
        mask = np.isin(self.group_code, wanted) & self.phase(ph) & self.valid_ts
        idx = np.flatnonzero(mask)
        return idx[np.argsort(self.start[idx], kind="stable")]

    def pids(self, idx: np.ndarray) -> pd.Series:
        return integers(self.pid[idx])

    def tids(self, idx: np.ndarray) -> pd.Series:
        return integers(self.tid[idx])

    def args(self, idx: np.ndarray, struct: type[Any]) -> ArgRows:
        """The args of rows `idx`, decoded into `struct`."""
        raws = column(self.structs[idx].tolist(), "args")
        return ArgRows(DECODERS[struct].decode(raws))

    def name_values(self, idx: np.ndarray) -> np.ndarray:
        """Names of the rows `idx` as an object array (None where absent)."""
        return take(self.name_uniques, self.name_codes[idx])

    def names(self, idx: np.ndarray) -> pd.Series:
        return categorical(self.name_codes[idx], self.name_uniques)

    def times(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {"start_ns": self.start[idx], "end_ns": self.start[idx] + self.dur[idx]}

    def host(self, idx: np.ndarray) -> dict[str, pd.Series]:
        return {"pid": self.pids(idx), "tid": self.tids(idx)}

    def labels(self) -> list[str]:
        """process_name / thread_name values of the metadata events."""
        meta = np.flatnonzero(self.phase("M"))
        return [str(v) for v in self.args(meta, LabelArgs).values("name") if v is not None]


def external_id(args: ArgRows) -> pd.Series:
    return args.num("external_id").fillna(args.num("external_id_legacy"))


def device_of(ev: Events, idx: np.ndarray, args: ArgRows) -> pd.Series:
    """args.device, else the event's pid (Kineto draws each GPU as a process)."""
    return args.num("device").fillna(ev.pids(idx))


def stream_of(ev: Events, idx: np.ndarray, args: ArgRows) -> pd.Series:
    """args.stream, else the event's tid (each stream is drawn as a thread)."""
    return args.num("stream").fillna(ev.tids(idx))


def _ids(values: list[Any]) -> np.ndarray:
    """pid / tid column as float64: numbers (or numeric strings), NaN for names like 'Spans'."""
    codes, uniques = codes_of(values)
    return take(floats(list(uniques)), codes, np.nan)


def _float_column(events: list[Any], field: str) -> np.ndarray:
    """A numeric field as float64 in one C pass; odd values (strings, null) take the slow way."""
    try:
        return np.fromiter(map(attrgetter(field), events), dtype=np.float64, count=len(events))
    except (TypeError, ValueError):
        return floats(column(events, field))
