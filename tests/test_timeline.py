"""Exact answers of gpudiag.analyzers.timeline on synthetic traces, and its invariants on
real ones. Agreement with HTA itself is tests/test_hta_oracle.py."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpudiag
from gpudiag import intervals
from gpudiag.analyzers.timeline import (
    IDLE_BREAKDOWN,
    IDLE_CATEGORIES,
    STREAM_SUMMARY,
    TEMPORAL,
    idle_breakdown,
    is_compute,
    stream_summary,
    temporal_breakdown,
)
from gpudiag.trace import Trace
from tests.builders import api_call, copy, kernel, trace
from tests.conftest import fixture


def by_stream(frame: pd.DataFrame) -> dict[tuple[object, ...], dict[str, object]]:
    keys = ["rank", "device", "stream"]
    return {tuple(None if pd.isna(v) else v for v in row[keys]): row.drop(keys).to_dict()
            for _, row in frame.iterrows()}


def idle_cells(frame: pd.DataFrame, stream: int = 7) -> dict[str, tuple[int, int]]:
    rows = frame[frame["stream"] == stream]
    return {c: (int(n), int(g)) for c, n, g in
            zip(rows["category"], rows["idle_ns"], rows["gaps"], strict=True)}


# -- stream_summary --------------------------------------------------------------------


def test_stream_idle_is_span_minus_union_of_kernels_and_copies() -> None:
    t = trace(
        kernels=[kernel(0, 100), kernel(50, 150), kernel(150, 200),  # overlap, then touch
                 kernel(400, 400),                                    # zero length: span only
                 kernel(1000, 1100, stream=9),
                 kernel(0, 10, device=1), kernel(20, 30, device=1)],
        copies=[{**copy(300, 350, "memset"), "correlation": None}],
    )
    rows = by_stream(stream_summary(t))
    assert rows[(None, 0, 7)] == {"span_ns": 400, "busy_ns": 250, "idle_ns": 150, "events": 5}
    assert rows[(None, 0, 9)] == {"span_ns": 100, "busy_ns": 100, "idle_ns": 0, "events": 1}
    assert rows[(None, 1, 7)] == {"span_ns": 30, "busy_ns": 20, "idle_ns": 10, "events": 2}


def test_streams_of_other_ranks_and_unknown_streams_are_kept_apart() -> None:
    t = trace(kernels=[kernel(0, 10, rank=0), kernel(100, 110, rank=0),
                       kernel(0, 10, rank=1), {**kernel(5, 20, rank=1), "stream": None}])
    out = stream_summary(t)
    assert list(out["rank"]) == [0, 1, 1]
    assert out["stream"].isna().tolist() == [False, False, True]  # NA stream sorts last
    assert list(out["idle_ns"]) == [90, 0, 0]


def test_copies_alone_make_a_busy_stream() -> None:
    t = trace(copies=[copy(0, 10), copy(30, 40, "DtoH")])
    assert stream_summary(t)[["span_ns", "busy_ns", "idle_ns"]].values.tolist() == [[40, 20, 20]]


# -- temporal_breakdown ----------------------------------------------------------------


def test_temporal_breakdown_splits_the_device_window_like_hta() -> None:
    t = trace(kernels=[kernel(0, 100, "gemm"),
                       kernel(50, 200, "ncclDevKernel_AllReduce_Sum_f32", stream=9),
                       kernel(500, 520, "cudaStreamSync")],
              copies=[copy(300, 400)])
    row = temporal_breakdown(t).iloc[0]
    assert (row["kernel_time_ns"], row["idle_time_ns"]) == (520, 200)
    # communication under compute counts as compute: only [100, 200) of the NCCL kernel is not
    assert (row["compute_time_ns"], row["non_compute_time_ns"]) == (100, 220)
    assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == pytest.approx(100)
    assert row["compute_pct"] == pytest.approx(100 * 100 / 520)


def test_temporal_breakdown_is_per_device() -> None:
    t = trace(kernels=[kernel(0, 10, device=0), kernel(1000, 1010, device=1)])
    out = temporal_breakdown(t)
    assert list(out["device"]) == [0, 1]
    assert list(out["kernel_time_ns"]) == [10, 10]
    assert list(out["idle_time_ns"]) == [0, 0]


def test_zero_length_device_has_no_percentages() -> None:
    out = temporal_breakdown(trace(kernels=[kernel(5, 5)]))
    assert out["kernel_time_ns"].tolist() == [0]
    assert out["idle_pct"].isna().all()


@pytest.mark.parametrize(("name", "compute"), [
    ("void at::native::vectorized_elementwise_kernel<4>", True),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", True),
    ("ncclKernel_AllReduce_RING_LL_Sum_float", False),
    ("ncclDevKernel_AllGather_RING_LL", False),
    ("nccl_other", True),        # HTA 0.5.0: communication is ^nccl.*Kernel only
    ("Memcpy DtoD (Device -> Device)", False),
    ("Memset (Device)", False),
    ("fooMemcpy", False),        # .*Memcpy anywhere...
    ("fooMemset", True),         # ...but Memset only at the start
    ("dma_copy", False),
    ("my_dma", True),
    ("cudaStreamSync", False),
])
def test_compute_classification_follows_hta(name: str, compute: bool) -> None:
    """Expected values are what HTA 0.5.0's get_kernel_type answers for each name."""
    assert is_compute(pd.Series(pd.Categorical([name]))).tolist() == [compute]


