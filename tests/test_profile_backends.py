"""`gpudiag profile` with the torch and jax backends on CPU, end to end, and gpudiag.capture().

Each test runs a real program under the real session (`python -m gpudiag profile`), so the
bootstrap, the import trigger, torch.profiler / jax.profiler, the gather and the report are
all exercised as a user runs them. Times are checked on the shared epoch clock: the
torch ops of a step must fall inside that step's host marker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import gpudiag
from tests.conftest import framework

TORCH_LOOP = """
    import sys, torch, gpudiag
    x = torch.randn(64, 64, requires_grad=True)
    for i in range({steps}):
        gpudiag.step()
        with gpudiag.region("forward"):
            y = (x @ x).relu().sum()
        y.backward()
        loss = y.item()
    {tail}
"""


def _profile(tmp_path: Path, code: str, *options: str, name: str = "run",
             timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    run_dir = tmp_path / name
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
           "--flush-interval", "0.2", *options, "--", sys.executable, str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return done, run_dir


def _ops(trace: gpudiag.Trace) -> pd.DataFrame:
    return trace.ranges[trace.ranges["source"] == "torch_op"]


def _steps(trace: gpudiag.Trace) -> pd.DataFrame:
    return trace.ranges[trace.ranges["source"] == "step"].sort_values("start_ns")


def test_torch_backend_run_dir_trace_and_report(tmp_path: Path) -> None:
    framework("torch")
    done, run_dir = _profile(tmp_path, TORCH_LOOP.format(steps=4, tail="sys.exit(3)"),
                             "--backend", "torch", "--warmup-steps", "0")  # every step
    assert done.returncode == 3, done.stderr  # the child's status comes back
    assert "not collected: GPU activity" in done.stderr  # said in one line, no GPU here
    procs = list((run_dir / "procs").iterdir())
    assert len(procs) == 1
    segments = [p.name for p in (procs[0] / "torch").iterdir()]
    assert segments == ["segment-0001.pt.trace.json.gz"]  # gzipped once merged
    report = (run_dir / "report.html").read_text()
    assert "gpudiag report: run<" in report and "processes" in report  # the program
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["exit_code"] == 3 and meta["options"]["backend"] == "torch"
    trace = gpudiag.load(run_dir / "trace")
    steps, ops = _steps(trace), _ops(trace)
    assert list(steps["name"]) == [f"step {i}" for i in range(4)]
    assert {"aten::matmul", "aten::relu", "aten::sum", "aten::item"} <= set(ops["name"])
    assert set(ops["pid"]) == set(steps["pid"]) and len(set(ops["pid"])) == 1
    # one clock: each step's aten::item lies inside that step's host marker
    items = ops[ops["name"] == "aten::item"].sort_values("start_ns")
    assert len(items) == 4
    for (_, step), (_, item) in zip(steps.iterrows(), items.iterrows(), strict=True):
        assert step["start_ns"] <= item["start_ns"] <= item["end_ns"] <= step["end_ns"]
    process = trace.meta["processes"][0]
    assert process["collectors"] == ["host", "torch"]


def test_steps_window_collects_only_those_steps(tmp_path: Path) -> None:
    framework("torch")
    done, run_dir = _profile(tmp_path, TORCH_LOOP.format(steps=6, tail=""),
                             "--backend", "torch", "--steps", "2", "--warmup-steps", "0",
                             "--no-report")
    assert done.returncode == 0, done.stderr
    trace = gpudiag.load(run_dir / "trace")
    steps, ops = _steps(trace), _ops(trace)
    assert len(steps) == 6  # host markers are always kept
    first, third = steps.iloc[0], steps.iloc[2]
    assert ops["start_ns"].min() >= first["start_ns"] - 1_000_000  # profiler started at step 0
    assert ops["end_ns"].max() <= third["start_ns"]  # ...and stopped when step 2 opened
    assert (ops["name"] == "aten::item").sum() == 2
    assert not (run_dir / "report.html").exists()


def test_default_window_finds_optimizer_steps_and_records_twenty_after_warm_up(
        tmp_path: Path) -> None:
    framework("torch")
    code = """
        import torch
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        for i in range(40):
            opt.zero_grad()
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
    """
    done, run_dir = _profile(tmp_path, code, "--backend", "torch", "--no-report")
    assert done.returncode == 0, done.stderr
    assert "collected steps 4-23 (steps from the optimizer" in done.stderr
    trace = gpudiag.load(run_dir / "trace")
    steps = _steps(trace)
    assert len(steps) == 39 and steps["name"].iloc[0] == "step 1"  # one per iteration
    optimizer = trace.ranges[trace.ranges["name"].astype(str).str.startswith("Optimizer.step")]
    assert len(optimizer) == 20  # exactly the window's steps: warm-up and the rest dropped
    assert optimizer["start_ns"].min() >= steps["start_ns"].iloc[3]  # from step 4 on


def test_steps_without_markers_is_said(tmp_path: Path) -> None:
    framework("torch")
    code = "import torch\nprint(torch.ones(3).sum().item())\n"
    done, _run_dir = _profile(tmp_path, code, "--backend", "torch", "--steps", "3")
    assert done.returncode == 0
    assert "no training step found" in done.stderr


def test_delay_skips_the_warm_up(tmp_path: Path) -> None:
    framework("torch")
    code = """
        import sys, time, torch, gpudiag
        window = sys.modules["gpudiag.profiler.bootstrap"]._active.window
        x = torch.ones(8)
        i = after = 0
        while after < 10:  # ten steps after the window opened, however slow the machine
            gpudiag.step()
            y = (x * i).sum().item()
            time.sleep(0.05)
            i += 1
            after += window.on
    """
    done, run_dir = _profile(tmp_path, code, "--backend", "torch", "--delay", "3",
                             "--no-report")
    assert done.returncode == 0, done.stderr
    trace = gpudiag.load(run_dir / "trace")
    delay_over = trace.meta["processes"][0]["start_ns"] + 3_000_000_000
    items, steps = _ops(trace).query("name == 'aten::item'"), _steps(trace)
    assert len(items) >= 3
    assert items["start_ns"].min() >= delay_over - 50_000_000  # a timer's latency at most
    if steps["start_ns"].min() < delay_over - 200_000_000:  # torch imported in time
        assert len(items) < len(steps)


def test_crash_keeps_the_profile(tmp_path: Path) -> None:
    framework("torch")
    done, run_dir = _profile(tmp_path, TORCH_LOOP.format(
        steps=3, tail="raise RuntimeError('planted crash')"), "--backend", "torch")
    assert done.returncode == 1
    assert "planted crash" in done.stderr  # the program's own traceback, untouched
    trace = gpudiag.load(run_dir / "trace")
    assert len(_steps(trace)) == 3 and (_ops(trace)["name"] == "aten::item").sum() == 3


def test_sigterm_writes_the_profile_then_dies_of_sigterm(tmp_path: Path) -> None:
    framework("torch")
    ready = tmp_path / "ready"
    script = tmp_path / "term.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, time, torch, gpudiag
        gpudiag.step()
        torch.ones(4).sum().item()
        gpudiag.step()
        pathlib.Path({str(ready)!r}).write_text("go")
        time.sleep(60)
    """))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
                             "--backend", "torch", "--no-report", "--", sys.executable,
                             str(script)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    trace = gpudiag.load(run_dir / "trace")
    assert (_ops(trace)["name"] == "aten::item").sum() == 1
    assert len(list(run_dir.glob("procs/*/torch/segment-*.pt.trace.json.gz"))) == 1


