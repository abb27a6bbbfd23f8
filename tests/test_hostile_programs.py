"""`gpudiag profile` around programs that do what gpudiag itself does: exec, run gpudiag,
run their own profiler or profile function, shadow the standard library, import torch on a
thread, delete the run. Each runs a real program under the real session; the program's own
result (its output, its files, its exit status) must be what it is without gpudiag.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gpudiag
from tests.conftest import framework


def _script(folder: Path, name: str, code: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(code))
    return path


def _profile(tmp_path: Path, script: Path, *options: str, run: str = "run",
             timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir = tmp_path / run
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--no-report",
           "--flush-interval", "0.2", *options, "--", sys.executable, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), run_dir


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr


TORCH_STEPS = """
    import torch
    x = torch.randn(32, 32)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.randn(4))], lr=0.1)
    for _ in range({steps}):
        x = (x @ x).tanh()
        opt.step()
"""


def test_a_program_that_execs_python_keeps_what_it_collected_before(tmp_path: Path) -> None:
    """os.execv skips atexit: the torch profile of the first image was lost and the second
    image's meta overwrote the first's (same pid, same directory)."""
    framework("torch")
    other = _script(tmp_path, "other.py", "import sys; print('other ran'); sys.exit(7)\n")
    script = _script(tmp_path, "prog.py", TORCH_STEPS.format(steps=3) + f"""
    import os, sys
    print("before exec", flush=True)
    os.execv(sys.executable, [sys.executable, {str(other)!r}])
    """)
    done, run_dir = _profile(tmp_path, script, "--steps", "all")
    assert done.returncode == 7 and done.stdout == "before exec\nother ran\n", done.stderr
    _no_traceback(done)
    first, second = sorted((run_dir / "procs").iterdir(), key=lambda path: len(path.name))
    assert second.name == first.name + ".2"  # the new image beside the old, never over it
    assert json.loads((first / "meta.json").read_text())["process"]["end_ns"] is not None
    assert list((first / "torch").glob("segment-*"))  # flushed before the exec
    trace = gpudiag.load(run_dir / "trace")
    assert (trace.ranges["name"] == "aten::mm").any()


def test_a_program_that_execs_a_shell_keeps_its_output_and_status(tmp_path: Path) -> None:
    script = _script(tmp_path, "prog.py", """
        import os
        print("before exec", flush=True)
        os.execvp("sh", ["sh", "-c", "echo hi; exit 5"])
    """)
    done, _run_dir = _profile(tmp_path, script)
    assert done.returncode == 5 and done.stdout == "before exec\nhi\n"
    _no_traceback(done)


def test_gpudiag_profile_inside_gpudiag_profile_profiles_the_program_once(
        tmp_path: Path) -> None:
    """The inner bootstrap chained to the outer one as "the user's sitecustomize", which
    chained back: a RecursionError in every process, printed into the program's stderr."""
    script = _script(tmp_path, "prog.py", """
        import sys, gpudiag
        for _ in range(3):
            gpudiag.step()
        print("prog ran")
        sys.exit(4)
    """)
    inner = [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "inner"),
             "--no-report", "--", sys.executable, str(script)]
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "outer"),
           "--no-report", "--", *inner]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and done.stdout == "prog ran\n", done.stderr
    assert "sitecustomize" not in done.stderr and "RecursionError" not in done.stderr
    trace = gpudiag.load(tmp_path / "inner" / "trace")
    assert (trace.ranges["source"] == "step").sum() == 3  # the innermost session has it
    assert f"its command is profiled in {tmp_path / 'inner'}" in done.stderr  # the outer says


def test_a_program_running_its_own_torch_profiler_keeps_its_trace_and_status(
        tmp_path: Path) -> None:
    """Two Kineto sessions in one process: the program's stop ended gpudiag's, and the
    process died of SIGSEGV at exit (status 139 for a program that exits 0)."""
    framework("torch")
    script = _script(tmp_path, "prog.py", """
        import os, torch
        from torch.profiler import ProfilerActivity, profile, schedule
        from torch.profiler import tensorboard_trace_handler
        x = torch.randn(64, 64)
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=1, warmup=1, active=2),
                     on_trace_ready=tensorboard_trace_handler("tb")) as prof:
            for _ in range(8):
                x = (x @ x).tanh()
                prof.step()
        print("traces", len(os.listdir("tb")))
    """)
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "run"),
         "--no-report", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "traces 2\n", done.stderr
    assert "the program started its own torch.profiler" in done.stderr
    assert gpudiag.load(tmp_path / "run" / "trace") is not None


def test_a_program_tracing_jax_itself_runs_as_without_gpudiag(tmp_path: Path) -> None:
    """jax runs one trace per process: the program's own failed with "Profile has already
    been started"."""
    framework("jax")
    script = _script(tmp_path, "prog.py", """
        import os, jax, jax.numpy as jnp
        x = jnp.ones((32, 32))
        with jax.profiler.trace("mine"):
            x = (x @ x).block_until_ready()
        jax.profiler.start_trace("mine2")
        x = (x @ x).block_until_ready()
        jax.profiler.stop_trace()
        print(sorted(os.listdir("mine")), sorted(os.listdir("mine2")))
    """)
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "run"),
         "--no-report", "--backend", "jax", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "['plugins'] ['plugins']\n", done.stderr
    assert "the program started its own jax trace" in done.stderr


