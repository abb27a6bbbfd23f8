"""`gpudiag profile` under signals, kills and a full disk: no hang, nothing lost silently, the
program's exit status kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.profiler import session
from tests.conftest import framework


def _profile(tmp_path: Path, code: str, *options: str, timeout: float = 180
             ) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(code))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--no-report",
           "--backend", "torch", "--flush-interval", "0.2", *options, "--",
           sys.executable, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), run_dir


POOL = """
    import multiprocessing as mp

    def work(i):
        import torch
        x = torch.randn(64, 64)
        for _ in range(20):
            x = (x @ x).tanh()
        return float(x.sum())

    if __name__ == "__main__":
        with mp.get_context("spawn").Pool(2) as pool:  # its exit SIGTERMs the workers
            print(sum(pool.map(work, range(4))))
"""


@pytest.mark.parametrize("run", range(3))
def test_a_spawn_pool_terminating_its_torch_workers_never_hangs_and_keeps_them(
        tmp_path: Path, run: int) -> None:
    """The pool's SIGTERM reached workers inside their final flush: the handler flushed
    again (hang, or death mid-export). The flush under way now finishes."""
    framework("torch")
    done, run_dir = _profile(tmp_path, POOL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "collected 4 processes" in done.stderr  # parent, 2 workers, resource tracker
    trace = gpudiag.load(run_dir / "trace")
    ops = trace.ranges[trace.ranges["source"] == "torch_op"]
    assert ops["pid"].nunique() == 2 and (ops["name"] == "aten::mm").sum() == 2 * 2 * 20


def test_a_killed_process_keeps_its_finished_segments_and_says_what_was_lost(
        tmp_path: Path) -> None:
    framework("torch")
    code = """
        import os, signal, time, torch
        x = torch.randn(32, 32)
        start, done = time.monotonic(), 0
        # at least 4 s and 400 steps of work (a loaded machine runs fewer per second):
        # a few 1 s segments written, most of the mm calls in finished ones
        while time.monotonic() - start < 4 or done < 400:
            x = (x @ x).tanh()
            done += 1
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    done, run_dir = _profile(tmp_path, code, "--steps", "all", "--segment-interval", "1")
    assert done.returncode == 128 + 9
    segments = list(run_dir.glob("procs/*/torch/segment-*.pt.trace.json.gz"))
    assert len(segments) >= 2
    trace = gpudiag.load(run_dir / "trace")
    assert (trace.ranges["name"] == "aten::mm").sum() > 50
    assert "ended without its final flush" in done.stderr
    assert "its earlier segments are kept" in done.stderr


def test_a_full_file_system_is_one_line_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage

    def almost_full(path: Any) -> Any:
        return real(path)._replace(free=10 * 2**20)

    monkeypatch.setattr(session.shutil, "disk_usage", almost_full)
    with pytest.raises(InputError, match="10 MB free; a profile needs at least 256 MB"):
        session.make_run_dir(["python", "train.py"], tmp_path / "run")


def test_a_run_that_cannot_be_written_keeps_the_programs_exit_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from gpudiag.cli import cli

    def full_disk(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session, "merge_run", full_disk)
    done = CliRunner().invoke(cli, ["profile", "-o", str(tmp_path / "run"), "--no-report",
                                    "--", sys.executable, "-c", "raise SystemExit(3)"])
    assert done.exit_code == 3
    assert "the command ran (exit status 3) but its profile could not be written" in \
        done.output
    assert "No space left on device" in done.output and "Traceback" not in done.output


def test_fork_pool_workers_keep_their_steps_and_torch_ops(tmp_path: Path) -> None:
    """Forked workers inherited a lock the parent's flush thread held at the fork: the
    SIGTERM that ends them hung there (the pool, and so the job, never ended)."""
    framework("torch")
    code = """
        import multiprocessing as mp
        import torch, gpudiag

        def work(i):
            out = 0.0
            for _ in range(6):
                with gpudiag.step():
                    x = torch.randn(32, 32)
                    out += float((x @ x).sum())
            return out

        if __name__ == "__main__":
            torch.ones(1).sum()  # the parent profiles too, so its state is forked
            with mp.get_context("fork").Pool(4) as pool:
                print(sum(pool.map(work, range(4), chunksize=1)))
    """
    done, run_dir = _profile(tmp_path, code, "--steps", "all")
    assert done.returncode == 0, done.stderr[-2000:]
    trace = gpudiag.load(run_dir / "trace")
    steps = trace.ranges[trace.ranges["source"] == "step"].groupby("pid").size()
    ops = trace.ranges[trace.ranges["name"] == "aten::mm"].groupby("pid").size()
    assert steps.sum() == 24 and set(ops.index) == set(steps.index)
    assert "collected 5 of" not in done.stderr and "ended without" not in done.stderr


