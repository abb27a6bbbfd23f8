"""The GPU collectors on a real GPU: what `gpudiag profile` records from the examples.

Run by scripts/gpu_validate.sh on the GPU machine (`pytest -m gpu tests/gpu`); skipped with
the reason anywhere torch sees no CUDA GPU (tests/gpu/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import gpudiag

pytestmark = pytest.mark.gpu

BACKENDS = ("cupti", "torch")
STEPS_AFTER_WARMUP = r"step ([5-9]|[1-9][0-9]+)"


def _trace(run_dir: Path) -> gpudiag.Trace:
    return gpudiag.load(run_dir / "trace")


def _steps_of(run_dir: Path) -> int:
    """The --steps the profiled example ran (from the run's meta.json command)."""
    command = json.loads((run_dir / "meta.json").read_text())["command"]
    return int(command[command.index("--steps") + 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_run_on_a_device_and_syncs_are_recorded(
        profiled_run: Callable[[str, str], Path], backend: str) -> None:
    run_dir = profiled_run("sync_in_loop", backend)
    trace, steps = _trace(run_dir), _steps_of(run_dir)
    assert len(trace.kernels) > 10 * steps  # forward, backward and SGD of 4 layers per step
    assert trace.kernels["device"].notna().all()
    assert set(trace.kernels["device"].dropna().astype(int)) == {0}
    assert (trace.kernels["end_ns"] > trace.kernels["start_ns"]).all()
    assert len(trace.syncs) >= steps  # a synchronize and an .item() in every step


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_fall_inside_the_host_step_ranges(
        profiled_run: Callable[[str, str], Path], backend: str) -> None:
    """Host markers (time.time_ns) and GPU timestamps share one clock: every step's
    kernels start after the first step began and before the run's last step ended."""
    run_dir = profiled_run("sync_in_loop", backend)
    trace = _trace(run_dir)
    steps = trace.ranges[trace.ranges["source"] == "step"]
    assert len(steps) == _steps_of(run_dir)
    first, last = int(steps["start_ns"].min()), int(steps["end_ns"].max())
    inside = trace.kernels["start_ns"].between(first, last + 5_000_000)  # 5 ms of slack
    assert inside.mean() > 0.9, f"only {inside.mean():.1%} of kernels inside the steps"


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_stall_is_the_top_finding_of_sync_in_loop(
        profiled_run: Callable[[str, str], Path], backend: str) -> None:
    dx = gpudiag.diagnose(_trace(profiled_run("sync_in_loop", backend)),
                          window=STEPS_AFTER_WARMUP)
    assert len(dx.findings) > 0, f"no findings; notes: {dx.notes}"
    top = dx.findings.iloc[0]
    assert top["cause"] == "sync_stall", dx.findings.head(5).to_string()
    share = dx.losses.groupby("cause", observed=True)["lost_ns"].sum()
    assert share["sync_stall"] / share.sum() > 0.20


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvml_samples_cover_the_run(profiled_run: Callable[[str, str], Path],
                                    backend: str) -> None:
    trace = _trace(profiled_run("sync_in_loop", backend))
    assert len(trace.samples) > 0
    window = trace.gpu_window_ns()
    assert window is not None
    times = trace.samples["ts_ns"]
    assert times.between(window[0] - 1_000_000_000, window[1] + 1_000_000_000).sum() >= 2


def test_fragmentation_run_holds_a_memory_snapshot_with_the_finding(
        profiled_run: Callable[[str, str], Path]) -> None:
    trace = _trace(profiled_run("fragmentation", "torch"))
    assert len(trace.memory_blocks) > 0
    assert (trace.memory_blocks["state"].astype(str) == "inactive").any()
    dx = gpudiag.diagnose(trace)
    assert "fragmentation" in set(dx.findings["cause"].astype(str)), \
        dx.findings.head(10).to_string()
