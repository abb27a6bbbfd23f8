"""A failed run says so first: the exit status, which processes died and of what, before any
finding (issue: a diagnosis of a run whose ranks died did not mention it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpudiag.analyzers.summary import run_outcome as outcome
from tests.conftest import framework, profile_program

PROCESS = {"pid": 10, "rank": None, "start_ns": 1, "end_ns": 2}


def test_a_run_that_ended_well_has_no_outcome_line() -> None:
    assert outcome({"run": {"exit_code": 0, "signal": None}, "processes": [PROCESS]}) is None
    assert outcome({"sources": [{"path": "x.json"}]}) is None  # not a profile run


def test_the_exit_the_exceptions_and_the_unfinished_are_named() -> None:
    meta = {"run": {"exit_code": 1, "signal": None}, "processes": [
        PROCESS, {"pid": 11, "rank": 1, "end_ns": 5, "exception": "RuntimeError: NCCL timeout"},
        {"pid": 12, "rank": 2, "end_ns": None},
        {"pid": 13, "rank": 3, "end_ns": 6, "ended_by": "SIGTERM"}]}
    said = outcome(meta)
    assert said is not None and said["failed"]
    assert said["headline"] == (
        "The run failed: exit status 1; rank 1 (pid 11) raised RuntimeError: NCCL timeout; "
        "rank 2 (pid 12) ended without exiting Python (killed, crashed or os._exit); rank 3 "
        "(pid 13) was ended by SIGTERM: what follows covers what was recorded before")
    killed = outcome({"run": {"exit_code": 137, "signal": 9}, "processes": []})
    assert killed is not None and killed["headline"].startswith("The run failed: killed by SIGKILL")


def test_a_helper_killed_while_the_run_succeeded_is_not_a_failure() -> None:
    said = outcome({"run": {"exit_code": 0}, "processes": [{"pid": 3, "end_ns": None}]})
    assert said is not None and not said["failed"]
    assert said["headline"].startswith("The run ended, but not every process did: pid 3")


CRASHING = """
    import multiprocessing as mp, os, signal, time, torch, gpudiag

    def killed():
        time.sleep(1.0)                      # after a flush or two
        os.kill(os.getpid(), signal.SIGKILL)

    def waits():
        time.sleep(120)                      # a rank stopped when another one failed

    if __name__ == "__main__":
        child = mp.get_context("spawn").Process(target=killed)
        child.start()
        other = mp.get_context("spawn").Process(target=waits)
        other.start()
        x = torch.randn(32, 32)
        for _ in range(3):
            gpudiag.step()
            x = x @ x
        child.join()
        time.sleep(1.0)                      # the other one is up, its SIGTERM guard too
        other.terminate()                    # what torchrun's agent does to the others
        other.join()
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
"""


def test_a_crashed_run_is_said_first_in_every_output(tmp_path: Path) -> None:
    """The program raises after three steps; a child it spawned died of SIGKILL, another
    one it stopped with SIGTERM (as torchrun's agent stops the ranks when one failed: each
    used to end with its flush and no word of it). `analyze` opens with all three,
    `--json` has them under `outcome`, and the report's summary too."""
    framework("torch")
    done, run_dir = profile_program(tmp_path, CRASHING, "--flush-interval", "0.2", "--steps",
                                    "all", name="crash.py")
    assert done.returncode == 1, done.stderr
    assert "illegal memory access" in done.stderr  # the program's own traceback, unchanged
    analyzed = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(run_dir)],
                              capture_output=True, text=True, timeout=300,
                              env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})
    assert analyzed.returncode == 0, analyzed.stderr
    first = analyzed.stdout.splitlines()[0]
    assert first.startswith("The run failed: exit status 1;"), analyzed.stdout
    assert "raised RuntimeError: CUDA error: an illegal memory access" in first
    assert "ended without exiting Python" in first
    assert "was ended by SIGTERM" in first
    info = json.loads(subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", "--json", str(run_dir)],
        capture_output=True, text=True, timeout=300, check=True).stdout)
    said = info["outcome"]
    assert said["failed"] and said["exit_code"] == 1 and len(said["processes"]) == 3
    page = tmp_path / "r.html"
    subprocess.run([sys.executable, "-m", "gpudiag", "report", str(run_dir), "-o", str(page),
                    "--cdn"], capture_output=True, timeout=300, check=True)
    assert "The run failed: exit status 1" in page.read_text(encoding="utf-8")


SEGFAULTING = """
    import os, signal, time, torch, gpudiag

    def read_freed_buffer():
        os.kill(os.getpid(), signal.SIGSEGV)  # what a use-after-free in an extension gets

    x = torch.randn(16, 16)
    for _ in range(2):
        gpudiag.step()
        x = x @ x
    time.sleep(0.5)                          # the markers are flushed
    read_freed_buffer()
"""


def test_a_segfault_says_where_it_happened(tmp_path: Path) -> None:
    """A program that dies of SIGSEGV used to be "ended without its final flush (killed,
    crashed or os._exit)": the user could not tell a crash from a kill, nor where. The
    bootstrap's faulthandler writes the stacks at the fatal signal; `profile` and `analyze`
    name the signal and the innermost Python frame, and the exit status stays the crash's."""
    framework("torch")
    done, run_dir = profile_program(tmp_path, SEGFAULTING, "--flush-interval", "0.1",
                                    "--steps", "all", name="segv.py")
    script = tmp_path / "segv.py"
    assert done.returncode == 139, done.stderr
    site = f"Segmentation fault in read_freed_buffer ({script}:5)"
    assert f"crashed: {site} (every thread's stack: " in done.stderr, done.stderr
    analyzed = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(run_dir)],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "COLUMNS": "400"})
    if analyzed.returncode == 0:  # a start-up segment was written before the crash
        first = analyzed.stdout.splitlines()[0]
        assert first.startswith("The run failed: killed by SIGSEGV; pid "), analyzed.stdout
        assert f"crashed: {site}: what follows" in first
    else:  # only the step markers were: one line says what happened, not "no data"
        assert analyzed.returncode == 2 and len(analyzed.stderr.splitlines()) == 1
        assert "The run failed: killed by SIGSEGV; pid " in analyzed.stderr, analyzed.stderr
        assert f"crashed: {site}; it ended before any GPU activity" in analyzed.stderr


def test_a_programs_own_faulthandler_is_left_alone(tmp_path: Path) -> None:
    """`python -X faulthandler` writes a crash to the program's stderr, as without gpudiag."""
    framework("torch")
    script = tmp_path / "segv.py"
    script.write_text(textwrap.dedent(SEGFAULTING))
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o",
                           str(tmp_path / "run"), "--no-report", "--", sys.executable,
                           "-X", "faulthandler", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 139
    assert 'Fatal Python error: Segmentation fault' in done.stderr
    assert "in read_freed_buffer" not in done.stderr.split("gpudiag:", 1)[-1]
