"""The schema of every Trace table, declared once.

Each table is a tuple of `Column(name, dtype, unit, meaning)`. From this one declaration come
`empty()` frames, `conform()` (what readers call to turn their columns into a valid table),
`problems()` (what `Trace.validate()` reports) and `markdown()` (docs/schema.md).

Conventions, so analyzers never guess:
- times are int64 nanoseconds on one clock per host (`*_ns`); durations are `end_ns - start_ns`;
- sizes are bytes (`bytes`, `*_bytes`);
- ids and counts that a source may lack are nullable `Int64` (pandas NA, never -1), except the
  documented sentinel `device == -1` in `memory`, which means host (CPU) memory;
- strings are pandas `category`: kernel names repeat thousands of times, a category stores each
  once (HTA's interning lesson) and round-trips through Parquet as a dictionary column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.errors import SchemaError

#: dtypes a column may declare
DTYPES = ("int64", "Int64", "float64", "category", "boolean")


@dataclass(frozen=True)
class Column:
    """One column: its name, pandas dtype, unit and what it means."""

    name: str
    dtype: str
    unit: str
    meaning: str
    values: tuple[str, ...] = ()  # the allowed values of an enumerated category column


@dataclass(frozen=True)
class Table:
    """One table of the Trace: what a row is and its columns, in order."""

    name: str
    row: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}")

    def empty(self) -> pd.DataFrame:
        """A zero-row frame with every column at its declared dtype."""
        prototype = _EMPTY.get(self.name)
        if prototype is None:
            prototype = pd.DataFrame({c.name: empty_series(c) for c in self.columns})
            _EMPTY[self.name] = prototype
        return prototype.copy()

    def conform(self, data: pd.DataFrame | Mapping[str, Any] | None) -> pd.DataFrame:
        """Return `data` as this table: declared column order and dtypes, missing columns NA.

        Readers build their columns as arrays or Series and call this once. A column that
        the schema does not declare is a reader bug and raises `SchemaError`. Columns that
        already have their declared dtype are taken as they are (no copy).
        """
        if data is None or (isinstance(data, pd.DataFrame) and data.empty and not len(data.columns)):
            return self.empty()
        if isinstance(data, pd.DataFrame) and self._conformed(data):
            return data.copy(deep=False)  # a new frame on the same columns (copy-on-write)
        frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(dict(data))
        unknown = [c for c in frame.columns if c not in self._index]
        if unknown:
            raise SchemaError(f"table {self.name} has undeclared columns {unknown}")
        n = len(frame)
        out = {}
        for col in self.columns:
            if col.name in frame.columns:
                series = frame[col.name]
                out[col.name] = (
                    series.to_numpy() if _conforms(series, col) and col.dtype in ("int64", "float64")
                    else series.array if _conforms(series, col)
                    else _cast(series, col, self.name).array
                )
            else:
                out[col.name] = _missing_series(col, n).array
        return pd.DataFrame(out, index=pd.RangeIndex(n), copy=False)

    def _conformed(self, frame: pd.DataFrame) -> bool:
        """Already this table: declared columns in order, each at its dtype, a RangeIndex
        from 0 (what a table of a Trace, or a concatenation of them, usually is)."""
        index = frame.index
        if not (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1):
            return False
        if list(frame.columns) != self.names:
            return False
        return all(_dtype_conforms(dtype, col)
                   for dtype, col in zip(frame.dtypes, self.columns, strict=True))

    @property
    def _index(self) -> frozenset[str]:
        return frozenset(self.names)

    def problems(self, frame: pd.DataFrame) -> list[str]:
        """Every way `frame` breaks this table's contract (empty list when it is valid)."""
        issues: list[str] = []
        if list(frame.columns) != self.names:
            return [f"{self.name}: columns {list(frame.columns)} != declared {self.names}"]
        for col in self.columns:
            series = frame[col.name]
            if str(series.dtype) != dtype_name(col.dtype):
                issues.append(f"{self.name}.{col.name}: dtype {series.dtype} != {col.dtype}")
                continue
            if col.values and len(series):
                extra = set(series.dropna().unique()) - set(col.values)
                if extra:
                    issues.append(f"{self.name}.{col.name}: values {sorted(extra)} not allowed")
        if {"start_ns", "end_ns"} <= set(frame.columns) and len(frame):
            backwards = int((frame["end_ns"] < frame["start_ns"]).sum())
            if backwards:
                issues.append(f"{self.name}: {backwards} rows end before they start")
        return issues


