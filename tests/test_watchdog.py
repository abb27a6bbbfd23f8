"""`gpudiag profile` never hangs on a stuck rank and never loses the others silently; the gloo
DDP job that deadlocked in teardown under torch.profiler ends by itself, run after run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gpudiag
from gpudiag.profiler.watchdog import MAX_IDLE_CPU, Watchdog
from tests.conftest import framework

PROGRAMS = Path(__file__).parent / "programs"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _profile(run_dir: Path, *cmd: str, options: tuple[str, ...] = (), timeout: float = 240
             ) -> subprocess.CompletedProcess[str]:
    line = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--no-report",
            "--backend", "torch", *options, "--", *cmd]
    return subprocess.run(line, capture_output=True, text=True, timeout=timeout)


def test_a_rank_that_stops_after_the_other_finished_is_ended_with_its_stacks(
        tmp_path: Path) -> None:
    framework("torch")
    run_dir = tmp_path / "run"
    done = _profile(run_dir, str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
                    str(PROGRAMS / "rank_hangs.py"), options=("--stall-timeout", "3"))
    assert done.returncode != 0  # torchrun reports the rank that was ended
    ended = json.loads((run_dir / "watchdog.json").read_text())
    assert [e["rank"] for e in ended] == [1]
    assert "no progress" in ended[0]["reason"]
    assert ended[0]["ended_by"] in ("SIGTERM", "SIGKILL")
    assert f"rank 1 (pid {ended[0]['pid']}) made no progress" in done.stderr
    stacks = Path(ended[0]["stacks"]).read_text()
    python = stacks.split("== Python")[1].split("== threads")[0]
    stuck = 1 + (PROGRAMS / "rank_hangs.py").read_text().splitlines().index(
        "    lock.acquire()  # never returns: no CPU used, no progress")
    assert f'rank_hangs.py", line {stuck}' in python  # where it is stuck, from faulthandler
    assert "== native (gdb) ==" in stacks and "futex" in stacks  # the kernel's wait channel
    trace = gpudiag.load(run_dir / "trace")
    assert set(trace.ranges.dropna(subset=["rank"])["rank"]) == {0, 1}  # nothing lost


def test_a_child_left_running_after_the_command_exits_is_ended(tmp_path: Path) -> None:
    script = tmp_path / "leaves_a_child.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([{sys.executable!r}, "-c", "import time; time.sleep(600)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)  # the child is under way (its bootstrap wrote its directory)
        print("parent done")
    """))
    started = time.monotonic()
    done = _profile(tmp_path / "run", sys.executable, str(script),
                    options=("--stall-timeout", "2"), timeout=120)
    assert done.returncode == 0 and time.monotonic() - started < 100
    assert "still running 2 s after the command exited" in done.stderr
    ended = json.loads((tmp_path / "run" / "watchdog.json").read_text())
    assert len(ended) == 1 and ended[0]["rank"] is None


def test_a_busy_rank_is_never_idle_and_a_silent_one_is(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, grace_s=2)
    busy = [(t * 0.5, t * 0.5) for t in range(10)]  # a whole core
    assert not dog.is_idle(busy, now=4.5)
    silent = [(t * 0.5, 1.0 + t * 0.0001) for t in range(10)]  # a flush thread's worth
    assert dog.is_idle(silent, now=4.5)
    assert silent[-1][1] - silent[0][1] < MAX_IDLE_CPU * 2
    assert not dog.is_idle(silent[-3:], now=4.5)  # not watched for the whole grace yet


@pytest.mark.parametrize("run", range(5))
def test_the_gloo_ddp_job_ends_by_itself_every_time(tmp_path: Path, run: int) -> None:
    """The DDP tutorial's shape on CPU with gloo hung in 3 of 5 profiled runs: the process
    group was torn down while torch.profiler ran. No watchdog may be needed here. (Five
    runs all pass by chance at that rate once in a hundred sessions.)"""
    framework("torch")
    run_dir = tmp_path / "run"
    done = _profile(run_dir, str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
                    str(PROGRAMS / "ddp_gloo.py"), "4", options=("--stall-timeout", "0"),
                    timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (run_dir / "watchdog.json").exists()
    segments = sorted(run_dir.glob("procs/*-rank*/torch/segment-*.pt.trace.json.gz"))
    assert len({s.parent.parent for s in segments}) == 2  # both ranks' profiles are there
    assert "collected 3 processes" in done.stderr
