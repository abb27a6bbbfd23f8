"""PyTorch profiler (Kineto) Chrome traces: `.json`, `.json.gz`, current and 2021 schemas.

    trace = gpudiag.readers.kineto.reader.read(Path("rank0.pt.trace.json.gz"))

Times: Kineto writes `ts`/`dur` in microseconds, as floats relative to `baseTimeNanoseconds`
when the trace has that key; we add the base back and keep integer nanoseconds (HTA instead
rounds to whole microseconds). GPU events carry the device as `pid` and the stream as `tid`;
their host process is found through the CUPTI correlation id of the launching API call.
(A Chrome trace written by `jax.profiler` never comes here: the registry sends it to the
JAX reader, `readers.xplane.reader.read_perfetto`.)
"""

from __future__ import annotations

import functools
import gc
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.devices import fill_from_compute_capability, vendor_of
from gpudiag.errors import InputError
from gpudiag.intervals import nesting_depth
from gpudiag.readers.chrome.structs import (
    Document,
    InvalidJSONError,
    integers,
    objects,
    too_deep,
    triple,
)
from gpudiag.readers.files import read_bytes
from gpudiag.readers.kineto import collectives as kineto_collectives
from gpudiag.readers.kineto import repair as kineto_repair
from gpudiag.readers.kineto.events import (
    GROUP_IDS,
    GROUPS,
    ArgColumns,
    Events,
    device_of,
    external_id,
    stream_of,
)
from gpudiag.schema import TABLES
from gpudiag.trace import Trace, warn_meta

SYNC_KINDS = {
    "Event Sync": "event", "Stream Sync": "stream", "Context Sync": "context",
    "Stream Wait Event": "stream_wait", "Device Sync": "device",
}
MEM_WORDS = {
    "Pageable": "pageable", "Pinned": "pinned", "Device": "device", "Managed": "managed",
    "Array": "array", "Host": "unknown", "Unknown": "unknown",
}
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")
_COPY = re.compile(r"Memcpy (?P<kind>\w+) \((?P<src>[\w ]+) -> (?P<dst>[\w ]+)\)")
_MEMSET = re.compile(r"Memset \((?P<dst>[\w ]+)\)")
#: the categories of the copies table's enumerated columns
COPY_COLUMNS = {column: list(TABLES["copies"].column(column).values)
                for column in ("kind", "src_mem", "dst_mem", "host_mem")}
RANGE_SOURCES = {"op": "torch_op", "annotation": "annotation", "python": "python",
                 "gpu_annotation": "gpu_annotation"}
KINETO_GROUPS = tuple(dict.fromkeys(GROUPS.values()))
#: the largest rank or world size believed (a header value past it is ignored and counted)
MAX_RANK = 2**31 - 1
RANGE_SOURCE_BY_ID = np.array(
    [RANGE_SOURCES.get(g) for g in GROUP_IDS], dtype=object)
RANGE_SOURCE_CATEGORIES = TABLES["ranges"].column("source").values


def read(path: Path) -> Trace:
    """Read a Kineto Chrome trace into a Trace.

    A trace that is invalid JSON only because Kineto left bare quotes, bytes that are not
    UTF-8 or lone surrogates in event names (`kineto_repair`) is read from a repaired copy,
    and each repair is counted.
    """
    with gc_paused():
        try:
            return _read(path)
        except RecursionError:  # msgspec (or pandas on the values) recursing into a nesting
            raise too_deep(path) from None
        except InvalidJSONError as exc:
            if exc.truncated:
                raise
            fixed, repairs = kineto_repair.repair(read_bytes(path))
            if not repairs:
                raise
            original = exc
        with tempfile.TemporaryDirectory(prefix="gpudiag-") as tmp:
            copy = Path(tmp) / path.name.removesuffix(".gz")
            copy.write_bytes(fixed)
            try:
                trace = _read(copy)
            except InputError:  # broken in other ways too: the error names the user's file
                raise original from None
        for kind, count in repairs.items():
            trace.warn(kind, count)
        return trace


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a trace is read: the reader builds hundreds of
    thousands of short-lived objects without cycles, and the collector's passes over them
    cost a few percent of the load for nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read(path: Path) -> Trace:
    ev = Events(path)
    doc = ev.header
    api = api_table(ev)
    calls = Calls(api)
    host_pid = host_pid_fallback(ev)
    trace = Trace(
        meta=read_meta(ev),
        devices=devices_table(doc),
        copies=join_host(copies_table(ev), calls, host_pid),
        api=api,
        syncs=join_host(syncs_table(ev), calls, host_pid),
        ranges=ranges_table(ev),
        memory=memory_table(ev),
    )
    kernel_idx = ev.where("kernel")
    trace.kernels = join_host(kernels_table(ev, kernel_idx, ev.args(kernel_idx)), calls, host_pid)
    trace.collectives = kineto_collectives.collectives(ev, trace.kernels, kernel_idx, calls)
    return trace