def test_the_programs_own_profile_function_stays_set(tmp_path: Path) -> None:
    """torch.profiler's Python stacks replace the thread's profile function at each start
    and clear it at each stop: the program's was gone after the warm-up steps."""
    framework("torch")
    script = _script(tmp_path, "prog.py", """
        import sys, threading, torch
        def prof(frame, event, arg):
            pass
        x = torch.randn(32, 32)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.randn(4))], lr=0.1)
        sys.setprofile(prof)
        threading.setprofile(prof)
        kept = []
        for _ in range(8):
            x = (x @ x).tanh()
            opt.step()
            kept.append(sys.getprofile() is prof)
        seen = []
        worker = threading.Thread(target=lambda: seen.append(sys.getprofile() is prof))
        worker.start(); worker.join()
        sys.setprofile(None)
        print(all(kept), seen)
    """)
    done, run_dir = _profile(tmp_path, script, "--warmup-steps", "2")
    assert done.returncode == 0 and done.stdout == "True [True]\n", done.stderr
    assert (gpudiag.load(run_dir / "trace").ranges["name"] == "aten::mm").any()


def _shadowing_folder(tmp_path: Path, program: str) -> Path:
    """A program's folder with its own json.py, socket.py, tempfile.py and a zoneinfo.py
    that must never run (pandas imports zoneinfo)."""
    folder = tmp_path / "prog"
    for name in ("json", "socket", "tempfile"):
        _script(folder, f"{name}.py", f"VALUE = 'mine-{name}'\n")
    _script(folder, "zoneinfo.py", "raise RuntimeError('the program zoneinfo.py ran')\n")
    return _script(folder, "prog.py", program)


def test_the_programs_modules_that_shadow_the_standard_library_stay_its_own(
        tmp_path: Path) -> None:
    """Its json.py was replaced by the standard json the bootstrap had imported, and
    pandas, imported by gpudiag's first marker, ran its zoneinfo.py: the error came out of
    gpudiag.step()."""
    script = _shadowing_folder(tmp_path, """
        import gpudiag
        for _ in range(3):
            gpudiag.step()
        import json, socket, tempfile
        print(json.VALUE, socket.VALUE, tempfile.VALUE)
    """)
    done, run_dir = _profile(tmp_path, script)
    assert (done.returncode, done.stdout) == (0, "mine-json mine-socket mine-tempfile\n"), \
        done.stderr
    _no_traceback(done)
    steps = gpudiag.load(run_dir / "trace").ranges
    assert (steps["source"] == "step").sum() == 3  # pandas came from the standard library


def test_a_shadowing_module_the_program_imported_first_costs_markers_not_the_program(
        tmp_path: Path) -> None:
    """pandas then finds the program's json in sys.modules and cannot import: the markers
    are lost, said in one line naming the file; the program runs as without gpudiag."""
    script = _shadowing_folder(tmp_path, """
        import json
        import gpudiag
        for _ in range(3):
            gpudiag.step()
        print(json.VALUE)
    """)
    done, run_dir = _profile(tmp_path, script)
    assert (done.returncode, done.stdout) == (0, "mine-json\n"), done.stderr
    _no_traceback(done)
    errors = (run_dir / "bootstrap-errors.log").read_text().splitlines()
    assert len(errors) == 1 and "host markers are not recorded" in errors[0]
    assert str(tmp_path / "prog" / "json.py") in errors[0]


def test_torch_imported_on_a_thread_that_ends_is_profiled_and_the_process_exits_cleanly(
        tmp_path: Path) -> None:
    """The profiler started on the importing thread was never stopped there (Kineto stops
    only on its own thread): SIGSEGV at exit, status 139 for a program that exits 3."""
    framework("torch")
    script = _script(tmp_path, "prog.py", """
        import sys, threading
        def work():
            import torch
            x = torch.randn(32, 32)
            for _ in range(4):
                x = (x @ x).tanh()
        worker = threading.Thread(target=work)
        worker.start(); worker.join()
        import torch
        y = torch.randn(8, 8)
        for _ in range(3):
            y = torch.mm(y, y)
        print("done")
        sys.exit(3)
    """)
    done, run_dir = _profile(tmp_path, script, "--steps", "all")
    assert done.returncode == 3 and done.stdout == "done\n", done.stderr
    ranges = gpudiag.load(run_dir / "trace").ranges
    threads = ranges[ranges["name"] == "aten::mm"]["tid"].nunique()
    assert threads == 2  # the worker's ops, then the main thread's after the hand-over


def test_a_program_that_deletes_its_run_directory_keeps_its_result(tmp_path: Path) -> None:
    """The torch plugin's next segment failed to write, and the error came out of the
    program's `optimizer.step()`: status 1 instead of 5, its result file never written."""
    framework("torch")
    script = _script(tmp_path, "prog.py", TORCH_STEPS.format(steps=5) + """
    import os, shutil, sys
    shutil.rmtree(os.environ["GPUDIAG_RUN_DIR"])
    for _ in range(12):
        x = (x @ x).tanh()
        opt.step()
    open("result.txt", "w").write("ok")
    sys.exit(5)
    """)
    # no periodic flush: one that lands inside the program's rmtree still makes it fail
    # ("Directory not empty", a race of a few ms per interval that no writer can avoid)
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "run"),
         "--flush-interval", "3600", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert (tmp_path / "result.txt").read_text() == "ok"
    _no_traceback(done)
    lines = [line for line in done.stderr.splitlines() if line.startswith("gpudiag: error")]
    assert len(lines) == 1 and "was deleted while it ran" in lines[0]
    assert not (tmp_path / "run").exists()  # nothing of it was made again