def test_four_spawned_workers_write_their_own_profiles(tmp_path: Path) -> None:
    framework("torch")
    code = """
        import os, torch, torch.multiprocessing as mp, gpudiag

        def work(index):
            os.environ["RANK"] = str(index)  # as torchrun would set it, before any step
            for _ in range(2):
                gpudiag.step()
                torch.full((16,), float(index)).sum().item()

        if __name__ == "__main__":
            mp.spawn(work, nprocs=4, join=True)
    """
    done, run_dir = _profile(tmp_path, code, "--backend", "torch", "--no-report",
                             timeout=240)
    assert done.returncode == 0, done.stderr
    # the parent, four workers, and multiprocessing's resource tracker (which has no torch)
    assert len(list((run_dir / "procs").iterdir())) == 6
    segments = list(run_dir.glob("procs/*/torch/segment-0001.pt.trace.json.gz"))
    assert len(segments) == 5
    trace = gpudiag.load(run_dir / "trace")
    items = _ops(trace).query("name == 'aten::item'")
    assert items.groupby("pid").size().tolist() == [2, 2, 2, 2]
    assert _steps(trace)["pid"].nunique() == 4


def test_jax_backend_lines_up_with_the_markers(tmp_path: Path) -> None:
    framework("jax")
    code = """
        import jax, jax.numpy as jnp, gpudiag
        f = jax.jit(lambda x: (x @ x).sum())
        x = jnp.ones((128, 128))
        for i in range(4):
            gpudiag.step()
            float(f(x))
    """
    done, run_dir = _profile(tmp_path, code, "--backend", "jax", timeout=180)
    assert done.returncode == 0, done.stderr
    assert list(run_dir.glob("procs/*/jax/plugins/profile/*/*.xplane.pb"))
    trace = gpudiag.load(run_dir / "trace")
    assert [s["format"] for s in trace.meta["sources"]].count("xplane") == 1  # JSON twin skipped
    steps = _steps(trace)
    xla = trace.ranges[trace.ranges["source"].isin(["host", "python"])]
    assert len(steps) == 4 and len(xla)
    # jax's events are on the epoch clock: they overlap the steps, not 1970
    assert xla["start_ns"].min() > steps["start_ns"].min() - 10**9
    assert xla["end_ns"].max() < steps["end_ns"].max() + 10**9


