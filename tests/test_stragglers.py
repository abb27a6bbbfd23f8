"""Stragglers (`analyzers.stragglers`): exact on a synthetic job whose late and slow ranks
are known by construction, on real rank files with shifted clocks, and the same from a job
diagnosed rank by rank as from the merged trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers import stragglers
from gpudiag.jobs import diagnose_job
from tests.builders import kernel, trace
from tests.test_jobs import KINETO, PAIR, shifted_job

US = 1_000
STEP_US = 1_000


def job_trace() -> gpudiag.Trace:
    """Three ranks, two steps of 1 ms (rank 1's second step 1.4 ms), two all_reduces per
    step. Rank 2 arrives last at both calls of step 0 (by 300 and 200 us over rank 0, 100
    over rank 1 each time); in step 1 rank 1 is last at both (it starts its step late)."""
    arrivals = {  # rank -> starts (us) of the four calls
        0: (100, 500, 1_100, 1_500), 1: (300, 600, 1_300, 1_700), 2: (400, 700, 1_200, 1_600)}
    kernels, calls, ranges = [], [], []
    for rank, starts in arrivals.items():
        for seq, start in enumerate(starts):
            end = (450, 800, 1_400, 1_800)[seq] if rank != 1 or seq < 2 else \
                (1_800, 2_300)[seq - 2]
            kernels.append(kernel(start * US, end * US, "ncclDevKernel_AllReduce_RING_LL",
                                  device=0, pid=100 + rank, rank=rank, stream=9))
            calls.append({"rank": rank, "pid": 100 + rank, "device": 0, "stream": 9,
                          "start_ns": start * US, "end_ns": end * US, "op": "all_reduce",
                          "bytes": 1 << 20, "dtype": "float", "group_size": 3, "comm": "0",
                          "seq": seq, "kernel_id": len(kernels) - 1,
                          "name": "ncclDevKernel_AllReduce"})
        ends = (STEP_US, 2 * STEP_US + (400 if rank == 1 else 0))
        for index, (start, end) in enumerate(zip((0, STEP_US), ends, strict=True)):
            ranges.append({"rank": rank, "pid": 100 + rank, "tid": 1,
                           "name": f"ProfilerStep#{index}", "source": "step",
                           "start_ns": start * US, "end_ns": end * US, "depth": 0})
    return trace(kernels=kernels, collectives=pd.DataFrame(calls),
                 ranges=pd.DataFrame(ranges), meta={"world_size": 3})


@pytest.fixture(scope="module")
def dx() -> Any:
    return gpudiag.diagnose(job_trace())


def test_late_arrivals_name_the_last_rank_with_its_skew_margin_and_caused_wait(dx: Any) -> None:
    late = dx.tables["late_arrivals"]
    assert late[["op", "rank", "last_calls", "op_calls"]].values.tolist() == [
        ["all_reduce", 2, 2, 4], ["all_reduce", 1, 2, 4]]
    rank2 = late.iloc[0]
    # call 0: starts 100/300/400 -> skew 300, margin 100, waits 300 + 100
    # call 1: starts 500/600/700 -> skew 200, margin 100, waits 200 + 100
    assert (rank2["skew_median_ns"], rank2["skew_max_ns"]) == (250 * US, 300 * US)
    assert (rank2["margin_ns"], rank2["caused_wait_ns"]) == (200 * US, 700 * US)
    rank1 = late.iloc[1]  # calls 2 and 3: starts 1100/1200/1300 and 1500/1600/1700
    assert (rank1["margin_ns"], rank1["caused_wait_ns"]) == (200 * US, 600 * US)
    assert rank2["share"] == 0.5 and rank2["ranks"] == 3


def test_step_stragglers_give_the_slowest_rank_and_the_last_arriver_per_step(dx: Any) -> None:
    steps = dx.tables["step_stragglers"].set_index("step")
    assert list(steps.index) == ["ProfilerStep#0", "ProfilerStep#1"]
    first, second = steps.loc["ProfilerStep#0"], steps.loc["ProfilerStep#1"]
    assert (first["slowest_rank"], first["excess_ns"]) == (0, 0)  # a tie: the lowest rank
    assert (first["last_rank"], first["last_calls"], first["caused_wait_ns"]) == (2, 2, 700 * US)
    assert (second["slowest_rank"], second["slowest_ns"]) == (1, 1_400 * US)
    assert (second["median_ns"], second["excess_ns"]) == (1_000 * US, 400 * US)
    assert (second["last_rank"], second["caused_wait_ns"]) == (1, 600 * US)
    assert second["wait_ns"] == 600 * US


def test_rank_losses_has_one_row_per_rank_whose_shares_sum_to_one(dx: Any) -> None:
    ranks = dx.tables["rank_losses"]
    assert sorted(ranks["rank"]) == [0, 1, 2]
    shares = ranks[list(stragglers.SHARE_COLUMNS)].sum(axis=1)
    assert shares.round(12).eq(1.0).all()
    assert ranks["useful_share"].is_monotonic_increasing
    assert (ranks.set_index("rank")["comm_wait_share"] > 0).loc[[0, 1]].all()


def test_one_rank_has_no_straggler_tables() -> None:
    dx = gpudiag.diagnose(gpudiag.load(PAIR[0]))
    assert not {"late_arrivals", "step_stragglers", "rank_losses"} & set(dx.tables)


def test_the_shifted_real_job_blames_its_latest_clock_at_every_collective(
        tmp_path: Path) -> None:
    folder = shifted_job(KINETO / "a100_80gb_rank0of16_nccl_streamsync.json.gz", 3,
                         tmp_path, shift_us=250.0)
    dx = diagnose_job(folder, workers=1, rows=False)
    late = dx.tables["late_arrivals"]
    assert set(late["rank"]) == {2} and (late["share"] == 1.0).all()
    assert (late["skew_max_ns"] == 500 * US).all()
    assert (late["margin_ns"] == late["last_calls"] * 250 * US).all()
    assert set(dx.tables["step_stragglers"]["last_rank"]) == {2}
    merged = gpudiag.diagnose(gpudiag.load(folder))
    for name in ("late_arrivals", "step_stragglers", "rank_losses"):
        pd.testing.assert_frame_equal(dx.tables[name], merged.tables[name], obj=name)
