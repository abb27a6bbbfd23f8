"""What `gpudiag analyze` prints above the tables: the sources, the analyzed window, and
its errors. End to end through the CLI, on real fixtures and small synthetic traces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import gpudiag
from gpudiag.cli import cli
from gpudiag.profiler import session
from tests.builders import KinetoTrace, kernel, trace
from tests.conftest import ROOT, fixture

ALEXNET = "kineto/a100_alexnet_sync_critical_path.json.gz"
#: a wide console, so rich does not fold the lines the tests look for
WIDE = {"COLUMNS": "250"}
#: absolute epoch nanoseconds, as the header used to print them
EPOCH_NS = re.compile(r"\b1[6-9]\d{17}\b")


def _steps_trace(tmp_path: Path) -> Path:
    """Five 1 ms steps from t=0, one 100 µs kernel each starting 10 µs in."""
    kt = KinetoTrace()
    for i in range(5):
        kt.annotation(f"ProfilerStep#{i}", ts=i * 1000, dur=1000)
        c = kt.launch(ts=i * 1000, dur=5)
        kt.kernel("gemm", ts=i * 1000 + 10, dur=100, correlation=c)
    return kt.write(tmp_path / "steps.pt.trace.json.gz")


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudiag", "analyze", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_a_window_past_the_trace_end_is_one_error_line_naming_the_span() -> None:
    path = str(fixture("kineto/h100_cuda_sync_category_small.json"))  # 20 ns of GPU work
    for extra in ([], ["--fail-on", "sync_stall>5%"]):
        done = _analyze(path, "--window", "100ms:300ms", *extra)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout == ""  # not "No findings."
        [line] = done.stderr.strip().splitlines()
        assert "window '100ms:300ms' lies outside the trace" in line
        assert "0 ns to 20 ns" in line and "within 0:20ns" in line


def test_a_window_before_the_trace_start_is_outside_too(tmp_path: Path) -> None:
    out = CliRunner(env=WIDE).invoke(cli, ["analyze", str(_steps_trace(tmp_path)), "--window",
                                   "-5ms:-1ms"])
    assert out.exit_code != 0
    assert "lies outside the trace" in str(out.exception)


def test_the_header_shows_the_chosen_window_not_the_whole_trace(tmp_path: Path) -> None:
    path = str(_steps_trace(tmp_path))
    out = CliRunner(env=WIDE).invoke(cli, ["analyze", path, "--window", "ProfilerStep#3"])
    assert out.exit_code == 0, out.output
    assert ("Window: ProfilerStep#3, 1 ms: 2.99 ms to 3.99 ms from the first GPU event "
            "(of 4.1 ms)") in out.output
    assert "4.1 ms" not in out.output.split("(of 4.1 ms)")[0]  # not the trace's 4.1 ms
    data = json.loads(CliRunner(env=WIDE).invoke(
        cli, ["analyze", path, "--window", "ProfilerStep#3", "--json"]).output)
    assert (data["window"]["start_ns"], data["window"]["end_ns"]) == (3_000_000, 4_000_000)
    assert data["window"]["spec"] == "ProfilerStep#3"
    assert data["top_kernels"][0]["count"] == 1  # the kernels of that step only


def test_the_gpu_window_reads_as_a_length_and_a_wall_clock_start() -> None:
    out = CliRunner(env=WIDE).invoke(cli, ["analyze", str(fixture(ALEXNET))])
    assert out.exit_code == 0, out.output
    assert "GPU window: 12.9 s, starting 2023-09-27 17:26:12.943 UTC" in out.output
    assert not EPOCH_NS.search(out.output)


def test_a_session_clock_has_no_wall_clock() -> None:
    out = CliRunner(env=WIDE).invoke(cli, ["analyze",
                                   str(fixture("nsys/rtx4090_4streams_eventsync.sqlite"))])
    assert out.exit_code == 0, out.output
    assert "GPU window: 76.9 µs\n" in out.output


def _run_dir(root: Path) -> Path:
    """A `gpudiag profile` run of two torchrun workers with CUPTI kernels (epoch clock)."""
    run_dir = root / "run"
    session.make_run_dir(["x"], run_dir)
    session.write_json(run_dir / "meta.json", {
        "command": ["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"]})
    t0 = 1_767_225_600_001_040_000
    for rank in (0, 1):
        proc = run_dir / "procs" / f"h-{7 + rank}-rank{rank}"
        proc.mkdir(parents=True)
        gpudiag.Trace(meta={"rank": rank, "process": {"pid": 7 + rank, "host": "h"},
                            "sources": [{"format": "gpudiag-host", "pid": 7 + rank}]}
                      ).save(proc)
        trace(kernels=[kernel(t0 + 1_000, t0 + 2_000_000),
                       kernel(t0 + 2_004_640, t0 + 14_800_000)]).save(
            proc / "cupti" / "chunk-000000")
    return run_dir


def test_a_profile_run_directory_names_the_run_not_none(tmp_path: Path) -> None:
    out = CliRunner(env=WIDE).invoke(cli, ["analyze", str(_run_dir(tmp_path))])
    assert out.exit_code == 0, out.output
    assert "Sources: gpudiag profile run of train (2 processes)\n" in out.output
    assert "None" not in out.output
    assert "GPU window: 14.8 ms, starting 2026-01-01 00:00:00.001 UTC" in out.output
    assert not EPOCH_NS.search(out.output)


def test_small_losses_and_medians_are_written_in_their_unit(tmp_path: Path) -> None:
    """The 4.64 µs gap between the run's kernels was '0.00 ms in all'; alexnet's host gaps
    had '(median 415856.5 µs)'."""
    run = CliRunner(env=WIDE).invoke(cli, ["analyze", str(_run_dir(tmp_path))]).output
    assert "median 4.64 µs" in run
    alexnet = CliRunner(env=WIDE).invoke(cli, ["analyze", str(fixture(ALEXNET))]).output
    for text in (run, alexnet):
        assert not re.search(r"\b0\.00 ms|\d{4,}(\.\d+)? µs", text), text


def test_the_report_writes_the_window_as_the_terminal_does(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    for args, text in (([str(fixture(ALEXNET))], "12.9 s, starting 2023-09-27 17:26:12.943 UTC"),
                       ([str(_steps_trace(tmp_path)), "--window", "ProfilerStep#3"],
                        "1 ms: 2.99 ms to 3.99 ms from the first GPU event (of 4.1 ms)")):
        result = CliRunner(env=WIDE).invoke(cli, ["report", *args, "-o", str(out)])
        assert result.exit_code == 0, result.output
        page = out.read_text(encoding="utf-8")
        assert text in page
        shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # figures' data aside
        assert not EPOCH_NS.search(shown)
