"""Kineto traces whose shape, not size, is hostile: correlation ids that collide (every
kernel, sync and launch call of two processes on one id) and thousands of distinct kernel
names (a small-grid finding each). Reading, diagnosing and reporting stay linear: the
expected savings plan at most `MAX_PLANNED` findings and keep at most `MAX_REPLAYS`
outcomes, and a shared key joins each event once, never rows x events. Traces are built
here; the bounds are counted, not timed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpudiag
from gpudiag.analyzers.critical import replay as replay_mod
from gpudiag.analyzers.critical import savings
from tests.builders import KinetoTrace
from tests.conftest import cli_status


def _colliding(path: Path, n: int) -> Path:
    """`n` kernels and syncs, and `n` launch calls in each of two processes, all on
    correlation id 7; the first call (in time) is process 2000's."""
    kt, other = KinetoTrace(), KinetoTrace(pid=2000, tid=2000)
    for i in range(n):
        other.runtime("cudaLaunchKernel", ts=10 + i * 10, dur=2, correlation=7)
        kt.runtime("cudaLaunchKernel", ts=11 + i * 10, dur=2, correlation=7)
        kt.kernel(f"k{i % 3}", ts=13 + i * 10, dur=5, correlation=7)
        kt.cuda_sync("stream", ts=14 + i * 10, dur=3, correlation=7)
    kt.events += other.events
    return kt.write(path)


def _distinct(path: Path, n: int) -> Path:
    """`n` one-block kernels, each with a name of its own."""
    kt = KinetoTrace()
    for i in range(n):
        kt.kernel(f"void kernel_{i}<float, {i}>(float*)", ts=13 + i * 10, dur=5,
                  correlation=kt.launch(ts=10 + i * 10))
    return kt.write(path)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many findings were planned and how many outcomes replayed."""
    seen = {"plans": 0, "replays": 0}
    plan, saving = savings._plan, replay_mod.Outcome.saving

    def counting_plan(*args: Any) -> Any:
        seen["plans"] += 1
        return plan(*args)

    def counting_saving(self: replay_mod.Outcome) -> int:
        seen["replays"] += 1
        return saving(self)

    monkeypatch.setattr(savings, "_plan", counting_plan)
    monkeypatch.setattr(replay_mod.Outcome, "saving", counting_saving)
    return seen


def test_colliding_correlation_ids_join_each_event_once(
        tmp_path: Path, counted: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    n = 3000
    trace = gpudiag.load(_colliding(tmp_path / "t.json", n))
    assert len(trace.kernels) == n and len(trace.api) == 2 * n and len(trace.syncs) == n
    assert set(trace.kernels["pid"]) == {2000}  # the id's first call, in time
    pairs: list[int] = []
    ranges = savings._ranges

    def counting_ranges(*args: Any) -> Any:
        out = ranges(*args)
        pairs.append(len(out[0]))
        return out

    monkeypatch.setattr(savings, "_ranges", counting_ranges)
    dx = gpudiag.diagnose(trace)
    assert max(pairs) <= 2 * n  # was n x 2n = 18,000,000 pairs (300 MB at n=3000)
    assert len(dx.tables["sync_waits"]) == n
    assert counted["replays"] <= savings.MAX_REPLAYS


def test_many_distinct_kernel_names_plan_a_bounded_number_of_findings(
        tmp_path: Path, counted: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    n = savings.MAX_PLANNED + 400
    path = _distinct(tmp_path / "t.json.gz", n)
    dx = gpudiag.diagnose(gpudiag.load(path))
    assert (dx.findings["cause"] == "small_grid").sum() == n  # every name is still listed
    assert counted["plans"] <= savings.MAX_PLANNED  # was one plan (and outcome) per finding
    assert counted["replays"] <= savings.MAX_REPLAYS
    assert any(f"of {len(dx.findings):,}" in note for note in dx.notes)
    lost = dx.findings["lost_ns"].to_numpy(np.int64)
    planned = dx.findings["saving_ns"].notna().to_numpy(bool)
    assert not planned.any() or lost[planned].min() >= np.sort(lost)[-savings.MAX_PLANNED]
    for args in (["report", str(path), "-o", str(tmp_path / "r.html")],
                 ["heatmap", str(path), "-o", str(tmp_path / "h.html")]):
        assert cli_status(*args) == 0, capsys.readouterr().err
    assert (tmp_path / "r.html").stat().st_size < 8_000_000  # tables cut to 50 rows
    assert (tmp_path / "h.html").stat().st_size < 8_000_000
