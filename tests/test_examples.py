"""The examples/ workloads run on CPU and print the numbers they advertise.

Each runs as a subprocess with a few steps (the way users and scripts/gpu_validate.sh run
them); the GPU behaviour — what gpudiag finds in them — is checked by scripts/gpu_checks.py
on a GPU machine. torch is needed (CI without it skips with that reason); the JAX and CuPy
variants skip when those packages are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import framework

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

torch = framework("torch")  # CI installs it; elsewhere a skip with the reason


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def run_example(name: str, *args: str, timeout: float = 120) -> tuple[
        subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run examples/<name>.py on CPU; returns the process and its last-line JSON."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--device", "cpu",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON line on stdout: {proc.stdout[-500:]!r}"
    return proc, json.loads(lines[-1])


def test_sync_in_loop_planted_reads_the_loss_every_step() -> None:
    _, out = run_example("sync_in_loop", "--steps", "6")
    assert out["example"] == "sync_in_loop"
    assert out["fixed"] is False
    assert out["device"] == "cpu"
    assert out["steps"] == 6
    assert out["timed_steps"] == 3  # warmup min(5, 6 // 2) steps are left out
    assert out["steps_per_s"] > 0
    assert isinstance(out["final_loss"], float)


def test_sync_in_loop_fixed_logs_every_n_steps_without_item() -> None:
    proc, out = run_example("sync_in_loop", "--steps", "7", "--fixed", "--log-every", "3")
    assert out["fixed"] is True
    assert out["final_loss"] is None
    logged = [ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("step ")]
    assert logged == ["0", "3", "6"]


def test_small_grids_torch_one_and_32_launches() -> None:
    outs = {n: run_example("small_grids", "--launches", str(n), "--steps", "4",
                           "--repeat", "5")[1] for n in (1, 32)}
    for n, out in outs.items():
        assert out["launches"] == n
        assert out["impl"] == "torch"
        assert out["elements"] == 1024 * 32
        assert out["grid_block"] is None  # torch picks its own grids
        assert out["timed_steps"] == 2
        assert out["per_pattern_us"] > 0


def test_small_grids_cupy_refuses_cpu_with_a_reason() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "small_grids.py"), "--device",
                           "cpu", "--impl", "cupy"], capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert proc.returncode == 1
    assert "--impl cupy needs a GPU" in proc.stderr


def test_small_grids_cupy_launches_the_published_grids() -> None:
    pytest.importorskip("cupy", reason="CuPy is not installed")
    if not torch.cuda.is_available():
        pytest.skip("the CuPy variant needs a CUDA GPU")
    for n, blocks in ((1, 1024), (32, 32)):
        proc = subprocess.run([sys.executable, str(EXAMPLES / "small_grids.py"), "--impl",
                               "cupy", "--launches", str(n), "--steps", "3"],
                              capture_output=True, text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1])["grid_block"] == [blocks, 32]


def test_fragmentation_runs_on_cpu_with_null_memory_numbers() -> None:
    _, out = run_example("fragmentation", "--steps", "3")
    assert out["example"] == "fragmentation"
    assert out["pairs"] == 50
    assert out["kept_block_bytes"] > out["activation_bytes"] > out["freed_block_bytes"]
    for key in ("reserved_bytes", "allocated_bytes", "reserved_over_allocated",
                "inactive_split_bytes", "snapshot"):
        assert out[key] is None, key


@pytest.mark.parametrize(("dtype", "accum"), [("fp32", 1), ("bf16", 4)])
def test_grad_accumulation_prints_samples_per_s_and_peak_memory(dtype: str,
                                                                accum: int) -> None:
    _, out = run_example("grad_accumulation", "--dtype", dtype, "--accum", str(accum),
                         "--steps", "4", "--batch", "64")
    assert {"samples_per_s", "steps_per_s", "peak_memory_bytes",
            "peak_memory_source"} <= out.keys()
    assert (out["dtype"], out["accum"], out["micro_batch"]) == (dtype, accum, 64 // accum)
    assert out["samples_per_s"] == pytest.approx(out["steps_per_s"] * 64, rel=0.01)
    assert out["peak_memory_bytes"] > 0
    assert out["peak_memory_source"] == "ru_maxrss"


def test_grad_accumulation_rejects_a_batch_not_divisible_by_accum() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "grad_accumulation.py"),
                           "--device", "cpu", "--batch", "10", "--accum", "4"],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1
    assert "not divisible" in proc.stderr


def test_nccl_allreduce_world_size_one_on_gloo() -> None:
    _, out = run_example("nccl_allreduce", "--steps", "3", "--sizes", "4096,65536")
    assert (out["backend"], out["world_size"]) == ("gloo", 1)
    assert [r["bytes"] for r in out["all_reduce"]] == [4096, 65536]
    assert all(r["median_us"] > 0 and r["algbw_gb_s"] > 0 for r in out["all_reduce"])


def test_jax_train_planted_and_fixed() -> None:
    framework("jax")
    _, planted = run_example("jax_train", "--steps", "6")
    _, fixed = run_example("jax_train", "--steps", "6", "--fixed")
    assert planted["example"] == fixed["example"] == "jax_train"
    assert planted["device"] == "cpu"
    assert isinstance(planted["final_loss"], float)
    assert fixed["final_loss"] is None
    assert planted["steps_per_s"] > 0
    assert fixed["steps_per_s"] > 0


def test_examples_run_when_gpudiag_is_not_importable() -> None:
    """`import gpudiag` failing (sys.modules entry None) turns the markers into no-ops.

    The script's folder goes first on sys.path, as `python examples/X.py` does (run_path
    does not), so the examples' shared `_example` module is found.
    """
    code = ("import os, runpy, sys; sys.modules['gpudiag'] = None; "
            "sys.argv = [sys.argv[1], '--device', 'cpu', '--steps', '3']; "
            "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    for name in ("sync_in_loop", "fragmentation", "nccl_allreduce"):
        proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / f"{name}.py")],
                              capture_output=True, text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1])["example"] == name


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "sync_in_loop.py"), "--device",
                           "cuda"], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 1
    assert "torch.cuda.is_available() is False" in proc.stderr


def test_profiled_example_records_one_step_range_per_step(tmp_path: Path) -> None:
    """Under `gpudiag profile`, the example's gpudiag.step() calls reach the merged trace."""
    from gpudiag import load

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
                           "--no-report", "--", sys.executable,
                           str(EXAMPLES / "sync_in_loop.py"), "--device", "cpu",
                           "--steps", "4"], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["steps"] == 4
    ranges = load(run_dir / "trace").ranges
    steps = sorted(ranges.loc[ranges["source"] == "step", "name"].astype(str))
    assert steps == ["step 0", "step 1", "step 2", "step 3"]