def test_an_unnamed_kernel_is_compute() -> None:
    names = pd.Series(pd.Categorical(["Memset (Device)", None]))
    assert is_compute(names).tolist() == [False, True]


# -- idle_breakdown --------------------------------------------------------------------


def launched(start: int, end: int, at: int | None, corr: int) -> tuple[dict[str, object],
                                                                       list[dict[str, object]]]:
    """A kernel and, unless `at` is None, the cudaLaunchKernel call at `at` that issued it."""
    calls = [] if at is None else [api_call(at, at + 500, correlation=corr)]
    return kernel(start, end, correlation=corr), calls


def idle_trace() -> Trace:
    parts = [
        launched(0, 10_000, 0, 1),
        launched(15_000, 20_000, 1_000, 2),      # gap 5 µs, launched early: kernel wait
        launched(100_000, 110_000, 50_000, 3),   # launched after the stream ran dry: host wait
        launched(200_000, 210_000, 60_000, 4),   # 90 µs, launched early: other
        launched(240_000, 250_000, 61_000, 5),   # exactly 30 µs: other (HTA's strict <)
        launched(255_000, 260_000, None, 6),     # no launch call found: never host wait
        launched(258_000, 262_000, 62_000, 7),   # overlaps the previous one: no gap
        launched(262_000, 270_000, 63_000, 8),   # touches: no gap
    ]
    return trace(kernels=[k for k, _ in parts], api=[c for _, calls in parts for c in calls])


def test_idle_gaps_are_host_wait_kernel_wait_or_other() -> None:
    out = idle_breakdown(idle_trace())
    assert idle_cells(out) == {"host_wait": (80_000, 1), "kernel_wait": (10_000, 2),
                               "other": (120_000, 2)}
    assert out["ratio"].tolist() == pytest.approx([80 / 210, 10 / 210, 120 / 210])


def test_idle_breakdown_sums_to_the_stream_idle() -> None:
    t = idle_trace()
    assert idle_breakdown(t)["idle_ns"].sum() == stream_summary(t)["idle_ns"].sum() == 210_000


def test_kernel_wait_threshold_is_a_keyword() -> None:
    out = idle_breakdown(idle_trace(), kernel_wait_ns=100_000)
    assert idle_cells(out) == {"host_wait": (80_000, 1), "kernel_wait": (130_000, 4),
                               "other": (0, 0)}