_EMPTY: dict[str, pd.DataFrame] = {}

#: categories of an all-NA category column (the default string dtype, so Parquet round-trips)
NO_CATEGORIES = pd.Index([], dtype=str)

#: how `str(dtype)` spells pandas' default string dtype, which a column declares as "str":
#: 'str' from pandas 3 on, 'object' before it
DEFAULT_STR = str(pd.Series([], dtype=str).dtype)


def dtype_name(declared: str) -> str:
    """What `str(series.dtype)` reads for a column declared with `declared`."""
    return DEFAULT_STR if declared == "str" else declared


def conform_column(series: pd.Series, col: Column, table: str) -> pd.Series:
    """`series` at `col`'s declared dtype: itself when it already is, else cast (a
    `SchemaError` when it cannot be, e.g. missing values in an `int64` or `bool` column)."""
    return series if _conforms(series, col) else _cast(series, col, table)


#: nanoseconds per time unit, in the spellings ncu has used across versions (the `metrics`
#: table keeps ncu's own unit; readers and analyzers convert through this one table)
NS_PER_UNIT: dict[str, float] = {
    "ns": 1.0, "nsecond": 1.0, "nanosecond": 1.0,
    "us": 1e3, "usecond": 1e3, "microsecond": 1e3,
    "ms": 1e6, "msecond": 1e6, "millisecond": 1e6,
    "s": 1e9, "second": 1e9,
}


def _conforms(series: pd.Series, col: Column) -> bool:
    """True when `series` already has the column's dtype (and declared categories)."""
    return _dtype_conforms(series.dtype, col)


def _dtype_conforms(dtype: Any, col: Column) -> bool:
    """True when a column of `dtype` needs no cast to be `col` (`_conforms`)."""
    if str(dtype) != dtype_name(col.dtype):
        return False
    if col.dtype != "category":
        return True
    cats = dtype.categories
    if col.values:
        return list(cats) == list(col.values)
    if len(cats) == 0:
        return cats.dtype == NO_CATEGORIES.dtype
    return pd.api.types.is_string_dtype(cats.dtype)


def empty_series(col: Column) -> pd.Series:
    """A zero-row column at `col`'s declared dtype (Trace and Diagnosis dtypes alike)."""
    if col.dtype == "category":
        categories = pd.Index(list(col.values)) if col.values else NO_CATEGORIES
        return pd.Series(pd.Categorical([], categories=categories))
    return pd.Series([], dtype=dtype_name(col.dtype))


def _missing_series(col: Column, n: int) -> pd.Series:
    """An all-NA column of n rows, built from arrays (no per-row Python objects)."""
    if col.dtype == "int64":
        raise SchemaError(f"required column {col.name} is missing")
    if col.dtype == "category":
        categories = pd.Index(list(col.values)) if col.values else NO_CATEGORIES
        return pd.Series(pd.Categorical.from_codes(np.full(n, -1), categories=categories))
    if col.dtype == "float64":
        return pd.Series(np.full(n, np.nan))
    mask = np.ones(n, dtype=bool)
    if col.dtype == "boolean":
        return pd.Series(pd.arrays.BooleanArray(np.zeros(n, dtype=bool), mask))
    return pd.Series(pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), mask))


def _cast(series: pd.Series, col: Column, table: str) -> pd.Series:
    series = series.reset_index(drop=True)
    try:
        if col.dtype == "category":
            return _as_category(series, col, table)
        if col.dtype in ("int64", "bool"):
            if series.isna().any():
                raise SchemaError(f"{table}.{col.name} has missing values")
            return series.astype(col.dtype)
        if col.dtype == "str":  # missing values stay missing (astype(str) would spell them)
            return series.astype(str) if DEFAULT_STR == "str" else series.astype(object)
        if col.dtype == "Int64" and series.dtype == object:
            series = pd.to_numeric(series, errors="raise")
        return series.astype(col.dtype)
    except (TypeError, ValueError) as exc:
        raise SchemaError(
            f"{table}.{col.name}: cannot cast {series.dtype} to {col.dtype}: {exc}"
        ) from exc


