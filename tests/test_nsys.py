"""The Nsight Systems reader: real exports against independent SQL, tiny synthetic exports of
three schema generations with exact answers, damaged input, and the `nsys export` path."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import CollectorError, InputError
from gpudiag.readers.nsys import export as nsys_export
from gpudiag.readers.nsys import reader as nsys
from gpudiag.readers.nsys.reader import (
    SYNC_TYPE_VS_CALL,
    SYNC_TYPE_VS_IDS,
    read_report,
    read_sqlite,
)
from gpudiag.trace import Trace
from tests.conftest import fixture

RTX3090 = "nsys/rtx3090x4_tensorrt_nvtx.sqlite"
RTX4090 = "nsys/rtx4090_4streams_eventsync.sqlite"
REPORT = "nsys/rtx3090x4_tensorrt_nvtx.nsys-rep"

PID, TID = 1234, 1240
GPID = (1 << 48) | (PID << 24)  # serialized global id: pid in bits 24-47
GTID = GPID | TID
INVALID = 0xFFFFFFFF  # CUPTI_SYNCHRONIZATION_INVALID_VALUE

Tables = dict[str, tuple[str, list[tuple[Any, ...]]]]


def make_export(path: Path, tables: Tables) -> Path:
    """An SQLite file holding `tables`: name -> (comma-separated columns, rows)."""
    con = sqlite3.connect(path)
    for name, (columns, rows) in tables.items():
        con.execute(f"CREATE TABLE {name} ({columns})")
        marks = ", ".join("?" * len(columns.split(",")))
        con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    con.commit()
    con.close()
    return path


def sql(path: Path, query: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def has_table(path: Path, table: str) -> bool:
    return bool(sql(path, f"SELECT 1 FROM sqlite_master WHERE name = '{table}'"))


def count_and_total(path: Path, table: str, where: str = "1") -> tuple[int, int]:
    if not has_table(path, table):
        return 0, 0
    n, total = sql(path, f'SELECT count(*), sum("end" - start) FROM {table} WHERE {where}')[0]
    return n, total or 0


def rows_and_total(frame: pd.DataFrame) -> tuple[int, int]:
    return len(frame), int((frame["end_ns"] - frame["start_ns"]).sum())


def col(frame: pd.DataFrame, name: str) -> list[Any]:
    """A column as a plain list with NA as None, for exact comparisons."""
    return [None if pd.isna(v) else v for v in frame[name].astype(object)]


# -- real exports -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [RTX3090, RTX4090])
def test_real_export_counts_and_totals_equal_sql(name: str) -> None:
    path = fixture(name)
    trace = read_sqlite(path)
    trace.validate()
    assert rows_and_total(trace.kernels) == count_and_total(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert rows_and_total(trace.api) == count_and_total(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    assert rows_and_total(trace.syncs) == count_and_total(
        path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    copies = [count_and_total(path, t) for t in
              ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")]
    assert rows_and_total(trace.copies) == tuple(map(sum, zip(*copies, strict=True)))
    assert rows_and_total(trace.ranges) == count_and_total(
        path, "NVTX_EVENTS", 'eventType IN (59, 60) AND "end" IS NOT NULL')


@pytest.mark.parametrize("name", [RTX3090, RTX4090])
def test_real_export_kernels_per_stream_equal_sql(name: str) -> None:
    path = fixture(name)
    expected = dict(sql(path, "SELECT streamId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                              "GROUP BY streamId"))
    counts = read_sqlite(path).kernels.groupby("stream")["kernel_id"].count()
    assert {int(k): int(v) for k, v in counts.items()} == expected


@pytest.mark.parametrize("name", [RTX3090, RTX4090])
def test_real_export_kernel_ids_follow_start_order(name: str) -> None:
    kernels = read_sqlite(fixture(name)).kernels
    assert kernels["kernel_id"].tolist() == list(range(len(kernels)))
    assert kernels["start_ns"].is_monotonic_increasing


def test_rtx4090_has_16_kernels_on_4_streams() -> None:
    kernels = read_sqlite(fixture(RTX4090)).kernels
    assert len(kernels) == 16
    assert kernels.groupby("stream")["kernel_id"].count().tolist() == [4, 4, 4, 4]
    assert set(kernels["name"].astype(str)) == {f"kernel_{i}()" for i in range(1, 5)}
    assert kernels["pid"].unique().tolist() == [6168]


def test_rtx4090_syncs_are_an_event_sync_and_a_context_sync() -> None:
    trace = read_sqlite(fixture(RTX4090))
    assert col(trace.syncs, "kind") == ["event", "context"]
    assert col(trace.syncs, "event_id") == [2, None]  # cudaEventSynchronize on event 2
    assert col(trace.syncs, "stream") == [None, None]
    assert col(trace.syncs, "tid") == [6168, 6168]
    # nsys 2023.3 stored them as syncType 2 ("stream wait") and 1 ("event")
    assert trace.meta["warnings"] == {SYNC_TYPE_VS_CALL: 2}


def test_rtx4090_device_and_meta() -> None:
    trace = read_sqlite(fixture(RTX4090))
    device = trace.devices.iloc[0]
    assert (device["device"], device["name"], device["sm_count"]) == (0, "NVIDIA GeForce RTX 4090",
                                                                      128)
    assert (device["cc_major"], device["cc_minor"], device["clock_khz"]) == (8, 9, 2_520_000)
    assert device["max_threads_per_sm"] == 48 * 32
    assert trace.meta["tool_versions"]["nsys"] == "2023.3.1.92"  # META_DATA_EXPORT
    assert trace.meta["tool_versions"]["nsys_export_schema"] == "3.4.0"
    assert trace.meta["session_start_epoch_ns"] == 1694763998414956583
    assert trace.meta["process_names"] == {"6168": "./build/streamSimple"}


def test_rtx3090_kernel_names_resolve_through_stringids() -> None:
    path = fixture(RTX3090)
    expected = [name for (name,) in sql(
        path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
              'ON s.id = k.demangledName ORDER BY k.start, k."end"')]
    kernels = read_sqlite(path).kernels
    assert kernels["name"].astype(str).tolist() == expected
    assert kernels["name"].notna().all()


def test_rtx3090_api_names_have_no_version_suffix() -> None:
    path = fixture(RTX3090)
    api = read_sqlite(path).api
    names = set(api["name"].astype(str))
    assert "cudaStreamSynchronize" in names
    assert not any(n.rsplit("_", 1)[-1].startswith("v3") for n in names)
    driver_rows = sql(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 1")
    assert int((api["kind"] == "driver").sum()) == driver_rows[0][0]
    assert set(api.loc[api["kind"] == "driver", "name"].astype(str)) == {
        "cuModuleUnload", "cuLaunchKernelEx", "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}


def test_rtx3090_stream_sync_comes_from_cuda_stream_synchronize() -> None:
    syncs = read_sqlite(fixture(RTX3090)).syncs
    assert col(syncs, "kind") == ["stream", "context"]
    assert col(syncs, "stream") == [82, None]  # 0xFFFFFFFF is "no stream"
    assert col(syncs, "tid") == [24129, None]  # the second has no recorded API call


def test_rtx3090_nvtx_depth_counts_enclosing_ranges() -> None:
    ranges = read_sqlite(fixture(RTX3090)).ranges
    start, end = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    enclosing = [int(((start <= s) & (end >= e)).sum()) - 1 for s, e in zip(start, end,
                                                                           strict=True)]
    assert ranges["depth"].tolist() == enclosing
    outer = ranges[ranges["depth"] == 0]
    assert outer["name"].astype(str).tolist() == ["ExecutionContext::execute"]
    assert set(ranges["domain"].astype(str)) == {"TensorRT"}
    assert set(ranges["source"].astype(str)) == {"nvtx"}


def test_rtx3090_devices_and_export_metadata_table() -> None:
    trace = read_sqlite(fixture(RTX3090))
    assert trace.devices["device"].tolist() == [0, 1, 2, 3]
    assert set(trace.devices["sm_count"]) == {82}
    assert trace.devices["mem_bandwidth_bytes_per_s"].iloc[0] == 936_096_000_000
    assert trace.meta["tool_versions"]["nsys"] == "2023.1.2.43"  # EXPORT_META_DATA
    assert trace.meta["process_names"] == {"24129": "python"}


# -- synthetic exports: exact answers -------------------------------------------------------


def export_2023(path: Path) -> Path:
    """A 2023-style export: TARGET_INFO_GPU, META_DATA_EXPORT, globalPid everywhere."""
    gpu = (0, 1, 7)  # deviceId, contextId, streamId
    return make_export(path, {
        "StringIds": ("id, value", [
            (1, "void gemm<float>(float*)"), (2, "gemm"), (3, "_Z4gemmPf"), (4, "copy_kernel"),
            (10, "cudaLaunchKernel_v7000"), (11, "cuLaunchKernel"),
            (12, "cudaStreamSynchronize_v3020"), (13, "cudaEventSynchronize_v3020"),
            (14, "cudaMemcpyAsync_v3020"), (20, "registered range")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, "
            "demangledName, shortName, mangledName, registersPerThread, gridX, gridY, gridZ, "
            "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory", [
                (5000, 6000, *gpu, 2, GPID, 1, 2, 3, 32, 64, 2, 1, 256, 1, 1, 1024, 2048),
                (1000, 1500, 0, 1, 8, 1, GPID, 99, 4, 3, 16, 1, 1, 1, 128, 1, 1, 0, 0),
                (0, 0, *gpu, 3, GPID, 1, 2, 3, 32, 1, 1, 1, 32, 1, 1, 0, 0)]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start, end, eventClass, globalTid, correlationId, nameId, returnValue", [
                (900, 950, 0, GTID, 1, 10, 0), (4900, 4950, 1, GTID, 2, 11, 0),
                (7000, 9000, 0, GTID, 5, 12, 0), (9100, 9600, 0, GTID, 6, 13, 0),
                (2000, 2100, 0, GTID, 4, 14, 0)]),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, "
            "copyKind, srcKind, dstKind", [
                (2050, 2400, *gpu, 4, GPID, 4096, 1, 0, 2),
                (3000, 3100, *gpu, 41, GPID, 512, 2, 2, 1),
                (3200, 3300, *gpu, 42, GPID, 64, 8, 5, 2),
                (3400, 3350, *gpu, 43, GPID, 8, 3, 0, 3)]),
        "CUPTI_ACTIVITY_KIND_MEMSET": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, value, bytes, "
            "memKind", [(3500, 3600, *gpu, 44, GPID, 0, 256, 4)]),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, syncType, "
            "eventId", [
                (7100, 8900, *gpu, 5, GPID, 3, INVALID), (9200, 9500, 0, 1, INVALID, 6, GPID, 1, 5),
                (9700, 9800, 0, 1, INVALID, 77, GPID, 4, INVALID),
                (9900, 9950, 0, 1, INVALID, 78, GPID, 1, INVALID)]),
        "NVTX_EVENTS": ("start, end, eventType, text, globalTid, textId, domainId", [
            (-5, None, 75, "mydomain", GTID, None, 1), (100, 1000, 59, "A", GTID, None, 1),
            (200, 500, 59, None, GTID, 20, 1), (300, 400, 59, "D", GTID, None, 1),
            (600, 900, 59, "C", GTID, None, 0), (650, None, 34, "mark", GTID, None, 0),
            (1100, None, 59, "unclosed", GTID, None, 0),
            (150, 2000, 60, "startend", GTID + 1, None, 0)]),
        "TARGET_INFO_GPU": (
            "id, cuDevice, name, smCount, computeMajor, computeMinor, maxWarpsPerSm, "
            "threadsPerWarp, maxBlocksPerSm, clockRate, totalMemory, memoryBandwidth, l2CacheSize",
            [(0, 0, "NVIDIA A100-SXM4-80GB", 108, 8, 0, 64, 32, 32, 1_410_000_000, 85_899_345_920,
              2_039_000_000_000, 41_943_040)]),
        "META_DATA_EXPORT": ("name, value", [("EXPORT_PRODUCT_VERSION", "2024.2.1.106"),
                                             ("EXPORT_SCHEMA_VERSION", "3.11.1")]),
        "TARGET_INFO_SESSION_START_TIME": ("utcEpochNs, utcTime, localTime",
                                           [(1_700_000_000_000_000_000, "", "")]),
        "PROCESSES": ("globalPid, pid, name", [(GPID, PID, "train.py"), (99 << 24, 99, "bash")]),
    })


def test_2023_export_kernels_exact(tmp_path: Path) -> None:
    trace = read_sqlite(export_2023(tmp_path / "a.sqlite"))
    trace.validate()
    k = trace.kernels
    assert col(k, "kernel_id") == [0, 1]
    assert col(k, "name") == ["copy_kernel", "void gemm<float>(float*)"]  # 99: shortName
    assert col(k, "start_ns") == [1000, 5000] and col(k, "end_ns") == [1500, 6000]
    assert col(k, "stream") == [8, 7] and col(k, "pid") == [PID, PID]
    launch = k.iloc[1][["grid_x", "grid_y", "block_x", "regs_per_thread"]]
    assert launch.tolist() == [64, 2, 256, 32]
    assert col(k, "smem_bytes") == [0, 3072] and col(k, "smem_dynamic_bytes") == [0, 2048]
    assert trace.meta["warnings"]["kernels without timestamps dropped"] == 1


def test_2023_export_api_names_and_kinds(tmp_path: Path) -> None:
    api = read_sqlite(export_2023(tmp_path / "a.sqlite")).api
    assert col(api, "name") == ["cudaLaunchKernel", "cudaMemcpyAsync", "cuLaunchKernel",
                                "cudaStreamSynchronize", "cudaEventSynchronize"]
    assert col(api, "kind") == ["runtime", "runtime", "driver", "runtime", "runtime"]
    assert set(col(api, "pid")) == {PID} and set(col(api, "tid")) == {TID}


def test_2023_export_copies_kinds_and_host_memory(tmp_path: Path) -> None:
    trace = read_sqlite(export_2023(tmp_path / "a.sqlite"))
    c = trace.copies
    assert col(c, "kind") == ["HtoD", "DtoH", "DtoD", "other", "memset"]
    assert col(c, "src_mem") == ["pageable", "device", "device", "pageable", None]
    assert col(c, "dst_mem") == ["device", "pinned", "device", "array", "managed"]
    assert col(c, "host_mem") == ["pageable", "pinned", None, None, None]
    assert col(c, "bytes") == [4096, 512, 64, 8, 256]
    assert col(c, "end_ns")[3] == 3400  # ended before it started: clipped to 0 ns
    assert trace.meta["warnings"]["copies ending before they start clipped to 0 ns"] == 1


def test_2023_export_syncs_kinds_ids_and_threads(tmp_path: Path) -> None:
    trace = read_sqlite(export_2023(tmp_path / "a.sqlite"))
    s = trace.syncs
    assert col(s, "kind") == ["stream", "event", "context", "context"]
    assert col(s, "stream") == [7, None, None, None]  # 0xFFFFFFFF -> NA
    assert col(s, "event_id") == [None, 5, None, None]
    assert col(s, "tid") == [TID, TID, None, None]  # the last two have no API call
    assert trace.meta["warnings"].get(SYNC_TYPE_VS_IDS) == 1  # syncType 1 without an event
    assert SYNC_TYPE_VS_CALL not in trace.meta["warnings"]


def test_2023_export_nvtx_ranges_depth_domain_and_names(tmp_path: Path) -> None:
    trace = read_sqlite(export_2023(tmp_path / "a.sqlite"))
    r = trace.ranges
    assert col(r, "name") == ["A", "startend", "registered range", "D", "C"]
    assert col(r, "depth") == [0, 0, 1, 2, 1]
    assert col(r, "tid") == [TID, TID + 1, TID, TID, TID]
    assert col(r, "domain") == ["mydomain", None, "mydomain", "mydomain", None]
    assert trace.meta["warnings"]["NVTX ranges without an end skipped"] == 1


def test_2023_export_device_and_meta(tmp_path: Path) -> None:
    trace = read_sqlite(export_2023(tmp_path / "a.sqlite"))
    d = trace.devices.iloc[0]
    assert (d["device"], d["sm_count"], d["cc_major"], d["cc_minor"]) == (0, 108, 8, 0)
    assert (d["max_threads_per_sm"], d["max_blocks_per_sm"], d["warp_size"]) == (2048, 32, 32)
    assert (d["clock_khz"], d["l2_bytes"], d["vendor"]) == (1_410_000, 41_943_040, "nvidia")
    assert d["mem_bandwidth_bytes_per_s"] == 2.039e12
    assert d["regs_per_sm"] == 65536  # not in the export: filled from compute capability 8.0
    assert trace.meta["tool_versions"] == {"nsys": "2024.2.1.106", "nsys_export_schema": "3.11.1"}
    assert trace.meta["session_start_epoch_ns"] == 1_700_000_000_000_000_000
    assert trace.meta["process_names"] == {str(PID): "train.py"}


EXPORT_2023_TABLES = [
    "StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "TARGET_INFO_GPU", "META_DATA_EXPORT",
    "TARGET_INFO_SESSION_START_TIME", "PROCESSES",
]


@pytest.mark.parametrize("keep", ["only", "all but"])
@pytest.mark.parametrize("table", EXPORT_2023_TABLES)
def test_export_with_any_table_missing_or_alone_loads(tmp_path: Path, table: str,
                                                       keep: str) -> None:
    """nsys creates tables lazily: any of them may be absent, and each alone must load."""
    path = export_2023(tmp_path / "full.sqlite")
    con = sqlite3.connect(path)
    for name in EXPORT_2023_TABLES:
        if (name == table) == (keep == "all but"):
            con.execute(f"DROP TABLE {name}")
    con.commit()
    con.close()
    if (table, keep) == ("PROCESSES", "only"):  # a table name other databases use too
        with pytest.raises(InputError, match="not an Nsight Systems export"):
            read_sqlite(path)
        return
    trace = read_sqlite(path)
    trace.validate()
    full = read_sqlite(export_2023(tmp_path / "again.sqlite"))
    for name, rows in trace.row_counts().items():
        assert rows <= full.row_counts()[name]


def export_2021(path: Path, core_clock: int) -> Path:
    """An early-2021-style export: TARGET_INFO_CUDA_GPU with CUPTI-like names, no globalPid
    on GPU tables, NVTX text inline, no export-metadata table."""
    return make_export(path, {
        "StringIds": ("id, value", [(1, "k1"), (2, "k1_short"), (10, "cudaLaunchKernel_v7000"),
                                    (11, "cudaDeviceSynchronize_v3020")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (
            "start, end, deviceId, contextId, streamId, correlationId, demangledName, shortName, "
            "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
            "staticSharedMemory, dynamicSharedMemory",
            [(1000, 2000, 0, 1, 7, 1, 1, 2, 8, 4, 1, 1, 64, 1, 1, 0, 128)]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start, end, eventClass, globalTid, correlationId, nameId, returnValue",
            [(900, 950, 0, GTID, 1, 10, 0), (2100, 3000, 0, GTID, 2, 11, 0)]),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            "start, end, deviceId, contextId, streamId, correlationId, syncType, eventId",
            [(2200, 2900, 0, 1, INVALID, 2, 4, INVALID)]),
        "NVTX_EVENTS": ("start, end, eventType, text, globalTid", [(500, 3000, 59, "step", GTID)]),
        "TARGET_INFO_CUDA_GPU": (
            "id, deviceId, name, numMultiprocessors, computeCapabilityMajor, "
            "computeCapabilityMinor, maxWarpsPerMultiprocessor, numThreadsPerWarp, coreClockRate, "
            "totalMemory, l2CacheSize, maxBlocksPerMultiprocessor, "
            "maxSharedMemoryPerMultiprocessor, maxRegistersPerMultiprocessor, "
            "globalMemoryBandwidth",
            [(0, 0, "Tesla V100-SXM2-16GB", 80, 7, 0, 64, 32, core_clock, 16_945_512_448,
              6_291_456, 32, 98_304, 65_536, 898_048_000)]),
    })


@pytest.mark.parametrize("core_clock", [1_530_000, 1_530_000_000], ids=["kHz", "Hz"])
def test_2021_export_device_columns_map(tmp_path: Path, core_clock: int) -> None:
    trace = read_sqlite(export_2021(tmp_path / "b.sqlite", core_clock))
    trace.validate()
    d = trace.devices.iloc[0]
    assert (d["device"], d["name"], d["vendor"]) == (0, "Tesla V100-SXM2-16GB", "nvidia")
    assert (d["sm_count"], d["cc_major"], d["cc_minor"]) == (80, 7, 0)
    assert (d["max_threads_per_sm"], d["max_blocks_per_sm"], d["clock_khz"]) == (2048, 32,
                                                                                  1_530_000)
    assert (d["mem_bytes"], d["l2_bytes"], d["smem_per_sm_bytes"]) == (16_945_512_448, 6_291_456,
                                                                       98_304)
    assert d["mem_bandwidth_bytes_per_s"] == 898_048_000_000  # CUPTI's kB/s


def test_2021_export_takes_pid_from_the_launching_call(tmp_path: Path) -> None:
    trace = read_sqlite(export_2021(tmp_path / "b.sqlite", 1_530_000))
    assert col(trace.kernels, "pid") == [PID] and col(trace.kernels, "name") == ["k1"]
    assert col(trace.kernels, "smem_bytes") == [128]
    s = trace.syncs
    assert (col(s, "kind"), col(s, "pid"), col(s, "tid")) == (["device"], [PID], [TID])
    assert col(trace.ranges, "name") == ["step"] and col(trace.ranges, "depth") == [0]
    assert trace.meta["tool_versions"] == {}
    assert "session_start_epoch_ns" not in trace.meta


def test_export_without_gpu_tables_loads_syncs_and_api(tmp_path: Path) -> None:
    path = make_export(tmp_path / "c.sqlite", {
        "StringIds": ("id, value", [(1, "cudaDeviceSynchronize_v3020"),
                                    (2, "cudaStreamSynchronize_v3020"),
                                    (3, "cudaStreamWaitEvent_ptsz_v7000")]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start, end, eventClass, globalTid, correlationId, nameId, returnValue",
            [(100, 900, 0, GTID, 1, 1, 0), (1000, 1500, 0, GTID, 2, 2, 0),
             (1600, 1700, 0, GTID, 3, 3, 0)]),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, syncType, "
            "eventId", [(150, 850, 0, 1, INVALID, 1, GPID, 4, INVALID),
                        (1100, 1400, 0, 1, 3, 2, GPID, 3, INVALID),
                        (1610, 1690, 0, 1, 3, 3, GPID, 2, 9)]),
    })
    trace = read_sqlite(path)
    trace.validate()
    assert trace.row_counts()["kernels"] == trace.row_counts()["devices"] == 0
    assert len(trace.copies) == len(trace.ranges) == 0
    assert col(trace.api, "name") == ["cudaDeviceSynchronize", "cudaStreamSynchronize",
                                      "cudaStreamWaitEvent_ptsz"]
    assert col(trace.syncs, "kind") == ["device", "stream", "stream_wait"]
    assert col(trace.syncs, "event_id") == [None, None, 9]
    assert trace.meta["warnings"] == {}
    assert trace.has_gpu_activity()


def test_2026_export_prefers_event_sync_ids_and_reads_driver_table(tmp_path: Path) -> None:
    path = make_export(tmp_path / "e.sqlite", {
        "StringIds": ("id, value", [(1, "cuEventSynchronize"), (2, "cudaLaunchKernel_v7000")]),
        "CUPTI_ACTIVITY_KIND_DRIVER": (
            "start, end, globalTid, correlationId, nameId", [(100, 900, GTID, 1, 1)]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start, end, globalTid, correlationId, nameId", [(10, 20, GTID, 5, 2)]),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            "start, end, deviceId, contextId, greenContextId, streamId, correlationId, "
            "globalPid, deprecatedSyncType, syncType, eventId, eventSyncId",
            [(150, 850, 0, 1, None, INVALID, 1, GPID, 2, 1, 2, 777)]),
    })
    trace = read_sqlite(path)
    assert col(trace.api, "name") == ["cudaLaunchKernel", "cuEventSynchronize"]
    assert col(trace.api, "kind") == ["runtime", "driver"]
    assert col(trace.syncs, "kind") == ["event"] and col(trace.syncs, "event_id") == [777]
    assert trace.meta["warnings"] == {}


def test_export_with_only_api_calls_loads_empty_gpu_tables(tmp_path: Path) -> None:
    path = make_export(tmp_path / "d.sqlite", {"CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start, end, eventClass, globalTid, correlationId, nameId, returnValue",
        [(100, 900, 0, GTID, 1, 1, 0)])})
    trace = read_sqlite(path)
    trace.validate()
    assert len(trace.api) == 1 and trace.api["name"].isna().all()  # no StringIds table
    assert not trace.has_gpu_activity()


# -- bad input ----------------------------------------------------------------------------


def test_sqlite_that_is_not_an_nsys_export_is_an_input_error(tmp_path: Path) -> None:
    path = make_export(tmp_path / "other.sqlite", {"people": ("id, name", [(1, "x")])})
    with pytest.raises(InputError, match="not an Nsight Systems export") as info:
        read_sqlite(path)
    assert str(path) in str(info.value) and "nsys export --type sqlite" in str(info.value)


@pytest.mark.parametrize("keep", [100, 5000, 300_000])
def test_truncated_export_is_an_input_error(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "cut.sqlite"
    path.write_bytes(fixture(RTX4090).read_bytes()[:keep])
    with pytest.raises(InputError, match="damaged or truncated") as info:
        read_sqlite(path)
    assert str(path) in str(info.value)


def test_garbage_after_sqlite_header_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    with pytest.raises(InputError, match="file is not a database") as info:
        read_sqlite(path)
    assert str(path) in str(info.value)


def test_unopenable_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot be opened") as info:
        read_sqlite(tmp_path / "missing.sqlite")
    assert "missing.sqlite" in str(info.value)


def test_locked_export_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = export_2023(tmp_path / "locked.sqlite")
    monkeypatch.setattr(nsys, "LOCK_WAIT_S", 0.05)
    writer = sqlite3.connect(path)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(InputError, match="locked") as info:
            read_sqlite(path)
    finally:
        writer.rollback()
        writer.close()
    assert str(path) in str(info.value)


def write_garbage(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\x07" * 600)


def write_other_database(path: Path) -> None:
    make_export(path, {"people": ("id", [(1,)])})


@pytest.mark.parametrize("write", [write_garbage, write_other_database])
def test_cli_reports_bad_export_in_one_line(tmp_path: Path, write: Any) -> None:
    path = tmp_path / "bad.sqlite"
    write(path)
    result = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(path)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"gpudiag: error: {path}: ")


# -- .nsys-rep through nsys export --------------------------------------------------------

FAKE_NSYS = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"; exit 0
fi
echo "$@" >> "$FAKE_NSYS_LOG"
if [ -n "$FAKE_NSYS_FAIL" ]; then echo "ERROR: $FAKE_NSYS_FAIL" >&2; exit 3; fi
out=""; prev=""
for arg in "$@"; do
  if [ "$prev" = "--output" ]; then out="$arg"; fi
  prev="$arg"
done
{cp} "$FAKE_NSYS_SQLITE" "$out"
"""


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `nsys` on PATH that copies the paired fixture export to --output;
    returns the log file where it records each export command line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nsys"
    script.write_text(FAKE_NSYS.replace("{cp}", shutil.which("cp") or "/bin/cp"))
    script.chmod(0o755)
    log = tmp_path / "nsys.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(fixture(RTX3090)))
    return log


