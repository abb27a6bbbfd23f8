"""`diagnose` calls each analyzer once per trace it analyzes, and the tables analyzers share
(the loss model's gaps and arrival skew, the sync waits, the allocator replay) are computed
once: a table a finding came from is the table the Diagnosis holds.

Counted on real profiles: a two-rank NCCL job (collectives, skew, syncs, launches), a
profile with sync calls, a memory snapshot and an Nsight Compute report.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import gpudiag
from gpudiag.analyzers.pipeline import registry
from tests.conftest import fixture

#: (module, function) computed behind `Trace.derived` or inside one analyzer: each must
#: run once per trace and options during one `diagnose`
SHARED = (
    ("gpudiag.analyzers.losses.gaps", "_idle_gaps"),
    ("gpudiag.analyzers.collectives.skew", "_arrival_skew"),
    ("gpudiag.analyzers.sync", "_classified_waits"),
    ("gpudiag.analyzers.sync", "sync_points"),
    ("gpudiag.analyzers.memory.replay", "_replay_devices"),
    ("gpudiag.analyzers.memory.allocator", "_fragmentation"),
    ("gpudiag.analyzers.host.steps", "_compute"),
    ("gpudiag.analyzers.kernels.metrics", "kernel_metrics"),
)


def _counting(counts: Counter[tuple[str, int]], label: str,
              function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, counting its calls per trace object (and per gap pieces given: the
    warm-up pass explains the whole trace's gaps inside the warm-up steps, a second input)."""
    def counted(trace: Any, *args: Any, **kwargs: Any) -> Any:
        counts[(label, hash((id(trace), id(kwargs.get("gaps")))))] += 1
        return function(trace, *args, **kwargs)
    return counted


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, int]]:
    """Calls per (analyzer or shared function, trace object) while the test runs."""
    seen: Counter[tuple[str, int]] = Counter()
    for analyzer in registry.ANALYZERS:  # what diagnose calls: the module's CONTRACT,
        module = importlib.import_module(analyzer.module)  # its part (else its analyze)
        contract = module.CONTRACT
        hook = "part" if contract.part is not None else "analyze"
        monkeypatch.setattr(module, "CONTRACT", dataclasses.replace(
            contract, **{hook: _counting(seen, analyzer.name, getattr(contract, hook))}))
    loaded = [module for name, module in list(sys.modules.items())
              if name.startswith("gpudiag.") and module is not None]
    for module_name, name in SHARED:
        original = getattr(importlib.import_module(module_name), name)
        wrapped = _counting(seen, f"{module_name}.{name}", original)
        # the defining module and every module that imported the function by name
        for module in loaded:
            if vars(module).get(name) is original:
                monkeypatch.setattr(module, name, wrapped)
    return seen


def _ran(counts: Counter[tuple[str, int]]) -> dict[str, list[int]]:
    """Each counted name -> its call count per trace object."""
    out: dict[str, list[int]] = {}
    for (label, _), n in counts.items():
        out.setdefault(label, []).append(n)
    return out


CASES = {
    "two NCCL ranks": ["kineto/world128_sampled_rank0.json.gz",
                       "kineto/world128_sampled_rank1.json.gz"],
    "stream syncs": ["kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz"],
    "alexnet syncs": ["kineto/a100_alexnet_sync_critical_path.json.gz"],
    "memory snapshot": ["memsnap/cs336_ctx256_forward_segment_free.pickle"],
    "Nsight Compute": ["ncu/t4_matadd_setfull.ncu-rep"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_analyzer_and_shared_table_runs_once_per_trace(
        case: str, counts: Counter[tuple[str, int]]) -> None:
    paths = [fixture(p) for p in CASES[case]]
    trace = gpudiag.load(paths if len(paths) > 1 else paths[0])
    counts.clear()
    dx = gpudiag.diagnose(trace)
    ran = _ran(counts)
    twice = {name: calls for name, calls in ran.items() if max(calls) > 1}
    assert not twice, f"computed more than once per trace: {twice}"
    applicable = {a.name for a in registry.ANALYZERS if a.name in ran}
    assert applicable, "no analyzer ran"
    # every analyzer that ran handed its tables to the Diagnosis
    if "sync" in applicable:
        assert "sync_points" in dx.tables
    if "collectives" in applicable:
        assert {"arrival_skew", "collective_stats", "overlap"} <= set(dx.tables)
    if "memory" in applicable:
        assert "fragmentation" in dx.tables
    if "kernel_metrics" in applicable:
        assert {"kernel_metrics", "ncu_rules"} <= set(dx.tables)


def test_the_expected_analyzers_run_on_a_two_rank_job(
        counts: Counter[tuple[str, int]]) -> None:
    paths = [fixture(p) for p in CASES["two NCCL ranks"]]
    trace = gpudiag.load(paths)
    counts.clear()
    dx = gpudiag.diagnose(trace)
    ran = set(_ran(counts))
    assert {"host_gaps", "timeline", "launch", "collectives"} <= ran
    assert dx.gaps is not None and len(dx.gaps)
    assert "_gaps" not in dx.tables  # the gaps are a named result, not a side channel


def test_findings_equal_with_a_window_and_warm_up_analyses(
        counts: Counter[tuple[str, int]]) -> None:
    """With a window, the analyzers run on the window and the waterfall's gaps on the whole
    trace; each still once per trace object (the warm-up pass is a trace of its own)."""
    path = fixture("kineto/a100_alexnet_sync_critical_path.json.gz")
    trace = gpudiag.load(path)
    start = int(trace.kernels["start_ns"].min())
    end = int(trace.kernels["end_ns"].max())
    counts.clear()
    gpudiag.diagnose(trace, window=(start, start + (end - start) // 2))
    twice = {name: calls for name, calls in _ran(counts).items() if max(calls) > 1}
    assert not twice