def read_meta(ev: Events) -> dict[str, Any]:
    """The meta of a trace read alone: its header's facts, then the repairs counted (its
    keys in the order a Trace's meta keeps them)."""
    meta = meta_of(ev.header, ev)
    meta.setdefault("sources", [])
    meta.setdefault("warnings", {})
    meta.setdefault("timeline", True)
    warn_meta(meta, "events with negative duration clipped to 0", ev.negative_dur)
    warn_meta(meta, "events without a timestamp skipped", int((~ev.valid_ts).sum()))
    warn_meta(meta, "implausible baseTimeNanoseconds ignored", int(ev.bad_base))
    warn_meta(meta, "events with an implausible duration (not a number, or over "
              "GPUDIAG_MAX_EVENT_SECONDS, 1 day) dropped", int(ev.bad_dur.sum()))
    warn_meta(meta, "pid or tid values too large for an id (over 2**53) ignored",
              ev.huge_ids)
    dist = ev.header.distributedInfo or {}
    warn_meta(meta, "implausible distributedInfo rank or world_size ignored", sum(
        dist.get(k) is not None and meta[k] is None for k in ("rank", "world_size")))
    return meta


def host_pid_fallback(ev: Events) -> int | None:
    """The host pid, when the trace has exactly one process with host (CPU) events."""
    host = ev.where("runtime", "driver", "op", "annotation", "python")
    pids = np.unique(ev.pid[host][np.isfinite(ev.pid[host])])
    return int(pids[0]) if len(pids) == 1 else None


class Calls:
    """The API calls of a trace, looked up by CUPTI correlation id (one sort, then searches)."""

    def __init__(self, api: pd.DataFrame, files: np.ndarray | None = None) -> None:
        correlation = api["correlation"].array
        known = np.flatnonzero(~np.asarray(correlation.isna()))
        ids = np.asarray(correlation[known], dtype=np.int64)
        #: joined files (`files`: each call's): an id is looked up among its file's calls,
        #: keyed by (file, position of the id among all ids)
        self._ids: np.ndarray | None = None
        if files is not None:
            self._ids = np.unique(ids)
            ids = files[known] * len(self._ids) + np.searchsorted(self._ids, ids)
        # each correlation id once, its first call (in time order), sorted by id
        self.keys, first = np.unique(ids, return_index=True)
        rows = known[first]
        self.columns = {
            col: api[col].to_numpy(dtype=np.float64, na_value=np.nan)[rows]
            for col in ("pid", "tid", "start_ns")
        }
        #: start_ns exactly: epoch nanoseconds lose up to 256 ns in a float64
        self.start_ns = api["start_ns"].to_numpy(dtype=np.int64)[rows]

    def lookup(self, correlation: pd.Series, col: str, files: np.ndarray | None = None
               ) -> np.ndarray:
        """`col` (pid, tid or start_ns) of the call with each correlation id; NaN if none.
        `files`: each row's file, for the calls of joined files. (start_ns as a float is
        only good for searching; `start_of` gives it exactly.)"""
        pos, found = self._positions(correlation, files)
        if pos is None:
            return np.full(len(found), np.nan)
        return np.where(found, self.columns[col][pos], np.nan)

    def start_of(self, correlation: pd.Series, otherwise: np.ndarray) -> np.ndarray:
        """The exact start (int64 ns) of the call with each correlation id, `otherwise`
        where there is none."""
        pos, found = self._positions(correlation, None)
        if pos is None:
            return np.asarray(otherwise, dtype=np.int64)
        return np.where(found, self.start_ns[pos], otherwise).astype(np.int64)

    def _positions(self, correlation: pd.Series, files: np.ndarray | None
                   ) -> tuple[np.ndarray | None, np.ndarray]:
        """The position among the calls of each correlation id's call, and whether there
        is one (positions None: no calls at all)."""
        wanted = correlation.to_numpy(dtype=np.float64, na_value=np.nan)
        if not len(self.keys):
            return None, np.zeros(len(wanted), dtype=bool)
        known = np.isfinite(wanted)
        if self._ids is not None:
            assert files is not None
            ids = np.where(known, wanted, 0).astype(np.int64)
            at = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
            known &= self._ids[at] == wanted
            wanted = (files * len(self._ids) + at).astype(np.float64)
        pos = np.minimum(np.searchsorted(self.keys, np.where(known, wanted, 0).astype(np.int64)),
                         len(self.keys) - 1)
        return pos, known & (self.keys[pos] == wanted)


