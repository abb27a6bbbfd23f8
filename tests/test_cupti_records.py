"""CUPTI records -> Trace tables, and the cupti backend's collector logic with a fake cupti.

Records are SimpleNamespaces with cupti-python 13.x's attribute names (its type stubs and
NVIDIA's samples) and realistic values; the fake `cupti.cupti` module below mirrors the
bindings' calls, so the collector is tested without a GPU.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.collectors.cupti import plugin as cupti_backend
from gpudiag.collectors.cupti import records as cr
from gpudiag.errors import CollectorError, MissingDependencyError
from gpudiag.trace import Trace

T0 = 5_000_000_000  # CUPTI clock at the start of the records
EPOCH = 1_733_000_000_000_000_000  # what T0 is on the time.time_ns() clock
OFFSET = EPOCH - T0
PID, TID = 4242, 4243
INVALID = 0xFFFFFFFF
LAUNCH, STREAM_SYNC, DEVICE_SYNC, EVENT_SYNC, MEMCPY_SYNC = 211, 131, 165, 136, 31
NAMES = {(5, LAUNCH): "cudaLaunchKernel_v7000", (5, STREAM_SYNC): "cudaStreamSynchronize_v3020",
         (5, DEVICE_SYNC): "cudaDeviceSynchronize_v3020",
         (5, EVENT_SYNC): "cudaEventSynchronize_v3020", (5, MEMCPY_SYNC): "cudaMemcpy_v3020",
         (4, 307): "cuLaunchKernel"}


def converter(rank: int | None = 0) -> cr.CuptiConverter:
    return cr.CuptiConverter(offset_ns=OFFSET, pid=PID, rank=rank,
                             api_name=lambda kind, cbid: NAMES.get((kind, cbid)))


def at(us: float) -> int:
    """CUPTI timestamp `us` microseconds after T0."""
    return T0 + int(us * 1000)


def epoch(us: float) -> int:
    return EPOCH + int(us * 1000)


# -- records as cupti-python hands them out -------------------------------------------------


def kernel(start: float, end: float, name: str = "ampere_sgemm_128x64_nn", corr: int = 1,
           **kw: Any) -> NS:
    fields = dict(kind=10, start=at(start), end=at(end), device_id=0, context_id=1, stream_id=7,
                  correlation_id=corr, name=name, grid_x=128, grid_y=1, grid_z=1, block_x=256,
                  block_y=1, block_z=1, registers_per_thread=122, static_shared_memory=16384,
                  dynamic_shared_memory=0, shared_memory_executed=102400, graph_id=0)
    return NS(**{**fields, **kw})


def runtime(start: float, end: float, cbid: int = LAUNCH, corr: int = 1, kind: int = 5,
            tid: int = TID) -> NS:
    return NS(kind=kind, cbid=cbid, start=at(start), end=at(end), process_id=PID,
              thread_id=tid, correlation_id=corr, return_value=0)


def sync(start: float, end: float, type_: int = 3, corr: int = 2, **kw: Any) -> NS:
    fields = dict(kind=38, start=at(start), end=at(end), type=type_, context_id=1,
                  stream_id=7, correlation_id=corr, cuda_event_id=INVALID,
                  cuda_event_sync_id=INVALID, return_value=0)
    return NS(**{**fields, **kw})


def memcpy(start: float, end: float, copy_kind: int = 1, src: int = 1, dst: int = 3,
           nbytes: int = 4 << 20, kind: int = 1, corr: int = 3) -> NS:
    return NS(kind=kind, start=at(start), end=at(end), device_id=0, context_id=1, stream_id=7,
              correlation_id=corr, copy_kind=copy_kind, src_kind=src, dst_kind=dst,
              bytes=nbytes, flags_=0, runtime_correlation_id=0)


def memory2(ts: float, op: int, nbytes: int = 2 << 20, memory_kind: int = 3,
            address: int = 0x7F3A_0000_0000) -> NS:
    return NS(kind=49, timestamp=at(ts), memory_operation_type=op, memory_kind=memory_kind,
              address=address, bytes=nbytes, device_id=0, context_id=1, stream_id=INVALID,
              correlation_id=9, process_id=PID, pc=0, is_async=0, name=None, source=None)


def marker(ts: float, flags: int, mark: int, name: str | None = None,
           domain: str | None = None, tid: int = TID) -> NS:
    return NS(kind=12, timestamp=at(ts), flags_=flags, id=mark, name=name, domain=domain,
              object_kind=2, object_id=NS(pt=NS(process_id=PID, thread_id=tid),
                                          dcs=NS(device_id=0, context_id=0, stream_id=0)))


def h100() -> NS:
    return NS(kind=8, id=0, name="NVIDIA H100 80GB HBM3", num_multiprocessors=132,
              compute_capability_major=9, compute_capability_minor=0,
              max_warps_per_multiprocessor=64, max_blocks_per_multiprocessor=32,
              max_threads_per_block=1024, max_registers_per_multiprocessor=65536,
              max_registers_per_block=65536, max_shared_memory_per_multiprocessor=233472,
              max_shared_memory_per_block=49152, num_threads_per_warp=32,
              global_memory_size=85_045_870_592, l2cache_size=52_428_800,
              core_clock_rate=1_980_000, global_memory_bandwidth=3_352_320_000, flags_=0)


def launch_then_sync() -> list[NS]:
    """cudaLaunchKernel, the sgemm, cudaStreamSynchronize until it ends, the GPU idles until
    the host launches again 700 µs later."""
    return [runtime(1, 5, LAUNCH, corr=1), kernel(10, 300, corr=1),
            runtime(20, 301, STREAM_SYNC, corr=2), sync(20.5, 300.5, corr=2),
            runtime(1000, 1004, LAUNCH, corr=3), kernel(1010, 1300, corr=3)]


# -- conversion -----------------------------------------------------------------------------


def test_kernel_record_becomes_a_kernels_row_with_its_launch_config_on_the_epoch_clock() -> None:
    k = converter().convert_records([kernel(10, 300, corr=1042)]).kernels
    row = k.iloc[0]
    assert (row["start_ns"], row["end_ns"]) == (epoch(10), epoch(300))
    assert row["name"] == "ampere_sgemm_128x64_nn"
    assert (row["grid_x"], row["grid_y"], row["grid_z"]) == (128, 1, 1)
    assert (row["block_x"], row["block_y"], row["block_z"]) == (256, 1, 1)
    assert (row["regs_per_thread"], row["smem_static_bytes"], row["smem_dynamic_bytes"],
            row["smem_bytes"], row["smem_config_bytes"]) == (122, 16384, 0, 16384, 102400)
    assert (row["device"], row["stream"], row["correlation"]) == (0, 7, 1042)
    assert (row["pid"], row["rank"], row["kernel_id"]) == (PID, 0, 0)


def test_mangled_kernel_names_are_demangled_and_plain_ones_kept() -> None:
    names = converter().convert_records([
        kernel(0, 1, name="_Z6vecAddPKfS0_Pfi"), kernel(2, 3, name="ampere_sgemm_128x64_nn"),
        kernel(4, 5, name="_Z6vecAddPKfS0_Pfi")]).kernels["name"]
    assert list(names) == ["vecAdd(float const*, float const*, float*, int)",
                           "ampere_sgemm_128x64_nn",
                           "vecAdd(float const*, float const*, float*, int)"]
    assert cr.demangle("_Znot a symbol") == "_Znot a symbol"


def test_carveout_is_kept_only_where_it_can_hold_the_blocks_shared_memory() -> None:
    trace = converter().convert_records([
        kernel(0, 1, shared_memory_executed=0),
        kernel(2, 3, static_shared_memory=65536, shared_memory_executed=32768),
        kernel(4, 5, dynamic_shared_memory=32768, shared_memory_executed=233472)])
    k = trace.kernels
    assert k["smem_config_bytes"].tolist() == [pd.NA, pd.NA, 233472]
    assert k["smem_bytes"].tolist() == [16384, 65536, 49152]
    assert trace.meta["warnings"][cr.IMPLAUSIBLE_CARVEOUT] == 2


def test_copies_take_direction_and_memory_kinds_with_the_host_side_named() -> None:
    records = [memcpy(0, 100),  # pageable HtoD
               memcpy(200, 250, copy_kind=2, src=3, dst=2),  # DtoH into pinned memory
               memcpy(300, 310, copy_kind=8, src=3, dst=3, nbytes=1 << 30),
               memcpy(400, 420, copy_kind=10, src=3, dst=3, kind=22),  # MEMCPY2: peer
               memcpy(500, 510, copy_kind=3, src=1, dst=4),  # host to array
               NS(kind=2, start=at(600), end=at(605), device_id=0, context_id=1, stream_id=7,
                  correlation_id=4, memory_kind=3, bytes=1 << 20, value=0)]
    c = converter().convert_records(records).copies
    assert c["kind"].tolist() == ["HtoD", "DtoH", "DtoD", "PtoP", "other", "memset"]
    assert c["src_mem"].astype(object).fillna("-").tolist() == [
        "pageable", "device", "device", "device", "pageable", "-"]
    assert c["dst_mem"].tolist() == ["device", "pinned", "device", "device", "array",
                                     "device"]
    assert c["host_mem"].astype(object).fillna("-").tolist() == [
        "pageable", "pinned", "-", "-", "-", "-"]
    assert c["bytes"].tolist() == [4 << 20, 4 << 20, 1 << 30, 4 << 20, 4 << 20, 1 << 20]
    assert (c.loc[0, "start_ns"], c.loc[0, "end_ns"]) == (epoch(0), epoch(100))


def test_api_rows_are_named_from_their_cbid_without_the_version_suffix() -> None:
    api = converter().convert_records([
        runtime(1, 5, LAUNCH, corr=1), runtime(6, 9, 307, corr=1, kind=4),
        runtime(10, 11, 9999, corr=5)]).api
    assert api["name"].tolist() == ["cudaLaunchKernel", "cuLaunchKernel", "cbid_9999"]
    assert api["kind"].tolist() == ["runtime", "driver", "runtime"]
    assert api["tid"].tolist() == [TID] * 3
    assert api["correlation"].tolist() == [1, 1, 5]
    assert (api.loc[0, "start_ns"], api.loc[0, "end_ns"]) == (epoch(1), epoch(5))


def test_stream_sync_takes_its_kind_thread_and_device_from_call_and_context() -> None:
    s = converter().convert_records(launch_then_sync()).syncs
    row = s.iloc[0]
    assert (row["kind"], row["tid"], row["device"], row["stream"]) == ("stream", TID, 0, 7)
    assert (row["start_ns"], row["end_ns"], row["correlation"]) == (epoch(20.5), epoch(300.5),
                                                                    2)
    assert pd.isna(row["event_id"])


def test_device_synchronize_is_a_device_sync_though_cupti_types_it_a_context_sync() -> None:
    s = converter().convert_records([
        kernel(0, 1), runtime(10, 50, DEVICE_SYNC, corr=7), sync(11, 49, type_=4, corr=7),
        sync(60, 70, type_=4, corr=8),  # no call record: CUPTI's type stands
        runtime(80, 90, EVENT_SYNC, corr=9),
        sync(81, 89, type_=1, corr=9, stream_id=INVALID, cuda_event_id=3,
             cuda_event_sync_id=17)]).syncs
    assert s["kind"].tolist() == ["device", "context", "event"]
    assert s["event_id"].tolist() == [pd.NA, pd.NA, 17]
    assert s["stream"].tolist() == [7, 7, pd.NA]


def test_sync_whose_call_arrived_in_an_earlier_batch_still_gets_kind_and_thread() -> None:
    conv = converter()
    conv.convert_records([kernel(0, 1), runtime(10, 50, DEVICE_SYNC, corr=7)])
    s = conv.convert_records([sync(11, 49, type_=4, corr=7)]).syncs
    assert (s.loc[0, "kind"], s.loc[0, "tid"], s.loc[0, "device"]) == ("device", TID, 0)


def test_memory2_alloc_and_free_become_segment_events_and_host_memory_device_minus_one() -> None:
    m = converter().convert_records([
        memory2(2, 2), memory2(1, 1), memory2(3, 1, nbytes=1 << 20, memory_kind=2,
                                              address=0x7F00_0000_1000)]).memory
    assert m["action"].tolist() == ["segment_alloc", "segment_free", "segment_alloc"]
    assert m["ts_ns"].tolist() == [epoch(1), epoch(2), epoch(3)]
    assert m["addr"].tolist() == [0x7F3A_0000_0000, 0x7F3A_0000_0000, 0x7F00_0000_1000]
    assert m["bytes"].tolist() == [2 << 20, 2 << 20, 1 << 20]
    assert m["delta_bytes"].tolist() == [2 << 20, -(2 << 20), 1 << 20]
    assert m["device"].tolist() == [0, 0, -1]
    assert m["stream"].isna().all() and (m["pid"] == PID).all()


def test_nvtx_push_pop_markers_pair_into_nested_ranges_with_their_domain() -> None:
    r = converter().convert_records([
        marker(0, 2, 1, "forward", "train"), marker(5, 2, 2, "attention", "train"),
        marker(50, 4, 2), marker(100, 4, 1), marker(60, 1, 3, "checkpoint")]).ranges
    assert r["name"].tolist() == ["forward", "attention"]
    assert r["depth"].tolist() == [0, 1]
    assert r["domain"].tolist() == ["train", "train"]
    assert r["source"].tolist() == ["nvtx", "nvtx"]
    assert (r["start_ns"].tolist(), r["end_ns"].tolist()) == ([epoch(0), epoch(5)],
                                                             [epoch(100), epoch(50)])
    assert r["tid"].tolist() == [TID, TID]


def test_an_nvtx_range_split_over_two_flushes_keeps_its_depth() -> None:
    conv = converter()
    first = conv.convert_records([marker(0, 2, 1, "step"), marker(5, 2, 2, "fwd"),
                                  marker(9, 4, 2)]).ranges
    second = conv.convert_records([marker(10, 2, 3, "bwd"), marker(20, 4, 3),
                                   marker(30, 4, 1)]).ranges
    assert list(zip(first["name"], first["depth"], strict=True)) == [("fwd", 1)]
    assert list(zip(second["name"], second["depth"], strict=True)) == [("step", 0), ("bwd", 1)]


def test_gpudiag_marker_ranges_are_left_to_the_bootstrap_but_count_for_depth() -> None:
    r = converter().convert_records([
        marker(0, 2, 1, "step", "gpudiag"), marker(1, 2, 2, "loss", "user"),
        marker(2, 4, 2), marker(3, 4, 1)]).ranges
    assert list(zip(r["name"], r["depth"], strict=True)) == [("loss", 1)]


def test_unpaired_nvtx_markers_are_counted_not_guessed() -> None:
    conv = converter()
    trace = conv.convert_records([marker(0, 4, 8), marker(1, 2, 9, "never closed")],
                                 final=True)
    assert trace.ranges.empty
    assert trace.meta["warnings"] == {"NVTX range ends without a start dropped": 1,
                                      "NVTX ranges still open at exit dropped": 1}


def test_device_record_fills_the_devices_table_in_gpudiag_units() -> None:
    d = converter().convert_records([h100(), h100()]).devices
    assert len(d) == 1
    row = d.iloc[0]
    assert (row["device"], row["name"], row["vendor"]) == (0, "NVIDIA H100 80GB HBM3", "nvidia")
    assert (row["sm_count"], row["cc_major"], row["cc_minor"]) == (132, 9, 0)
    assert (row["max_threads_per_sm"], row["max_blocks_per_sm"],
            row["max_threads_per_block"]) == (2048, 32, 1024)
    assert (row["regs_per_sm"], row["regs_per_block"]) == (65536, 65536)
    assert (row["smem_per_sm_bytes"], row["smem_per_block_bytes"],
            row["smem_per_block_optin_bytes"]) == (233472, 49152, 227 * 1024)
    assert (row["warp_size"], row["mem_bytes"], row["l2_bytes"]) == (32, 85_045_870_592,
                                                                      52_428_800)
    assert row["clock_khz"] == 1_980_000
    assert row["mem_bandwidth_bytes_per_s"] == 3_352_320_000_000.0
    assert d.loc[0, "rank"] == 0


def test_untimed_records_are_dropped_and_backwards_ones_clipped_both_counted() -> None:
    trace = converter().convert_records([
        kernel(0, 1), NS(**{**vars(kernel(0, 0)), "start": 0, "end": 0}),
        NS(**{**vars(kernel(0, 0)), "start": at(10), "end": at(9)})])
    assert trace.kernels["end_ns"].tolist() == [epoch(1), epoch(10)]
    assert trace.kernels["start_ns"].tolist() == [epoch(0), epoch(10)]
    assert trace.meta["warnings"] == {
        "CUPTI kernels without timestamps dropped": 1,
        "CUPTI kernels ending before they start clipped to 0 ns": 1}


def test_clock_offset_is_taken_from_the_tightest_wall_clock_bracket() -> None:
    walls = iter([100, 180, 1_000, 1_010, 2_000, 2_300])  # brackets of 80, 10, 300 ns
    cuptis = iter([40, 955, 1_900])
    clock = cr.measure_offset(lambda: next(cuptis), lambda: next(walls), samples=3)
    assert clock == cr.ClockOffset(offset_ns=1_005 - 955, uncertainty_ns=10)


def test_every_table_is_schema_valid_and_rows_carry_pid_and_rank() -> None:
    records = [*launch_then_sync(), memcpy(400, 500), memory2(1, 1), h100(),
               marker(0, 2, 1, "step"), marker(2000, 4, 1), NS(kind=9, context_id=1,
                                                                device_id=0)]
    trace = converter(rank=3).convert_records(records)
    trace.validate()
    for name in ("kernels", "copies", "api", "syncs", "memory", "ranges", "devices"):
        table = trace.tables()[name]
        assert len(table) and (table["rank"] == 3).all(), name
        if "pid" in table:
            assert (table["pid"] == PID).all(), name
    assert trace.meta["rank"] == 3 and trace.meta["sources"] == [{"format": "cupti",
                                                                  "pid": PID}]


def test_no_records_give_empty_valid_tables() -> None:
    trace = converter().convert_records([])
    trace.validate()
    assert set(trace.row_counts().values()) == {0}
    assert trace.meta["warnings"] == {}


def test_dict_records_and_older_record_versions_read_like_objects() -> None:
    rows = converter().convert_records([
        {"kind": "CONCURRENT_KERNEL", **{k: v for k, v in vars(kernel(0, 1)).items()
                                         if k not in ("kind", "shared_memory_executed")}},
        {"kind": 12, "timestamp": at(0), "flags": 2, "id": 1, "name": "r", "domain": None,
         "object_kind": 2, "thread_id": 77},
        {"kind": 12, "timestamp": at(1), "flags": 4, "id": 1, "object_kind": 2,
         "thread_id": 77},
        NS(kind=38, start=at(3), end=at(4), type=3, context_id=1, stream_id=7,
           correlation_id=5, cuda_event_id=INVALID)])  # SYNCHRONIZATION v1: no sync id
    assert rows.kernels.loc[0, "grid_x"] == 128
    assert pd.isna(rows.kernels.loc[0, "smem_config_bytes"])
    assert (rows.ranges.loc[0, "name"], rows.ranges.loc[0, "tid"]) == ("r", 77)
    assert rows.syncs.loc[0, "kind"] == "stream"


def test_records_of_kinds_gpudiag_does_not_read_are_counted() -> None:
    trace = converter().convert_records([NS(kind=17, start=1, end=2), NS(kind=39), kernel(0, 1)])
    assert len(trace.kernels) == 1
    assert trace.meta["warnings"] == {"CUPTI records of kinds gpudiag does not read": 2}


def test_launch_kernel_sync_sequence_diagnoses_a_sync_stall_at_the_users_line() -> None:
    site = cr.CallSite(TID, 2, epoch(19), epoch(302),
                       (("/home/me/train.py", 12, "train_step", 4),
                        ("/home/me/train.py", 30, "main", 1)))
    trace = converter().convert_records(launch_then_sync(), [site])
    found = gpudiag.diagnose(trace).findings
    stall = found[found["cause"] == "sync_stall"]
    assert len(stall) == 1
    assert stall.iloc[0]["where"] == "/home/me/train.py:12 (train_step)"
    assert stall.iloc[0]["lost_ns"] == epoch(1010) - epoch(300)  # kernel end -> next kernel
    python = trace.ranges[trace.ranges["source"] == "python"]
    assert python["name"].tolist() == ["/home/me/train.py(30): main",
                                       "/home/me/train.py(12): train_step"]
    assert python["depth"].tolist() == [1, 4]


def test_python_call_site_range_is_widened_to_enclose_the_api_call() -> None:
    site = cr.CallSite(TID, 2, epoch(21), epoch(300), (("a.py", 3, "f", 0),))
    r = converter().convert_records([runtime(20, 301, STREAM_SYNC, corr=2)], [site]).ranges
    assert (r.loc[0, "start_ns"], r.loc[0, "end_ns"]) == (epoch(20), epoch(301))


# -- the collector, with a fake cupti-python ----------------------------------------------


class FakeCupti(types.ModuleType):
    """What the backend calls in `cupti.cupti`, recording the calls; enum values are
    cupti_activity.h's (cbid values are arbitrary here)."""

    ActivityKind = enum.IntEnum("ActivityKind", {
        "MEMCPY": 1, "MEMSET": 2, "KERNEL": 3, "DRIVER": 4, "RUNTIME": 5, "DEVICE": 8,
        "CONTEXT": 9, "CONCURRENT_KERNEL": 10, "MARKER": 12, "MEMCPY2": 22,
        "SYNCHRONIZATION": 38, "MEMORY2": 49})
    ActivityThreadIdType = enum.IntEnum("ActivityThreadIdType", {"DEFAULT": 0, "SYSTEM": 1})
    CallbackDomain = enum.IntEnum("CallbackDomain", {"DRIVER_API": 1, "RUNTIME_API": 2})
    ApiCallbackSite = enum.IntEnum("ApiCallbackSite", {"API_ENTER": 0, "API_EXIT": 1})
    RuntimeApiTraceCbid = enum.IntEnum("RuntimeApiTraceCbid", {
        "cudaMemcpy_v3020": MEMCPY_SYNC, "cudaMemcpyAsync_v3020": 41,
        "cudaStreamSynchronize_v3020": STREAM_SYNC, "cudaEventSynchronize_v3020": EVENT_SYNC,
        "cudaDeviceSynchronize_v3020": DEVICE_SYNC, "cudaLaunchKernel_v7000": LAUNCH,
        "cudaStreamSynchronize_ptsz_v7000": 236, "cudaStreamWaitEvent_v3020": 147})

    def __init__(self) -> None:
        super().__init__("cupti.cupti")
        self.enabled: set[int] = set()
        self.calls: list[tuple[Any, ...]] = []
        self.queued: list[Any] = []
        self.callbacks: tuple[Any, Any] | None = None
        self.api_callback: Any = None
        self.hooked: list[tuple[int, int]] = []
        self.shift = 10**12  # CUPTI clock = wall clock - shift

    def get_timestamp(self) -> int:
        return time.time_ns() - self.shift

    def set_thread_id_type(self, kind: int) -> None:
        self.calls.append(("thread_id_type", kind))

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.callbacks = (requested, completed)

    def activity_enable(self, kind: int) -> None:
        self.calls.append(("enable", int(kind)))
        self.enabled.add(int(kind))

    def activity_disable(self, kind: int) -> None:
        self.calls.append(("disable", int(kind)))
        self.enabled.discard(int(kind))

    def activity_flush_all(self, flag: int) -> None:
        self.calls.append(("flush", flag))
        records, self.queued = self.queued, []
        if records and self.callbacks:
            self.callbacks[1](records)

    def subscribe(self, callback: Any, userdata: Any) -> int:
        self.api_callback = callback
        return 1

    def enable_callback(self, enable: int, subscriber: int, domain: int, cbid: int) -> None:
        self.hooked.append((int(domain), int(cbid)))

    def unsubscribe(self, subscriber: int) -> None:
        self.calls.append(("unsubscribe", subscriber))

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return self.RuntimeApiTraceCbid(cbid).name


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCupti:
    api = FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = api  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setitem(sys.modules, "cupti.cupti", api)
    monkeypatch.setattr(cupti_backend, "check_driver", lambda: None)
    monkeypatch.setattr(cupti_backend, "loaded_library", lambda stem: "/opt/libcupti.so.13")
    monkeypatch.delenv(cupti_backend.NVTX_INJECTION, raising=False)
    monkeypatch.delenv(cupti_backend.ENV_DRIVER_API, raising=False)
    monkeypatch.setenv("RANK", "1")
    return api