def test_a_sigterm_another_thread_took_ends_the_blocked_program_with_its_profile(
        tmp_path: Path) -> None:
    """The kernel may hand a process's SIGTERM to any thread: the main thread, blocked on a
    lock, never ran the Python handler, and the program (a fork Pool's worker, in CI) never
    ended. Now it flushes and dies of SIGTERM, its step kept."""
    code = """
        import signal, threading, gpudiag

        with gpudiag.step():
            pass
        lock = threading.Lock()
        lock.acquire()
        kick = lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        threading.Timer(0.3, kick).start()
        lock.acquire()
    """
    done, run_dir = _profile(tmp_path, code, timeout=60)
    assert done.returncode == 128 + 15, done.stderr[-2000:]
    trace = gpudiag.load(run_dir / "trace")
    assert (trace.ranges["source"] == "step").sum() == 1


def test_profile_lines_never_carry_raw_control_characters(tmp_path: Path) -> None:
    """A command or run directory name holding ESC reaches the terminal escaped."""
    from click.testing import CliRunner

    from gpudiag.cli import cli

    done = CliRunner().invoke(cli, ["profile", "-o", str(tmp_path / "run\x1b]8;;x\x07"),
                                    "--no-report", "--", "no-such-\x1b[31mprogram"])
    assert done.exit_code == 127 and "cannot start" in done.output
    assert "\x1b" not in done.output and "\x07" not in done.output


def test_a_stop_reentered_on_its_own_thread_returns_instead_of_deadlocking(
        tmp_path: Path) -> None:
    """A second SIGTERM (the pool's and the forwarded one, or the handler's resend) landed
    inside the first stop, in `Event.set()` with its condition's lock held: the nested stop
    saw no flag set yet, called set() again and waited on its own thread's lock forever.
    Here the re-entry happens at that exact point, every time."""
    import threading

    from gpudiag.profiler import bootstrap

    run_dir = tmp_path / "run"
    session.make_run_dir(["x"], run_dir)
    session.write_json(run_dir / "meta.json", {"command": ["x"]})
    collector = bootstrap.HostCollector(run_dir, 3600.0, ["host"], {})
    collector.dir.mkdir(parents=True)
    nested: list[bool] = []

    class ReenteredEvent(threading.Event):
        def set(self) -> None:
            with self._cond:  # what Event.set holds when a handler may run in it
                nested.append(collector.stopping)
                collector.stop(from_signal=True)  # the nested handler's stop
                self._flag = True
                self._cond.notify_all()

    collector._wake = ReenteredEvent()
    stopper = threading.Thread(target=collector.stop, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "the re-entered stop deadlocked"
    assert nested == [True]  # the nested stop saw the stop under way and returned


def test_a_sigterm_flush_that_never_ends_still_ends_the_process(tmp_path: Path) -> None:
    """The backstop: past `FLUSH_DEADLINE_S` faulthandler's C thread writes the stacks and
    exits, even with the main thread stuck in the flush."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import os, signal, threading
        from gpudiag.profiler import sigterm

        sigterm.FLUSH_DEADLINE_S = 1.0

        class Stuck:
            stopping = False

            def stop(self, from_signal=False):
                self.stopping = True
                threading.Event().wait()  # a flush that never ends

            def postpone(self, function):
                return False

        sigterm.flush_on_sigterm(Stuck(), lambda function: False)
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "Timeout" in done.stderr and "in stop" in done.stderr  # the stuck stack, shown


SIGTERM_IN_A_WRITE = """
    import os, signal, sys, torch, gpudiag

    export = torch.profiler.profile.export_chrome_trace
    calls = 0

    def export_while_terminated(self, path):
        if calls:                              # a segment with the loop's ops in it
            with open(sys.argv[1], "w") as out:    # what the program ran before the signal
                out.write(str(calls))
            os.kill(os.getpid(), signal.SIGTERM)   # as a pool's terminate() lands mid-write
        return export(self, path)

    torch.profiler.profile.export_chrome_trace = export_while_terminated
    x = torch.randn(16, 16)
    while True:                                # until gpudiag writes its first segment
        gpudiag.step()
        x = (x @ x).tanh()
        calls += 1
"""


def test_a_sigterm_in_the_middle_of_a_segment_write_waits_for_it(tmp_path: Path) -> None:
    """A SIGTERM whose handler ran inside gpudiag's segment write used to find the write's
    lock taken, say "the open segment was lost" and end the process mid-write: the ops of
    the whole segment were gone (a spawn Pool's worker lost a quarter of its work that way,
    under load). The final flush now waits for the write, then the process dies of SIGTERM
    as it would have, with every op it ran kept."""
    framework("torch")
    ran = tmp_path / "ran"
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(SIGTERM_IN_A_WRITE))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--no-report",
         "--steps", "all", "--segment-interval", "1", "--", sys.executable, str(script),
         str(ran)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 128 + 15, done.stderr
    assert "segment was lost" not in done.stderr and "lost" not in done.stderr, done.stderr
    trace = gpudiag.load(run_dir / "trace")
    assert (trace.ranges["name"] == "aten::mm").sum() == int(ran.read_text()) > 0
    assert trace.meta["processes"][0]["ended_by"] == "SIGTERM"