def test_jax_step_window_drops_the_warm_up(tmp_path: Path) -> None:
    framework("jax")
    code = """
        import jax, jax.numpy as jnp, gpudiag
        f = jax.jit(lambda x: (x @ x).sum())
        x = jnp.ones((64, 64))
        for i in range(8):
            gpudiag.step()
            float(f(x + i))
    """
    done, run_dir = _profile(tmp_path, code, "--backend", "jax", "--warmup-steps", "2",
                             "--steps", "3", "--no-report", timeout=180)
    assert done.returncode == 0, done.stderr
    assert len(list(run_dir.glob("procs/*/jax/plugins/profile/*/*.xplane.pb"))) == 1
    assert "collected steps 3-5" in done.stderr
    trace = gpudiag.load(run_dir / "trace")
    steps = _steps(trace)
    xla = trace.ranges[trace.ranges["source"].isin(["host", "python"])]
    assert len(steps) == 8 and len(xla)
    ops = xla[xla["source"] == "host"] if (xla["source"] == "host").any() else xla[
        xla["depth"] > 0]  # a Python frame open since the start (the module) starts early
    assert ops["start_ns"].min() >= steps["start_ns"].iloc[2]  # warm-up steps 1-2 dropped
    assert xla["end_ns"].max() <= steps["start_ns"].iloc[5] + 50_000_000  # closed at step 6


def test_capture_collects_a_block_in_this_process() -> None:
    torch = framework("torch")
    x = torch.randn(32, 32)  # type: ignore[attr-defined]
    with gpudiag.capture("torch") as cap:
        for _ in range(3):
            gpudiag.step()
            (x @ x).sum().item()
    try:
        trace = cap.trace
        assert len(_steps(trace)) == 3
        assert (_ops(trace)["name"] == "aten::item").sum() == 3
        assert any("no NVIDIA GPU" in line for line in cap.not_collected)
        assert not gpudiag.profiler.bootstrap.is_active()  # markers are free again
    finally:
        cap.cleanup()
    assert not cap.run_dir.exists()


def test_capture_trace_before_the_block_ends_is_an_error() -> None:
    cap = gpudiag.capture("torch")
    with pytest.raises(gpudiag.CollectorError, match="block has ended"):
        _ = cap.trace
    with pytest.raises(gpudiag.CollectorError, match="gpudiag profile --backend nsys"):
        gpudiag.capture("nsys")


def test_cupti_backend_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--backend", "cupti",
                           "--", sys.executable, "-c", "pass"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={**os.environ})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudiag: error: --backend cupti needs")
    assert not (tmp_path / "gpudiag-runs").exists()  # nothing ran, nothing half-written


def test_auto_backend_without_a_gpu_profiles_with_torch(tmp_path: Path) -> None:
    framework("torch")
    done, run_dir = _profile(tmp_path, TORCH_LOOP.format(steps=2, tail=""))
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("gpudiag: not")]
    assert notes == ["gpudiag: not collected: GPU activity (kernels, copies, syncs, NVML): no "
                     "NVIDIA GPU or driver here (`gpudiag doctor` says how to get them)"]
    trace = gpudiag.load(run_dir / "trace")
    assert (_ops(trace)["name"] == "aten::item").sum() == 2
    assert trace.meta["processes"][0]["collectors"] == ["host", "torch"]
    n_ops = f"{(trace.ranges['source'] == 'torch_op').sum():,}"
    assert "gpudiag: collected 1 process, 2 steps (median " in done.stderr
    assert f"), {n_ops} torch ops" in done.stderr  # what a run without a GPU did record


def test_torchrun_workers_are_profiled_per_rank_and_the_launcher_is_not(tmp_path: Path) -> None:
    framework("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    code = """
        import torch, gpudiag
        for _ in range(2):
            gpudiag.step()
            torch.ones(8).sum().item()
    """
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--backend", "torch",
         "--no-report", "--", str(torchrun), "--standalone", "--nproc-per-node", "2",
         str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    procs = {p.name.rsplit("-", 1)[-1]: p for p in (run_dir / "procs").iterdir()}
    assert {"rank0", "rank1"} <= set(procs)
    launchers = [p for name, p in procs.items() if not name.startswith("rank")]
    assert launchers and all(not (p / "torch").exists() for p in launchers)
    launcher_meta = json.loads((launchers[0] / "meta.json").read_text())["process"]
    assert launcher_meta["collectors_skipped"] == ["torch (launcher process)"]
    trace = gpudiag.load(run_dir)
    items = _ops(trace).query("name == 'aten::item'")
    assert sorted(items["rank"].tolist()) == [0, 0, 1, 1]
    assert trace.meta["ranks"] == [0, 1]