def started(tmp_path: Path, settings: dict[str, Any] | None = None) -> Any:
    collector = cupti_backend.create(tmp_path, settings or {"memory": True})
    collector.start()
    return collector


def test_create_without_cupti_python_raises_missing_dependency(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti -> ImportError
    with pytest.raises(MissingDependencyError, match=r"gpudiag\[cupti\]"):
        cupti_backend.create(tmp_path, {})


def test_driver_check_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match=r"libcuda-absent\.so\.1 cannot be loaded"):
        cupti_backend.check_driver("libcuda-absent.so.1")
    with pytest.raises(CollectorError, match="no GPU is visible"):
        cupti_backend.check_driver("libc.so.6", (str(tmp_path / "nvidia[0-9]*"),))
    (tmp_path / "nvidia0").touch()
    cupti_backend.check_driver("libc.so.6", (str(tmp_path / "nvidia[0-9]*"),))


def test_start_enables_the_kinds_and_hooks_only_the_blocking_calls(fake: FakeCupti,
                                                                    tmp_path: Path) -> None:
    started(tmp_path)
    assert fake.enabled == {1, 2, 5, 8, 9, 10, 12, 22, 38, 49}
    assert ("thread_id_type", 1) in fake.calls
    assert sorted(fake.hooked) == [(2, MEMCPY_SYNC), (2, STREAM_SYNC), (2, EVENT_SYNC),
                                   (2, DEVICE_SYNC), (2, 236)]
    assert os.environ[cupti_backend.NVTX_INJECTION] == "/opt/libcupti.so.13"


