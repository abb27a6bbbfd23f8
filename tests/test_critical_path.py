"""The critical path (`analyzers.critical`): exact on synthetic traces whose answer is known
by construction, and equal to Holistic Trace Analysis's on every Kineto fixture HTA's
critical path analysis runs on (HTA run in its own environment, as the breakdown oracle is:
tests/hta_critical_path_runner.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.critical.events import GPU
from gpudiag.analyzers.critical.path import critical_path, rank_paths
from gpudiag.analyzers.critical.replay import PEERS, Replay
from tests.builders import api_call, kernel, trace
from tests.conftest import fixtures_dir, tool_missing
from tests.oracle_runs import INSTALL, OracleRun

KINETO = fixtures_dir() / "kineto"
TRACES = sorted(KINETO.glob("*.json*"))
RUNNER = Path(__file__).parent / "hta_critical_path_runner.py"
#: HTA's critical path of every Kineto fixture (tests/oracle_runs.py): exact float µs (no
#: whole-µs rounding: ours is in ns) and without its last-ProfilerStep filter (ours covers
#: every event)
ORACLE_RUN = OracleRun(RUNNER, [*map(str, TRACES), "--exact", "--no-step-filter"],
                       timeout_s=1200)
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


def synced_steps() -> gpudiag.Trace:
    """Three steps of `step_with_sync`, 200 ns apart."""
    api, kernels, syncs = [], [], []
    for step in range(3):
        more = step_with_sync(step * 200, 10 * step + 1)
        api += more[0]
        kernels += more[1]
        syncs += more[2]
    return trace(api=api, kernels=kernels, syncs=syncs)


def test_a_sync_in_a_loop_puts_the_kernels_and_their_launches_on_the_path() -> None:
    """Each step's host waits for its kernel: the path runs launch -> kernel -> the wait's
    end -> the next launch, so it holds every kernel and launch delay and no host time
    (the host's 5 ns calls are off it, its waiting weighs nothing)."""
    path = critical_path(synced_steps())
    assert path.length_ns == 3 * (10 + 100)
    assert path.summary().to_dict() == {"gpu_compute": 300, "launch_overhead": 30}
    assert list(path.edges["kind"].astype(str)) == ["launch", "span", "sync", "dependency"] * 2 \
        + ["launch", "span", "sync"]


def host_bound_loop() -> gpudiag.Trace:
    """Three torch ops of 200 ns, back to back, each launching a 20 ns kernel."""
    ranges, api, kernels = [], [], []
    for step in range(3):
        base = step * 200
        ranges.append({"pid": 100, "tid": 100, "start_ns": base, "end_ns": base + 200,
                       "name": "aten::mm", "source": "torch_op", "depth": 0})
        api.append(api_call(base + 50, base + 60, correlation=step + 1))
        kernels.append(kernel(base + 70, base + 90, correlation=step + 1))
    return trace(api=api, kernels=kernels, ranges=pd.DataFrame(ranges))


def test_a_host_bound_loop_has_only_host_time_on_its_path() -> None:
    """Ops of 200 ns that each launch a 20 ns kernel: the GPU waits for the host, so the
    path is the host thread's, gaps included as nothing."""
    path = critical_path(host_bound_loop())
    assert path.length_ns == 600
    assert path.summary().to_dict() == {"host": 600}
    assert set(path.edges.loc[path.edges["ns"] > 0, "name"]) == {"aten::mm",
                                                                  "cudaLaunchKernel"}


def test_a_window_keeps_the_host_events_that_start_in_it() -> None:
    path = critical_path(synced_steps(), window=(200, 399))
    assert path.length_ns == 110 and path.window == (200, 399)


@pytest.fixture(scope="module")
def hta() -> dict[str, Any]:
    """HTA's critical path of every Kineto fixture (ORACLE_RUN)."""
    results = ORACLE_RUN.result()
    if results is None:
        tool_missing(f"Holistic Trace Analysis not found; to run the oracle: {INSTALL}")
    traces: dict[str, Any] = results["traces"]
    return traces


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


# -- what-if replays --------------------------------------------------------------------------


def sync_loop(*, steps: int = 3, host_ns: int = 100, tail_ns: int = 100,
              records: bool = True) -> gpudiag.Trace:
    """A training loop that syncs every step: launch (5 ns), a 50 ns kernel, a stream
    synchronize that waits until it is done, then `host_ns` of host work (a torch op); the
    last step is followed by `tail_ns` of host work. `records`: the driver's sync records
    (Kineto's cuda_sync) are in the trace; without them the replay infers what each
    synchronize waited for."""
    api, kernels, syncs, ranges = [], [], [], []
    base = 0
    for step in range(steps):
        correlation = 10 * step + 1
        api.append(api_call(base, base + 5, correlation=correlation))
        kernels.append(kernel(base + 10, base + 60, correlation=correlation))
        api.append(api_call(base + 6, base + 62, "cudaStreamSynchronize",
                            correlation=correlation + 1))
        if records:
            syncs.append({"pid": 100, "tid": None, "device": 0, "stream": 7,
                          "start_ns": base + 6, "end_ns": base + 62, "kind": "stream",
                          "correlation": correlation + 1})
        work = host_ns if step < steps - 1 else tail_ns
        ranges.append({"pid": 100, "tid": 100, "start_ns": base + 62,
                       "end_ns": base + 62 + work, "name": "aten::add", "source": "torch_op",
                       "depth": 0})
        base += 62 + work
    return trace(api=api, kernels=kernels, syncs=syncs or None, ranges=pd.DataFrame(ranges))


@pytest.mark.parametrize("records", [True, False])
def test_removing_a_sync_in_a_loop_saves_exactly_its_waits(records: bool) -> None:
    """The host does 100 ns of work per step, the GPU 50: without the waits (56 ns a step)
    the GPU keeps up, so the replayed loop is shorter by every wait, no more, no less."""
    built = sync_loop(records=records)
    replay = Replay.of(built)
    assert replay.length_ns == 3 * 162  # the recorded window: the replay starts from it
    calls = np.flatnonzero(replay.graph.events.name == "cudaStreamSynchronize")
    waits = 3 * (62 - 6)
    assert replay.without_waits(calls).saving() == waits
    assert replay.without_waits(calls).bound() >= waits


def test_removing_the_gpu_s_gaps_saves_nothing_in_a_host_bound_loop() -> None:
    """Kernels of 20 ns behind host ops of 200 ns: the GPU idles between them, but taking
    its gaps away cannot shorten a loop the host sets."""
    replay = Replay.of(host_bound_loop())
    assert replay.length_ns == 600
    assert replay.without_gaps().length() == 600
    ops = np.flatnonzero(replay.graph.events.name == "aten::mm")
    assert replay.faster_host(ops[:1]).saving() == 200 - 10  # its launch remains


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_replaying_a_real_trace_as_recorded_gives_its_window_back(path: Path) -> None:
    """Nothing taken away, the replay ends where the trace did (within 0.1 %: GPU work
    without a launch call in the trace is left out of the graph): the graph holds what
    held each event."""
    replay = Replay.of(gpudiag.load(path))
    start, end = replay.graph.events.window
    assert abs(replay.length_ns - (end - start)) <= 0.001 * (end - start)


WORLD128 = [KINETO / "world128_sampled_rank0.json.gz", KINETO / "world128_sampled_rank1.json.gz"]


def test_each_rank_of_a_merged_job_has_the_path_it_has_alone() -> None:
    """Ranks of a merged job reuse pids, devices and streams; each is a graph of its own,
    so its path is the one its file alone gives (the same edges, the same breakdown)."""
    paths = rank_paths(gpudiag.load(WORLD128))
    assert sorted(paths["rank"].unique()) == [0, 1]
    for rank, path in enumerate(WORLD128):
        alone = critical_path(gpudiag.load(path))
        mine = paths[paths["rank"] == rank].drop(columns="rank").reset_index(drop=True)
        columns = ["kind", "start_ns", "end_ns", "ns", "name", "bound_by"]
        pd.testing.assert_frame_equal(mine[columns], alone.edges[columns])


def test_the_critical_path_is_a_perfetto_track_and_a_timeline_row(tmp_path: Path) -> None:
    """`gpudiag export` draws each rank's path as a track of slices named by where the time
    went, summing to the path's length; the utilization figure has a row per rank's path
    (`Diagnosis.critical_paths`: without a Diagnosis there is none to draw)."""
    import gzip

    from gpudiag.reports import figures
    from gpudiag.reports.export import write_chrome_trace

    built = gpudiag.load(KINETO / "a100_alexnet_sync_critical_path.json.gz")
    dx = gpudiag.diagnose(built)
    written = write_chrome_trace(built, tmp_path / "t.json.gz", dx)
    events = json.loads(gzip.decompress(written.read_bytes()))["traceEvents"]
    path = [event for event in events if event.get("cat") == "gpudiag.critical_path"]
    assert path and all(event["name"].split(": ")[0] in set(BOUND_BY.values())
                        for event in path)
    length = critical_path(built).length_ns
    assert sum(event["dur"] for event in path) * 1e3 == pytest.approx(length, rel=1e-6)
    figure = figures.utilization(built, dx)  # the Diagnosis' path: reports only render it
    assert "rank 0 · critical path" in figure.data[0].y
    assert "rank 0 · critical path" not in figures.utilization(built, None).data[0].y


def test_replaying_a_merged_job_gives_each_rank_its_window_back() -> None:
    """Two real ranks in one replay, their matched collectives joined across ranks: with
    nothing taken away each rank ends where it did (the joins hold what was recorded)."""
    merged = gpudiag.load(WORLD128)
    replay = Replay.of(merged)
    assert (replay.kind == PEERS).any()
    for rank, length in zip(replay.ranks.tolist(), replay.lengths.tolist(), strict=True):
        alone = Replay.of(gpudiag.load(WORLD128[rank]))
        assert abs(length - alone.length_ns) <= 0.001 * alone.length_ns


def test_a_trace_past_the_draw_limit_is_drawn_without_its_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reports leave the critical path out past `DRAW_LIMIT` launch calls and GPU work
    (its own pass would outweigh the page); the streams are still drawn."""
    from gpudiag.analyzers.critical import path as path_mod
    from gpudiag.reports import figures

    built = gpudiag.load(KINETO / "a100_alexnet_sync_critical_path.json.gz")
    monkeypatch.setattr(path_mod, "DRAW_LIMIT", 10)
    rows = figures.utilization(built, None).data[0].y
    assert rows and not any("critical path" in row for row in rows)