def report_copy(tmp_path: Path, name: str = "run.nsys-rep") -> Path:
    folder = tmp_path / "reports"
    folder.mkdir(exist_ok=True)
    report = folder / name
    shutil.copyfile(fixture(REPORT), report)
    return report


def test_report_is_exported_beside_it_and_read(tmp_path: Path, fake_nsys: Path) -> None:
    report = report_copy(tmp_path)
    trace = read_report(report)
    trace.validate()
    assert trace.row_counts() == read_sqlite(fixture(RTX3090)).row_counts()
    assert (report.parent / "run.sqlite").is_file()
    assert trace.meta["format"] == "nsys-rep"
    assert trace.meta["tool_versions"]["nsys_cli"] == "2024.5.1.113"
    out = Path(fake_nsys.read_text().split("--output ")[1].split()[0])
    assert out.name == "run.sqlite" and out.parent.parent == report.parent  # a private folder
    assert not out.parent.exists()  # removed once the export was moved beside the report


def test_report_reuses_an_up_to_date_export(tmp_path: Path, fake_nsys: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_copy(tmp_path)
    shutil.copyfile(fixture(RTX4090), report.with_suffix(".sqlite"))  # newer than the report
    monkeypatch.setenv("FAKE_NSYS_FAIL", "must not be called")
    assert len(read_report(report).kernels) == 16
    assert not fake_nsys.exists()


def test_report_replaces_a_stale_export(tmp_path: Path, fake_nsys: Path) -> None:
    report = report_copy(tmp_path)
    stale = report.with_suffix(".sqlite")
    shutil.copyfile(fixture(RTX4090), stale)
    os.utime(stale, (report.stat().st_mtime - 60,) * 2)
    assert len(read_report(report).kernels) == 36  # the fresh export of the 3090 report
    assert fake_nsys.read_text().count("export") == 1


def test_report_in_read_only_folder_exports_to_a_temporary_folder(
        tmp_path: Path, fake_nsys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_copy(tmp_path)
    monkeypatch.setattr(nsys_export, "writable", lambda folder: False)
    trace = read_report(report)
    assert len(trace.kernels) == 36 and trace.meta["export"] is None
    assert sorted(p.name for p in report.parent.iterdir()) == ["run.nsys-rep"]
    out = Path(fake_nsys.read_text().split("--output ")[1].split()[0])
    assert out.parent != report.parent and not out.parent.exists()  # temporary, removed


def test_failed_nsys_export_is_a_collector_error_with_its_stderr(
        tmp_path: Path, fake_nsys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NSYS_FAIL", "report is corrupted")
    report = report_copy(tmp_path)
    with pytest.raises(CollectorError, match="report is corrupted") as info:
        read_report(report)
    assert str(report) in str(info.value) and "exit status 3" in str(info.value)


def test_report_without_nsys_says_how_to_export(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_copy(tmp_path)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(InputError, match="Nsight Systems report") as info:
        read_report(report)
    assert f"nsys export --type sqlite -o run.sqlite {report}" in str(info.value)


def test_report_without_nsys_points_at_the_export_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = report_copy(tmp_path)
    shutil.copyfile(fixture(RTX3090), report.with_suffix(".sqlite"))
    monkeypatch.setenv("PATH", "")
    with pytest.raises(InputError, match="read that file instead") as info:
        read_report(report)
    assert str(report.with_suffix(".sqlite")) in str(info.value)


def test_load_detects_a_report_and_exports_it(tmp_path: Path, fake_nsys: Path) -> None:
    trace: Trace = gpudiag.load(report_copy(tmp_path))
    assert len(trace.kernels) == 36
    assert trace.meta["sources"][0]["format"] == "nsys-rep"