def join_host(frame: pd.DataFrame | None, calls: Calls, fallback: int | np.ndarray | None,
              files: np.ndarray | None = None) -> pd.DataFrame | None:
    """Fill `pid` (and `tid` when present) from the API call with the same correlation id.
    Joined files: `files` holds each row's file, `fallback` each row's (NaN: none)."""
    if frame is None:
        return None
    for col in ("pid", "tid") if "tid" in frame.columns else ("pid",):
        frame[col] = integers(calls.lookup(frame["correlation"], col, files))
    if isinstance(fallback, np.ndarray):
        frame["pid"] = frame["pid"].fillna(integers(fallback))
    elif fallback is not None:
        frame["pid"] = frame["pid"].fillna(fallback)
    return frame


def kernels_table(ev: Events, idx: np.ndarray, args: ArgColumns) -> pd.DataFrame | None:
    if not len(idx):
        return None
    grid = triple(args.values("grid"))
    block = triple(args.values("block"))
    return pd.DataFrame({
        **ev.times(idx),
        "name": ev.names(idx),
        "device": device_of(ev, idx, args),
        "stream": stream_of(ev, idx, args),
        "correlation": args.num("correlation"),
        "external_id": external_id(args),
        "kernel_id": np.arange(len(idx), dtype=np.int64),
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "regs_per_thread": args.num("regs"),
        "smem_bytes": args.num("smem"),
    })


def copies_table(ev: Events) -> pd.DataFrame | None:
    idx = ev.where("memcpy", "memset")
    if not len(idx):
        return None
    args = ev.args(idx)
    is_set = ev.is_group(idx, "memset")
    codes = ev.name_codes[idx]
    used, position = np.unique(codes, return_inverse=True)
    position = position.reshape(-1)
    # (kind, source, destination) each distinct name spells, as the schema's words
    spelled = [_copy_name(str(ev.name_uniques[code])) if code >= 0 else (None, None, None)
               for code in used]
    kind, src, dst = (np.array([fields[n] for fields in spelled] + [None], dtype=object)
                      for n in range(3))
    kind, src, dst = kind[position], src[position], dst[position]
    unnamed = pd.isna(kind)
    kind[unnamed] = objects(args.values("kind"))[unnamed]
    kind = np.where(pd.Series(kind, dtype=object).isin(COPY_KINDS).to_numpy(), kind, "other")
    kind[is_set] = "memset"
    src[is_set] = None
    frame = pd.DataFrame({
        **ev.times(idx),
        "device": device_of(ev, idx, args),
        "stream": stream_of(ev, idx, args),
        "kind": _declared("kind", kind),
        "bytes": args.num("bytes"),
        "src_mem": _declared("src_mem", src),
        "dst_mem": _declared("dst_mem", dst),
        "correlation": args.num("correlation"),
        "external_id": external_id(args),
    })
    frame["host_mem"] = host_memory(frame)
    return frame


@functools.lru_cache(maxsize=4096)
def _copy_name(name: str) -> tuple[str | None, str | None, str | None]:
    """'Memcpy HtoD (Pageable -> Device)' -> ('HtoD', 'pageable', 'device'); 'Memset
    (Device)' -> (None, None, 'device'); words the schema does not know are None."""
    copy = _COPY.search(name)
    if copy is not None:
        return copy["kind"], MEM_WORDS.get(copy["src"]), MEM_WORDS.get(copy["dst"])
    memset = _MEMSET.search(name)
    return None, None, MEM_WORDS.get(memset["dst"]) if memset is not None else None


def _declared(column: str, values: np.ndarray) -> pd.Categorical:
    """A copies column at its declared categories (values outside them never occur)."""
    return pd.Categorical(values, categories=COPY_COLUMNS[column])


