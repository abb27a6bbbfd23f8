"""The Diagnosis contract: every frame and analyzer table is declared in diagnosis_schema.py,
and what `diagnose` returns matches the declaration on every real fixture."""

from __future__ import annotations

import importlib
import shutil
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag import diagnosis_schema as ds
from gpudiag.analyzers import diagnosis
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import Result
from gpudiag.errors import SchemaError
from tests.builders import api_call, kernel, trace
from tests.conftest import fixture, profile_fixtures

U = 1_000
LOADABLE = [name for name in profile_fixtures()
            if not name.endswith(".nsys-rep") or shutil.which("nsys")
            ] or ["(shared fixtures absent)"]
RANK_PAIR = ["kineto/world128_sampled_rank0.json.gz", "kineto/world128_sampled_rank1.json.gz"]


def check(dx: Diagnosis) -> None:
    """Every frame and table of `dx` matches its declaration; no table is undeclared."""
    for name in ds.FRAME_NAMES:
        frame = getattr(dx, name)
        if frame is not None:
            assert ds.FRAMES[name].problems(frame) == [], name
    assert set(dx.tables) <= set(ds.TABLES), set(dx.tables) - set(ds.TABLES)
    for name, table in dx.tables.items():
        assert ds.TABLES[name].problems(table) == [], name


def _loop(steps: int = 3) -> gpudiag.Trace:
    """Per step: a launch, a kernel, `.item()` (a stream sync) from train.py:12, then host
    work with no CUDA call (a host-bound gap) and a late launch (a launch-bound one)."""
    kernels, api, ranges = [], [], []
    for i in range(steps):
        t0 = i * 1000
        api.append(api_call((t0 + 1) * U, (t0 + 4) * U, correlation=3 * i + 1))
        kernels.append(kernel((t0 + 10) * U, (t0 + 300) * U, correlation=3 * i + 1))
        api.append(api_call((t0 + 20) * U, (t0 + 301) * U, "cudaStreamSynchronize",
                            correlation=3 * i + 2))
        api.append(api_call((t0 + 700) * U, (t0 + 705) * U, correlation=3 * i + 3))
        kernels.append(kernel((t0 + 706) * U, (t0 + 900) * U, correlation=3 * i + 3))
        ranges += [(f"ProfilerStep#{i}", "step", t0, t0 + 999, 0),
                   ("train.py(12): train_step", "python", t0, t0 + 990, 1),
                   ("aten::item", "torch_op", t0 + 16, t0 + 304, 2),
                   ("aten::mm", "torch_op", t0 + 1, t0 + 5, 2),
                   ("aten::add", "torch_op", t0 + 310, t0 + 690, 2)]  # CPU work, no launch
    frame = pd.DataFrame([{"pid": 100, "tid": 100, "name": n, "source": s, "start_ns": a * U,
                           "end_ns": b * U, "depth": d} for n, s, a, b, d in ranges])
    return trace(kernels=kernels, api=api, ranges=frame)


@pytest.mark.parametrize("name", LOADABLE)
def test_every_fixture_diagnosis_matches_the_declaration(name: str) -> None:
    t = gpudiag.load(fixture(name))
    check(gpudiag.diagnose(t, steps=True))


def test_a_rank_pair_with_arrival_skew_matches_the_declaration() -> None:
    dx = gpudiag.diagnose(gpudiag.load([fixture(f) for f in RANK_PAIR]), steps=True)
    assert len(dx.tables["arrival_skew"]) and len(dx.tables["overlap"])
    check(dx)


def test_a_synthetic_loop_and_a_window_of_it_match_the_declaration() -> None:
    t = _loop()
    dx = gpudiag.diagnose(t, steps=True)
    assert {"sync_stall", "host_bound"} <= set(dx.gaps["cause"])
    assert dx.by_step is not None and len(dx.steps) == 3
    check(dx)
    cut = gpudiag.diagnose(t, window=(1_000 * U, 2_000 * U), steps=True)
    assert cut.gaps is not None and len(cut.gaps) < len(dx.gaps)
    if "host_gaps" in cut.tables:  # placed pieces keep the labels of the gaps they are
        assert set(cut.tables["host_gaps"].index) <= set(cut.gaps.index)
    check(cut)


def test_a_trace_with_nothing_to_find_has_declared_empty_frames() -> None:
    dx = gpudiag.diagnose(trace(kernels=[kernel(0, 10 * U)]), steps=True)
    assert dx.gaps is not None and dx.gaps.empty and dx.steps.empty
    check(dx)


