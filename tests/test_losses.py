"""The loss waterfall on synthetic traces with planted causes and exact expected losses.

Times are written in µs (U) so the planted gaps read like the rules in gaps.py; one host
thread (pid 100, tid 100) launches onto device 0.
"""

from __future__ import annotations

import pandas as pd
import pytest

from gpudiag.analyzers.losses.gaps import idle_gaps
from gpudiag.analyzers.losses.waterfall import loss_timeline, losses
from tests.builders import api_call, copy, kernel, sync, trace

U = 1_000  # ns per µs


class Timeline:
    """Kernels and copies with their launch calls, built in order."""

    def __init__(self) -> None:
        self.kernels: list[dict[str, object]] = []
        self.copies: list[dict[str, object]] = []
        self.api: list[dict[str, object]] = []
        self.syncs: list[dict[str, object]] = []
        self._corr = 0

    def launch(self, api_at: float, start: float, end: float, name: str = "gemm",
               api_dur: float = 3, **extra: object) -> None:
        self._corr += 1
        self.api.append(api_call(int(api_at * U), int((api_at + api_dur) * U),
                                 correlation=self._corr))
        self.kernels.append(kernel(int(start * U), int(end * U), name,
                                   correlation=self._corr, **extra))

    def memcpy(self, api_at: float, api_end: float, start: float, end: float,
               kind: str = "HtoD") -> None:
        self._corr += 1
        self.api.append(api_call(int(api_at * U), int(api_end * U), "cudaMemcpyAsync",
                                 correlation=self._corr))
        row = copy(int(start * U), int(end * U), kind)
        self.copies.append({**row, "correlation": self._corr})

    def stream_sync(self, start: float, end: float) -> None:
        self._corr += 1
        self.api.append(api_call(int(start * U), int(end * U), "cudaStreamSynchronize",
                                 correlation=self._corr))
        self.syncs.append({**sync(int(start * U), int(end * U)), "correlation": self._corr})

    def build(self, **tables: object):  # type: ignore[no-untyped-def]
        return trace(kernels=self.kernels, copies=self.copies or None, api=self.api,
                     syncs=self.syncs or None, **tables)


def by_cause(tr, **options: object) -> dict[str, int]:  # type: ignore[no-untyped-def]
    table = losses(tr, **options)
    return {c: int(v) // U for c, v in zip(table["cause"], table["lost_ns"], strict=True)
            if v}


def test_sync_stall_is_the_whole_gap_after_a_sync_that_drained_the_queue() -> None:
    tl = Timeline()
    tl.launch(0, 10, 110)
    tl.stream_sync(20, 111)          # host waits until the kernel ends (+1 µs return)
    tl.launch(150, 160, 200)         # the host launches again 39 µs after the sync
    assert by_cause(tl.build()) == {"useful": 140, "sync_stall": 50}


def test_sync_that_returned_before_the_gap_is_not_a_stall() -> None:
    tl = Timeline()
    tl.launch(0, 10, 110)
    tl.stream_sync(20, 30)           # returned while the GPU was still busy
    tl.launch(150, 160, 200)
    assert "sync_stall" not in by_cause(tl.build())


def test_short_host_wait_is_launch_bound() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(30, 35, 45)            # host issued the next launch 10 µs after idle
    assert by_cause(tl.build()) == {"useful": 20, "launch_bound": 15}


def test_long_host_wait_is_host_bound_then_launch_latency() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(220, 226, 230)         # 200 µs of host work, then 6 µs launch latency
    assert by_cause(tl.build()) == {"useful": 14, "host_bound": 200, "launch_bound": 6}


def test_threshold_edge_of_launch_gap() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(70, 71, 80)            # exactly 50 µs of host wait: not below the threshold
    assert by_cause(tl.build()) == {"useful": 19, "host_bound": 50, "launch_bound": 1}
    assert by_cause(tl.build(), launch_gap_ns=50 * U + 1) == {"useful": 19, "launch_bound": 51}


def test_queued_work_short_gap_is_dispatch_latency_long_gap_is_a_dependency() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(5, 24, 30)             # issued before the GPU went idle: 4 µs latency
    tl.launch(6, 130, 140)           # queued, yet idle 100 µs: waited on a dependency
    assert by_cause(tl.build()) == {"useful": 26, "launch_bound": 4, "host_bound": 100}


def test_copy_api_open_when_the_gpu_went_idle_is_copy_time() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.memcpy(15, 100, 95, 100)      # pageable staging held the host 15..100
    tl.launch(101, 105, 120)
    got = by_cause(tl.build())
    # idle 20..95 staging + busy 95..100 exposed copy; 100..105 host wait then launch
    assert got == {"useful": 25, "copy": 80, "launch_bound": 5}


def test_small_grid_fraction_and_concurrency() -> None:
    tl = Timeline()
    tl.launch(0, 0, 100, "small", stream=1)      # fills 25% of the SMs
    tl.launch(1, 50, 100, "big", stream=2)       # fills them all from 50 on
    t = tl.build()
    eff = pd.Series([0.25, 1.0], index=t.kernels.index)
    got = losses(t, efficiency=eff)
    lost = dict(zip(got["cause"], got["lost_ns"], strict=True))
    assert lost["small_grid"] == 75 * U / 100 * 50  # only while the small one runs alone
    assert lost["useful"] == 100 * U - lost["small_grid"]


