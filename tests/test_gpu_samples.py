"""NVML samples: exact per-GPU summary values from a synthetic samples table, the throttle
findings, and the samples figure checked on its data (`fig.to_dict()`)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpudiag.analyzers import gpu_samples
from gpudiag.analyzers.findings import ADVICE, COLUMNS
from gpudiag.analyzers.gpu_samples import SUMMARY_COLUMNS, findings, sample_summary
from gpudiag.reports.figures_samples import bucketed
from gpudiag.reports.figures_samples import gpu_samples as samples_figure
from gpudiag.trace import Trace
from tests.builders import kernel, trace
from tests.conftest import plotly_array

T0 = 1_700_000_000_000_000_000  # epoch ns, as the sampler writes them
MS = 1_000_000
STEP = 100 * MS
GIB = 2**30
#: device 1's throttle reasons, one per sample: 3 power cap, 2 hw thermal (with hw slowdown,
#: as NVML sets them), 1 hw slowdown alone, 2 idle, 1 sync boost (not counted), 1 none
THROTTLE_1 = (0x4, 0x4, 0x4, 0x8 | 0x40, 0x8 | 0x40, 0x8, 0x1, 0x1, 0x10, 0x0)
POWER_OR_THERMAL = (True, True, True, True, True, True, False, False, False, False)

Row = tuple[Any, Any, int, str, float, str]


def _rows(device: int, i: int, *, rank: Any = None) -> list[Row]:
    """Sample i of a device: device 0 ramps gpu_util 0..90 %, device 1 sits at 80 %."""
    ts = T0 + i * STEP
    bits = THROTTLE_1[i] if device == 1 else 0
    clock = 1200.0 if device == 1 and POWER_OR_THERMAL[i] else 1980.0
    values = [("gpu_util", 10.0 * i if device == 0 else 80.0, "%"),
              ("mem_util", 5.0, "%"),
              ("mem_used", float((i + 1) * GIB) if device == 0 else float(3 * GIB), "bytes"),
              ("mem_total", float(80 * GIB), "bytes"),
              ("power", 300.0 + 10 * device + i, "W"),
              ("temperature", 50.0 + 2 * i + 20 * device, "C"),
              ("sm_clock", clock, "MHz"),
              ("pcie_tx", 1e9 * (device + 1), "bytes/s"),
              ("throttle_reasons", float(bits), "bitmask")]
    return [(rank, device, ts, metric, value, unit) for metric, value, unit in values]


def _samples(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "device", "ts_ns", "metric", "value", "unit"])


def two_gpus(kernels: list[dict[str, Any]] | None = None) -> Trace:
    rows = [r for device in (0, 1) for i in range(10) for r in _rows(device, i)]
    return trace(kernels=kernels, samples=_samples(rows))




# -- summary ----------------------------------------------------------------------------------


def test_summary_gives_exact_values_per_gpu() -> None:
    s = sample_summary(two_gpus()).set_index("device")
    assert list(s.index) == [0, 1] and s["rank"].isna().all()
    assert s["samples"].tolist() == [10, 10]
    assert s["start_ns"].tolist() == [T0, T0] and s["span_ns"].tolist() == [9 * STEP] * 2
    assert s.loc[0, "gpu_util_mean_pct"] == pytest.approx(45.0)
    assert s.loc[0, "gpu_util_median_pct"] == pytest.approx(45.0)
    assert s.loc[0, "low_util_share"] == pytest.approx(0.3)  # 0, 10 and 20 % of 10 samples
    assert s.loc[1, "gpu_util_mean_pct"] == 80.0 and s.loc[1, "low_util_share"] == 0.0
    assert s["mem_used_peak_bytes"].tolist() == [10 * GIB, 3 * GIB]
    assert s["mem_total_bytes"].tolist() == [80 * GIB, 80 * GIB]
    assert s["power_mean_w"].tolist() == pytest.approx([304.5, 314.5])
    assert s["temperature_max_c"].tolist() == [68.0, 88.0]
    assert s.loc[0, "sm_clock_mean_mhz"] == 1980.0
    assert s.loc[1, "sm_clock_mean_mhz"] == pytest.approx((6 * 1200 + 4 * 1980) / 10)
    assert s["kernel_busy_share"].isna().all()  # no kernels: no claim


def test_throttle_shares_count_each_reason_bit() -> None:
    s = sample_summary(two_gpus()).set_index("device")
    one = s.loc[1]
    assert one["throttle_samples"] == 10
    assert one["throttle_gpu_idle"] == pytest.approx(0.2)
    assert one["throttle_app_clocks"] == 0.0
    assert one["throttle_sw_power_cap"] == pytest.approx(0.3)
    assert one["throttle_hw_slowdown"] == pytest.approx(0.3)
    assert one["throttle_sw_thermal"] == 0.0
    assert one["throttle_hw_thermal"] == pytest.approx(0.2)
    assert one["throttle_hw_power_brake"] == 0.0
    # power: the 3 power caps and the hw slowdown without a thermal bit; sync boost is neither
    assert one["power_throttled_share"] == pytest.approx(0.4)
    assert one["thermal_throttled_share"] == pytest.approx(0.2)
    assert one["sm_clock_throttled_mhz"] == 1200.0
    assert one["sm_clock_unthrottled_mhz"] == 1980.0
    assert s.loc[0, "power_throttled_share"] == 0.0
    assert np.isnan(s.loc[0, "sm_clock_throttled_mhz"])  # never throttled


def test_utilization_mean_and_low_share_are_weighted_by_time() -> None:
    """A skipped stretch: the last sample describes the 800 ms since the one before."""
    times, utils = [0, 100, 200, 1000], [0.0, 0.0, 0.0, 100.0]
    rows = [(None, 0, T0 + t * MS, "gpu_util", u, "%") for t, u in zip(times, utils, strict=True)]
    s = sample_summary(Trace(samples=_samples(rows))).iloc[0]
    assert s["gpu_util_mean_pct"] == pytest.approx(100 * 800 / 1100)  # first: the median 100
    assert s["gpu_util_median_pct"] == 0.0
    assert s["low_util_share"] == pytest.approx(300 / 1100)


def test_kernel_busy_share_is_the_kernels_union_over_the_sampled_span() -> None:
    kernels = [kernel(T0 - 50 * MS, T0, device=0),  # before the span: not counted
               kernel(T0, T0 + 300 * MS, device=0, rank=0),
               kernel(T0 + 200 * MS, T0 + 450 * MS, device=0, rank=1)]  # overlaps: once
    t = two_gpus(kernels)
    s = sample_summary(t).set_index("device")
    assert s.loc[0, "kernel_busy_share"] == pytest.approx(450 / 900)  # any rank: NA samples
    assert np.isnan(s.loc[1, "kernel_busy_share"])  # device 1 ran no kernel


def test_samples_with_a_rank_count_only_that_ranks_kernels() -> None:
    rows = [r for i in range(10) for r in _rows(0, i, rank=1)]
    kernels = [kernel(T0, T0 + 300 * MS, device=0, rank=0),
               kernel(T0 + 600 * MS, T0 + 690 * MS, device=0, rank=1)]
    s = sample_summary(trace(samples=_samples(rows), kernels=kernels))
    assert s["rank"].tolist() == [1]
    assert s["kernel_busy_share"].iloc[0] == pytest.approx(90 / 900)


def test_other_series_and_other_units_are_left_out() -> None:
    rows = [(None, pd.NA, T0, "memory.PARAMETER", 5e9, "bytes"),  # a torch memory timeline
            (None, 0, T0, "gpu_util", 0.5, "fraction"),  # not NVML's unit
            (None, 0, T0 + STEP, "power", 250.0, "W")]
    s = sample_summary(Trace(samples=_samples(rows)))
    assert s["device"].tolist() == [0] and s["samples"].tolist() == [1]
    assert np.isnan(s["gpu_util_mean_pct"].iloc[0]) and s["power_mean_w"].iloc[0] == 250.0
    assert s["mem_used_peak_bytes"].isna().all() and s["throttle_samples"].tolist() == [0]


# -- findings ---------------------------------------------------------------------------------


def test_power_throttling_in_over_a_fifth_of_samples_is_a_finding() -> None:
    f = findings(two_gpus())
    assert list(f.columns) == list(COLUMNS)
    assert len(f) == 1  # thermal is 20 %: not over the threshold
    row = f.iloc[0]
    assert row["cause"] == "throttle" and row["where"] == "GPU 1" and row["count"] == 4
    assert row["lost_ns"] == 0 and row["advice"] == ADVICE["throttle_power"]
    assert row["evidence"] == ("power throttling in 40% of 10 NVML samples (sw power cap 30%, "
                               "hw slowdown 30%); SM clock 1200 MHz while throttled vs "
                               "1980 MHz otherwise; up to 88 °C; 314 W on average")
    assert "nvidia-smi -q -d PERFORMANCE" in row["advice"]


def test_a_lower_threshold_also_reports_the_thermal_throttling() -> None:
    f = findings(two_gpus(), throttle_share=0.1)
    assert f["advice"].tolist() == [ADVICE["throttle_thermal"], ADVICE["throttle_power"]]
    thermal = f.iloc[0]
    assert thermal["count"] == 2 and thermal["where"] == "GPU 1"
    assert thermal["evidence"].startswith("thermal throttling in 20% of 10 NVML samples "
                                          "(hw thermal 20%, hw slowdown 30%)")
    assert "cooling" in thermal["advice"]


def test_changing_a_returned_summary_leaves_the_findings_alone() -> None:
    t = two_gpus()
    summary, rows = sample_summary(t), gpu_samples.nvml_rows(t)  # computed once, copied out
    summary["power_throttled_share"] = 0.0
    rows["value"] = 0.0
    assert len(findings(t)) == 1
    assert sample_summary(t)["power_mean_w"].tolist() == pytest.approx([304.5, 314.5])


def test_findings_name_the_rank_when_samples_have_one() -> None:
    rows = [r for i in range(10) for r in _rows(1, i, rank=2)]
    assert findings(Trace(samples=_samples(rows)))["where"].tolist() == ["rank 2 · GPU 1"]


# -- figure -----------------------------------------------------------------------------------


def _yaxis_titles(fig: Any) -> list[str]:
    layout = fig.to_dict()["layout"]
    axes = sorted((k for k in layout if re.fullmatch(r"yaxis\d*", k)),
                  key=lambda k: int(k[5:] or 1))
    return [layout[k]["title"]["text"] for k in axes]


def test_figure_has_a_row_per_group_and_a_line_per_gpu_and_metric() -> None:
    fig = samples_figure(two_gpus())
    assert fig is not None
    assert _yaxis_titles(fig) == ["utilization (%)", "memory (GiB)", "power (W)",
                                  "temperature (°C)", "SM clock (MHz)",
                                  "PCIe / NVLink (GB/s)"]
    data = fig.to_dict()["data"]
    assert len(data) == 2 * 8  # 2 GPUs x (gpu/mem util, used/total, power, temp, clock, tx)
    names = [t["name"] for t in data]
    assert names[:4] == ["GPU 0 GPU util", "GPU 0 memory util", "GPU 1 GPU util",
                         "GPU 1 memory util"]
    memory = {t["name"]: plotly_array(t["y"]) for t in data if "memory " in t["name"]
              and "util" not in t["name"]}
    assert memory["GPU 0 memory used"].tolist() == [float(i) for i in range(1, 11)]  # GiB
    assert memory["GPU 1 memory total"].tolist() == [80.0] * 10
    tx = next(t for t in data if t["name"] == "GPU 1 PCIe tx")
    assert plotly_array(tx["y"]).tolist() == [2.0] * 10 and tx["yaxis"] == "y6"  # GB/s, last row
    assert {t["xaxis"] for t in data} <= {f"x{i}" if i > 1 else "x" for i in range(1, 7)}


def test_x_axis_counts_seconds_from_the_traces_first_event() -> None:
    t = two_gpus([kernel(T0 - 2_000 * MS, T0 - 1_000 * MS)])
    fig = samples_figure(t)
    assert fig is not None
    x = plotly_array(fig.to_dict()["data"][0]["x"])
    assert x.tolist() == pytest.approx([2.0 + 0.1 * i for i in range(10)])


def test_every_line_hovers_with_its_unit() -> None:
    fig = samples_figure(two_gpus())
    assert fig is not None
    units = {"util": "%", "memory used": "GiB", "memory total": "GiB", "power": "W",
             "temperature": "°C", "SM clock": "MHz", "PCIe": "GB/s"}
    for line in fig.to_dict()["data"]:
        unit = next(u for key, u in units.items() if key in line["name"])
        assert f"%{{y:.4g}} {unit}<extra>" in line["hovertemplate"], line["name"]
        assert line["hovertemplate"].startswith(line["name"] + "<br>")


def test_long_series_are_bucketed_and_keep_their_peaks() -> None:
    n = 10_001
    power = np.full(n, 200.0)
    power[7_777] = 650.0  # one spike
    rows = [(None, 0, T0 + i * STEP, "power", float(p), "W") for i, p in enumerate(power)]
    fig = samples_figure(Trace(samples=_samples(rows)), max_points=2000)
    assert fig is not None
    (line,) = fig.to_dict()["data"]
    y, custom = plotly_array(line["y"]), plotly_array(line["customdata"])
    assert len(y) == 2000 and y.max() == 650.0 and np.count_nonzero(y == 650.0) == 1
    assert custom[:, 1].sum() == n  # every sample in exactly one bucket
    spike = int(np.argmax(y))
    assert plotly_array(line["x"])[spike] == pytest.approx(7_777 * 0.1)  # drawn at the spike's time
    assert custom[spike, 0] == pytest.approx((650.0 + 4 * 200.0) / 5)  # the bucket's mean
    assert "max %{y:.4g} W of %{customdata[1]} samples" in line["hovertemplate"]


def test_bucketed_gives_peak_time_mean_and_size_of_each_bucket() -> None:
    ts = np.arange(6, dtype=np.int64) * 10
    ts_out, peak, mean, size = bucketed(ts, np.array([1.0, 5.0, 2.0, 3.0, 9.0, 4.0]), 3)
    assert ts_out.tolist() == [10, 30, 40]
    assert peak.tolist() == [5.0, 3.0, 9.0] and mean.tolist() == [3.0, 2.5, 6.5]
    assert size.tolist() == [2, 2, 2]
    short = bucketed(ts, np.ones(6), 10)
    assert short[0] is ts and short[3].tolist() == [1] * 6


# -- contracts --------------------------------------------------------------------------------


def test_empty_samples_give_empty_typed_frames_and_no_figure() -> None:
    empty, full = sample_summary(Trace()), sample_summary(two_gpus())
    assert empty.empty and list(empty.columns) == list(SUMMARY_COLUMNS) == list(full.columns)
    assert empty.dtypes.astype(str).tolist() == full.dtypes.astype(str).tolist()
    assert findings(Trace()).empty and list(findings(Trace()).columns) == list(COLUMNS)
    assert samples_figure(Trace()) is None
    only_torch = _samples([(None, pd.NA, T0, "memory.PARAMETER", 5e9, "bytes")])
    assert samples_figure(Trace(samples=only_torch)) is None
    only_bits = _samples([(None, 0, T0, "throttle_reasons", 4.0, "bitmask")])
    assert samples_figure(Trace(samples=only_bits)) is None  # nothing to draw as a line


@pytest.mark.parametrize("function", [gpu_samples.nvml_rows, sample_summary, findings,
                                      samples_figure, bucketed], ids=lambda f: f.__name__)
def test_every_public_function_opens_with_a_three_line_example(function: Any) -> None:
    doc = function.__doc__ or ""
    assert re.search(r"\n\n((?:        \S.*\n){3})\n", doc), function.__name__