def host_memory(copies: pd.DataFrame) -> pd.Series:
    """Pageable or pinned: the host side of each HtoD / DtoH copy (NA otherwise)."""
    kind = copies["kind"].to_numpy(dtype=object)
    host = np.where(kind == "HtoD", copies["src_mem"].to_numpy(dtype=object),
                    np.where(kind == "DtoH", copies["dst_mem"].to_numpy(dtype=object), None))
    host[~np.isin(host, COPY_COLUMNS["host_mem"])] = None  # device-side words
    return pd.Series(pd.Categorical(host, categories=COPY_COLUMNS["host_mem"]))


def api_table(ev: Events) -> pd.DataFrame:
    idx = ev.where("runtime", "driver")
    args = ev.args(idx)
    return pd.DataFrame({
        **ev.times(idx),
        **ev.host(idx),
        "name": ev.names(idx),
        "kind": pd.Categorical.from_codes(ev.is_group(idx, "driver").astype(np.int8),
                                          categories=["runtime", "driver"]),
        "correlation": args.num("correlation"),
        "external_id": external_id(args),
    })


def syncs_table(ev: Events) -> pd.DataFrame | None:
    idx = ev.where("sync")
    if not len(idx):
        return None
    args = ev.args(idx)
    labels = pd.Series(args.values("sync_kind"), dtype=object).fillna(
        pd.Series(ev.name_values(idx), dtype=object)
    )
    stream = args.num("stream")
    event_id = args.num("wait_event")
    recorded = args.num("record_correlation")
    record_stream = args.num("record_stream")
    return pd.DataFrame({
        **ev.times(idx),
        "device": device_of(ev, idx, args),
        "stream": stream.where(stream >= 0),
        "kind": pd.Categorical(labels.map(SYNC_KINDS).fillna("unknown").to_numpy()),
        "correlation": args.num("correlation"),
        "event_id": event_id.where(event_id >= 0),
        "record_correlation": recorded.where(recorded >= 0),
        "record_stream": record_stream.where(record_stream >= 0),
        "tid": pd.array([pd.NA] * len(idx), dtype="Int64"),
    })


def ranges_table(ev: Events) -> pd.DataFrame | None:
    idx = ev.where(*RANGE_SOURCES)
    if not len(idx):
        return None
    on_gpu = ev.is_group(idx, "gpu_annotation")
    args = ev.args(idx)
    names = ev.names(idx)
    source = RANGE_SOURCE_BY_ID[ev.group_code[idx]]
    is_step = ev.name_test(idx, lambda name: name.startswith("ProfilerStep#"))
    source[ev.is_group(idx, "annotation") & is_step] = "step"
    pid, tid = ev.pids(idx), ev.tids(idx)
    times = ev.times(idx)
    depth = nesting_depth(_lanes(ev.pid[idx], ev.tid[idx], on_gpu, ev.file_of(idx)),
                          times["start_ns"], times["end_ns"])
    return pd.DataFrame({  # declared order and dtypes: the Trace takes it as it is
        "pid": pid.mask(on_gpu), "tid": tid.mask(on_gpu),
        "device": device_of(ev, idx, args).where(on_gpu), "stream": tid.where(on_gpu),
        **times, "name": names,
        "depth": pd.arrays.IntegerArray(np.asarray(depth, dtype=np.int64),
                                        np.zeros(len(idx), dtype=bool)),
        "source": pd.Categorical(source, categories=RANGE_SOURCE_CATEGORIES),
        "external_id": external_id(args),
    })


def _lanes(pid: np.ndarray, tid: np.ndarray, on_gpu: np.ndarray,
           files: np.ndarray | None = None) -> np.ndarray:
    """One int64 id per (pid, tid, on GPU) lane (a thread or a stream), NaN ids equal, of
    each file (`files`: joined files' rows); from hash factorizations (a DataFrame groupby
    cost 2 ms even on one row)."""
    pid_code, _ = pd.factorize(pid, use_na_sentinel=False)
    tid_code, tids = pd.factorize(tid, use_na_sentinel=False)
    lane = (pid_code.astype(np.int64) * len(tids) + tid_code) * 2 + np.asarray(on_gpu, bool)
    return lane if files is None else lane * (int(files.max()) + 1) + files