def test_collective_wait_counts_only_where_nothing_else_runs() -> None:
    tl = Timeline()
    tl.launch(0, 0, 100, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", stream=3)
    tl.launch(1, 0, 30, "gemm", stream=1)
    t = tl.build()
    waits = pd.DataFrame({"rank": [pd.NA], "device": [0], "start_ns": [0], "end_ns": [60 * U]})
    got = losses(t, comm_waits=waits)
    lost = dict(zip(got["cause"], got["lost_ns"], strict=True))
    assert lost["comm_wait"] == 30 * U            # 30..60: waiting, no compute to hide it
    assert lost["useful"] == 70 * U


def test_mixed_causes_tile_the_window_exactly() -> None:
    tl = Timeline()
    tl.launch(0, 10, 110)
    tl.stream_sync(20, 111)
    tl.launch(150, 160, 200)
    tl.launch(210, 215, 220)
    tl.memcpy(219, 300, 295, 300)
    tl.launch(900, 905, 1000)
    t = tl.build()
    got = by_cause(t)
    assert got == {"useful": 240, "sync_stall": 50, "launch_bound": 20, "copy": 80,
                   "host_bound": 600}
    assert sum(got.values()) == 990
    pieces = idle_gaps(t)
    assert (pieces["end_ns"] - pieces["start_ns"]).sum() == (990 - 240 - 5) * U


def test_two_devices_have_their_own_windows() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(1, 500, 600, device=1)
    table = losses(tl.build())
    assert table.groupby("device")["lost_ns"].sum().to_dict() == {0: 10 * U, 1: 100 * U}
    assert table.groupby("device")["share"].sum().round(12).eq(1).all()


def test_window_limits_the_waterfall() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(220, 226, 230)
    got = losses(tl.build(), window=(15 * U, 100 * U))
    lost = {c: v for c, v in zip(got["cause"], got["lost_ns"], strict=True) if v}
    assert lost == {"useful": 5 * U, "host_bound": 80 * U}


def test_amounts_per_bin_sum_to_the_bin() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(220, 226, 230)
    t = tl.build()
    tlm = loss_timeline(t)
    key = next(iter(tlm.windows))
    amounts = tlm.amounts(key, [10 * U, 100 * U, 230 * U])
    total = sum(a for a in amounts.values())
    assert list(total) == [90 * U, 130 * U]
    assert amounts["host_bound"].tolist() == [80 * U, 120 * U]


def test_no_launch_information_falls_back_to_gap_length() -> None:
    t = trace(kernels=[kernel(0, 10 * U), kernel(20 * U, 30 * U), kernel(200 * U, 210 * U)])
    assert by_cause(t) == {"useful": 30, "launch_bound": 10, "host_bound": 170}


def test_empty_trace_gives_empty_losses() -> None:
    table = losses(trace())
    assert table.empty and list(table.columns) == ["rank", "device", "cause", "lost_ns",
                                                   "share"]


@pytest.mark.parametrize("tolerance", [0, 2 * U])
def test_sync_tolerance_absorbs_rounded_clocks(tolerance: int) -> None:
    tl = Timeline()
    tl.launch(0, 10, 110)
    tl.stream_sync(20, 109)          # Kineto rounding: the sync 'ends' 1 µs early
    tl.launch(150, 160, 200)
    got = by_cause(tl.build(), sync_tolerance_ns=tolerance)
    assert ("sync_stall" in got) == (tolerance > 0)


# -- regressions found in review --------------------------------------------------------

EPOCH = 1_682_700_000_000_000_000  # Kineto times are epoch ns: float64 would lose 128 ns


def test_epoch_times_keep_every_nanosecond() -> None:
    tl = Timeline()
    tl.launch(0, 10, 20)
    tl.launch(220, 226, 230)
    t = tl.build()
    for table in (t.kernels, t.api):
        table["start_ns"] += EPOCH
        table["end_ns"] += EPOCH
    assert by_cause(t) == {"useful": 14, "host_bound": 200, "launch_bound": 6}


def test_ranks_that_reuse_a_pid_keep_their_own_launches_and_syncs() -> None:
    def rank_rows(rank: int, next_launch: float, sync: bool) -> Timeline:
        tl = Timeline()
        tl.launch(0, 10, 110)
        if sync:
            tl.stream_sync(20, 111)
        tl.launch(next_launch, next_launch + 6, next_launch + 50)
        for rows in (tl.kernels, tl.api, tl.syncs):
            for row in rows:
                row["rank"] = rank
        return tl

    a, b = rank_rows(0, 150, True), rank_rows(1, 330, False)
    t = trace(kernels=a.kernels + b.kernels, api=a.api + b.api, syncs=a.syncs)
    table = losses(t)
    got = {(int(r), c): int(v) // U for r, c, v in
           zip(table["rank"], table["cause"], table["lost_ns"], strict=True) if v}
    assert got[(0, "sync_stall")] == 46
    assert (1, "sync_stall") not in got            # only rank 0 synchronized
    assert got[(1, "host_bound")] == 220 and got[(1, "launch_bound")] == 6
