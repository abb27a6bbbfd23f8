"""A `gpudiag profile` run directory of several processes is a job too: each process read
and analyzed apart (`readers.run_dir.process_trace`), then reduced, equal to the merged
run's diagnosis; `gpudiag profile --workers N` (or a run of many processes) never merges it
in one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gpudiag
from gpudiag.analyzers.summary import summarize
from gpudiag.jobs import diagnose_job
from gpudiag.readers.run_dir import merge_run, process_trace, run_units
from gpudiag.reports.collected import describe, describe_job
from gpudiag.trace import merge
from tests.conftest import framework
from tests.test_jobs import assert_same, diagnose

PROGRAMS = Path(__file__).parent / "programs"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _profile(run_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """The 2-rank gloo DDP job under `gpudiag profile` (torchrun and its two ranks)."""
    line = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--backend",
            "torch", "--steps", "all", *options, "--", str(TORCHRUN), "--standalone",
            "--nproc-per-node", "2", str(PROGRAMS / "ddp_gloo.py"), "3"]
    return subprocess.run(line, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    framework("torch")
    run = tmp_path_factory.mktemp("ddp") / "run"
    done = _profile(run, "--no-report")
    assert done.returncode == 0, done.stderr[-2000:]
    return run


def test_a_run_is_its_processes_merged(run_dir: Path) -> None:
    units = run_units(run_dir)
    assert len(units) >= 3 and all(unit.parent.name == "procs" for unit in units[:3])
    parts = [process_trace(unit) for unit in units if unit.parent.name == "procs"]
    assert sorted(part.meta["rank"] for part in parts if part.meta["rank"] is not None) == [0, 1]
    merged = gpudiag.load(run_dir)  # the run's <run>/trace/ cache
    by_process = merge(parts)
    for name, table in merged.tables().items():
        if name != "samples":  # the NVML samples are a unit of their own (none on CPU)
            assert len(getattr(by_process, name)) == len(table), name


def test_a_run_directory_analyzed_process_by_process_equals_the_merged_run(
        run_dir: Path) -> None:
    trace = gpudiag.load(run_dir)
    merged = diagnose(trace, steps=True)
    for workers in (1, 2):
        job = diagnose_job(run_dir, workers=workers, steps=True)
        assert_same(job, merged)
        assert job.failed == [] and len(job.units) == len(run_units(run_dir))
    assert job.meta["processes"] == trace.meta["processes"]
    assert job.meta["ranks"] == trace.meta["ranks"] == [0, 1]
    # the same summary; its sources name the torch segments as they are now (gzipped
    # once merged), where the run's cache named them before
    ours, theirs = job.summary(), summarize(trace)
    assert {**ours, "sources": None} == {**theirs, "sources": None}
    assert [Path(s.get("path", "")).name.removesuffix(".gz") for s in ours["sources"]] == \
        [Path(s.get("path", "")).name for s in theirs["sources"]]
    assert describe_job(job) == describe(trace)
    assert len(merged.findings) and merged.steps is not None and len(merged.steps) >= 6


def test_profile_with_workers_analyzes_the_run_process_by_process(tmp_path: Path) -> None:
    framework("torch")
    run = tmp_path / "run"
    done = _profile(run, "--workers", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "process by process" in done.stderr and "Traceback" not in done.stderr
    assert "collected 3 processes" in done.stderr
    assert not (run / "trace").exists()  # no process held the merged run
    page = (run / "report.html").read_text()
    assert "Stragglers" in page  # a job of two ranks
    merged = diagnose(merge_run(run))  # merging it afterwards gives the same findings
    job = diagnose_job(run, workers=1)
    assert_same(job, merged)


def test_a_damaged_run_directory_analyzed_by_process_is_one_clear_line(tmp_path: Path) -> None:
    """The run's meta.json is read where the job completes its meta: damaged, it is the
    same one line `gpudiag analyze RUN` gives, never a traceback."""
    from gpudiag.profiler import session
    from tests.builders import kernel, trace

    run = tmp_path / "run"
    session.make_run_dir(["x"], run)
    proc = run / "procs" / "h-7-rank0"
    proc.mkdir(parents=True)
    gpudiag.Trace(meta={"rank": 0, "process": {"pid": 7, "host": "h",
                                               "collectors": ["host", "cupti"]}}).save(proc)
    trace(kernels=[kernel(1_000, 2_000)]).save(proc / "cupti" / "chunk-000000")
    (run / "meta.json").write_text("{not json")
    for extra in ([], ["--workers", "1"]):
        done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(run), *extra],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "meta.json: unreadable run meta.json" in done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