def memory_table(ev: Events) -> pd.DataFrame | None:
    idx = ev.where("memory")
    if not len(idx):
        return None
    args = ev.args(idx)
    signed = args.num("mem_bytes")
    device_type = args.num("device_type")
    return pd.DataFrame({
        "pid": ev.pids(idx),
        "device": args.num("device_id").where(device_type != 0, -1),
        "ts_ns": ev.start[idx],
        "action": pd.Categorical.from_codes((signed < 0).fillna(False).to_numpy().astype(np.int8),
                                            categories=["alloc", "free"]),
        "addr": args.num("addr"),
        "bytes": signed.abs(),
        "delta_bytes": signed,
        "total_allocated_bytes": args.num("total_allocated"),
        "total_reserved_bytes": args.num("total_reserved"),
    })


_DEVICE_KEYS = {
    "device": "id", "name": "name", "sm_count": "numSms", "cc_major": "computeMajor",
    "cc_minor": "computeMinor", "max_threads_per_sm": "maxThreadsPerMultiprocessor",
    "max_threads_per_block": "maxThreadsPerBlock", "regs_per_sm": "regsPerMultiprocessor",
    "regs_per_block": "regsPerBlock", "smem_per_sm_bytes": "sharedMemPerMultiprocessor",
    "smem_per_block_bytes": "sharedMemPerBlock",
    "smem_per_block_optin_bytes": "sharedMemPerBlockOptin", "warp_size": "warpSize",
    "mem_bytes": "totalGlobalMem",
}


def devices_table(doc: Document) -> pd.DataFrame | None:
    """The devices table; the ranks of one job share their deviceProperties, so a folder of
    them builds it once (building it cost 12 ms, a quarter of reading a tiny trace)."""
    props = [p for p in (doc.deviceProperties or []) if isinstance(p, dict)]
    if not props:
        return None
    try:
        key = msgspec.json.encode(props)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return _build_devices(props)
    return _devices_of(key).copy()


@functools.lru_cache(maxsize=16)
def _devices_of(key: bytes) -> pd.DataFrame:
    return _build_devices(msgspec.json.decode(key))


def _build_devices(props: list[dict[str, Any]]) -> pd.DataFrame:
    columns = {col: [p.get(key) for p in props] for col, key in _DEVICE_KEYS.items()}
    amd_smem = [p.get("maxSharedMemoryPerMultiProcessor") for p in props]
    nvidia_smem = columns["smem_per_sm_bytes"]
    columns["smem_per_sm_bytes"] = [
        a if a is not None else b for a, b in zip(nvidia_smem, amd_smem, strict=True)
    ]
    columns["name"] = [None if v is None else str(v) for v in columns["name"]]
    frame = pd.DataFrame({
        col: values if col == "name" else integers(values) for col, values in columns.items()
    })
    frame["vendor"] = [vendor_of(v) for v in columns["name"]]
    frame = frame.dropna(subset=["device"])
    return fill_from_compute_capability(frame)


def meta_of(doc: Document, ev: Events) -> dict[str, Any]:
    dist = doc.distributedInfo or {}
    versions = {
        "kineto_schema": doc.schemaVersion, "cupti": doc.cupti_version,
        "cuda_runtime": doc.cuda_runtime_version, "cuda_driver": doc.cuda_driver_version,
    }
    api_names = pd.Series(ev.name_values(ev.where("runtime")[:50]), dtype=object)
    vendors = {vendor_of(str(p.get("name", ""))) for p in (doc.deviceProperties or [])}
    hip = bool(api_names.astype(str).str.startswith("hip").any())
    return {
        "format": "kineto",
        "rank": _whole(dist.get("rank")),
        "world_size": _whole(dist.get("world_size")),
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        "tool_versions": {k: v for k, v in versions.items() if v is not None},
        "vendor": "amd" if hip or vendors == {"amd"} else "nvidia" if "nvidia" in vendors
        else "unknown",
        "base_time_ns": 0 if ev.bad_base else int(doc.baseTimeNanoseconds or 0),
        "trace_name": doc.traceName if isinstance(doc.traceName, str) else None,
        "timeline": True,
    }


def _whole(value: Any) -> int | None:
    """An integer from the trace header, or None when it is absent, not a whole number or
    beyond MAX_RANK."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not -MAX_RANK <= value <= MAX_RANK:  # 1e300 or 2**70: no process group is that big
        return None
    return int(value) if float(value).is_integer() else None