def test_host_gaps_and_sync_waits_match_what_their_functions_return() -> None:
    from gpudiag.analyzers.host.bound import host_gaps
    from gpudiag.analyzers.sync import classified_waits

    t = _loop()
    dx = gpudiag.diagnose(t)
    for name, frame in (("host_gaps", host_gaps(t, dx.gaps)),
                        ("sync_waits", classified_waits(t))):
        assert len(frame)
        assert ds.TABLES[name].problems(frame) == [], name


# -- the declaration -----------------------------------------------------------------------


PARTS = {**ds.FRAMES, **ds.TABLES}


@pytest.mark.parametrize("name", list(PARTS))
def test_each_part_names_its_analyzer_and_function_and_follows_the_conventions(
        name: str) -> None:
    part = PARTS[name]
    assert part.table.name == name
    assert part.analyzer in {a.name for a in diagnosis.ANALYZERS} | diagnosis.VIEWS \
        | {"diagnose"}
    assert (part.analyzer == "diagnose") == (name in ds.FRAME_NAMES)
    module, _, attr = part.source.rpartition(".")
    try:
        owner = importlib.import_module(f"gpudiag.{module}")
    except ModuleNotFoundError:  # a method: module.Class.method
        module, _, cls = module.rpartition(".")
        owner = getattr(importlib.import_module(f"gpudiag.{module}"), cls)
    assert callable(getattr(owner, attr))
    assert len(set(part.table.names)) == len(part.table.names)
    for col in part.table.columns:
        assert col.dtype in ds.DTYPES and col.meaning, (name, col.name)
        if col.name.endswith("_ns") and not col.name.startswith("overlap_of_"):  # ratios
            assert col.unit == "ns", (name, col.name)
        if col.name == "bytes" or col.name.endswith("_bytes"):
            assert col.unit == "bytes", (name, col.name)
    assert f"## `{part.where}`" in ds.markdown()


def _constants() -> list[tuple[str, Any, bool]]:
    """(part, the analyzer's own column constant, whether it maps names to dtypes)."""
    from gpudiag.analyzers import copies, findings, gpu_samples, sync, timeline
    from gpudiag.analyzers.collectives import calls, skew
    from gpudiag.analyzers.host import steps as host_steps
    from gpudiag.analyzers.kernels import launch, metrics
    from gpudiag.analyzers.losses import gaps, waits
    from gpudiag.analyzers.memory import allocator
    from gpudiag.analyzers.steps import training

    return [
        ("findings", findings.COLUMNS, False), ("by_step", training.COLUMNS, False),
        ("gaps", gaps.GAP_COLUMNS, False), ("steps", training.STEP_COLUMNS, False),
        ("stream_summary", timeline.STREAM_SUMMARY, True),
        ("sync_points", sync.COLUMNS, False),
        ("sync_waits", (*waits.WAIT_COLUMNS, "where", "gpu_idle_ns", "step"), False),
        ("host_gaps", (*gaps.GAP_COLUMNS, "where", "site_known", "next_short"), False),
        ("small_grid", launch.SMALL_GRID_COLUMNS, True),
        ("launch_rate", launch.RATE_COLUMNS, True),
        ("copy_stats", copies.STATS_COLUMNS, True),
        ("collective_stats", {**{k: calls.KEY_DTYPES[k] for k in calls.STATS_BY},
                              **calls.STATS_COLUMNS}, True),
        ("overlap", calls.OVERLAP_COLUMNS, True), ("arrival_skew", skew.SKEW_COLUMNS, True),
        ("fragmentation", allocator.FRAGMENTATION_COLUMNS, True),
        ("kernel_metrics", metrics.COLUMNS, True),
        ("ncu_rules", metrics.RULE_FINDING_COLUMNS, True),
        ("sample_summary", gpu_samples.SUMMARY_COLUMNS, True),
        ("host_by_step", host_steps.BY_STEP, False),
    ]


@pytest.mark.parametrize("entry", _constants(), ids=lambda e: e[0])
def test_declared_columns_are_the_analyzers_own(entry: tuple[str, Any, bool]) -> None:
    name, constant, typed = entry
    table = PARTS[name].table
    assert table.names == list(constant)
    if typed:
        assert {c.name: c.dtype for c in table.columns} == {
            k: str(v) for k, v in constant.items()}


