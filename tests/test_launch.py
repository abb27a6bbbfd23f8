"""The launch analyzer: SM-time lost to small grids and partial waves, ncu's launch rules on
every launch, launch overhead and rate, and the findings they give; exact answers on
synthetic traces, then the real reports."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.findings import ADVICE, COLUMNS
from gpudiag.analyzers.kernels import launch
from gpudiag.analyzers.kernels.launch import (
    findings,
    launch_overhead,
    launch_rate,
    per_launch,
    small_grid,
)
from gpudiag.trace import Trace
from tests.builders import api_call, kernel, trace
from tests.conftest import fixture

#: 8 blocks of 256 threads per SM x 108 SMs = 864 block slots
A100 = {"device": 0, "name": "NVIDIA A100-SXM4-80GB", "vendor": "nvidia", "sm_count": 108,
        "cc_major": 8, "cc_minor": 0}
SLOTS = 864


def k(start: int, end: int, name: str = "k", grid: int = SLOTS, block: int = 256,
      **extra: Any) -> dict[str, Any]:
    return kernel(start, end, name, grid=(grid, 1, 1), block=(block, 1, 1),
                  **{"regs_per_thread": 16, "smem_bytes": 0, **extra})


def gpu(*kernels: dict[str, Any], **tables: Any) -> Trace:
    return trace(kernels=list(kernels), devices=pd.DataFrame([A100]), **tables)


# -- small_grid ----------------------------------------------------------------------------


def test_idle_sm_time_is_split_into_small_grid_and_tail() -> None:
    t = gpu(k(0, 1600, "a", grid=54),            # 1/16 wave: SMs idle 15/16 of 1600 ns
            k(2000, 4000, "b", grid=1296),       # 1.5 waves: idle 1/4 of 2000 ns
            k(5000, 6000, "b", grid=SLOTS))      # exactly one wave: nothing idle
    sg = small_grid(t).set_index("name")
    assert sg.index.tolist() == ["a", "b"]  # most SM-time lost first
    a, b = sg.loc["a"], sg.loc["b"]
    assert (a["count"], a["dur_ns"], a["small_grid_ns"], a["tail_ns"], a["lost_ns"]) == (
        1, 1600, 1500, 0, 1500)
    assert (b["count"], b["dur_ns"], b["small_grid_ns"], b["tail_ns"], b["lost_ns"]) == (
        2, 3000, 0, 500, 500)
    assert a["ncu_small_grid_speedup"] == 0.5          # (108 - 54) / 108
    assert b["ncu_tail_speedup"] == pytest.approx(1 / 3)  # 1/2 on 2000 ns, 0 on 1000 ns
    assert b["waves"] == pytest.approx((1.5 * 2000 + 1.0 * 1000) / 3000)
    # the configuration shown is the launch that lost the most
    assert (b["grid_blocks"], b["blocks_per_sm"], b["sm_count"], b["limiter"]) == (
        1296, 8, 108, "warps")


def test_exactly_one_wave_loses_nothing_and_one_block_more_loses_almost_half() -> None:
    pl = per_launch(gpu(k(0, 864_000, grid=SLOTS), k(0, 865_000, grid=SLOTS + 1)))
    assert pl["small_grid_ns"].tolist() == [0, 0] and pl["tail_ns"].iloc[0] == 0
    # 865 blocks = 1 + 1/864 waves over 2 waves of time: idle 1 - 865/1728
    assert pl["tail_ns"].iloc[1] == pytest.approx(865_000 * (1 - 865 / 1728))


def test_ncu_tail_effect_is_reported_only_from_20_percent() -> None:
    t = gpu(k(0, 1000, grid=int(5.5 * SLOTS)), k(0, 1000, grid=int(2.5 * SLOTS)))
    assert per_launch(t)["ncu_tail_speedup"].tolist() == [0.0, pytest.approx(1 / 3)]
    loose = per_launch(t, tail_min_speedup=0.1)["ncu_tail_speedup"]
    assert loose.tolist() == [pytest.approx(1 / 6), pytest.approx(1 / 3)]


def test_block_size_not_a_multiple_of_32() -> None:
    sg = small_grid(gpu(k(0, 1000, "odd", block=48), k(0, 3000, "even", block=64)))
    odd, even = sg.set_index("name").loc["odd"], sg.set_index("name").loc["even"]
    assert (odd["odd_block_launches"], odd["ncu_block_size_speedup"]) == (1, 0.25)
    assert (even["odd_block_launches"], even["ncu_block_size_speedup"]) == (0, 0.0)


def test_kernel_names_are_shortened_and_kept_in_full() -> None:
    full = "void at::native::reduce_kernel<512, 1>(int*)"
    row = small_grid(gpu(k(0, 10, full, grid=1))).iloc[0]
    assert (row["name"], row["full_name"]) == ("reduce_kernel<512, 1>", full)


def test_collective_kernels_are_left_out() -> None:
    t = gpu(k(0, 1000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", grid=2),
            k(0, 1000, "gemm", grid=2))
    assert small_grid(t)["name"].tolist() == ["gemm"]
    assert findings(t)["evidence"].str.contains("ncclDev").sum() == 0
    assert per_launch(t)["collective"].tolist() == [True, False]


def test_launches_without_waves_are_counted_not_guessed() -> None:
    t = gpu(k(0, 1000, grid=54), k(0, 1000, grid=54, regs_per_thread=None))
    row = small_grid(t).iloc[0]
    assert (row["count"], row["unknown_launches"]) == (2, 1)
    assert row["small_grid_ns"] == round(1000 * (1 - 54 / SLOTS))


# -- launch overhead and rate --------------------------------------------------------------


def test_launch_overhead_follows_htas_definitions() -> None:
    t = gpu(k(10_000, 12_000, "quick", correlation=1),
            k(25_000, 100_000, "long", correlation=2),
            k(200_000, 210_000, "slow_call", correlation=4),
            k(300_000, 301_000, "orphan", correlation=3),  # its launch call was not traced
            api=[api_call(1_000, 6_000, correlation=1), api_call(20_000, 30_000, correlation=2),
                 api_call(100_000, 160_000, correlation=4)])
    lo = launch_overhead(t, delay_cutoff_ns=3_000).set_index("name")
    assert lo.index.tolist() == ["quick", "long", "slow_call"]
    quick, long_, slow = lo.loc["quick"], lo.loc["long"], lo.loc["slow_call"]
    assert (quick["api_dur_ns"], quick["gpu_dur_ns"], quick["launch_delay_ns"]) == (
        5_000, 2_000, 4_000)
    assert quick["short"] and quick["long_delay"]
    assert long_["launch_delay_ns"] == 0 and not long_["short"]  # started before the return
    assert not slow["short"]  # a 60 us call is over HTA's 50 us runtime cutoff
    assert (quick["pid"], quick["tid"], quick["api_name"]) == (100, 100, "cudaLaunchKernel")


def test_launch_rate_per_thread() -> None:
    t = gpu(k(100, 110, correlation=1), k(100, 110, correlation=2),
            k(200, 210, correlation=3), k(200, 220, correlation=3),  # a graph: 2 kernels
            api=[api_call(0, 10, correlation=1), api_call(5, 20, correlation=2),
                 api_call(50, 60, correlation=3, tid=200),
                 api_call(60, 90, "cudaMemcpyAsync", correlation=9, tid=200)],
            ranges=pd.DataFrame([{"pid": 100, "tid": 100, "start_ns": 0, "end_ns": 100,
                                  "name": "step", "depth": 0, "source": "annotation"}]))
    lr = launch_rate(t).set_index("tid")
    assert lr.index.tolist() == [100, 200]
    main, side = lr.loc[100], lr.loc[200]
    assert (main["launches"], main["kernels"], main["launch_ns"], main["window_ns"]) == (
        2, 2, 20, 100)  # overlapping calls [0,10) and [5,20) count once
    assert main["launch_share"] == 0.2 and main["launches_per_s"] == 2 / 100e-9
    assert (side["launches"], side["kernels"], side["window_ns"]) == (1, 2, 40)
    assert side["launch_share"] == 0.25


# -- findings ------------------------------------------------------------------------------


def python_frame(line: int, start: int, end: int) -> dict[str, Any]:
    return {"pid": 100, "tid": 100, "start_ns": start, "end_ns": end, "depth": 0,
            "name": f"train.py({line}): step", "source": "python"}


def test_findings_name_the_call_site_and_carry_the_numbers() -> None:
    t = gpu(k(1_000, 2_600, "tiny", grid=54, correlation=1),
            k(3_000, 5_000, "tailing", grid=1296, correlation=2),
            api=[api_call(0, 500, correlation=1), api_call(2_700, 2_900, correlation=2)],
            ranges=pd.DataFrame([python_frame(42, 0, 600), python_frame(50, 2_600, 3_000)]))
    f = findings(t)
    assert list(f.columns) == list(COLUMNS)
    small, tail = f.iloc[0], f.iloc[1]
    assert (small["cause"], small["lost_ns"], small["where"], small["count"]) == (
        "small_grid", 1500, "train.py:42 (step)", 1)
    assert small["advice"] == ADVICE["small_grid"]
    assert small["evidence"] == (
        "tiny: 1 launch, 1.6 µs; grid of 54 blocks for 864 block slots (8 blocks/SM x 108 "
        "SMs) = 0.0625 waves; SM slots idle 94% of the kernel time; theoretical occupancy "
        "100% (limited by warps); estimated speedup 50% with a grid filling the GPU")
    assert (tail["cause"], tail["lost_ns"], tail["where"]) == ("small_grid", 500,
                                                               "train.py:50 (step)")
    assert tail["advice"] == ADVICE["tail"]
    assert "= 1.5 waves, last wave 50% full" in tail["evidence"]
    assert "estimated speedup 50% without the partial last wave" in tail["evidence"]
    assert "ncu" not in small["evidence"] + tail["evidence"]  # no Nsight Compute data here


def test_findings_fall_back_to_the_kernel_name_and_say_when_times_are_replays() -> None:
    t = gpu(k(0, 1600, "void ns::tiny<4>(float*)", grid=54), meta={"timeline": False})
    f = findings(t)
    assert f["where"].tolist() == ["tiny<4>"]
    assert f["evidence"].iloc[0].startswith("1 launch, 1.6 µs; grid of 54 blocks")
    assert f["evidence"].iloc[0].endswith("; " + launch.NO_TIMELINE_NOTE)


def test_findings_group_launches_per_kernel_and_site() -> None:
    t = gpu(*(k(i * 1000, i * 1000 + 800, "tiny", grid=54) for i in range(3)))
    f = findings(t)
    assert (len(f), f["count"].iloc[0], f["lost_ns"].iloc[0]) == (1, 3, 2250)
    assert f["evidence"].iloc[0].startswith("3 launches, 2.4 µs")


def test_findings_below_min_share_of_their_kernel_time_are_dropped() -> None:
    t = gpu(k(0, 100_000, "many_waves", grid=100 * SLOTS + 1))  # idle 0.99 % of the time
    assert findings(t).empty
    assert len(findings(t, min_share=0.001)) == 1


def test_no_findings_without_durations_or_waves() -> None:
    assert findings(gpu(k(0, 0, grid=1))).empty
    assert findings(trace(kernels=[k(0, 100, grid=1)])).empty  # no devices: no claim


# -- contracts -----------------------------------------------------------------------------

PUBLIC = (launch.occupancy, per_launch, small_grid, launch_overhead, launch_rate, findings)


@pytest.mark.parametrize("function", PUBLIC, ids=lambda f: f.__name__)
def test_empty_trace_in_empty_typed_frame_out(function: Any) -> None:
    empty, full = function(Trace()), function(gpu(k(0, 10, correlation=1, grid=1),
                                                 api=[api_call(0, 5, correlation=1)]))
    assert empty.empty and list(empty.columns) == list(full.columns)
    assert empty.dtypes.astype(str).tolist() == full.dtypes.astype(str).tolist()


@pytest.mark.parametrize("function", PUBLIC, ids=lambda f: f.__name__)
def test_every_public_function_opens_with_a_three_line_example(function: Any) -> None:
    doc = function.__doc__ or ""
    assert re.search(r"\n\n((?:        \S.*\n){3})\n", doc), function.__name__


# -- real reports --------------------------------------------------------------------------


def test_every_kernel_of_the_small_grid_report_is_a_small_grid() -> None:
    t = gpudiag.load(fixture("ncu/rtx4090_smem_square_9kernels_smallgrid.ncu-rep"))
    sg = small_grid(t)
    assert len(sg) == 9 and (sg["tail_ns"] == 0).all() and (sg["small_grid_ns"] > 0).all()
    assert (sg["ncu_small_grid_speedup"] == 127 / 128).all()  # grid of 1 on 128 SMs
    f = findings(t)
    assert len(f) == 9 and f["evidence"].str.endswith(launch.NO_TIMELINE_NOTE).all()


def test_ncus_tail_effect_rule_agrees_where_it_fired() -> None:
    """ncu 2022.4 fired Tail Effect on this report ('up to 50.0% of the total kernel
    runtime'); our evaluation of the same rule on the same launches gives the same number."""
    t = gpudiag.load(fixture("ncu/a100pcie_selfjoin_setfull_ncu2022.ncu-rep"))
    fired = {r["kernel_id"]: float(re.search(r"up to ([\d.]+)%", r["message"]).group(1))
             for r in t.meta["ncu_rules"] if r["title"] == "Tail Effect"}
    assert fired
    ours = per_launch(t)["ncu_tail_speedup"]
    for kernel_id, pct in fired.items():
        assert ours.iloc[kernel_id] * 100 == pytest.approx(pct, abs=0.05)


def test_findings_on_a_real_pytorch_trace_point_at_torch_ops() -> None:
    t = gpudiag.load(fixture("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz"))
    f = findings(t)
    assert len(f) and (f["cause"] == "small_grid").all()
    assert f["where"].str.startswith("aten::").any()
    assert np.isin(f["advice"], [ADVICE["small_grid"], ADVICE["tail"]]).all()