def test_memory_off_leaves_memory2_out_and_the_driver_api_is_opt_in(
        fake: FakeCupti, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cupti_backend.ENV_DRIVER_API, "1")
    started(tmp_path, {"memory": False})
    assert 49 not in fake.enabled and 4 in fake.enabled


def test_flush_writes_one_chunk_of_what_is_new_that_load_dir_reads_back(
        fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path)
    fake.queued = [kernel(10, 300, corr=1), runtime(1, 5, LAUNCH, corr=1)]
    collector.flush(final=False)
    collector.flush(final=False)  # nothing new: no chunk
    fake.queued = [memcpy(400, 500)]
    collector.flush(final=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk-000001", "chunk-000002"]
    first = Trace.load_dir(tmp_path / "chunk-000001")
    first.validate()
    start = int(first.kernels.loc[0, "start_ns"])
    assert abs(start - (at(10) + fake.shift)) < 5_000_000  # the measured offset, within 5 ms
    assert first.api.loc[0, "name"] == "cudaLaunchKernel"
    assert (first.meta["rank"], int(first.kernels.loc[0, "rank"])) == (1, 1)
    assert first.meta["cupti"]["python_callsites"] is True
    second = Trace.load_dir(tmp_path / "chunk-000002")
    assert (len(second.kernels), second.copies.loc[0, "kind"]) == (0, "HtoD")
    assert [c for c in fake.calls if c[0] == "flush"] == [("flush", 0)] * 2 + [("flush", 1)]
    assert fake.enabled == set() and ("unsubscribe", 1) in fake.calls
    collector.flush(final=True)  # after the final flush: nothing more
    assert len(list(tmp_path.iterdir())) == 2


def test_records_are_copied_in_the_buffer_callback(fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path)
    record = kernel(10, 300)
    assert fake.callbacks is not None
    fake.callbacks[1]([record])
    record.start, record.name = 0, "reused buffer"  # CUPTI reuses the buffer afterwards
    collector.flush(final=False)
    k = Trace.load_dir(tmp_path / "chunk-000001").kernels
    assert k.loc[0, "name"] == "ampere_sgemm_128x64_nn" and k.loc[0, "start_ns"] > 0


def test_pause_and_resume_toggle_every_kind_once(fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path)
    kinds = set(fake.enabled)
    fake.calls.clear()
    collector.pause()
    collector.pause()
    assert fake.enabled == set()
    assert sorted(c[1] for c in fake.calls) == sorted(kinds)
    collector.resume()
    collector.resume()
    assert fake.enabled == kinds and len(fake.calls) == 2 * len(kinds)


def blocking_call(fake: FakeCupti, correlation: int) -> None:
    """Stands for user code in which cudaStreamSynchronize runs and CUPTI calls back."""
    enter = NS(callback_site=0, correlation_id=correlation,
               function_name="cudaStreamSynchronize")
    fake.api_callback(None, 2, STREAM_SYNC, enter)
    fake.api_callback(None, 2, STREAM_SYNC, NS(**{**vars(enter), "callback_site": 1}))


def test_blocking_call_callback_records_the_users_frame_as_a_python_range(
        fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path)
    blocking_call(fake, 2)
    tid = threading.get_native_id()  # CUPTI's SYSTEM thread id
    fake.queued = [runtime(1, 5, LAUNCH, corr=1, tid=tid), kernel(10, 300, corr=1),
                   runtime(20, 301, STREAM_SYNC, corr=2, tid=tid), sync(20.5, 300.5, corr=2)]
    collector.flush(final=True)
    trace = Trace.load_dir(tmp_path / "chunk-000001")
    python = trace.ranges[trace.ranges["source"] == "python"]
    line = blocking_call.__code__.co_firstlineno + 4
    assert python["name"].tolist()[-1] == f"{__file__}({line}): blocking_call"
    assert (python["tid"] == tid).all()
    sync_call = trace.api[trace.api["name"] == "cudaStreamSynchronize"].iloc[0]
    assert (python["start_ns"] <= sync_call["start_ns"]).all()
    assert (python["end_ns"] >= sync_call["end_ns"]).all()


def test_paused_collector_does_not_capture_call_sites(fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path)
    collector.pause()
    blocking_call(fake, 2)
    collector.flush(final=True)
    assert not list(tmp_path.iterdir())


def test_user_frames_skip_library_frames_and_count_depth_from_the_outermost() -> None:
    frames = cupti_backend.user_frames(sys._getframe())
    file, _, func, depth = frames[0]
    assert (file, func) == (__file__, "test_user_frames_skip_library_frames_and_count_depth"
                            "_from_the_outermost")
    outer = sys._getframe()
    total = 0
    while outer is not None:
        total, outer = total + 1, outer.f_back
    assert depth == total - 1
    assert all("site-packages" not in f[0] for f in frames)


def test_after_fork_the_child_is_not_traced(fake: FakeCupti, tmp_path: Path) -> None:
    collector = started(tmp_path / "parent")
    fake.callbacks[1]([kernel(0, 1)])  # type: ignore[index]
    collector.after_fork(tmp_path / "child")
    collector.flush(final=True)
    assert collector.disabled and not (tmp_path / "child").exists()


def test_cupti_refusing_the_buffers_is_a_collector_error(fake: FakeCupti, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    monkeypatch.setattr(fake, "activity_register_callbacks", refuse)
    with pytest.raises(CollectorError, match="another CUPTI client"):
        started(tmp_path)


def test_loaded_library_finds_a_mapped_shared_object() -> None:
    path = cupti_backend.loaded_library("libc.so")
    assert path is not None and Path(path).exists()
    assert cupti_backend.loaded_library("libnot-loaded-here.so") is None
