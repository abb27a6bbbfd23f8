"""CUPTI activity records as gpudiag tables: the pure half of the cupti backend.

    rows: dict[int, list[tuple]] = {}
    snapshot(records, rows)                       # in the buffer callback: plain tuples
    trace = CuptiConverter(offset_ns=off, pid=os.getpid()).convert(rows)

Records are cupti-python objects (`cupti.cupti.ActivityKernel9`, `ActivityAPI`, ...) or
dicts with the same attribute names; they may not outlive the CUPTI buffer, so `snapshot`
copies the fields gpudiag reads into tuples, one attrgetter call per record. `convert` turns
a batch into one Trace, vectorized per table. It keeps what spans batches: open NVTX ranges,
the context -> device map (sync records carry no device), recent synchronize calls.
Which fields those are, and what CUPTI's field values mean, is in `cupti_fields`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.collectors.cupti.fields import (
    ALLOCATION,
    CONCURRENT_KERNEL,
    CONTEXT,
    COPY_KINDS,
    DEVICE,
    DRIVER,
    KERNEL,
    MARKER,
    MARKER_END,
    MARKER_START,
    MEM_KINDS,
    MEMCPY,
    MEMCPY2,
    MEMORY2,
    MEMSET,
    OBJECT_THREAD,
    RELEASE,
    RUNTIME,
    SYNC_TYPES,
    SYNCHRONIZATION,
    CallSite,
    ClockOffset,
    base_api_name,
    demangle,
    mapped_names,
    measure_offset,
    records_frame,
    renamed_names,
    snapshot,
    valid_ids,
)
from gpudiag.devices import arch_limits, fill_from_compute_capability
from gpudiag.markers import DOMAIN as MARKERS_DOMAIN
from gpudiag.readers.nsys.schema import SYNC_CALLS, VERSION_SUFFIX
from gpudiag.trace import Trace

# the public names, with those that moved to cupti_fields and that cupti_backend or the
# tests import from here
__all__ = ["BLOCKING_CALLS", "CONCURRENT_KERNEL", "DRIVER", "IMPLAUSIBLE_CARVEOUT", "CallSite",
           "ClockOffset", "CuptiConverter", "base_api_name", "demangle", "measure_offset",
           "snapshot"]

# -- convert: tuples -> Trace --------------------------------------------------------------

GROUPS: dict[str, tuple[int, ...]] = {
    "kernels": (CONCURRENT_KERNEL, KERNEL), "memcpy": (MEMCPY, MEMCPY2), "memset": (MEMSET,),
    "api": (RUNTIME, DRIVER), "syncs": (SYNCHRONIZATION,), "memory": (MEMORY2,),
    "markers": (MARKER,), "devices": (DEVICE,), "contexts": (CONTEXT,),
}
#: host calls that block until the GPU is done: the calls whose Python call site is captured
BLOCKING_CALLS = re.compile(
    r"^cuda(?:Device|Stream|Event|Thread)Synchronize$|^cu(?:Ctx|Stream|Event)Synchronize$"
    r"|^cudaMemcpy(?:2D|3D)?(?:Peer)?(?:ToSymbol|FromSymbol)?$")
IMPLAUSIBLE_CARVEOUT = ("kernels whose shared_memory_executed is not above zero or is below "
                        "their shared memory per block (carveout left NA)")
#: blocking calls remembered for syncs and call sites whose API record came in an earlier batch
REMEMBERED_CALLS = 4096


class CuptiConverter:
    """One process's CUPTI batches as Traces, keeping what spans batches.

    `api_name(record_kind, cbid)` names API records (cupti-python's `get_callback_name`);
    without it they are named `cbid_<n>`. Every row gets `pid`; `rank` goes to the meta and
    the rows, as the collector contract asks.
    """

    def __init__(self, *, offset_ns: int, pid: int, rank: int | None = None,
                 api_name: Callable[[int, int], str | None] | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        self.offset_ns = int(offset_ns)
        self.pid = pid
        self.rank = rank
        self.api_name = api_name
        self.meta = dict(meta or {})
        self.context_devices: dict[int, int] = {}
        self.calls: dict[int, tuple[str, Any, int, int]] = {}  # corr -> name, tid, start, end
        self._open: dict[int, tuple[int, Any, Any, Any, int]] = {}  # marker id -> range start
        self._depth: Counter[Any] = Counter()  # open NVTX ranges per thread
        self.warnings: Counter[str] = Counter()

    def convert(self, rows: Mapping[int, Sequence[tuple[Any, ...]]],
                callsites: Sequence[CallSite] = (), *, ignored: int = 0,
                final: bool = False) -> Trace:
        """One batch (`snapshot` output) and the call sites captured with it as a Trace."""
        self.warnings = Counter({"CUPTI records of kinds gpudiag does not read": ignored})
        frames = {name: records_frame(rows, kinds) for name, kinds in GROUPS.items()}
        self._learn_contexts(frames)
        tables = {"kernels": self._kernels(frames["kernels"]),
                  "copies": self._copies(frames["memcpy"], frames["memset"]),
                  "api": self._api(frames["api"]), "memory": self._memory(frames["memory"]),
                  "devices": self._devices(frames["devices"])}
        tables["syncs"] = self._syncs(frames["syncs"])
        tables["ranges"] = self._ranges(frames["markers"], callsites, final)
        self._forget_calls()
        meta = {"sources": [{"format": "cupti", "pid": self.pid}], "vendor": "nvidia",
                "timeline": True, "rank": self.rank, **self.meta,
                "warnings": {key: int(value) for key, value in self.warnings.items() if value}}
        trace = Trace(meta=meta, **{key: value for key, value in tables.items()
                                    if value is not None})
        trace.fill_rank()
        return trace

    def convert_records(self, records: Iterable[Any], callsites: Sequence[CallSite] = (),
                        *, final: bool = False) -> Trace:
        """`snapshot` and `convert` in one step (records still valid: tests, small batches)."""
        rows: dict[int, list[tuple[Any, ...]]] = {}
        ignored = snapshot(records, rows)
        return self.convert(rows, callsites, ignored=ignored, final=final)

    # -- per table ------------------------------------------------------------------------

    def _timed(self, frame: pd.DataFrame, what: str) -> pd.DataFrame:
        """Drop untimed rows (start = end = 0), clip backwards ones, move to the epoch clock."""
        start, end = frame.pop("start"), frame.pop("end")
        untimed = (start.isna() | end.isna() | ((start == 0) & (end == 0))).fillna(True)
        keep = ~untimed.to_numpy(bool)
        self.warnings[f"CUPTI {what} without timestamps dropped"] += int((~keep).sum())
        start_ns = start[keep].to_numpy(np.int64) + self.offset_ns
        end_ns = end[keep].to_numpy(np.int64) + self.offset_ns
        backwards = end_ns < start_ns
        self.warnings[f"CUPTI {what} ending before they start clipped to 0 ns"] += int(
            backwards.sum())
        return frame[keep].reset_index(drop=True).assign(
            start_ns=start_ns, end_ns=np.maximum(end_ns, start_ns))

    def _learn_contexts(self, frames: dict[str, pd.DataFrame]) -> None:
        """context -> device from every record naming both (sync records name only the
        context); kept across batches."""
        pairs = pd.concat([frames[group][["context_id", "device_id"]]
                           for group in ("contexts", "kernels", "memcpy", "memset")])
        pairs = pairs.apply(valid_ids).dropna().drop_duplicates()
        for context, device in pairs.itertuples(index=False):  # a few contexts per process
            self.context_devices[int(context)] = int(device)

    def _kernels(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        if frame.empty:
            return None
        frame = self._timed(frame, "kernels")
        static, dynamic = frame["static_shared_memory"], frame["dynamic_shared_memory"]
        smem = static + dynamic
        executed = frame["shared_memory_executed"]
        plausible = ((executed > 0) & (executed >= smem)).fillna(False).astype(bool)
        self.warnings[IMPLAUSIBLE_CARVEOUT] += int((executed.notna() & ~plausible).sum())
        out = pd.DataFrame({
            "pid": self.pid, "device": valid_ids(frame["device_id"]),
            "stream": valid_ids(frame["stream_id"]), "start_ns": frame["start_ns"],
            "end_ns": frame["end_ns"], "name": renamed_names(frame["name"], demangle),
            "correlation": frame["correlation_id"],
            **{column: frame[column] for column in ("grid_x", "grid_y", "grid_z", "block_x",
                                                    "block_y", "block_z",
                                                    "registers_per_thread")},
            "smem_bytes": smem, "smem_static_bytes": static, "smem_dynamic_bytes": dynamic,
            "smem_config_bytes": executed.where(plausible),
        }).rename(columns={"registers_per_thread": "regs_per_thread"})
        out = out.sort_values(["start_ns", "end_ns"], kind="stable", ignore_index=True)
        return out.assign(kernel_id=np.arange(len(out), dtype=np.int64))

    def _copies(self, memcpy: pd.DataFrame, memset: pd.DataFrame) -> pd.DataFrame | None:
        parts = []
        if len(memcpy):
            kind = mapped_names(memcpy["copy_kind"], COPY_KINDS, "other")
            parts.append(memcpy.assign(
                kind=kind.where(memcpy["record_kind"] != MEMCPY2, "PtoP"),
                src_mem=mapped_names(memcpy["src_kind"], MEM_KINDS, "unknown"),
                dst_mem=mapped_names(memcpy["dst_kind"], MEM_KINDS, "unknown")))
        if len(memset):
            parts.append(memset.assign(kind="memset", src_mem=None,
                                       dst_mem=mapped_names(memset["memory_kind"], MEM_KINDS,
                                                       "unknown")))
        if not parts:
            return None
        frame = self._timed(pd.concat(parts, ignore_index=True), "copies")
        kind = frame["kind"]
        host = frame["src_mem"].where(kind == "HtoD", frame["dst_mem"].where(kind == "DtoH"))
        out = pd.DataFrame({
            "pid": self.pid, "device": valid_ids(frame["device_id"]),
            "stream": valid_ids(frame["stream_id"]), "start_ns": frame["start_ns"],
            "end_ns": frame["end_ns"], "kind": kind, "bytes": frame["bytes"],
            "src_mem": frame["src_mem"], "dst_mem": frame["dst_mem"],
            "host_mem": host.where(host.isin(["pageable", "pinned"])),
            "correlation": frame["correlation_id"]})
        return out.sort_values("start_ns", kind="stable", ignore_index=True)

    def _api(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        if frame.empty:
            return None
        frame = self._timed(frame, "API calls")
        layer = frame["record_kind"].to_numpy(np.int64)
        cbid = frame["cbid"].fillna(-1).to_numpy(np.int64)
        keys, uniques = pd.factorize(layer * (1 << 33) + cbid + 1)  # hashing, no sort
        labels = [self._api_label(*divmod(int(key) - 1, 1 << 33)) for key in uniques]
        codes, names = pd.factorize(pd.Index(labels))
        out = pd.DataFrame({
            "pid": self.pid, "tid": frame["thread_id"], "start_ns": frame["start_ns"],
            "end_ns": frame["end_ns"],
            "name": pd.Categorical.from_codes(codes[keys], categories=names),
            "kind": np.where(layer == DRIVER, "driver", "runtime"),
            "correlation": frame["correlation_id"]})
        out = out.sort_values("start_ns", kind="stable", ignore_index=True)
        self._remember_calls(out)
        return out

    def _api_label(self, layer: int, cbid: int) -> str:
        name = self.api_name(layer, cbid) if self.api_name is not None and cbid >= 0 else None
        return re.sub(VERSION_SUFFIX, "", str(name)) if name else f"cbid_{cbid}"

    def _remember_calls(self, api: pd.DataFrame) -> None:
        """Synchronize-family calls by correlation: syncs take their kind and thread from
        them, call sites their span (also when the other record comes a batch later)."""
        names = api["name"].cat.categories  # decided once per distinct name
        blocking = [category for category in names if base_api_name(category) in SYNC_CALLS
                    or BLOCKING_CALLS.match(base_api_name(category))]
        wanted = api["name"].isin(blocking) & api["correlation"].notna()
        for corr, name, tid, start, end in api.loc[wanted.to_numpy(bool), [
                "correlation", "name", "tid", "start_ns", "end_ns"]].itertuples(index=False):
            self.calls[int(corr)] = (str(name), tid, int(start), int(end))  # syncs: few

    def _forget_calls(self) -> None:
        for corr in list(self.calls)[: max(0, len(self.calls) - REMEMBERED_CALLS)]:
            del self.calls[corr]

    def _syncs(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        """Kind from the blocking call (cudaDeviceSynchronize is a context sync to CUPTI but
        a `device` sync to us), else from CUPTI's type; thread from the call."""
        if frame.empty:
            return None
        frame = self._timed(frame, "syncs")
        keys = pd.Index(list(self.calls), dtype="int64")
        pos = keys.get_indexer(frame["correlation_id"].fillna(-1).to_numpy(np.int64))
        calls = list(self.calls.values())  # position -1 picks the None appended last
        names = np.array([call[0] for call in calls] + [None], dtype=object)[pos]
        tid = pd.array([call[1] for call in calls] + [None], dtype="Int64")[pos]
        kinds = {name: SYNC_CALLS.get(base_api_name(name)) for name in set(names) if name}
        by_call = pd.Series(names, dtype=object).map(kinds).astype(object)
        sync_id, event = valid_ids(frame["cuda_event_sync_id"]), valid_ids(frame["cuda_event_id"])
        return pd.DataFrame({
            "pid": self.pid, "tid": tid,
            "device": frame["context_id"].astype(object).map(self.context_devices),
            "stream": valid_ids(frame["stream_id"]), "start_ns": frame["start_ns"],
            "end_ns": frame["end_ns"],
            "kind": by_call.where(by_call.notna(), mapped_names(frame["type"], SYNC_TYPES,
                                                           "unknown")),
            "correlation": frame["correlation_id"], "event_id": sync_id.fillna(event)})

    def _memory(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        """cudaMalloc / cudaFree (and host allocations at device -1) as segment events: the
        driver-level allocations a caching allocator carves its blocks from."""
        if frame.empty:
            return None
        operation, timestamps = frame["memory_operation_type"], frame["timestamp"]
        known = operation.isin([ALLOCATION, RELEASE]).fillna(False).to_numpy(bool)
        timed = (timestamps.notna() & (timestamps != 0)).fillna(False).to_numpy(bool)
        self.warnings["CUPTI memory records of an unknown operation dropped"] += int(
            (~known).sum())
        self.warnings["CUPTI memory records without timestamps dropped"] += int(
            (known & ~timed).sum())
        frame = frame[known & timed].reset_index(drop=True)
        alloc = (frame["memory_operation_type"] == ALLOCATION).to_numpy(bool)
        host = mapped_names(frame["memory_kind"], MEM_KINDS, "unknown").isin(["pageable", "pinned"])
        out = pd.DataFrame({
            "pid": self.pid, "device": valid_ids(frame["device_id"]).mask(host, -1),
            "ts_ns": frame["timestamp"].to_numpy(np.int64) + self.offset_ns,
            "action": np.where(alloc, "segment_alloc", "segment_free"),
            "addr": frame["address"], "bytes": frame["bytes"],
            "delta_bytes": frame["bytes"] * np.where(alloc, 1, -1),
            "stream": valid_ids(frame["stream_id"])})
        return out.sort_values("ts_ns", kind="stable", ignore_index=True)

    def _ranges(self, markers: pd.DataFrame, callsites: Sequence[CallSite],
                final: bool) -> pd.DataFrame | None:
        rows = self._nvtx(markers) + self._python(callsites)
        if final:
            self.warnings["NVTX ranges still open at exit dropped"] += len(self._open)
        if not rows:
            return None
        out = pd.DataFrame(rows, columns=["tid", "start_ns", "end_ns", "name", "depth",
                                          "source", "domain"])
        out = out.assign(pid=self.pid, tid=pd.array(out["tid"].tolist(), dtype="Int64"))
        return out.sort_values(["start_ns", "depth"], kind="stable", ignore_index=True)

    def _nvtx(self, markers: pd.DataFrame) -> list[tuple[Any, ...]]:
        """NVTX push/pop and start/end markers paired by id into ranges. The depth is the
        number of ranges open on the thread when one starts (exact for push/pop, and
        right across batches, where a depth computed per batch would not be). Ranges of
        gpudiag's own markers (domain "gpudiag") are left out: the bootstrap records them."""
        out: list[tuple[Any, ...]] = []
        markers = markers.astype(object).where(markers.notna(), None).sort_values(
            "timestamp", kind="stable", key=lambda stamps: stamps.fillna(0).astype("int64"))
        for timestamp, flags, mark, name, domain, kind, thread in markers[[
                "timestamp", "flags", "id", "name", "domain", "object_kind",
                "thread_id"]].itertuples(index=False):  # one per NVTX push or pop
            tid = thread if kind == OBJECT_THREAD else None
            if not timestamp or flags is None:
                self.warnings["NVTX markers without timestamps dropped"] += 1
            elif flags & MARKER_START:
                self._open[mark] = (timestamp + self.offset_ns, name, domain, tid, self._depth[tid])
                self._depth[tid] += 1
            elif flags & MARKER_END:
                begun = self._open.pop(mark, None)
                if begun is None:
                    self.warnings["NVTX range ends without a start dropped"] += 1
                    continue
                start, label, space, tid, depth = begun
                self._depth[tid] -= 1
                if space != MARKERS_DOMAIN:
                    out.append((tid, start, timestamp + self.offset_ns, label, depth, "nvtx",
                                space))
        return out

    def _python(self, callsites: Sequence[CallSite]) -> list[tuple[Any, ...]]:
        """The user frames around each blocking call, spanning the call (its API record's
        span too, which CUPTI timed inside the callback's own enter/exit readings)."""
        out: list[tuple[Any, ...]] = []
        for site in callsites:  # one per blocking call: a few per step
            start, end = site.enter_ns, max(site.exit_ns, site.enter_ns)
            call = self.calls.get(site.correlation)
            if call is not None:
                start, end = min(start, call[2]), max(end, call[3])
            out += [(site.tid, start, end, f"{file}({line}): {func}", depth, "python", None)
                    for file, line, func, depth in site.frames]
        return out

    def _devices(self, frame: pd.DataFrame) -> pd.DataFrame | None:
        """DEVICE records (CUpti_ActivityDevice5: clock in kHz, bandwidth in kB/s)."""
        frame = frame[frame["id"].notna()].drop_duplicates("id")
        if frame.empty:
            return None
        major, minor = frame["compute_capability_major"], frame["compute_capability_minor"]
        optin = [_optin(cc_major, cc_minor)  # one per GPU
                 for cc_major, cc_minor in zip(major, minor, strict=True)]
        out = pd.DataFrame({
            "device": frame["id"].astype("int64"), "name": frame["name"], "vendor": "nvidia",
            "sm_count": frame["num_multiprocessors"], "cc_major": major, "cc_minor": minor,
            "max_threads_per_sm": frame["max_warps_per_multiprocessor"]
            * frame["num_threads_per_warp"],
            "max_blocks_per_sm": frame["max_blocks_per_multiprocessor"],
            "max_threads_per_block": frame["max_threads_per_block"],
            "regs_per_sm": frame["max_registers_per_multiprocessor"],
            "regs_per_block": frame["max_registers_per_block"],
            "smem_per_sm_bytes": frame["max_shared_memory_per_multiprocessor"],
            "smem_per_block_bytes": frame["max_shared_memory_per_block"],
            "smem_per_block_optin_bytes": pd.array(optin, dtype="Int64"),
            "warp_size": frame["num_threads_per_warp"], "mem_bytes": frame["global_memory_size"],
            "l2_bytes": frame["l2cache_size"], "clock_khz": frame["core_clock_rate"],
            "mem_bandwidth_bytes_per_s": frame["global_memory_bandwidth"].astype("float64")
            * 1000.0})
        return fill_from_compute_capability(out.sort_values("device", ignore_index=True))


def _optin(major: Any, minor: Any) -> int | None:
    """Opt-in shared memory per block, which CUPTI's device record does not carry."""
    if pd.isna(major) or pd.isna(minor):
        return None
    limits = arch_limits(int(major), int(minor))
    return None if limits is None else limits.max_smem_per_block_optin_bytes
