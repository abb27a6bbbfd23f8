"""The ncu kernel x metric heatmap: its rows and cells against kernel_metrics on every real
report, health scores at each threshold edge, missing columns named and never zero-filled,
the size bound on a 10,000-kernel report, and input strings kept as escaped data."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpudiag.analyzers.kernels.metrics import kernel_metrics
from gpudiag.errors import InputError
from gpudiag.reports.ncu import heatmap as nh
from gpudiag.reports.ncu.heatmap import METRICS, figure, health, kernel_table
from gpudiag.trace import Trace
from tests.test_kernel_metrics import NCU, metric_trace
from tests.test_ncu import load  # the reports, read once per session

SMALL_GRID_REPORT = "rtx4090_smem_square_9kernels_smallgrid.ncu-rep"
DUR = "gpu__time_duration.sum"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
L2 = "lts__t_sector_hit_rate.pct"
WAVES = "launch__waves_per_multiprocessor"


def heat(fig: Any) -> dict[str, Any]:
    data = fig.to_dict()["data"]
    assert len(data) == 1 and data[0]["type"] == "heatmap"
    return dict(data[0])


def shown_columns(fig: Any) -> list[str]:
    by_label = {nh._column_label(c): c for c in METRICS}
    return [by_label[x] for x in heat(fig)["x"]]


def close(a: Any, b: Any) -> bool:
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return (a is None or pd.isna(a)) and (b is None or pd.isna(b))
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)


# -- every real report -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NCU)
def test_one_row_per_kernel_name_with_kernel_metrics_values(name: str) -> None:
    trace = load(name)
    km = kernel_metrics(trace)
    fig = figure(trace, top=None)
    h = heat(fig)
    assert len(h["y"]) == km["name"].nunique() == len(set(h["y"]))
    table = kernel_table(trace)
    columns = shown_columns(fig)
    for i, full in enumerate(table["name"]):
        launches = km[km["name"] == full]
        assert table["launches"][i] == len(launches)
        for j, column in enumerate(columns):
            x = launches[column].astype("float64")
            w = launches["duration_ns"].astype("float64")
            ok = x.notna() & w.notna()
            expected = np.average(x[ok], weights=w[ok]) if ok.any() else np.nan
            assert close(h["customdata"][i][j], expected), (full, column)


@pytest.mark.parametrize("name", NCU)
def test_per_launch_cells_equal_kernel_metrics_exactly(name: str) -> None:
    trace = load(name)
    km = kernel_metrics(trace).set_index("kernel_id")
    fig = figure(trace, per_launch=True, top=None)
    h = heat(fig)
    table = kernel_table(trace, per_launch=True)
    assert len(h["y"]) == len(km) == len(set(h["y"]))
    for i, kernel_id in enumerate(table["kernel_id"]):
        for j, column in enumerate(shown_columns(fig)):
            assert close(h["customdata"][i][j], km.at[kernel_id, column]), (kernel_id, column)


@pytest.mark.parametrize("name", NCU)
def test_missing_columns_are_dropped_and_named_never_zero(name: str) -> None:
    trace = load(name)
    missing = kernel_metrics(trace).attrs["missing"]
    fig = figure(trace)
    columns = shown_columns(fig)
    title = fig.layout.title.text
    for column in METRICS:
        if column in missing:
            assert column not in columns and METRICS[column].label in title
        else:
            assert column in columns
    for j in range(len(columns)):
        assert any(row[j] is not None for row in heat(fig)["customdata"])


def test_volta_basic_set_reports_its_missing_hit_rates() -> None:
    fig = figure(load("v100_jacobi_basic.ncu-rep"))
    assert "not collected" in fig.layout.title.text
    assert "L1 hit rate, L2 hit rate" in fig.layout.title.text
    assert not {"l1_hit_rate_pct", "l2_hit_rate_pct"} & set(shown_columns(fig))
    assert "sm_throughput_pct" in shown_columns(fig)


def test_small_grid_report_shows_every_kernel_under_one_wave_as_unhealthy() -> None:
    trace = load(SMALL_GRID_REPORT)
    fig = figure(trace)
    h = heat(fig)
    j = shown_columns(fig).index("waves_per_sm")
    assert len(h["y"]) == 9
    for i in range(9):
        assert h["customdata"][i][j] < 1 and h["z"][i][j] >= 0.5
        assert "unhealthy" in h["hovertext"][i][j]


def test_rule_findings_of_a_kernel_are_on_its_hover() -> None:
    trace = load("t4_matadd_setfull.ncu-rep")
    table = kernel_table(trace)
    assert "Achieved Occupancy" in table["rules"][0]
    assert "Roofline Analysis" not in table["rules"][0]  # an "ok" result is no finding
    assert all("Achieved Occupancy" in cell for cell in heat(figure(trace))["hovertext"][0])


# -- health at the threshold edges -------------------------------------------------------------


def scores(**columns: float) -> dict[str, Any]:
    table = pd.DataFrame({c: pd.array([v], dtype="Float64") for c, v in columns.items()})
    return {c: (None if pd.isna(v) else float(v)) for c, v in health(table).iloc[0].items()}


@pytest.mark.parametrize(("values", "column", "marked"), [
    ({"l2_hit_rate_pct": 61.9}, "l2_hit_rate_pct", True),
    ({"l2_hit_rate_pct": 62.0}, "l2_hit_rate_pct", False),
    ({"theoretical_occupancy_pct": 79.9}, "theoretical_occupancy_pct", True),
    ({"theoretical_occupancy_pct": 80.0}, "theoretical_occupancy_pct", False),
    ({"waves_per_sm": 0.99}, "waves_per_sm", True),
    ({"waves_per_sm": 1.0}, "waves_per_sm", False),
    ({"waves_per_sm": 1.5}, "waves_per_sm", True),  # Tail Effect: 1 full wave + a partial
    ({"waves_per_sm": 4.5}, "waves_per_sm", True),
    ({"waves_per_sm": 5.5}, "waves_per_sm", False),  # ncu reports no tail at 5 full waves
    ({"achieved_occupancy_pct": 69.9, "theoretical_occupancy_pct": 80.0},
     "achieved_occupancy_pct", True),
    ({"achieved_occupancy_pct": 70.0, "theoretical_occupancy_pct": 80.0},
     "achieved_occupancy_pct", False),
    # SM throughput is low only while memory is low too (ncu's Latency Issue)
    ({"sm_throughput_pct": 59.9, "memory_throughput_pct": 59.9}, "sm_throughput_pct", True),
    ({"sm_throughput_pct": 10.0, "memory_throughput_pct": 60.0}, "sm_throughput_pct", False),
    ({"sm_throughput_pct": 60.0, "memory_throughput_pct": 10.0}, "sm_throughput_pct", False),
    ({"sm_throughput_pct": 59.9, "memory_throughput_pct": 49.9}, "memory_throughput_pct",
     True),
    ({"sm_throughput_pct": 59.9, "memory_throughput_pct": 50.0}, "memory_throughput_pct",
     False),
    ({"sm_throughput_pct": 60.0, "memory_throughput_pct": 5.0}, "memory_throughput_pct",
     False),  # a compute-bound kernel rightly leaves memory idle
])
def test_health_marks_each_metric_past_its_threshold(values: dict[str, float], column: str,
                                                     marked: bool) -> None:
    score = scores(**values)[column]
    assert score is not None and (score >= 0.5 if marked else score == 0.0)


def test_health_rises_to_one_at_the_worst_value_and_is_na_without_its_inputs() -> None:
    assert scores(l2_hit_rate_pct=0.0)["l2_hit_rate_pct"] == 1.0
    assert scores(waves_per_sm=0.0)["waves_per_sm"] == 1.0
    assert scores(l2_hit_rate_pct=31.0)["l2_hit_rate_pct"] == pytest.approx(0.75)
    assert scores(sm_throughput_pct=5.0)["sm_throughput_pct"] is None  # no partner
    assert scores(achieved_occupancy_pct=5.0)["achieved_occupancy_pct"] is None
    assert scores(regs_per_thread=255.0, l1_hit_rate_pct=0.0) == {
        "l1_hit_rate_pct": None, "regs_per_thread": None}  # context, not scored


# -- grouping, sorting, options ----------------------------------------------------------------


def test_grouped_values_are_duration_weighted_over_launches_that_have_them() -> None:
    trace = metric_trace({DUR: 1000.0, SM: 10.0, L2: 90.0}, {DUR: 3000.0, SM: 50.0},
                         {DUR: 500.0, SM: 99.0}, names=["a(int)", "a(int)", "b(int)"])
    table = kernel_table(trace)
    assert list(table["label"]) == ["a ×2", "b"] and list(table["launches"]) == [2, 1]
    assert table["sm_throughput_pct"][0] == pytest.approx(40.0)
    assert table["l2_hit_rate_pct"][0] == pytest.approx(90.0)  # the other launch lacks it
    assert table["duration_ns"][0] == 4000


def test_sort_by_time_health_or_a_column_and_top_summarized_in_title() -> None:
    trace = metric_trace({DUR: 100.0, WAVES: 0.1}, {DUR: 300.0, WAVES: 8.0},
                         {DUR: 200.0, WAVES: 2.5})
    assert list(kernel_table(trace)["short_name"]) == ["k1", "k2", "k0"]
    # small grid (0.95) before a tail (0.5) before healthy
    assert list(kernel_table(trace, sort="health")["short_name"]) == ["k0", "k2", "k1"]
    assert list(kernel_table(trace, sort="waves_per_sm")["short_name"]) == ["k1", "k2", "k0"]
    assert list(kernel_table(trace, sort="short_name")["short_name"]) == ["k0", "k1", "k2"]
    fig = figure(trace, top=1)
    assert len(heat(fig)["y"]) == 1
    assert "top 1 shown; 2 more hold 50.0% of GPU time" in fig.layout.title.text


def test_metrics_option_picks_columns_and_bad_options_say_what_to_use() -> None:
    trace = metric_trace({DUR: 100.0, WAVES: 0.1, SM: 5.0})
    fig = figure(trace, metrics=["waves_per_sm", "regs_per_thread"])
    assert shown_columns(fig) == ["waves_per_sm", "regs_per_thread"]
    with pytest.raises(InputError, match="choose from"):
        kernel_table(trace, metrics=["l3_hit_rate"])
    with pytest.raises(InputError, match="use time, health"):
        kernel_table(trace, sort="nope")


def test_empty_trace_gives_an_empty_figure() -> None:
    fig = figure(Trace())
    assert heat(fig)["y"] == [] and "No Nsight Compute" in fig.layout.title.text
    assert len(kernel_table(Trace())) == 0


# -- size and escaping -------------------------------------------------------------------------


def big_trace(n: int) -> Trace:
    """n distinct long-named kernels with every heatmap metric, built as whole columns."""
    ids = np.arange(n)
    names = [f"void ns::gemm_kernel<{i}, cutlass::Shape<128, 256, 64>, "
             f"{'float, ' * 20}>(Params{i} const&, float*, int)" for i in ids]
    rng = np.random.default_rng(0)
    metric_names = [DUR, SM, WAVES, L2, "l1tex__t_sector_hit_rate.pct",
                    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                    "sm__warps_active.avg.pct_of_peak_sustained_active",
                    "sm__maximum_warps_per_active_cycle_pct"]
    metrics = pd.DataFrame({
        "kernel_id": np.tile(ids, len(metric_names)), "device": 0,
        "name": np.tile(names, len(metric_names)),
        "metric": np.repeat(metric_names, n),
        "value": rng.uniform(0.5, 100.0, n * len(metric_names)),
        "unit": np.repeat(["nsecond"] + ["%"] * (len(metric_names) - 1), n),
    })
    kernels = pd.DataFrame({"kernel_id": ids, "device": 0, "name": names, "start_ns": 0,
                            "end_ns": 0, "grid_x": 64, "grid_y": 1, "grid_z": 1,
                            "block_x": 256, "block_y": 1, "block_z": 1,
                            "regs_per_thread": 96, "smem_bytes": 49152})
    return Trace(meta={"timeline": False}, kernels=kernels, metrics=metrics,
                 devices=pd.DataFrame([{"device": 0, "sm_count": 132}]))


@pytest.mark.parametrize("per_launch", [False, True])
def test_a_10000_kernel_report_stays_under_5_mb(per_launch: bool) -> None:
    trace = big_trace(10_000)
    started = time.perf_counter()
    fig = figure(trace, per_launch=per_launch)
    size = len(fig.to_json())
    assert size < 5_000_000, size
    assert time.perf_counter() - started < 30
    assert len(heat(fig)["y"]) == 50
    assert "top 50 shown; 9,950 more" in fig.layout.title.text


def test_a_script_kernel_name_is_only_escaped_data() -> None:
    evil = "<script>alert(1)</script>"
    trace = metric_trace({DUR: 100.0, SM: 5.0, WAVES: 0.5}, names=[evil])
    fig = figure(trace)
    h = heat(fig)
    assert h["y"] == ["&lt;script&gt;alert&lt;/script&gt;"]  # the short form: no "(1)"
    assert all("&lt;script&gt;alert(1)&lt;/script&gt;" in cell for cell in h["hovertext"][0])
    assert evil not in repr(fig.to_dict())
    assert "script" not in repr(fig.to_dict()["layout"])
    assert "<script>alert" not in fig.to_json()
    assert "<script>alert" not in fig.to_html(include_plotlyjs=False)


def test_every_public_function_opens_with_a_three_line_example() -> None:
    for function in (kernel_table, health, figure):
        doc = function.__doc__ or ""
        assert re.search(r"\n\n((?:        \S.*\n){3})\n", doc), function.__name__


# -- reads at a glance (issue 11) ------------------------------------------------------------


def test_a_kernel_without_any_metric_says_why_in_its_row() -> None:
    """ncu recorded nothing for vectorized_blocktiling: its row is not a row of bare 'n/a'
    cells but one line across it saying so, and the same on hover."""
    fig = figure(load("a10g_esmm_4kernels_default.ncu-rep"))
    h = heat(fig)
    row = next(i for i, y in enumerate(h["y"]) if y.startswith("vectorized_blocktiling"))
    assert h["text"][row] == [""] * len(h["x"])
    assert all(nh.NO_METRICS in cell for cell in h["hovertext"][row])
    notes = [(a.text, a.y, a.yref) for a in fig.layout.annotations]
    assert notes == [(nh.NO_METRICS, row, "y")]
    others = [t for i, t in enumerate(h["text"]) if i != row]
    assert all("" not in cells for cells in others)  # measured rows keep their values


def test_health_key_is_a_bar_under_the_rows_and_the_figure_grows_with_them() -> None:
    """Three labels on a 420 px horizontal bar never collide, however few the rows; the
    figure is its title, column labels, rows and key, with no fixed band left over."""
    one = figure(load("a100pcie_selfjoin_setfull_ncu2022.ncu-rep"))
    nine = figure(load(SMALL_GRID_REPORT))
    for fig in (one, nine):
        bar = fig.data[0].colorbar
        assert (bar.orientation, bar.lenmode, bar.len) == ("h", "pixels", 420)
        assert list(bar.ticktext) == ["healthy", "past threshold", "far off"]
        rows = len(fig.data[0].y)
        assert fig.layout.height == fig.layout.margin.t + fig.layout.margin.b + 24 * rows
        assert bar.y == pytest.approx(-10 / (24 * rows))  # just under the last row
    assert len(one.data[0].y) == 1 and len(nine.data[0].y) == 9
