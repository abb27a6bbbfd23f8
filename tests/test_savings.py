"""Expected savings (`analyzers.critical.savings`): each finding's fix replayed, exact on
synthetic traces whose answer is known by construction, sane on every real fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.critical import savings
from gpudiag.analyzers.critical.replay import Replay
from gpudiag.analyzers.critical.savings import EXACT_TOP
from gpudiag.diagnosis_schema import FIXES
from tests.builders import KinetoTrace, api_call, kernel
from tests.conftest import fixtures_dir

US = 1_000
KINETO = sorted((fixtures_dir() / "kineto").glob("*.json*"))


def finding(dx: gpudiag.Diagnosis, cause: str, where: str | None = None) -> dict[str, Any]:
    """The one finding of `cause` (at `where`)."""
    found = dx.findings[dx.findings["cause"] == cause]
    if where is not None:
        found = found[found["where"].str.startswith(where)]
    assert len(found) == 1, dx.findings[["cause", "where"]]
    return dict(found.iloc[0])


def sync_loop(*, steps: int = 3, host_ns: int = 100 * US, gpu_ns: int = 50 * US,
              records: bool = True, synced: bool = True) -> gpudiag.Trace:
    """Each step: a 5 µs launch, a `gpu_ns` kernel 10 µs after it, a stream synchronize
    from 6 µs until 2 µs after the kernel, then `host_ns` of host work (a torch op). The
    GPU is faster than the host: without the waits (56 µs a step) it keeps up.
    `synced=False`: the same loop with the synchronize removed (the fixed run)."""
    api, kernels, syncs, ranges = [], [], [], []
    base = 0
    for step in range(steps):
        correlation = 10 * step + 1
        end = base + 12 * US + gpu_ns if synced else base + 6 * US
        api.append(api_call(base, base + 5 * US, correlation=correlation))
        kernels.append(dict(kernel(base + 10 * US, base + 10 * US + gpu_ns,
                                   correlation=correlation), kernel_id=step))
        if synced:
            api.append(api_call(base + 6 * US, end, "cudaStreamSynchronize",
                                correlation=correlation + 1))
        if records and synced:
            syncs.append({"pid": 100, "tid": None, "device": 0, "stream": 7,
                          "start_ns": base + 6 * US, "end_ns": end, "kind": "stream",
                          "correlation": correlation + 1})
        ranges.append({"pid": 100, "tid": 100, "start_ns": end, "end_ns": end + host_ns,
                       "name": "aten::add", "source": "torch_op", "depth": 0})
        base = end + host_ns
    tables = {"api": api, "kernels": kernels, "syncs": syncs, "ranges": ranges}
    return gpudiag.Trace(**{name: pd.DataFrame(rows) for name, rows in tables.items() if rows})


@pytest.mark.parametrize("records", [True, False])
def test_a_sync_in_a_loop_saves_exactly_its_waits(records: bool) -> None:
    """The sync site's finding saves its three 56 µs waits, no more (its GPU idle, 224 µs,
    is larger: the kernels' launch delays stay); the host op's finding saves all its
    time (the host sets the pace); the Python between ops here is waiting, which a
    faster host does not shorten: 0."""
    dx = gpudiag.diagnose(sync_loop(records=records))
    sync = finding(dx, "sync_stall")
    assert (sync["lost_ns"], sync["saving_ns"], sync["fix"]) == (224 * US, 3 * 56 * US,
                                                                  "no_wait")
    assert finding(dx, "host_op")["saving_ns"] == 3 * 100 * US
    assert finding(dx, "host_python_overhead")["saving_ns"] == 0
    window = 3 * 162 * US
    assert sync["saving_share"] == pytest.approx(3 * 56 / 486)
    assert sync["saving_step_share"] == pytest.approx(3 * 56 * US / 3 / 162 / US)
    assert dx.findings["saving_ns"].max() <= window


def test_a_long_window_is_replayed_on_a_sample_of_its_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over SAMPLE_EVENTS events, the replays run on steady steps around the median and
    their savings are scaled to the window: identical steps give the whole loop's saving,
    and a note says which steps were replayed."""
    from gpudiag.analyzers.critical import sample

    monkeypatch.setattr(sample, "SAMPLE_EVENTS", 20)
    dx = gpudiag.diagnose(sync_loop(steps=30))
    sync = finding(dx, "sync_stall")
    assert sync["saving_ns"] == 30 * 56 * US
    assert sync["saving_share"] == pytest.approx(56 / 162)
    [note] = [line for line in dx.notes if line.startswith("expected savings replayed on")]
    assert "steady steps" in note and "scaled to the window" in note


