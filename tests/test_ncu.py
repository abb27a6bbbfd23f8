"""Nsight Compute reports: the real fixtures checked against what ncu_report itself says,
bad input turned into one-line errors, and the reader's rules on fake ncu_report objects."""

from __future__ import annotations

import enum
import json
import math
import os
import subprocess
import sys
import types
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpudiag.errors import InputError, MissingDependencyError
from gpudiag.readers.ncu import reader as ncu
from gpudiag.readers.ncu.metrics import (
    MetricRows,
    ValueKinds,
    axes,
    duration_ns,
    metric_value,
    peak_bandwidth,
)
from gpudiag.readers.ncu.native import NativeStderr
from gpudiag.trace import Trace
from tests.conftest import ROOT, fixture, fixtures

NCU = [p.name for p in fixtures("ncu/*.ncu-rep")] or ["(shared fixtures absent)"]
NS_PER = {"ns": 1, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


@pytest.fixture(scope="module")
def ncu_report() -> types.ModuleType:
    return pytest.importorskip("ncu_report")


@cache
def load(name: str) -> Trace:
    """Each report read once per session (the tests only look at the Trace)."""
    pytest.importorskip("ncu_report")
    return ncu.read(fixture(f"ncu/{name}"))


@cache
def _report(name: str) -> tuple[Any, list[Any]]:
    """The ncu_report context and its actions, straight from ncu_report (the actions are
    views into the context, so both are kept together)."""
    report = pytest.importorskip("ncu_report")
    context = report.load_report(str(fixture(f"ncu/{name}")))
    actions = [context.range_by_idx(r).action_by_idx(j)
               for r in range(context.num_ranges())
               for j in range(context.range_by_idx(r).num_actions())]
    return context, actions


def raw_actions(name: str) -> list[Any]:
    return _report(name)[1]


def raw(action: Any, name: str) -> Any:
    metric = action.metric_by_name(name)
    return None if metric is None else metric.value()


# -- every real report -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NCU)
def test_report_gives_one_kernel_per_profiled_result(name: str, ncu_report: Any) -> None:
    path = fixture(f"ncu/{name}")
    context = ncu_report.load_report(str(path))
    results = sum(context.range_by_idx(r).num_actions() for r in range(context.num_ranges()))
    trace = load(name)
    trace.validate()
    assert len(trace.kernels) == results > 0
    assert trace.kernels["kernel_id"].tolist() == list(range(results))
    assert trace.meta["format"] == "ncu-rep"
    assert trace.meta["timeline"] is False
    assert trace.meta["vendor"] == "nvidia"
    assert trace.meta["ranges"] == context.num_ranges()
    assert trace.meta["tool_versions"]["ncu_report"]
    assert trace.kernels["pid"].isna().all()  # ncu_report exposes no host process


@pytest.mark.parametrize("name", NCU)
def test_launch_shape_and_duration_match_the_report(name: str) -> None:
    actions = raw_actions(name)
    k = load(name).kernels
    grid = k["grid_x"] * k["grid_y"] * k["grid_z"]
    block = k["block_x"] * k["block_y"] * k["block_z"]
    dur = k["end_ns"] - k["start_ns"]
    for i, action in enumerate(actions):
        assert k.at[i, "name"] == action.name(action.NameBase_DEMANGLED)
        if raw(action, "launch__grid_size") is not None:
            assert grid[i] == raw(action, "launch__grid_size")
            assert block[i] == raw(action, "launch__block_size")
        metric = action.metric_by_name("gpu__time_duration.sum")
        value = math.nan if metric is None else metric.value()
        # a kernel ncu failed to measure has no duration (or NaN): placed with zero
        expected = 0 if math.isnan(value) else value * NS_PER[metric.unit()]
        assert dur[i] == pytest.approx(expected, abs=0.5)


@pytest.mark.parametrize("name", NCU)
def test_kernels_are_placed_back_to_back_from_zero(name: str) -> None:
    k = load(name).kernels
    assert k["start_ns"].iloc[0] == 0
    assert (k["start_ns"].iloc[1:].to_numpy() == k["end_ns"].iloc[:-1].to_numpy()).all()
    assert load(name).gpu_window_ns() is None  # no timeline: analyzers see no window


@pytest.mark.parametrize("name", NCU)
def test_every_metric_of_every_kernel_is_one_row(name: str) -> None:
    actions = raw_actions(name)
    m = load(name).metrics
    per_kernel = m.groupby("kernel_id").size().reindex(range(len(actions)), fill_value=0)
    assert per_kernel.tolist() == [len(a.metric_names()) for a in actions]
    display = m[m["metric"] == "device__attribute_display_name"]
    assert display["value"].isna().all()
    assert display["text"].notna().all()
    assert (m["name"].astype(str) == load(name).kernels["name"].astype(str)[m["kernel_id"]]
            .to_numpy()).all()


@pytest.mark.parametrize("name", NCU)
def test_devices_come_from_the_device_attributes(name: str) -> None:
    action = raw_actions(name)[0]
    trace = load(name)
    d = trace.devices
    assert len(d) == trace.kernels["device"].nunique() == 1
    assert d.at[0, "name"] == raw(action, "device__attribute_display_name")
    assert d.at[0, "sm_count"] == raw(action, "device__attribute_multiprocessor_count")
    assert d.at[0, "cc_major"] == raw(action, "device__attribute_compute_capability_major")
    assert d.at[0, "vendor"] == "nvidia"
    assert d.at[0, "max_blocks_per_sm"] == raw(action, "device__attribute_limits_max_cta_per_sm")
    assert d.at[0, "mem_bytes"] == raw(action, "device__attribute_total_memory")
    assert d.at[0, "mem_bandwidth_bytes_per_s"] > 1e11


@pytest.mark.parametrize("name", NCU)
def test_rule_results_are_compact_json(name: str) -> None:
    actions = raw_actions(name)
    rules = load(name).meta["ncu_rules"]
    assert len(rules) == sum(len(a.rule_results_as_dicts()) for a in actions)
    json.dumps(rules)
    for rule in rules:
        assert 0 <= rule["kernel_id"] < len(actions)
        assert rule["rule_identifier"] and rule["type"] in {"none", "ok", "optimization",
                                                            "warning", "error"}


# -- what each report is known to hold (MANIFEST.md) -------------------------------------------


def test_small_grid_report_has_nine_launches_below_the_sm_count() -> None:
    trace = load("rtx4090_smem_square_9kernels_smallgrid.ncu-rep")
    k = trace.kernels
    assert len(k) == 9
    assert trace.devices.at[0, "sm_count"] == 128
    assert ((k["grid_x"] * k["grid_y"] * k["grid_z"]) < 128).all()
    assert (k["smem_bytes"] == k["smem_static_bytes"] + k["smem_dynamic_bytes"]).all()


def test_repeated_launches_keep_their_names() -> None:
    k = load("rtx4090_readsegment_unroll_36launches.ncu-rep").kernels
    counts = Counter(k["name"].astype(str))
    assert len(k) == 36
    assert sorted(counts.values()) == [12, 12, 12]
    assert all(n.startswith("readOffset") for n in counts)


def test_metric_counts_may_differ_between_kernels_of_one_report() -> None:
    trace = load("a10g_esmm_4kernels_default.ncu-rep")
    per_kernel = trace.metrics.groupby("kernel_id").size()
    assert sorted(set(per_kernel)) == [247, 281]
    # the 247-metric kernel lost its launch__* metrics and its duration (ncu's own rules
    # failed on it too): it stays, with NA launch columns, placed with zero duration
    short = per_kernel.idxmin()
    assert pd.isna(trace.kernels.at[short, "grid_x"])
    assert trace.kernels.at[short, "device"] == 0  # from device__attribute_device_index
    assert trace.meta["warnings"] == {ncu.NO_DURATION: 1}


def test_basic_set_on_volta_loads_without_memory_workload_metrics() -> None:
    trace = load("v100_jacobi_basic.ncu-rep")
    metric = set(trace.metrics["metric"].astype(str))
    # the basic set keeps L2/DRAM throughput percentages (Speed of Light) but none of the
    # Memory Workload Analysis counters
    assert not metric & {"dram__bytes_read.sum", "dram__bytes_write.sum",
                         "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
                         "dram__throughput.avg.pct_of_peak_sustained_elapsed"}
    assert "lts__throughput.avg.pct_of_peak_sustained_elapsed" in metric
    k = trace.kernels.iloc[0]
    assert (k["grid_x"], k["grid_y"], k["grid_z"]) == (4096, 1, 1)  # only launch__grid_size
    assert trace.meta["warnings"] == {ncu.SHAPE_FROM_TOTAL: 1}
    assert trace.devices.at[0, "cc_major"] == 7


@pytest.mark.parametrize("name", ["rtx3050laptop_filter_nvtx.ncu-rep", "v100_jacobi_basic.ncu-rep"])
def test_nvtx_column_follows_the_recorded_nvtx_state(name: str) -> None:
    action = raw_actions(name)[0]
    state = action.nvtx_state()
    assert state is not None
    domains = [state.domain_by_id(i) for i in state.domains()]
    has_ranges = any(d.push_pop_ranges() or d.start_end_ranges() for d in domains)
    assert load(name).kernels["nvtx"].notna().iloc[0] == has_ranges


def test_metric_filter_keeps_only_the_named_metrics(ncu_report: Any) -> None:
    path = fixture("ncu/a100sxm4_silu_setfull.ncu-rep")
    wanted = ["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
    trace = ncu.read(path, metrics=wanted)
    assert sorted(set(trace.metrics["metric"].astype(str))) == sorted(wanted)
    assert len(trace.metrics) == 2 * len(trace.kernels)
    assert trace.kernels["grid_x"].notna().all()  # launch columns do not depend on the filter


# -- optional dependency and bad input ----------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)


def test_importing_gpudiag_leaves_ncu_report_unloaded() -> None:
    done = run_python("import gpudiag, gpudiag.readers.ncu.reader, sys; "
                      "assert 'ncu_report' not in sys.modules")
    assert done.returncode == 0, done.stderr


def test_missing_ncu_report_is_an_install_hint_with_exit_status_2() -> None:
    path = fixture("ncu/rtx3050laptop_filter_nvtx.ncu-rep")
    done = run_python(
        "import runpy, sys; sys.modules['ncu_report'] = None; "
        f"sys.argv = ['gpudiag', 'analyze', {str(path)!r}]; "
        "runpy.run_module('gpudiag', run_name='__main__')"
    )
    assert done.returncode == 2
    assert "pip install 'gpudiag[ncu]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_ncu_report_raises_missing_dependency(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ncu_report", None)
    with pytest.raises(MissingDependencyError, match=r"gpudiag\[ncu\]"):
        ncu.read(tmp_path / "any.ncu-rep")


def truncated(tmp_path: Path) -> Path:
    source = fixture("ncu/rtx4090_readsegment_unroll_36launches.ncu-rep")
    out = tmp_path / "truncated.ncu-rep"
    data = source.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    return out


BAD = {
    "truncated": truncated,
    "garbage": lambda tmp: _write(tmp / "garbage.ncu-rep", b"NVR\0" + bytes(range(256)) * 8),
    "empty": lambda tmp: _write(tmp / "empty.ncu-rep", b""),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", BAD)
def test_bad_report_is_an_input_error_naming_the_file(kind: str, tmp_path: Path,
                                                      ncu_report: Any) -> None:
    path = BAD[kind](tmp_path)
    with pytest.raises(InputError) as err:
        ncu.read(path)
    assert err.value.path == str(path) and err.value.fix


@pytest.mark.parametrize("kind", BAD)
def test_bad_report_is_one_line_and_exit_status_2_on_the_cli(kind: str, tmp_path: Path,
                                                             ncu_report: Any) -> None:
    path = BAD[kind](tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert str(path) in done.stderr


def test_native_stderr_is_captured_and_stripped_of_absl_prefixes(
        capfd: pytest.CaptureFixture[str]) -> None:
    with NativeStderr() as native:
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                    b"written to STDERR\n")
        os.write(2, b"E0000 00:00:1796241075.474318   10826 message_lite.cc:195] Can't parse\n")
        assert native.messages() == ["Can't parse"]
    os.write(2, b"after\n")
    assert native.messages() == ["Can't parse"]
    assert capfd.readouterr().err == "after\n"


# -- fake ncu_report objects: exact answers for the reader's rules --------------------------


class FakeMetric:
    ValueKind_UNKNOWN, ValueKind_ANY, ValueKind_STRING = 0, 1, 2
    ValueKind_FLOAT, ValueKind_DOUBLE, ValueKind_UINT32, ValueKind_UINT64 = 3, 4, 5, 6

    def __init__(self, value: Any, unit: str = "", kind: int | None = None) -> None:
        self._value, self._unit = value, unit
        self._kind = kind if kind is not None else (
            self.ValueKind_STRING if isinstance(value, str)
            else self.ValueKind_UINT64 if isinstance(value, int)
            else self.ValueKind_DOUBLE
        )

    def kind(self) -> int:
        return self._kind

    def has_value(self) -> bool:
        return self._value is not None

    def as_double(self) -> float:
        assert self._kind in (3, 4, 5, 6), "as_double on a string metric invents 0.0"
        return float(self._value)

    def as_uint64(self) -> int:
        assert self._kind in (5, 6)
        return int(self._value)

    def as_string(self) -> str:
        assert self._kind == 2
        return str(self._value)

    def unit(self) -> str:
        return self._unit


KINDS = ValueKinds.of(FakeMetric)


class FakeAction:
    NameBase_FUNCTION, NameBase_DEMANGLED = 0, 1

    def __init__(self, metrics: dict[str, Any], name: str | None = "k",
                 demangled: str | None = None, nvtx: Any = None,
                 rules: list[dict[str, Any]] | None = None) -> None:
        self.metrics = {n: m if isinstance(m, FakeMetric) else FakeMetric(m)
                        for n, m in metrics.items()}
        self._name, self._demangled, self._nvtx, self._rules = name, demangled, nvtx, rules

    def name(self, base: int = 0) -> str | None:
        return self._demangled if base == self.NameBase_DEMANGLED else self._name

    def metric_names(self) -> tuple[str, ...]:
        return tuple(self.metrics)

    def metric_by_name(self, name: str) -> FakeMetric | None:
        return self.metrics.get(name)

    def nvtx_state(self) -> Any:
        return self._nvtx

    def rule_results_as_dicts(self) -> list[dict[str, Any]]:
        return self._rules or []


def launch_metrics(grid: int = 4, block: int = 64, dur: float = 1000.0, unit: str = "nsecond",
                   device: int = 0) -> dict[str, Any]:
    return {
        "launch__grid_dim_x": grid, "launch__grid_dim_y": 1, "launch__grid_dim_z": 1,
        "launch__grid_size": grid, "launch__block_dim_x": block, "launch__block_dim_y": 1,
        "launch__block_dim_z": 1, "launch__block_size": block, "launch__device_id": device,
        "launch__stream_id": 7, "gpu__time_duration.sum": FakeMetric(dur, unit),
        "device__attribute_display_name": "NVIDIA A100-SXM4-40GB",
        "device__attribute_multiprocessor_count": 108,
        "device__attribute_compute_capability_major": 8,
        "device__attribute_compute_capability_minor": 0,
    }


@pytest.mark.parametrize(("value", "unit", "ns"), [
    (1500.0, "ns", 1500), (1500.0, "nsecond", 1500), (1.5, "usecond", 1500),
    (1.5, "us", 1500), (2.25, "msecond", 2_250_000), (2.25, "ms", 2_250_000),
    (0.5, "second", 500_000_000), (0.5, "s", 500_000_000), (7, "nsecond", 7),
])
def test_duration_is_converted_to_integer_ns_from_its_unit(value: float, unit: str,
                                                           ns: int) -> None:
    action = FakeAction({"gpu__time_duration.sum": FakeMetric(value, unit)})
    assert duration_ns(action, KINDS) == ns


def test_duration_in_an_unknown_unit_or_absent_is_none() -> None:
    assert duration_ns(FakeAction({"gpu__time_duration.sum": FakeMetric(3.0, "cycle")}),
                       KINDS) is None
    assert duration_ns(FakeAction({}), KINDS) is None


def test_grid_and_block_fall_back_to_their_totals() -> None:
    old = FakeAction({"launch__grid_size": 4096.0, "launch__block_size": 256.0})
    assert axes(old, KINDS, "launch__grid_dim", "launch__grid_size") == ((4096, 1, 1), True)
    new = FakeAction({"launch__grid_dim_x": 8.0, "launch__grid_dim_y": 4.0,
                      "launch__grid_dim_z": 2.0, "launch__grid_size": 64.0})
    assert axes(new, KINDS, "launch__grid_dim", "launch__grid_size") == ((8, 4, 2), False)
    assert axes(FakeAction({}), KINDS, "launch__block_dim", "launch__block_size") == (
        (None, None, None), False)


def test_metric_value_uses_the_accessor_of_its_kind() -> None:
    assert metric_value(FakeMetric("No-CC"), KINDS) == "No-CC"
    assert metric_value(FakeMetric(2**60 + 1), KINDS) == 2**60 + 1  # exact, not via float
    assert metric_value(FakeMetric(0.25), KINDS) == 0.25
    assert metric_value(FakeMetric(None, kind=4), KINDS) is None  # instanced-only metric
    assert metric_value(FakeMetric(3, kind=FakeMetric.ValueKind_ANY), KINDS) is None


def test_launch_row_sums_shared_memory_and_falls_back_for_the_device() -> None:
    notes: Counter[str] = Counter()
    split = FakeAction({"launch__shared_mem_per_block_static": 4096.0,
                        "launch__shared_mem_per_block_dynamic": 8192.0,
                        "launch__shared_mem_per_block": 13312.0,
                        "device__attribute_device_index": 3}, demangled="k(int)")
    row = ncu.launch(split, 0, KINDS, notes)
    assert (row["smem_bytes"], row["smem_static_bytes"], row["smem_dynamic_bytes"]) == (
        12288, 4096, 8192)
    assert row["device"] == 3 and row["name"] == "k(int)"
    total = ncu.launch(FakeAction({"launch__shared_mem_per_block": 1024.0}), 1, KINDS, notes)
    assert total["smem_bytes"] == 1024 and total["smem_static_bytes"] is None
    assert notes[ncu.NO_DURATION] == 2


def test_kernel_name_prefers_the_demangled_name() -> None:
    assert ncu.kernel_name(FakeAction({}, name="k", demangled="k(float *, int)")) == (
        "k(float *, int)")
    assert ncu.kernel_name(FakeAction({}, name="k", demangled="")) == "k"


class FakeRange:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class FakeDomain:
    def __init__(self, name: str, stack: list[str], started: tuple[str, ...] = ()) -> None:
        self._name, self.stack, self.started = name, stack, started

    def name(self) -> str:
        return self._name

    def push_pop_ranges(self) -> tuple[str, ...]:
        return tuple(sorted(self.stack))  # ncu lists them sorted, not in stack order

    def push_pop_range(self, idx: int) -> FakeRange | None:
        return FakeRange(self.stack[idx]) if idx < len(self.stack) else None

    def start_end_ranges(self) -> tuple[str, ...]:
        return self.started


class FakeNvtxState:
    def __init__(self, *domains: FakeDomain) -> None:
        self._domains = domains

    def domains(self) -> list[int]:
        return list(range(len(self._domains)))

    def domain_by_id(self, idx: int) -> FakeDomain:
        return self._domains[idx]


def test_nvtx_text_is_the_range_stack_per_domain() -> None:
    default = FakeDomain(ncu.DEFAULT_DOMAIN, ["train", "step", "forward"])
    named = FakeDomain("nccl", ["allreduce"], started=("epoch",))
    assert ncu.nvtx_text(FakeNvtxState(default)) == "train/step/forward"
    assert ncu.nvtx_text(FakeNvtxState(default, named)) == (
        "train/step/forward; nccl:allreduce/epoch")
    assert ncu.nvtx_text(FakeNvtxState(FakeDomain(ncu.DEFAULT_DOMAIN, []))) is None
    assert ncu.nvtx_text(None) is None


class MsgType(enum.IntEnum):
    NONE, OK, OPTIMIZATION, WARNING, ERROR = range(5)


class SpeedupType(enum.IntEnum):
    UNKNOWN, LOCAL, GLOBAL = range(3)


def test_rule_row_is_compact_and_tolerates_missing_parts() -> None:
    msg = {int(m): m.name.lower() for m in MsgType}
    speed = {int(m): m.name.lower() for m in SpeedupType}
    full = {"rule_identifier": "LaunchConfiguration", "name": "Launch Configuration",
            "section_identifier": "LaunchStats",
            "rule_message": {"title": "Small Grid", "message": "grid too small", "type": 2},
            "speedup_estimation": {"type": 2, "speedup": 61.7},
            "focus_metrics": [{"name": "launch__grid_size", "value": 50, "severity": 2,
                               "info": "raise the grid"}]}
    row = ncu.rule_row(3, full, msg, speed)
    assert row == {"kernel_id": 3, "rule_identifier": "LaunchConfiguration",
                   "name": "Launch Configuration", "section_identifier": "LaunchStats",
                   "title": "Small Grid", "message": "grid too small", "type": "optimization",
                   "speedup_type": "global", "speedup": 61.7,
                   "focus_metrics": [{"name": "launch__grid_size", "value": 50.0,
                                      "severity": 2, "info": "raise the grid"}]}
    bare = ncu.rule_row(0, {"rule_identifier": "X"}, msg, speed)
    assert bare["speedup"] is None and bare["speedup_type"] is None and bare["type"] is None


def test_metric_rows_split_numbers_and_text() -> None:
    rows = MetricRows(KINDS)
    rows.add(0, FakeAction({"a": FakeMetric(1.5, "%"), "b": "text", "c": FakeMetric(None, kind=4)}))
    rows.add(1, FakeAction({"a": FakeMetric(2.0, "%")}))
    frame = rows.frame(["k0", "k1"], [0, None])
    assert frame["kernel_id"].tolist() == [0, 0, 0, 1]
    assert frame["name"].astype(str).tolist() == ["k0", "k0", "k0", "k1"]
    assert frame["text"][1] == "text" and math.isnan(frame["value"][1])
    assert math.isnan(frame["value"][2]) and pd.isna(frame["text"][2])
    assert frame["unit"][0] == "%" and pd.isna(frame["unit"][1])
    assert frame["device"].isna().tolist() == [False, False, False, True]
    kept = MetricRows(KINDS, keep=frozenset({"b"}))
    kept.add(0, FakeAction({"a": 1.0, "b": "x"}))
    assert kept.metric == ["b"] and kept.per_kernel == [1]


def test_peak_bandwidth_is_double_data_rate_over_the_bus() -> None:
    assert peak_bandwidth(1_215_000, 5120) == pytest.approx(1.555e12, rel=1e-3)  # A100 40GB
    assert peak_bandwidth(None, 384) is None


# -- the whole reader on a fake ncu_report module -----------------------------------------


class FakeReportRange:
    def __init__(self, actions: list[FakeAction]) -> None:
        self.actions = actions

    def num_actions(self) -> int:
        return len(self.actions)

    def action_by_idx(self, idx: int) -> FakeAction:
        return self.actions[idx]


class FakeContext:
    def __init__(self, *ranges: list[FakeAction]) -> None:
        self.ranges = [FakeReportRange(r) for r in ranges]

    def num_ranges(self) -> int:
        return len(self.ranges)

    def range_by_idx(self, idx: int) -> FakeReportRange:
        return self.ranges[idx]

    def get_version(self) -> str:
        return "2099.1.0"


def fake_module(monkeypatch: pytest.MonkeyPatch, context: FakeContext | Exception) -> None:
    def load_report(path: str) -> FakeContext:
        if isinstance(context, Exception):
            raise context
        return context

    module = types.ModuleType("ncu_report")
    module.load_report = load_report  # type: ignore[attr-defined]
    module.IMetric = FakeMetric  # type: ignore[attr-defined]
    module.MsgType = MsgType  # type: ignore[attr-defined]
    module.SpeedupType = SpeedupType  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ncu_report", module)


def test_reader_places_ranges_and_units_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = {"rule_identifier": "R", "rule_message": {"type": 3, "message": "m"}}
    fake_module(monkeypatch, FakeContext(
        [FakeAction(launch_metrics(dur=1.5, unit="usecond"), demangled="a(int)", rules=[rule])],
        [FakeAction(launch_metrics(dur=2.0, unit="msecond", device=1), demangled="b()")],
    ))
    trace = ncu.read(Path("fake.ncu-rep"), isolated=False)
    trace.validate()
    k = trace.kernels
    assert k["start_ns"].tolist() == [0, 1500]
    assert k["end_ns"].tolist() == [1500, 2_001_500]
    assert k["device"].tolist() == [0, 1] and trace.devices["device"].tolist() == [0, 1]
    assert trace.devices["max_blocks_per_sm"].tolist() == [32, 32]  # filled from CC 8.0
    assert trace.meta["ranges"] == 2
    assert trace.meta["tool_versions"] == {"ncu_report": "2099.1.0"}
    assert trace.meta["ncu_rules"][0]["type"] == "warning"
    assert trace.meta["warnings"] == {}


def test_reader_rejects_empty_damaged_and_unopenable_reports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        "no profiled kernels": FakeContext(),
        "truncated or damaged": FakeContext([FakeAction(launch_metrics()), FakeAction({}, None)]),
        "cannot be opened": RuntimeError("bad magic"),
    }
    for problem, context in cases.items():
        fake_module(monkeypatch, context)
        with pytest.raises(InputError, match=problem) as err:
            ncu.read(Path("bad.ncu-rep"), isolated=False)
        assert err.value.path == "bad.ncu-rep"