def test_enumerations_are_the_analyzers_own() -> None:
    from gpudiag.analyzers import findings, sync
    from gpudiag.analyzers.host.categories import CATEGORIES
    from gpudiag.analyzers.kernels import metrics as m
    from gpudiag.analyzers.kernels.occupancy import LIMITERS
    from gpudiag.analyzers.losses.gaps import RULES, TABLE_CODES
    from gpudiag.analyzers.memory.allocator import SOURCES
    from gpudiag.analyzers.steps.detection import METHODS

    values = {f"{n}.{c.name}": c.values for n, p in PARTS.items() for c in p.table.columns}
    assert values["losses.cause"] == values["by_step.cause"] == findings.LOSS_CAUSES
    assert values["findings.cause"] == (*findings.LOSS_CAUSES[1:], *findings.OTHER_CAUSES)
    assert values["gaps.rule"] == values["host_gaps.rule"] == RULES
    assert values["gaps.next_table"] == TABLE_CODES
    assert values["steps.method"] == tuple(METHODS)
    assert values["host_breakdown.category"] == CATEGORIES
    assert tuple(ds.HOST_CATEGORIES) == CATEGORIES
    assert values["small_grid.limiter"] == LIMITERS
    assert values["fragmentation.source"] == tuple(SOURCES)
    assert values["kernel_metrics.bottleneck"] == (m.SMALL_GRID, m.LATENCY, m.HIGH_COMPUTE,
                                                   m.HIGH_MEMORY, m.BALANCED, m.HIGH)
    assert set(sync.TORCH_SYNC_OPS.values()) <= set(values["sync_points.kind"])
    assert values["sync_points.kind"] == values["sync_waits.kind"] == ds.SYNC_KINDS


# -- enforcement ---------------------------------------------------------------------------


def test_conform_casts_keeps_index_and_attrs_and_returns_a_conforming_frame_as_is() -> None:
    part = ds.TABLES["host_top_ops"]
    frame = pd.DataFrame({"name": pd.Series([], dtype=object), "calls": [],
                          "self_ns": pd.Series([], dtype="Int64"), "share": []})
    assert part.problems(ds.conform(part, frame)) == []
    good = pd.DataFrame({"name": ["a"], "calls": [1], "self_ns": [5], "share": [0.5]},
                        index=[7])
    good["name"] = good["name"].astype(str)
    assert ds.conform(part, good) is good
    good.attrs["missing"] = ["x"]
    cast = ds.conform(part, good.astype({"self_ns": "Int64"}))
    assert cast.index.tolist() == [7] and cast.attrs == {"missing": ["x"]}
    assert str(cast["self_ns"].dtype) == "int64"


def test_a_missing_column_is_filled_only_in_a_frame_without_rows() -> None:
    part = ds.TABLES["host_gaps"]
    empty = pd.DataFrame({c: [] for c in part.table.names[:-2]})
    assert part.problems(ds.conform(part, empty)) == []
    rows = pd.DataFrame({"name": ["a"], "calls": [1], "self_ns": [5]})
    with pytest.raises(SchemaError, match=r"lacks the declared columns \['share'\]"):
        ds.conform(ds.TABLES["host_top_ops"], rows)


def test_undeclared_tables_columns_and_producers_are_bugs() -> None:
    with pytest.raises(SchemaError, match="does not declare"):
        ds.conform_table("bogus", pd.DataFrame(), "sync")
    with pytest.raises(SchemaError, match="declared as the 'sync' analyzer's"):
        ds.conform_table("sync_points", pd.DataFrame(), "copies")
    with pytest.raises(SchemaError, match="undeclared"):
        ds.conform(ds.TABLES["host_top_ops"], pd.DataFrame({"colour": []}))
    with pytest.raises(SchemaError, match="missing values"):
        ds.conform(ds.TABLES["host_top_ops"],
                   pd.DataFrame({"name": ["a"], "calls": [None], "self_ns": [1], "share": [1.0]}))


def test_diagnose_refuses_an_undeclared_analyzer_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from gpudiag.analyzers import timeline

    monkeypatch.setattr(timeline, "CONTRACT", dataclasses.replace(  # diagnose: part, combine
        timeline.CONTRACT, combine=lambda parts: Result(
            pd.DataFrame(), {"stream_summary": parts[0], "colours": pd.DataFrame()})))
    with pytest.raises(SchemaError, match="'colours'"):
        gpudiag.diagnose(trace(kernels=[kernel(0, 10 * U), kernel(20 * U, 30 * U)]))
