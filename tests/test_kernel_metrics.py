"""Per-kernel Nsight Compute metrics: the real reports against ncu_report read directly,
ncu's SOL bottleneck decision at every threshold edge on synthetic metric tables, ncu's own
rule results, and the findings built from both."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd
import pytest

from gpudiag.analyzers import findings as fnd
from gpudiag.analyzers.kernels import metrics as km
from gpudiag.analyzers.kernels.metrics import (
    BALANCED,
    HIGH,
    HIGH_COMPUTE,
    HIGH_MEMORY,
    LATENCY,
    SMALL_GRID,
    findings,
    kernel_metrics,
    rules,
)
from gpudiag.trace import Trace
from tests.conftest import fixtures
from tests.test_ncu import _report, load  # the reports, read once per session

NCU = [p.name for p in fixtures("ncu/*.ncu-rep")] or ["(shared fixtures absent)"]
SMALL_GRID_REPORT = "rtx4090_smem_square_9kernels_smallgrid.ncu-rep"
NS_PER = {"ns": 1, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}

#: the metric each column must equal, written out here rather than taken from the module
RAW_NAMES = {
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1_hit_rate_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "regs_per_thread": "launch__registers_per_thread",
}


def raw(action: Any, name: str) -> float | None:
    metric = action.metric_by_name(name)
    value = None if metric is None else metric.value()
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def raw_duration_ns(action: Any) -> float | None:
    metric = action.metric_by_name("gpu__time_duration.sum")
    value = raw(action, "gpu__time_duration.sum")
    return None if value is None else value * NS_PER[metric.unit()]


def assert_same(ours: Any, expected: float | None, what: str) -> None:
    if expected is None:
        assert pd.isna(ours), what
    else:
        assert ours == pytest.approx(expected, abs=0.5 if what == "duration_ns" else 1e-9), what


# -- every real report -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NCU)
def test_one_row_per_profiled_kernel_equal_to_the_raw_metrics(name: str) -> None:
    actions = _report(name)[1]
    table = kernel_metrics(load(name))
    assert table["kernel_id"].tolist() == list(range(len(actions)))
    for i, action in enumerate(actions):
        row = table.iloc[i]
        assert row["name"] == action.name(action.NameBase_DEMANGLED)
        assert_same(row["duration_ns"], raw_duration_ns(action), "duration_ns")
        for column, metric in RAW_NAMES.items():
            assert_same(row[column], raw(action, metric), f"{column} of kernel {i}")
        static = raw(action, "launch__shared_mem_per_block_static")
        dynamic = raw(action, "launch__shared_mem_per_block_dynamic")
        assert_same(row["smem_bytes"], None if static is None else static + dynamic, "smem")
        assert row["sm_count"] == raw(action, "device__attribute_multiprocessor_count")


@pytest.mark.parametrize("name", NCU)
def test_missing_lists_exactly_the_na_metric_columns(name: str) -> None:
    table = kernel_metrics(load(name))
    metric_columns = list(km.METRIC_ALIASES)
    for _, row in table.iterrows():
        na = [c for c in metric_columns if pd.isna(row[c])]
        assert row["missing"] == ",".join(na)
    assert table.attrs["missing"] == [c for c in metric_columns if table[c].isna().all()]


@pytest.mark.parametrize("name", NCU)
def test_bottleneck_agrees_with_ncus_own_sol_rule(name: str) -> None:
    table = kernel_metrics(load(name)).set_index("kernel_id")
    sol = rules(load(name))
    sol = sol[sol["rule"] == "SOLBottleneck"]
    for _, rule in sol.iterrows():
        ours = table.at[rule["kernel_id"], "bottleneck"]
        if rule["type"] == "error":  # ncu could not evaluate it: neither can we
            assert pd.isna(ours)
        elif pd.notna(rule["title"]):
            assert ours == rule["title"]
        else:  # older reports (V100 basic) give the message without a title
            assert ours == LATENCY and "latency issues" in rule["message"]


@pytest.mark.parametrize("name", NCU)
def test_achieved_occupancy_flag_is_set_where_ncus_rule_fired(name: str) -> None:
    table = kernel_metrics(load(name)).set_index("kernel_id")
    r = rules(load(name))
    for kernel_id in r.loc[r["rule"] == "AchievedOccupancy", "kernel_id"]:
        assert table.at[kernel_id, "achieved_occupancy_gap"]


@pytest.mark.parametrize("name", NCU)
def test_rules_flatten_every_rule_result(name: str) -> None:
    trace = load(name)
    r = rules(trace)
    assert len(r) == len(trace.meta["ncu_rules"])
    assert r.dtypes.astype(str).to_dict() == {c: str(pd.Series(dtype=t).dtype)
                                              for c, t in km.RULE_COLUMNS.items()}
    names = trace.kernels.set_index("kernel_id")["name"].astype(str)
    assert (r["name"] == r["kernel_id"].map(names)).all()


@pytest.mark.parametrize("name", NCU)
def test_findings_have_the_findings_shape_and_known_advice(name: str) -> None:
    f = findings(load(name))
    assert list(f.columns) == list(fnd.COLUMNS)
    advice = {p.advice for p in km.PROBLEMS.values()}
    assert set(f["advice"]) <= advice
    assert f["lost_ns"].is_monotonic_decreasing
    assert set(f["cause"]) <= {"small_grid", "kernel"}


# -- what individual reports are known to hold ---------------------------------------------


def test_small_grid_report_flags_all_nine_kernels() -> None:
    table = kernel_metrics(load(SMALL_GRID_REPORT))
    assert len(table) == 9
    assert (table["grid_size"] == 1).all() and (table["sm_count"] == 128).all()
    # 1024-thread blocks fit once per SM, so one block is 1/128 of a wave
    assert table["waves_per_sm"].tolist() == [1 / 128] * 9
    assert table["small_grid"].all()
    # a custom-sections report without Speed of Light: ncu could not decide, nor do we
    assert table["bottleneck"].isna().all()
    assert "sm_throughput_pct" in table.attrs["missing"]
    f = findings(load(SMALL_GRID_REPORT))
    assert (f["cause"] == "small_grid").all() and len(f) == 9
    assert set(f["where"]) == set(table["short_name"])
    assert (f["lost_ns"] == 0).all()  # the report holds no rule results to price them
    assert (f["advice"] == fnd.ADVICE["small_grid"]).all()
    assert f["evidence"].str.contains("0.00781 waves per SM").all()


def test_volta_basic_set_lists_its_missing_memory_columns() -> None:
    table = kernel_metrics(load("v100_jacobi_basic.ncu-rep"))
    assert table.attrs["missing"] == ["l1_hit_rate_pct", "l2_hit_rate_pct"]
    assert table.at[0, "missing"] == "l1_hit_rate_pct,l2_hit_rate_pct"
    assert pd.isna(table.at[0, "low_l2_hit"])  # unknown, not False
    assert table.at[0, "dram_throughput_pct"] == pytest.approx(25.885, abs=1e-3)
    assert table.at[0, "bottleneck"] == LATENCY


def test_lost_time_uses_only_global_speedups() -> None:
    t4 = findings(load("t4_matadd_setfull.ncu-rep"))  # AchievedOccupancy: GLOBAL 11.6 %
    gap = t4[t4["evidence"].str.startswith("achieved occupancy")]
    assert gap["lost_ns"].tolist() == [round(52576 * 11.607055023609657 / 100)]
    laptop = findings(load("rtx3050laptop_filter_nvtx.ncu-rep"))  # the same rule, LOCAL
    assert laptop["evidence"].str.startswith("achieved occupancy").any()
    assert (laptop["lost_ns"] == 0).all()


def test_repeated_launches_are_one_finding_per_kernel_name() -> None:
    f = findings(load("a100pcie_selfjoin_setfull_ncu2022.ncu-rep"))
    latency = f[f["evidence"].str.startswith("Latency Issue")]
    assert latency["count"].tolist() == [4]
    assert latency["evidence"].iloc[0].endswith("(mean of 4 launches)")


# -- synthetic metric tables: exact answers ---------------------------------------------------


SM, MEM, WAVES = (RAW_NAMES["sm_throughput_pct"], RAW_NAMES["memory_throughput_pct"],
                  RAW_NAMES["waves_per_sm"])


def metric_trace(*kernels: dict[str, float], units: dict[str, str] | None = None,
                 ncu_rules: list[dict[str, Any]] | None = None, names: list[str] | None = None,
                 sm_count: int = 100) -> Trace:
    """A Trace as the ncu reader makes it: one kernels row and long metrics rows per dict."""
    names = names or [f"k{i}(int)" for i in range(len(kernels))]
    rows = [{"kernel_id": i, "device": 0, "name": names[i], "metric": metric, "value": value,
             "unit": (units or {}).get(metric, "nsecond" if "duration" in metric else "%")}
            for i, metrics in enumerate(kernels) for metric, value in metrics.items()]
    launches = [{"kernel_id": i, "device": 0, "name": names[i], "start_ns": 0, "end_ns": 0,
                 "grid_x": 8, "grid_y": 1, "grid_z": 1, "block_x": 128, "block_y": 1,
                 "block_z": 1, "regs_per_thread": 32, "smem_bytes": 0}
                for i in range(len(kernels))]
    return Trace(meta={"ncu_rules": ncu_rules or [], "timeline": False},
                 kernels=pd.DataFrame(launches), metrics=pd.DataFrame(rows),
                 devices=pd.DataFrame([{"device": 0, "sm_count": sm_count}]))


EDGES = [
    # (sm %, memory %, waves, decision): every threshold on both sides
    (59.9, 10.0, 2.0, LATENCY), (60.0, 10.0, 2.0, HIGH_COMPUTE),
    (10.0, 59.9, 2.0, LATENCY), (10.0, 60.0, 2.0, HIGH_MEMORY),
    (59.9, 59.9, 0.99, SMALL_GRID), (59.9, 59.9, 1.0, LATENCY),
    (60.0, 59.9, 0.5, BALANCED),  # not both below 60: waves no longer matter
    (79.9, 10.0, 2.0, HIGH_COMPUTE), (80.0, 10.0, 2.0, HIGH),
    (10.0, 79.9, 2.0, HIGH_MEMORY), (10.0, 80.0, 2.0, HIGH), (80.0, 80.0, 0.1, HIGH),
    (70.0, 60.1, 2.0, BALANCED), (70.0, 60.0, 2.0, HIGH_COMPUTE),  # difference 9.9 / 10
    (60.1, 70.0, 2.0, BALANCED), (60.0, 70.0, 2.0, HIGH_MEMORY),
]


@pytest.mark.parametrize(("sm", "mem", "waves", "expected"), EDGES)
def test_sol_bottleneck_at_every_threshold_edge(sm: float, mem: float, waves: float,
                                               expected: str) -> None:
    table = kernel_metrics(metric_trace({SM: sm, MEM: mem, WAVES: waves}))
    assert table.at[0, "bottleneck"] == expected


def test_sol_bottleneck_needs_both_throughputs_but_not_waves() -> None:
    table = kernel_metrics(metric_trace({SM: 30.0, WAVES: 0.5}, {SM: 30.0, MEM: 30.0}))
    assert pd.isna(table.at[0, "bottleneck"])
    assert table.at[1, "bottleneck"] == LATENCY  # unknown waves never make a Small Grid
    assert table.at[1, "missing"] == ("duration_ns,dram_throughput_pct,l1_hit_rate_pct,"
                                      "l2_hit_rate_pct,achieved_occupancy_pct,"
                                      "theoretical_occupancy_pct,waves_per_sm")


L2, ACH, THEO = (RAW_NAMES["l2_hit_rate_pct"], RAW_NAMES["achieved_occupancy_pct"],
                 RAW_NAMES["theoretical_occupancy_pct"])
FLAG_EDGES = [
    ("low_l2_hit", {L2: 61.9}, True), ("low_l2_hit", {L2: 62.0}, False),
    ("low_memory_throughput", {MEM: 49.9}, True), ("low_memory_throughput", {MEM: 50.0}, False),
    ("small_grid", {WAVES: 0.99}, True), ("small_grid", {WAVES: 1.0}, False),
    ("achieved_occupancy_gap", {THEO: 100.0, ACH: 89.9}, True),
    ("achieved_occupancy_gap", {THEO: 100.0, ACH: 90.0}, False),
    ("low_theoretical_occupancy", {THEO: 79.9}, True),
    ("low_theoretical_occupancy", {THEO: 80.0}, False),
]


@pytest.mark.parametrize(("flag", "metrics", "expected"), FLAG_EDGES)
def test_flags_at_their_default_thresholds(flag: str, metrics: dict[str, float],
                                           expected: bool) -> None:
    value = kernel_metrics(metric_trace(metrics)).at[0, flag]
    assert not pd.isna(value) and bool(value) is expected


def test_flags_follow_their_keyword_thresholds_and_are_na_without_input() -> None:
    trace = metric_trace({L2: 55.0, MEM: 45.0})
    assert kernel_metrics(trace).at[0, "low_l2_hit"]
    relaxed = kernel_metrics(trace, l2_hit_rate_min=50.0, memory_throughput_min=40.0)
    assert not relaxed.at[0, "low_l2_hit"] and not relaxed.at[0, "low_memory_throughput"]
    assert pd.isna(relaxed.at[0, "small_grid"]) and pd.isna(relaxed.at[0, "achieved_occupancy_gap"])


def test_duration_is_scaled_by_its_unit_and_an_unknown_unit_is_na() -> None:
    dur = "gpu__time_duration.sum"
    table = kernel_metrics(metric_trace({dur: 1.5}, units={dur: "usecond"}))
    assert table.at[0, "duration_ns"] == 1500
    assert pd.isna(kernel_metrics(metric_trace({dur: 1.5}, units={dur: "fortnight"}))
                   .at[0, "duration_ns"])


def test_an_alias_fills_the_column_when_the_first_name_is_absent() -> None:
    newer = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
    table = kernel_metrics(metric_trace({newer: 42.0}))
    assert table.at[0, "dram_throughput_pct"] == 42.0


def test_empty_trace_gives_empty_typed_frames() -> None:
    table = kernel_metrics(Trace())
    assert len(table) == 0 and table.attrs["missing"] == []
    assert table.dtypes.astype(str).to_dict() == {c: str(pd.Series(dtype=t).dtype)
                                                  for c, t in km.COLUMNS.items()}
    assert len(rules(Trace())) == 0 and list(rules(Trace()).columns) == list(km.RULE_COLUMNS)
    f = findings(Trace())
    assert len(f) == 0 and list(f.columns) == list(fnd.COLUMNS)


def test_a_trace_without_metrics_has_no_profiled_kernels() -> None:
    trace = metric_trace({SM: 1.0})
    trace.metrics = None  # a Kineto-like trace: kernels but no ncu metrics
    assert len(kernel_metrics(trace)) == 0 and len(findings(trace)) == 0


def rule(kernel_id: int, rule_id: str, title: str | None, speedup: float | None,
         speedup_type: str | None = "global", **extra: Any) -> dict[str, Any]:
    return {"kernel_id": kernel_id, "rule_identifier": rule_id, "title": title,
            "type": "optimization", "speedup_type": speedup_type, "speedup": speedup, **extra}


def test_small_grid_lost_time_is_the_duration_times_ncus_global_speedup() -> None:
    dur = "gpu__time_duration.sum"
    small = {dur: 1000.0, SM: 5.0, MEM: 5.0, WAVES: 0.08, THEO: 50.0, ACH: 10.0}
    trace = metric_trace(small, small, names=["void tiny<1>(float*)"] * 2, ncu_rules=[
        rule(0, "LaunchConfiguration", "Small Grid", 92.0),
        rule(1, "LaunchConfiguration", "Small Grid", 92.0),
        rule(1, "LaunchConfiguration", "Tail Effect", 50.0),  # another problem's speedup
        rule(0, "AchievedOccupancy", None, 80.0),
    ])
    f = findings(trace)
    # occupancy problems of a small grid are left out: the grid must grow first
    assert f["cause"].tolist() == ["small_grid"]
    assert f.at[0, "lost_ns"] == 2 * 920 and f.at[0, "count"] == 2
    assert f.at[0, "where"] == "tiny<1>"
    assert f.at[0, "evidence"] == ("Small Grid: 0.08 waves per SM (< 1), a grid of 8 block(s) "
                                   "for 100 SMs (mean of 2 launches)")


def test_l2_finding_needs_a_busy_memory_system() -> None:
    busy = {L2: 40.0, MEM: 85.0, SM: 20.0}
    idle = {L2: 40.0, MEM: 30.0, SM: 20.0}
    f = findings(metric_trace(busy, idle, names=["busy()", "idle()"]))
    l2 = f[f["evidence"].str.startswith("low L2 hit rate")]
    assert l2["where"].tolist() == ["busy"]
    assert l2["advice"].tolist() == [km.ADVICE_L2]
    assert "DRAM n/a" in l2["evidence"].iloc[0]  # a metric not collected reads n/a
    assert f.loc[f["where"] == "idle", "advice"].tolist() == [km.ADVICE_LATENCY]


def test_rules_keep_speedups_and_format_focus_metrics() -> None:
    focus = [{"name": "sm__throughput.avg.pct_of_peak_sustained_elapsed", "value": 33.5336,
              "severity": 2, "info": "33.534 < 80.000"}, {"name": "Sectors", "value": None}]
    trace = metric_trace({SM: 1.0}, ncu_rules=[
        rule(0, "SOLBottleneck", "Latency Issue", None, None, focus_metrics=focus,
             message="low", section_identifier="SpeedOfLight", name="Bottleneck"),
    ])
    r = rules(trace).iloc[0]
    assert r["rule"] == "SOLBottleneck" and r["section"] == "SpeedOfLight"
    assert r["rule_name"] == "Bottleneck" and r["name"] == "k0(int)"
    assert pd.isna(r["speedup_pct"]) and pd.isna(r["speedup_type"])
    assert r["focus_metrics"] == ("sm__throughput.avg.pct_of_peak_sustained_elapsed=33.53 "
                                  "[33.534 < 80.000]; Sectors")


def test_every_public_function_opens_with_a_three_line_example() -> None:
    for function in (kernel_metrics, km.sol_bottleneck, rules, findings):
        doc = function.__doc__ or ""
        block = re.search(r"\n\n((?:        \S.*\n){3})\n", doc)
        assert block, function.__name__


def test_rule_messages_lose_ncus_link_markup() -> None:
    assert km.plain_message("use @url:fused:https://docs.nvidia.com/x/#y@ ops; see "
                            "@section:SourceCounters:Source Counters@") == \
        "use fused (https://docs.nvidia.com/x/#y) ops; see Source Counters"