def _as_category(series: pd.Series, col: Column, table: str) -> pd.Series:
    """Categories are always strings; enumerated columns carry exactly their declared values."""
    if series.isna().all():
        return _missing_series(col, len(series))
    if isinstance(series.dtype, pd.CategoricalDtype):
        cat = series.cat.remove_unused_categories()
        if len(cat.cat.categories) and not pd.api.types.is_string_dtype(cat.cat.categories):
            cat = cat.cat.rename_categories([str(v) for v in cat.cat.categories])
    else:
        if len(series) and not pd.api.types.is_string_dtype(series.dtype):
            present = series.notna()
            series = series.astype(object)
            series[present] = series[present].map(str)
        cat = series.astype("category")
    if col.values:
        unknown = set(cat.cat.categories) - set(col.values)
        if unknown:
            raise SchemaError(f"{table}.{col.name}: values {sorted(map(str, unknown))} are not declared")
        cat = cat.cat.set_categories(list(col.values))
    return cat


def text_category(values: np.ndarray, col: Column) -> Any:
    """Object `values` as `col`'s category column, built at once when they are text (None
    or NaN where missing) that `conform` would keep: what conforming them gives, without
    its ~0.4 ms of pandas steps, paid per table of every file read. Other values are
    returned as they are, for `conform` to cast (or refuse)."""
    if pd.api.types.infer_dtype(values, skipna=True) != "string":
        return values
    if not col.values:
        return pd.Categorical(values)
    if not set(pd.unique(values[pd.notna(values)])) <= set(col.values):
        return values
    return pd.Categorical(values, categories=list(col.values))


def _c(name: str, dtype: str, unit: str, meaning: str, values: tuple[str, ...] = ()) -> Column:
    return Column(name, dtype, unit, meaning, values)


RANK = _c("rank", "Int64", "", "distributed rank of the process that recorded the row (NA: none given)")
PID = _c("pid", "Int64", "", "host process id")
TID = _c("tid", "Int64", "", "host thread id")
DEVICE = _c("device", "Int64", "", "CUDA device index")
STREAM = _c("stream", "Int64", "", "CUDA stream id")
START = _c("start_ns", "int64", "ns", "start time")
END = _c("end_ns", "int64", "ns", "end time")
CORRELATION = _c("correlation", "Int64", "", "CUPTI correlation id joining a GPU activity to its API call")
EXTERNAL_ID = _c("external_id", "Int64", "", "framework op id (Kineto 'External id') joining GPU work to the op")
MEM_KINDS = ("pageable", "pinned", "device", "managed", "array", "unknown")

TABLES: dict[str, Table] = {}


def _table(name: str, row: str, *columns: Column) -> Table:
    table = Table(name, row, columns)
    TABLES[name] = table
    return table


_table(
    "devices", "GPU that the source describes",
    RANK,
    _c("device", "int64", "", "CUDA device index"),
    _c("name", "category", "", "product name, e.g. 'NVIDIA H100 80GB HBM3'"),
    _c("vendor", "category", "", "GPU vendor", ("nvidia", "amd", "unknown")),
    _c("sm_count", "Int64", "", "streaming multiprocessors"),
    _c("cc_major", "Int64", "", "compute capability, major"),
    _c("cc_minor", "Int64", "", "compute capability, minor"),
    _c("max_threads_per_sm", "Int64", "", "resident threads per SM"),
    _c("max_blocks_per_sm", "Int64", "", "resident thread blocks per SM"),
    _c("max_threads_per_block", "Int64", "", "threads per block limit"),
    _c("regs_per_sm", "Int64", "registers", "32-bit registers per SM"),
    _c("regs_per_block", "Int64", "registers", "registers per block limit"),
    _c("smem_per_sm_bytes", "Int64", "bytes", "shared memory per SM"),
    _c("smem_per_block_bytes", "Int64", "bytes", "shared memory per block without opt-in"),
    _c("smem_per_block_optin_bytes", "Int64", "bytes", "shared memory per block with opt-in"),
    _c("warp_size", "Int64", "threads", "threads per warp"),
    _c("mem_bytes", "Int64", "bytes", "device memory"),
    _c("l2_bytes", "Int64", "bytes", "L2 cache size"),
    _c("clock_khz", "Int64", "kHz", "maximum SM clock"),
    _c("mem_bandwidth_bytes_per_s", "float64", "bytes/s", "peak device-memory bandwidth"),
)