def test_compare_puts_the_predicted_saving_beside_the_measured_one() -> None:
    """The run with the sync removed is the baseline's replay made real: the sync site's
    finding is gone, its predicted saving per step (56 µs) is the measured change of the
    median step, and the terminal prints both. The Python time between ops went with it
    (it was the waiting): fixed too, predicted 0."""
    from rich.console import Console

    from gpudiag.analyzers.compare import compare
    from gpudiag.reports.terminal.compare import print_comparison

    found = compare([sync_loop(), sync_loop(synced=False)], ["before", "after"])
    fixed = found.predicted.set_index("cause")
    assert sorted(fixed.index) == ["host_python_overhead", "sync_stall"]
    assert fixed.loc["host_python_overhead", "predicted_ns"] == 0
    row = fixed.loc["sync_stall"]
    assert (row["predicted_ns"], row["fix"]) == (3 * 56 * US, "no_wait")
    assert row["predicted_step_ns"] == pytest.approx(56 * US)
    assert row["measured_step_ns"] == 56 * US
    console = Console(record=True, width=200)
    print_comparison(found, console)
    text = console.export_text()
    assert "Predicted vs measured" in text
    assert "measured: 56 µs per step faster (predicted at most 56 µs; predicted / measured " \
           "1.00)" in text
    assert json.dumps(found.to_dict())


def host_bound_loop(path: Path) -> gpudiag.Trace:
    """Four 300 µs torch ops, each launching (5 µs, 100 µs in) a 40 µs kernel of 4 blocks
    on a 132-SM H100: the grid leaves most SMs idle, the host sets the pace."""
    built = KinetoTrace()
    for step in range(4):
        base = step * 300.0
        built.op("aten::mm", base, 300.0)
        correlation = built.launch(base + 100, 5)
        built.kernel("gemm", base + 110, 40, correlation, grid=(4, 1, 1))
    return gpudiag.load(built.write(path / "host_bound.json"))


def test_a_host_bound_loop_gains_nothing_from_a_full_wave(tmp_path: Path) -> None:
    """The small grid lost GPU time, but a faster kernel cannot shorten a loop the host
    sets: its saving is 0. The host's idle gaps (250 µs before each of three kernels) are
    saved whole; launches at a graph's cost save 4 µs each of the three behind gaps."""
    dx = gpudiag.diagnose(host_bound_loop(tmp_path))
    small = finding(dx, "small_grid")
    assert small["lost_ns"] > 0 and small["saving_ns"] == 0 and small["fix"] == "full_wave"
    assert finding(dx, "host_bound")["saving_ns"] == 3 * 250 * US
    assert finding(dx, "launch_bound")["saving_ns"] == 3 * 4 * US
    # ranked by saving: the finding that saves the most first, the small grid last
    assert list(dx.findings["cause"]) == ["host_op", "host_bound", "launch_bound",
                                          "small_grid"]
    by_lost = gpudiag.diagnose(host_bound_loop(tmp_path), rank_by="lost")
    assert list(by_lost.findings["cause"])[:3] == ["host_bound", "small_grid", "launch_bound"]


