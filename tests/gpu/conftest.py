"""GPU tests: run only where torch sees a CUDA GPU, skipped with the reason everywhere else.

Tests marked `@pytest.mark.gpu` are skipped, with why, when torch is missing or
`torch.cuda.is_available()` is False (CI, this laptop). The `profiled_run` fixture runs an
example under `python -m gpudiag profile --backend B` once per session, or reuses the run
directory `scripts/gpu_validate.sh` already made (`$GPUDIAG_GPU_RUNS/<name>-<backend>/`),
so the GPU minutes are not spent twice.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: run name -> example arguments (the same as scripts/gpu_validate.sh, fewer steps)
WORKLOADS = {
    "sync_in_loop": ["examples/sync_in_loop.py", "--steps", "100"],
    "fragmentation": ["examples/fragmentation.py", "--steps", "10"],
}


@functools.cache
def no_gpu_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return "torch is not installed, so no CUDA GPU can be used"
    if not torch.cuda.is_available():
        return (f"no CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__},"
                f" CUDA build {torch.version.cuda or 'none'})")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every `gpu`-marked test, with the reason, when there is no CUDA GPU."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = no_gpu_reason() if marked else None
    if reason:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


def _profile(run_dir: Path, name: str, backend: str) -> Path:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--backend",
           backend, "--no-report", "--", sys.executable, *WORKLOADS[name]]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}"
    return run_dir


@pytest.fixture(scope="session")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """`profiled_run(name, backend)` -> a run directory with `trace/` (made once)."""
    made: dict[tuple[str, str], Path] = {}

    def get(name: str, backend: str) -> Path:
        key = (name, backend)
        if key not in made:
            reuse = Path(os.environ.get("GPUDIAG_GPU_RUNS", "/nonexistent")) / \
                f"{name}-{backend}"
            made[key] = reuse if (reuse / "trace").is_dir() else _profile(
                tmp_path_factory.mktemp(f"{name}-{backend}") / "run", name, backend)
        return made[key]

    return get