_table(
    "kernels", "kernel execution on the GPU",
    RANK, PID, DEVICE, STREAM, START, END,
    _c("name", "category", "", "kernel name as recorded (demangled where the source demangles)"),
    CORRELATION, EXTERNAL_ID,
    _c("kernel_id", "int64", "", "row id, unique in the trace; `metrics.kernel_id` refers to it"),
    _c("grid_x", "Int64", "blocks", "grid size, x"),
    _c("grid_y", "Int64", "blocks", "grid size, y"),
    _c("grid_z", "Int64", "blocks", "grid size, z"),
    _c("block_x", "Int64", "threads", "block size, x"),
    _c("block_y", "Int64", "threads", "block size, y"),
    _c("block_z", "Int64", "threads", "block size, z"),
    _c("regs_per_thread", "Int64", "registers", "registers per thread"),
    _c("smem_bytes", "Int64", "bytes", "shared memory per block, static + dynamic (what occupancy uses)"),
    _c("smem_static_bytes", "Int64", "bytes", "static shared memory per block, where the source splits it"),
    _c("smem_dynamic_bytes", "Int64", "bytes", "dynamic shared memory per block, where the source splits it"),
    _c("smem_config_bytes", "Int64", "bytes", "shared memory carveout per SM the launch ran with (ncu launch__shared_mem_config_size, nsys sharedMemoryExecuted); NA: not recorded"),
    _c("nvtx", "category", "", "NVTX range stack at launch, where the source records it (ncu)"),
)

_table(
    "copies", "memcpy or memset executed on the GPU",
    RANK, PID, DEVICE, STREAM, START, END,
    _c("kind", "category", "", "direction", ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "memset", "other")),
    _c("bytes", "Int64", "bytes", "bytes copied or set"),
    _c("src_mem", "category", "", "source memory kind", MEM_KINDS),
    _c("dst_mem", "category", "", "destination memory kind (the set memory for memset)", MEM_KINDS),
    _c("host_mem", "category", "", "kind of the host side of a host<->device copy", ("pageable", "pinned")),
    CORRELATION, EXTERNAL_ID,
)

_table(
    "api", "CUDA runtime or driver API call on a host thread",
    RANK, PID, TID, START, END,
    _c("name", "category", "", "API function, version suffix removed (cudaLaunchKernel)"),
    _c("kind", "category", "", "API layer", ("runtime", "driver")),
    CORRELATION, EXTERNAL_ID,
)

_table(
    "syncs", "blocking synchronization the CUDA driver recorded (CUPTI SYNCHRONIZATION)",
    RANK, PID, TID, DEVICE, STREAM, START, END,
    _c("kind", "category", "", "what was waited on",
       ("device", "context", "stream", "event", "stream_wait", "unknown")),
    CORRELATION,
    _c("event_id", "Int64", "", "CUDA event waited on (event and stream_wait syncs)"),
    _c("record_correlation", "Int64", "",
       "correlation of the cudaEventRecord that recorded the event waited on (event and "
       "stream_wait syncs; NA: not recorded)"),
    _c("record_stream", "Int64", "", "stream that event was recorded on (NA: not recorded)"),
)

_table(
    "ranges", "named host or GPU time range: NVTX range, framework op, annotation, step",
    RANK, PID, TID,
    _c("device", "Int64", "", "device, for ranges drawn on the GPU timeline (gpu_annotation)"),
    STREAM, START, END,
    _c("name", "category", "", "range name"),
    _c("depth", "Int64", "", "nesting depth on its thread (0 = outermost)"),
    _c("source", "category", "", "what produced the range",
       ("torch_op", "annotation", "step", "python", "nvtx", "gpu_annotation", "host", "device_op")),
    _c("domain", "category", "", "NVTX domain or other namespace of the name"),
    EXTERNAL_ID,
    _c("cpu_time", "Int64", "ns", "time the recording thread ran on a CPU within the range "
       "(its thread CPU time: gpudiag's steps and markers; NA where not measured)"),
)

_table(
    "collectives", "collective communication (NCCL kernel or timed torch.distributed call)",
    RANK, PID, DEVICE, STREAM, START, END,
    _c("op", "category", "", "collective",
       ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
        "send_recv", "send", "recv", "barrier", "other")),
    _c("bytes", "Int64", "bytes", "message size S as nccl-tests defines it (all_gather: output, reduce_scatter: input)"),
    _c("dtype", "category", "", "element type"),
    _c("group_size", "Int64", "ranks", "ranks in the communicator"),
    _c("comm", "category", "", "communicator / process group (stream when none is recorded)"),
    _c("seq", "Int64", "", "order of this collective within its (rank, comm): matches calls across ranks"),
    _c("kernel_id", "Int64", "", "the kernels row of the NCCL kernel"),
    _c("name", "category", "", "kernel or call name"),
)

