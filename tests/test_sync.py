"""Sync points: kinds, call sites, host wait, GPU idle, per-step recurrence; real fixtures."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers import sync
from gpudiag.analyzers.losses.waits import blocking_waits
from tests.builders import api_call, kernel, trace
from tests.conftest import fixture

U = 1_000


def _ranges(rows: list[tuple[str, str, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"pid": 100, "tid": 100, "name": n, "source": s, "start_ns": a * U,
                          "end_ns": b * U, "depth": d} for n, s, a, b, d in rows])


def _item_loop(steps: int = 3) -> gpudiag.Trace:
    """Each step: a kernel, then `.item()` (memcpy + stream sync) from train.py:12."""
    kernels, api, ranges = [], [], []
    for i in range(steps):
        t0 = i * 1000
        api.append(api_call((t0 + 1) * U, (t0 + 4) * U, correlation=2 * i + 1))
        kernels.append(kernel((t0 + 10) * U, (t0 + 300) * U, correlation=2 * i + 1))
        api.append(api_call((t0 + 20) * U, (t0 + 301) * U, "cudaStreamSynchronize",
                            correlation=2 * i + 2))
        ranges += [(f"ProfilerStep#{i}", "step", t0, t0 + 999, 0),
                   ("train.py(12): train_step", "python", t0, t0 + 990, 1),
                   ("torch/_tensor.py(40): item", "python", t0 + 15, t0 + 305, 2),
                   ("aten::item", "torch_op", t0 + 16, t0 + 304, 3),
                   ("aten::_local_scalar_dense", "torch_op", t0 + 17, t0 + 303, 4)]
    return trace(kernels=kernels, api=api, ranges=_ranges(ranges))


def test_item_is_recognized_with_its_user_call_site_and_recurrence() -> None:
    points = sync.sync_points(_item_loop())
    assert len(points) == 1
    p = points.iloc[0]
    assert (p["kind"], p["where"], p["count"]) == ("item", "train.py:12 (train_step)", 3)
    assert p["host_wait_ns"] == 3 * 281 * U
    # after each sync the GPU idles from 300 until the next step's kernel at 1010
    assert p["gpu_idle_ns"] == 2 * 710 * U
    assert (p["steps_with"], p["per_step"]) == (3, 1.0)


def test_findings_carry_the_item_advice() -> None:
    found = sync.findings(_item_loop())
    assert found.loc[0, "cause"] == "sync_stall"
    assert "`.item()`" in found.loc[0, "advice"]
    assert found.loc[0, "lost_ns"] == 2 * 710 * U


def test_host_only_trace_counts_syncs_without_gpu_activity() -> None:
    t = trace(api=[api_call(0, 50 * U, "cudaDeviceSynchronize", correlation=1),
                   api_call(60 * U, 70 * U, "cudaDeviceSynchronize", correlation=2)])
    points = sync.sync_points(t)
    assert points[["kind", "count", "host_wait_ns", "gpu_idle_ns"]].values.tolist() == [
        ["device", 2, 60 * U, 0]]
    found = sync.findings(t)
    assert found.loc[0, "lost_ns"] == 60 * U and "no GPU activity" in found.loc[0, "evidence"]


def test_empty_trace() -> None:
    assert sync.sync_points(trace()).empty
    assert sync.findings(trace()).empty


@pytest.mark.parametrize(("name", "expected"), [
    ("kineto/a100_alexnet_sync_critical_path.json.gz",
     {"cudaStreamSynchronize": 16, "cudaDeviceSynchronize": 5}),
    ("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz",
     {"cudaStreamSynchronize": 75, "cudaDeviceSynchronize": 1}),
    ("kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz",
     {"cudaEventSynchronize": 24, "cudaDeviceSynchronize": 1}),
])
def test_kineto_sync_calls_counted_once(name: str, expected: dict[str, int]) -> None:
    path = fixture(name)
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    runtime = pd.Series([e["name"] for e in events if e.get("cat") == "cuda_runtime"])
    assert runtime.value_counts()[list(expected)].to_dict() == expected  # the MANIFEST counts
    t = gpudiag.load(path)
    waits = blocking_waits(t)
    by_api = waits["api"].value_counts().to_dict()
    assert {k: by_api.get(k, 0) for k in expected} == expected
    # every cuda_sync record is one of those calls: nothing counted twice
    assert len(waits) == sum(expected.values()) + int(waits["api"].isna().sum())
    assert sync.sync_points(t)["count"].sum() == len(waits)


@pytest.mark.parametrize("name", ["nsys/rtx4090_4streams_eventsync.sqlite",
                                  "nsys/rtx3090x4_tensorrt_nvtx.sqlite"])
def test_nsys_waits_equal_sql(name: str) -> None:
    path = fixture(name)
    with sqlite3.connect(path) as db:
        # both fixtures' SYNCHRONIZATION rows are blocking syncs (MANIFEST: stream, event and
        # context syncs; the reader explains why syncType itself cannot be trusted)
        n_sync_rows = db.execute("select count(*) from CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
                                 ).fetchone()[0]
        calls = db.execute(
            "select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME r join StringIds s "
            "on r.nameId = s.id where (s.value like 'cudaDeviceSynchronize%' or s.value like "
            "'cudaStreamSynchronize%' or s.value like 'cudaEventSynchronize%' or s.value like "
            "'cuCtxSynchronize%') and r.correlationId not in (select correlationId from "
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)").fetchone()[0]
    t = gpudiag.load(path)
    assert len(blocking_waits(t)) == n_sync_rows + calls
    points = sync.sync_points(t)
    assert points["count"].sum() == n_sync_rows + calls
    assert (points["host_wait_ns"] > 0).all()


def test_waits_without_correlation_and_repeated_keys_do_not_crash() -> None:
    t = trace(api=[api_call(0, 50 * U, "cudaDeviceSynchronize"),
                   api_call(60 * U, 70 * U, "cudaDeviceSynchronize")])
    assert len(blocking_waits(t)) == 2
    path = fixture("kineto/a100_alexnet_sync_critical_path.json.gz")
    one, other = gpudiag.load(path), gpudiag.load(path)
    for name in ("api", "syncs", "kernels", "copies", "ranges"):  # rank 1 reuses the pid
        setattr(other, name, getattr(other, name).assign(rank=1))
    twice = gpudiag.merge([one, other])
    assert sync.sync_points(twice)["count"].sum() == 2 * 21
    assert len(gpudiag.diagnose(twice).losses) == 2 * 7


def test_steps_marked_on_another_thread_of_the_process() -> None:
    t = _item_loop()
    ranges = t.ranges.copy()
    steps = ranges["source"] == "step"
    ranges.loc[steps, "tid"] = 999                     # the step markers' own thread
    t.ranges = ranges
    p = sync.sync_points(t).iloc[0]
    assert (p["steps_with"], p["per_step"]) == (3, 1.0)
    assert p["where"] == "train.py:12 (train_step)"    # step names are never call sites
