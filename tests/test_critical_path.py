"""The critical path (`analyzers.critical`): exact on synthetic traces whose answer is known
by construction, and equal to Holistic Trace Analysis's on every Kineto fixture HTA's
critical path analysis runs on (HTA run in its own environment, as the breakdown oracle is:
tests/hta_critical_path_runner.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.critical.events import GPU
from gpudiag.analyzers.critical.path import critical_path
from tests.builders import api_call, kernel, trace
from tests.conftest import fixtures_dir, tool_missing
from tests.test_hta_oracle import INSTALL, hta_python

KINETO = fixtures_dir() / "kineto"
TRACES = sorted(KINETO.glob("*.json*"))
RUNNER = Path(__file__).parent / "hta_critical_path_runner.py"
#: HTA's bound_by classes -> ours
BOUND_BY = {"cpu_bound": "host", "gpu_compute_bound": "gpu_compute",
            "gpu_communication_bound": "gpu_communication",
            "gpu_kernel_kernel_overhead": "kernel_gap",
            "gpu_kernel_launch_overhead": "launch_overhead"}


def step_with_sync(base: int, correlation: int) -> tuple[list[dict[str, Any]], ...]:
    """One loop step: launch a 100 ns kernel, then cudaStreamSynchronize until it is done."""
    launch = api_call(base, base + 5, correlation=correlation)
    work = kernel(base + 10, base + 110, correlation=correlation)
    wait = api_call(base + 6, base + 115, "cudaStreamSynchronize",
                    correlation=correlation + 1)
    waited = {"pid": 100, "tid": None, "device": 0, "stream": 7, "start_ns": base + 6,
              "end_ns": base + 115, "kind": "stream", "correlation": correlation + 1}
    return [launch, wait], [work], [waited]


def test_a_sync_in_a_loop_puts_the_kernels_and_their_launches_on_the_path() -> None:
    """Each step's host waits for its kernel: the path runs launch -> kernel -> the wait's
    end -> the next launch, so it holds every kernel and launch delay and no host time
    (the host's 5 ns calls are off it, its waiting weighs nothing)."""
    api, kernels, syncs = [], [], []
    for step in range(3):
        more = step_with_sync(step * 200, 10 * step + 1)
        api += more[0]
        kernels += more[1]
        syncs += more[2]
    path = critical_path(trace(api=api, kernels=kernels, syncs=syncs))
    assert path.length_ns == 3 * (10 + 100)
    assert path.summary().to_dict() == {"gpu_compute": 300, "launch_overhead": 30}
    assert list(path.edges["kind"].astype(str)) == ["launch", "span", "sync", "dependency"] * 2 \
        + ["launch", "span", "sync"]


def test_a_host_bound_loop_has_only_host_time_on_its_path() -> None:
    """Ops of 200 ns that each launch a 20 ns kernel: the GPU waits for the host, so the
    path is the host thread's, gaps included as nothing."""
    ranges, api, kernels = [], [], []
    for step in range(3):
        base = step * 200
        ranges.append({"pid": 100, "tid": 100, "start_ns": base, "end_ns": base + 200,
                       "name": "aten::mm", "source": "torch_op", "depth": 0})
        api.append(api_call(base + 50, base + 60, correlation=step + 1))
        kernels.append(kernel(base + 70, base + 90, correlation=step + 1))
    built = trace(api=api, kernels=kernels, ranges=pd.DataFrame(ranges))
    path = critical_path(built)
    assert path.length_ns == 600
    assert path.summary().to_dict() == {"host": 600}
    assert set(path.edges.loc[path.edges["ns"] > 0, "name"]) == {"aten::mm",
                                                                  "cudaLaunchKernel"}


def test_a_window_keeps_the_host_events_that_start_in_it() -> None:
    api, kernels, syncs = [], [], []
    for step in range(3):
        more = step_with_sync(step * 200, 10 * step + 1)
        api += more[0]
        kernels += more[1]
        syncs += more[2]
    path = critical_path(trace(api=api, kernels=kernels, syncs=syncs), window=(200, 399))
    assert path.length_ns == 110 and path.window == (200, 399)


@pytest.fixture(scope="module")
def hta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """HTA's critical path of every Kineto fixture: exact float µs (no whole-µs rounding:
    ours is in ns) and without its last-ProfilerStep filter (ours covers every event)."""
    python = hta_python()
    if python is None:
        tool_missing(f"Holistic Trace Analysis not found; to run the oracle: {INSTALL}")
    out = tmp_path_factory.mktemp("hta-critical-path") / "cp.json"
    done = subprocess.run([python, str(RUNNER), str(out), *map(str, TRACES), "--exact",
                           "--no-step-filter"], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text())
    return results["traces"]


#: where HTA's critical path differs from ours, and why
EXPLAINED = {
    "a100_80gb_rank0of16_nccl_streamsync.json.gz":
        "HTA keeps one kernel of each cudaGraphLaunch (its launch call points at one of "
        "them); ours keeps every kernel a graph launch ran",
    "v100_resnet50_legacy2021_schema.pt.trace.json.gz":
        "HTA fails on the 2021 Kineto schema: its 'Runtime' calls are not a category HTA "
        "makes nodes of",
}


@pytest.mark.slow
@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_the_critical_path_equals_hta_s(hta: dict[str, Any], path: Path) -> None:
    theirs = hta[path.name]
    ours = critical_path(gpudiag.load(path))
    if path.name == "v100_resnet50_legacy2021_schema.pt.trace.json.gz":
        assert "Could not find runtime" in theirs["error"], EXPLAINED[path.name]
        assert ours.length_ns > 0
        return
    assert "error" not in theirs, theirs.get("error")
    assert ours.length_ns == theirs["length_ns"]
    summary = {name: int(ns) for name, ns in ours.summary().items()}
    expected = {BOUND_BY[name]: ns for name, ns in theirs["breakdown"].items() if name and ns}
    if path.name in EXPLAINED:
        graph = ours.graph.events
        launched_by_graphs = (graph.in_graph & (graph.kind == GPU)
                              & (graph.name[np.maximum(graph.launch, 0)] == "cudaGraphLaunch"))
        graph_launches = len(np.unique(graph.launch[launched_by_graphs]))
        extra = int(launched_by_graphs.sum()) - graph_launches
        assert extra > 0 and len(ours.graph.src) == theirs["graph"]["edges"] + 2 * extra, \
            EXPLAINED[path.name]
        assert sum(summary.values()) == sum(expected.values())
        return
    assert len(ours.graph.src) == theirs["graph"]["edges"]
    assert len(ours.edges) == len(theirs["edges"])
    assert summary == expected