_table(
    "memory", "allocator event",
    RANK, PID,
    _c("device", "Int64", "", "CUDA device; -1 = host (CPU) memory"),
    _c("ts_ns", "int64", "ns", "event time (-1: existed before recording began)"),
    _c("action", "category", "", "what happened",
       ("alloc", "free", "free_requested", "free_completed", "segment_alloc", "segment_free",
        "segment_map", "segment_unmap", "oom", "snapshot", "preexisting", "create",
        "increment_version", "destroy")),
    _c("addr", "Int64", "", "address of the block or segment"),
    _c("bytes", "Int64", "bytes", "size of the block, segment or tensor"),
    _c("delta_bytes", "Int64", "bytes", "signed change of allocated bytes this event makes (NA: none or unknown)"),
    _c("total_allocated_bytes", "Int64", "bytes", "allocated bytes after the event, where recorded"),
    _c("total_reserved_bytes", "Int64", "bytes", "reserved bytes after the event, where recorded"),
    _c("device_free_bytes", "Int64", "bytes", "free device memory the driver reported (oom events)"),
    STREAM,
    _c("site", "category", "", "allocation call site 'file:line (function)'"),
    _c("category", "category", "", "tensor category (torch memory timeline: PARAMETER, ACTIVATION, ...)"),
)

_table(
    "memory_blocks", "allocator block at snapshot time",
    RANK,
    _c("device", "Int64", "", "CUDA device"),
    _c("pool", "category", "", "caching-allocator pool", ("large", "small")),
    _c("segment_addr", "Int64", "", "address of the segment holding the block"),
    _c("segment_bytes", "Int64", "bytes", "size of that segment"),
    _c("addr", "Int64", "", "block address"),
    _c("bytes", "Int64", "bytes", "block size"),
    _c("requested_bytes", "Int64", "bytes", "bytes the caller asked for"),
    _c("state", "category", "", "block state", ("allocated", "inactive", "awaiting_free")),
    STREAM,
    _c("expandable", "boolean", "", "segment is an expandable segment"),
    _c("site", "category", "", "allocation call site 'file:line (function)'"),
)

_table(
    "samples", "periodic counter sample (NVML and other samplers)",
    RANK,
    _c("device", "Int64", "", "CUDA device (NA: not device-specific)"),
    _c("ts_ns", "int64", "ns", "sample time"),
    _c("metric", "category", "", "counter name, e.g. 'gpu_util', 'mem_used'"),
    _c("value", "float64", "", "value, in `unit`"),
    _c("unit", "category", "", "unit of `value`"),
)

_table(
    "metrics", "hardware metric of one profiled kernel (Nsight Compute)",
    RANK,
    _c("kernel_id", "int64", "", "the kernels row this metric belongs to"),
    DEVICE,
    _c("name", "category", "", "kernel name"),
    _c("metric", "category", "", "ncu metric name, e.g. 'sm__throughput.avg.pct_of_peak_sustained_elapsed'"),
    _c("value", "float64", "", "numeric value in `unit` (NaN for text metrics)"),
    _c("unit", "category", "", "unit as ncu reports it"),
    _c("text", "category", "", "value of a text metric (e.g. a device name)"),
)

TABLE_NAMES: tuple[str, ...] = tuple(TABLES)

#: tables whose rows are GPU activity; a trace with none of them has nothing to diagnose
GPU_TABLES = ("kernels", "copies", "syncs", "collectives", "memory", "memory_blocks", "samples",
              "metrics")


def markdown() -> str:
    """The schema as Markdown: the generated body of docs/schema.md."""
    lines = [
        "# Trace schema",
        "",
        "Generated from `gpudiag/schema.py` by `gpudiag schema > docs/schema.md`; do not edit by hand.",
        "Times are int64 nanoseconds, sizes bytes; `Int64` columns are nullable (pandas NA).",
        "",
    ]
    for table in TABLES.values():
        lines += [f"## `{table.name}`", "", f"One row per {table.row}.", ""]
        lines += column_lines(table.columns)
        lines.append("")
    return "\n".join(lines)


def column_lines(columns: tuple[Column, ...]) -> list[str]:
    """The Markdown table of `columns`, header first (one line per column)."""
    lines = ["| column | dtype | unit | meaning |", "|---|---|---|---|"]
    for col in columns:
        meaning = col.meaning
        if col.values:
            meaning += ": " + ", ".join(f"`{v}`" for v in col.values)
        lines.append(f"| `{col.name}` | {col.dtype} | {col.unit} | {meaning} |")
    return lines
