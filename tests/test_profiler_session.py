"""The profile session without a GPU: exit status, stdio, signals, per-process output, merge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from gpudiag.profiler.session import ProfileOptions, make_run_dir, merge_run, run
from tests.conftest import wait_for

FAST = ProfileOptions(flush_interval_s=0.2)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _session_in_subprocess(cmd: list[str], out: Path, **kwargs: object) -> subprocess.Popen[str]:
    """Run a session in its own process, so the test can capture its stdout or signal it."""
    # SIGINT as a foreground command has it: a test run in the background (`pytest &`, a CI
    # job started with `nohup ... &`) inherits it ignored, and so would the session's child,
    # which then slept through the forwarded SIGINT
    driver = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from pathlib import Path
        from gpudiag.profiler.session import ProfileOptions, run
        result = run({cmd!r}, out_dir=Path({str(out)!r}),
                     options=ProfileOptions(flush_interval_s=0.2))
        sys.exit(result.exit_code)
    """)
    return subprocess.Popen([sys.executable, "-c", driver], text=True, **kwargs)  # type: ignore[call-overload]




def test_exit_status_of_the_child_is_returned(tmp_path: Path) -> None:
    assert run(_py("pass"), out_dir=tmp_path / "ok", options=FAST).exit_code == 0
    result = run(_py("import sys; sys.exit(3)"), out_dir=tmp_path / "three", options=FAST)
    assert result.exit_code == 3
    meta = json.loads((result.run_dir / "meta.json").read_text())
    assert meta["exit_code"] == 3
    assert meta["command"][0] == sys.executable
    assert meta["options"]["flush_interval_s"] == 0.2


def test_child_stdout_is_forwarded(tmp_path: Path) -> None:
    proc = _session_in_subprocess(_py("print('hello from the child')"), tmp_path / "run",
                                  stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "hello from the child" in out


def test_sigterm_to_the_session_reaches_the_child(tmp_path: Path) -> None:
    got, ready = tmp_path / "got-sigterm", tmp_path / "ready"
    child = _py(f"""
        import pathlib, signal, sys, time
        def on_term(signum, frame):
            pathlib.Path({str(got)!r}).write_text("yes")
            sys.exit(5)
        signal.signal(signal.SIGTERM, on_term)
        pathlib.Path({str(ready)!r}).write_text("ready")
        time.sleep(60)
    """)
    proc = _session_in_subprocess(child, tmp_path / "run")
    wait_for(ready)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 5
    assert got.read_text() == "yes"


def test_sigint_to_the_session_reaches_the_child(tmp_path: Path) -> None:
    """A `kill -INT` aimed at the session (not a terminal Ctrl-C) is passed on; the child's
    KeyboardInterrupt runs its cleanup, and its death by SIGINT is the session's status."""
    ready, cleaned = tmp_path / "ready", tmp_path / "cleaned"
    child = _py(f"""
        import pathlib, time
        pathlib.Path({str(ready)!r}).write_text("ready")
        try:
            time.sleep(60)
        finally:
            pathlib.Path({str(cleaned)!r}).write_text("yes")
    """)
    proc = _session_in_subprocess(child, tmp_path / "run", stderr=subprocess.PIPE)
    wait_for(ready)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    assert cleaned.read_text() == "yes" and "KeyboardInterrupt" in err
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["signal"] == signal.SIGINT and meta["exit_code"] == 130


def test_each_python_process_writes_its_own_directory(tmp_path: Path) -> None:
    code = """
        import subprocess, sys
        procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(4)]
        assert all(p.wait() == 0 for p in procs)
    """
    result = run(_py(code), out_dir=tmp_path / "run", options=FAST)
    assert result.exit_code == 0
    dirs = sorted((result.run_dir / "procs").iterdir())
    assert len(dirs) == 5
    trace = merge_run(result.run_dir)
    pids = {p["pid"] for p in trace.meta["processes"]}
    assert len(pids) == 5
    assert (result.run_dir / "trace" / "meta.json").is_file()


def test_rank_is_in_the_process_directory_name(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "8"}
    result = run(_py("pass"), out_dir=tmp_path / "run", env=env, options=FAST)
    (proc_dir,) = (result.run_dir / "procs").iterdir()
    assert proc_dir.name.endswith("-rank3")
    assert merge_run(result.run_dir).meta["ranks"] == [3]


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    marker = tmp_path / "user-sitecustomize-ran"
    (user / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": str(user)}
    result = run(_py("pass"), out_dir=tmp_path / "run", env=env, options=FAST)
    assert result.exit_code == 0
    assert marker.read_text() == "ran"
    assert len(list((result.run_dir / "procs").iterdir())) == 1  # ours ran too


def test_recorded_ranges_reach_the_merged_trace(tmp_path: Path) -> None:
    code = """
        from gpudiag.profiler.bootstrap import is_active, record_range
        assert is_active()
        record_range("step", 1_000, 2_000, "step")
        record_range("data", 1_100, 1_500)
    """
    result = run(_py(code), out_dir=tmp_path / "run", options=FAST)
    assert result.exit_code == 0
    ranges = merge_run(result.run_dir).ranges
    assert sorted(ranges["name"].astype(str)) == ["data", "step"]
    assert set(ranges["source"].astype(str)) == {"step", "annotation"}
    assert ranges["pid"].nunique() == 1


def test_sigkill_keeps_the_ranges_flushed_before_it(tmp_path: Path) -> None:
    code = """
        import os, signal, time
        from gpudiag.profiler.bootstrap import record_range
        record_range("before-kill", 10, 20, "step")
        time.sleep(1.0)  # five flush intervals
        os.kill(os.getpid(), signal.SIGKILL)
    """
    result = run(_py(code), out_dir=tmp_path / "run", options=FAST)
    assert result.signal == signal.SIGKILL
    assert result.exit_code == 128 + signal.SIGKILL
    trace = merge_run(result.run_dir)
    assert list(trace.ranges["name"].astype(str)) == ["before-kill"]


def test_a_run_without_python_gives_an_empty_trace_with_run_meta(tmp_path: Path) -> None:
    result = run(["/bin/sh", "-c", "exit 0"], out_dir=tmp_path / "run", options=FAST)
    trace = merge_run(result.run_dir)
    assert sum(trace.row_counts().values()) == 0
    assert trace.meta["command"] == ["/bin/sh", "-c", "exit 0"]
    assert trace.meta["run"]["exit_code"] == 0


def test_run_directories_are_never_reused(tmp_path: Path) -> None:
    first = make_run_dir(["x"], tmp_path / "run")
    second = make_run_dir(["x"], tmp_path / "run")
    assert first != second
    assert second.name == "run-2"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_run_dir(["x"], empty) == empty.resolve()


def test_forked_multiprocessing_workers_flush_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "forky.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp
        from gpudiag.profiler.bootstrap import record_range
        def work(i):
            record_range(f"worker{i}", 1, 2)
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            procs = [ctx.Process(target=work, args=(i,)) for i in range(4)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
    """))
    result = run([sys.executable, str(script)], out_dir=tmp_path / "run", options=FAST)
    assert result.exit_code == 0
    trace = merge_run(result.run_dir)
    assert len(trace.meta["processes"]) == 5
    assert sorted(trace.ranges["name"].astype(str)) == [f"worker{i}" for i in range(4)]
    assert trace.ranges["pid"].nunique() == 4
