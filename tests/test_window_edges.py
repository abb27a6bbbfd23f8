"""`--window` at its edges: a window that holds no kernel is an answer, not an internal error,
and a number without a unit is refused instead of being read as nanoseconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag.analyzers.critical.path import critical_path
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.cli import cli
from tests.builders import api_call, kernel, trace

EXAMPLE = str(Path(__file__).parent.parent / "examples/traces/train_loop_sync.pt.trace.json.gz")
U = 1_000


def _two_kernels_far_apart():  # type: ignore[no-untyped-def]
    return trace(kernels=[kernel(0, 10 * U, correlation=1), kernel(90 * U, 100 * U, correlation=2)],
                 api=[api_call(0, 1 * U, correlation=1), api_call(89 * U, 90 * U, correlation=2)])


def test_a_window_between_kernels_is_all_idle_and_has_no_graph_work() -> None:
    """Between the two kernels the device is idle: the waterfall says so (no useful time)
    and the critical path's graph, which has no GPU work there, still builds."""
    t = _two_kernels_far_apart()
    dx = diagnose(t, window=(40 * U, 60 * U))
    assert int(dx.losses["lost_ns"].sum()) == 20 * U
    useful = dx.losses.loc[dx.losses["cause"] == "useful", "lost_ns"]
    assert int(useful.sum()) == 0
    assert critical_path(t, window=(40 * U, 60 * U)) is not None


@pytest.mark.parametrize("spec", ["0:0.1ms", "1us:2us", "0.5ms:0.6ms"])
def test_example_windows_without_kernels_answer(spec: str) -> None:
    """The bundled trace's first 100 µs hold one pageable HtoD copy and no kernel: the
    answer is that copy, not an IndexError in the critical path."""
    for command in ("analyze", "report"):
        extra = ["-o", "/dev/null"] if command == "report" else []
        done = CliRunner().invoke(cli, [command, EXAMPLE, "--window", spec, *extra])
        assert done.exit_code == 0, done.output
        assert "internal error" not in done.output
    out = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["analyze", EXAMPLE, "--window",
                                                         "0:0.1ms"]).output
    assert "copy" in out and "cudaMemcpyAsync (HtoD)" in out


@pytest.mark.parametrize(("spec", "shown"), [("0:1", "(1)"), ("1000:2000", "(1000, 2000)"),
                                             (":5", "(5)"), ("0.5:1ms", "(0.5)")])
def test_a_number_without_a_unit_is_refused_in_one_line(spec: str, shown: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", EXAMPLE, "--window",
                           spec], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"a number without a unit {shown}" in lines[0]
    assert "e.g." in lines[0] and "Traceback" not in done.stderr


def test_zero_needs_no_unit() -> None:
    done = CliRunner().invoke(cli, ["analyze", EXAMPLE, "--window", "0:100us"])
    assert done.exit_code == 0, done.output