def test_copies_are_gaps_of_their_stream_with_their_own_launch_calls() -> None:
    t = trace(kernels=[kernel(0, 10_000, correlation=1)],
              copies=[{**copy(50_000, 60_000), "correlation": 2}],
              api=[api_call(0, 100, correlation=1),
                   api_call(40_000, 41_000, "cudaMemcpyAsync", correlation=2)])
    assert idle_cells(idle_breakdown(t))["host_wait"] == (40_000, 1)


def test_a_stream_without_gaps_has_no_ratio() -> None:
    out = idle_breakdown(trace(kernels=[kernel(0, 10)]))
    assert list(out["category"]) == list(IDLE_CATEGORIES)
    assert out["idle_ns"].tolist() == [0, 0, 0]
    assert out["ratio"].isna().all()


# -- contracts -------------------------------------------------------------------------


@pytest.mark.parametrize(("analyzer", "columns"), [
    (stream_summary, STREAM_SUMMARY), (temporal_breakdown, TEMPORAL),
    (idle_breakdown, IDLE_BREAKDOWN),
])
def test_empty_trace_gives_empty_typed_frames(analyzer: object, columns: dict[str, object]
                                              ) -> None:
    assert callable(analyzer)
    out = analyzer(Trace())
    assert len(out) == 0
    assert {c: str(t) for c, t in out.dtypes.items()} == {c: str(t) for c, t in columns.items()}


@pytest.mark.parametrize("name", ["world128_sampled_rank0.json.gz",
                                  "b200_rank0of8_nccl_allgather_pystack.json.gz"])
def test_real_traces_add_up(name: str) -> None:
    t = gpudiag.load(fixture(f"kineto/{name}"))
    summary = stream_summary(t)
    assert (summary["busy_ns"] <= summary["span_ns"]).all()
    assert summary["events"].sum() == len(t.kernels) + len(t.copies)
    per_stream = idle_breakdown(t).groupby("stream")["idle_ns"].sum()
    assert per_stream.to_dict() == summary.set_index("stream")["idle_ns"].to_dict()
    tb = temporal_breakdown(t).iloc[0]
    assert tb["idle_time_ns"] + tb["compute_time_ns"] + tb["non_compute_time_ns"] == \
        tb["kernel_time_ns"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 300), st.integers(0, 60)),
                min_size=1, max_size=40))
def test_stream_busy_and_gaps_match_the_interval_algebra(
        events: list[tuple[int, int, int]]) -> None:
    """Per stream: busy = |union|, and the gaps = the complement of the union in the span,
    as gpudiag.intervals computes them one stream at a time."""
    t = trace(kernels=[kernel(s, s + d, stream=k) for k, s, d in events])
    summary = stream_summary(t).set_index("stream")
    gaps = idle_breakdown(t).groupby("stream", observed=True)["idle_ns"].sum()
    for k in {k for k, _, _ in events}:
        mine = [(s, s + d) for kk, s, d in events if kk == k]
        starts, ends = zip(*mine, strict=True)
        spans = intervals.union(starts, ends)
        idle = intervals.total(intervals.complement(spans, min(starts), max(ends)))
        assert summary.loc[k, "busy_ns"] == intervals.total(spans)
        assert summary.loc[k, "idle_ns"] == gaps[k] == idle


def test_launch_times_stay_exact_nanoseconds_when_some_kernel_has_no_launch_call() -> None:
    """Epoch nanoseconds through float64 round to 256 ns: the launch times of a batch with
    one kernel whose launch call was lost moved, and a 50 µs gap crossed `launch_gap_ns`
    (a job's losses then depended on how its ranks were batched)."""
    from gpudiag.analyzers.callsites import launch_calls

    epoch = 1_682_725_898_082_280_000
    t = trace(kernels=[kernel(epoch + 10_000, epoch + 20_000, correlation=1),
                       kernel(epoch + 70_000, epoch + 80_000, correlation=9)],
              api=[api_call(epoch + 1_000, epoch + 2_000, correlation=1)])
    found = launch_calls(t, t.kernels)["api_start_ns"]
    assert found.iloc[0] == epoch + 1_000 and pd.isna(found.iloc[1])