def two_ranks(*, delay: int = 150 * US, steps: int = 3, period: int = 340 * US
              ) -> gpudiag.Trace:
    """Two ranks, each step: 100 µs of host work, a 50 µs kernel, an all-reduce after it
    and a synchronize. Rank 1 runs `delay` more host work (`aten::slow`) first, so rank 0
    waits `delay` in every all-reduce, which ends 20 µs after the last arrival."""
    api, kernels, syncs, ranges, calls = [], [], [], [], []

    def op(rank: int, name: str, start: int, end: int) -> None:
        ranges.append({"rank": rank, "pid": 100 + rank, "tid": 100 + rank, "start_ns": start,
                       "end_ns": end, "name": name, "source": "torch_op", "depth": 0})

    def call(rank: int, start: int, end: int, correlation: int, name: str = "cudaLaunchKernel"
             ) -> None:
        api.append(dict(api_call(start, end, name, correlation=correlation, pid=100 + rank,
                                 tid=100 + rank), rank=rank))

    for step in range(steps):
        base = step * period
        arrival = base + 100 * US + delay + 60 * US  # the late rank's all-reduce starts
        for rank in (0, 1):
            pid, late = 100 + rank, delay if rank else 0
            op(rank, "aten::mm", base, base + 100 * US)
            if late:
                op(rank, "aten::slow", base + 100 * US, base + 100 * US + late)
            at, correlation, end = base + 100 * US + late, 10 * step + 1, arrival + 20 * US
            op(rank, "aten::linear", at, at + 10 * US)
            call(rank, at + 1 * US, at + 6 * US, correlation)
            kernels.append(kernel(at + 10 * US, at + 60 * US, "gemm", device=rank, pid=pid,
                                  rank=rank, correlation=correlation))
            op(rank, "c10d::allreduce_", at + 10 * US, at + 20 * US)
            call(rank, at + 11 * US, at + 16 * US, correlation + 1)
            kernels.append(kernel(at + 60 * US, end, "ncclDevKernel_AllReduce_RING_LL",
                                  device=rank, pid=pid, rank=rank, correlation=correlation + 1))
            calls.append({"rank": rank, "pid": pid, "device": rank, "stream": 7,
                          "start_ns": at + 60 * US, "end_ns": end, "op": "all_reduce",
                          "bytes": 1 << 20, "dtype": "float", "group_size": 2, "comm": "0",
                          "seq": step, "kernel_id": len(kernels) - 1,
                          "name": "ncclDevKernel_AllReduce"})
            op(rank, "aten::item", at + 20 * US, end + 2 * US)
            call(rank, at + 21 * US, end + 1 * US, correlation + 2, "cudaStreamSynchronize")
            syncs.append({"rank": rank, "pid": pid, "tid": None, "device": rank, "stream": 7,
                          "start_ns": at + 21 * US, "end_ns": end + 1 * US, "kind": "stream",
                          "correlation": correlation + 2})
    kernels = [dict(row, kernel_id=index) for index, row in enumerate(kernels)]
    tables = {"kernels": kernels, "api": api, "syncs": syncs, "ranges": ranges,
              "collectives": calls}
    return gpudiag.Trace(meta={"world_size": 2},
                         **{name: pd.DataFrame(rows) for name, rows in tables.items()})


def test_the_late_rank_s_delay_is_the_saving_of_both_ranks() -> None:
    """Rank 0 waits 150 µs for rank 1 in each of three all-reduces: its comm_wait finding
    (no wait for peers) saves 3 x 150 µs, and so does rank 1's own cause, the slow op that
    made it late (no host time): fixing either buys the job the delay."""
    dx = gpudiag.diagnose(two_ranks())
    wait = finding(dx, "comm_wait")
    assert (wait["lost_ns"], wait["saving_ns"], wait["fix"]) == (450 * US, 450 * US,
                                                                  "no_peer_wait")
    slow = finding(dx, "host_op", "aten::slow")
    assert (slow["saving_ns"], slow["fix"]) == (450 * US, "no_host_time")


def test_a_late_rank_s_fix_shortens_its_peers_through_their_collectives() -> None:
    """Matched collectives tie the ranks' replays (each call ends its transfer time after
    the last peer arrived): rank 1's slow op gone, both ranks end 3 x 150 µs earlier;
    rank 0 not waiting in its all-reduces shortens rank 0 alone."""
    replay = Replay.of(two_ranks())
    events = replay.graph.events
    slow = np.flatnonzero(events.name == "aten::slow")
    gone = replay.without_host_time(events.pid[slow], events.tid[slow], events.start[slow],
                                    events.end[slow])
    assert list(replay.lengths - gone.lengths()) == [450 * US, 450 * US]
    calls = np.flatnonzero((events.rank == 0) & (events.name == "ncclDevKernel_AllReduce_RING_LL"))
    alone = replay.without_peer_waits(calls, np.ones(len(calls)))
    assert list(replay.lengths - alone.lengths()) == [450 * US, 0]


@pytest.mark.parametrize("path", KINETO, ids=[p.name for p in KINETO])
def test_every_saving_on_a_real_trace_is_within_its_window(path: Path) -> None:
    """On real traces: a saving is never negative nor longer than the window, every fix is
    a declared one, and the findings a fix applies to (syncs, gaps, grids, collective
    waits) are replayed until none left can rank in the top `EXACT_TOP`."""
    dx = gpudiag.diagnose(gpudiag.load(path))
    found = dx.findings
    saved = found[found["saving_ns"].notna()]
    assert (saved["saving_ns"] >= 0).all()
    assert (saved["saving_share"] <= 1).all()
    assert set(saved["fix"].dropna()) <= set(FIXES)
    fixed = found["cause"].isin(["sync_stall", "launch_bound", "small_grid", "comm_wait"])
    # a finding that lost under MIN_SHARE of the window may be left out (the Inductor
    # trace's launch gaps of 1 ns are): it cannot matter
    window = sum(end - start for start, end in dx.timeline.windows.values()) \
        if dx.timeline is not None else 0
    fixed &= found["lost_ns"] >= savings.MIN_SHARE * window
    assert found["saving_ns"].notna().sum() >= min(int(fixed.sum()), EXACT_TOP)
    json.dumps(dx.to_dict(top=5))  # the savings reach --json as plain numbers


def test_the_findings_left_unreplayed_could_not_rank_in_the_top(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings are replayed from the largest bound down and the rest left out once none
    can reach the top (or save 0.1 % of the window, or 30 replays ran): the top findings
    by saving are those every replay gives."""
    path = fixtures_dir() / "kineto" / "a100_rank0of2_nccl_eventsync_annotations.json.gz"
    top = gpudiag.diagnose(gpudiag.load(path)).findings
    assert top["saving_ns"].isna().any()  # some were left out
    for name, value in (("EXACT_TOP", 10**6), ("MAX_REPLAYS", 10**6), ("MIN_SHARE", 0.0)):
        monkeypatch.setattr(savings, name, value)
    every = gpudiag.diagnose(gpudiag.load(path)).findings
    assert every["saving_ns"].notna().sum() > top["saving_ns"].notna().sum()
    # the ten largest savings are the same numbers (findings saving the same may trade
    # places: ties rank by lost time, and a capped run leaves some of a tie unreplayed)
    assert list(top["saving_ns"].head(EXACT_TOP)) == list(every["saving_ns"].head(EXACT_TOP))
    key = ["cause", "where", "advice"]
    both = top.dropna(subset=["saving_ns"]).merge(every, on=key, suffixes=("", "_all"))
    assert (both["saving_ns"] == both["saving_ns_all"]).all()  # a replay is a replay


def test_the_terminal_shows_what_each_finding_saves() -> None:
    """`gpudiag analyze` titles the findings by expected saving and gives each a "saves"
    cell (with its share of the window and of a step); --no-savings and a trace without a
    timeline leave the column out; --rank-by lost restores the old title."""
    from click.testing import CliRunner

    from gpudiag.cli import cli

    example = Path(__file__).parents[1] / "examples" / "traces" / "train_loop_sync.pt.trace.json.gz"
    shown = CliRunner().invoke(cli, ["analyze", str(example)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "Findings, by expected saving" in shown.output and "saves" in shown.output
    assert "of a step)" in shown.output
    plain = CliRunner().invoke(cli, ["analyze", str(example), "--no-savings", "--rank-by",
                                     "lost"], env={"COLUMNS": "250"})
    assert "Findings, by GPU time lost" in plain.output and "saves" not in plain.output


def test_a_reworded_finding_keeps_its_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay finds a finding's events by its kind and subject, never by its text: a
    kernel name read back from the evidence, a communicator from `where`, a kind from the
    advice once turned a saving into NA whenever a sentence changed."""
    from gpudiag.analyzers import findings
    from gpudiag.analyzers.collectives import calls
    from gpudiag.analyzers.kernels import launch

    path = fixtures_dir() / "kineto" / "a100_rank0of2_nccl_eventsync_annotations.json.gz"
    before = gpudiag.diagnose(gpudiag.load(path)).findings
    for key in list(findings.ADVICE):
        monkeypatch.setitem(findings.ADVICE, key, f"reworded {key}")  # type: ignore[index]
    monkeypatch.setattr(launch, "_evidence", lambda *args: "reworded")
    monkeypatch.setattr(calls, "_at", lambda site: " (reworded)")
    after = gpudiag.diagnose(gpudiag.load(path)).findings
    assert (after["advice"] == "reworded small_grid").any()
    assert (after["evidence"] == "reworded").any()
    key = ["cause", "kind", "subject", "lost_ns", "count"]
    saved = before[before["saving_ns"].notna()]
    assert set(saved["kind"]) >= {"small_grid", "comm_exposed"}  # both used to parse text
    both = saved.merge(after, on=key, suffixes=("", "_after"), validate="one_to_one")
    assert len(both) == len(saved) and both["saving_ns_after"].notna().all()
    assert list(both["saving_ns"]) == list(both["saving_ns_after"])
