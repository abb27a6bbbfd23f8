"""`gpudiag doctor`: which collectors this machine can run, and how to get the missing ones.

The probes are `collectors/probes.py`; this module lists them in a fixed order and renders
the report. The same checks give `gpudiag profile` its one line on what was not collected.

    from gpudiag.profiler.doctor import checks, render
    rich.print(render(checks()))
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpudiag.collectors.probes import (
    DRIVER_FIX,
    Check,
    check_gpu,
    check_ncu_permission,
    check_package,
    check_tool,
    check_torch_cuda,
)

__all__ = ["Check", "checks", "missing_line", "render", "render_text"]


def checks() -> list[Check]:
    """Every collector of `gpudiag profile` and the tools behind them, in a fixed order."""
    return [
        check_gpu(),
        check_tool("nvidia-smi", "driver tool", DRIVER_FIX),
        check_package("cupti", "cupti", "cupti-python", "CUPTI kernel/memcpy/sync activity",
                      "pip install 'gpudiag[cupti]' (needs a CUDA 12.8+ driver)"),
        check_package("nvtx", "nvtx", "nvtx", "step/region markers seen by every profiler",
                      "pip install nvtx"),
        check_package("torch", "torch", "torch", "torch.profiler backend, CPU or GPU",
                      "pip install 'gpudiag[torch]'"),
        check_torch_cuda(),
        check_package("jax", "jax", "jax", "jax.profiler backend",
                      "pip install 'gpudiag[jax]' (GPU: pip install 'jax[cuda12]')"),
        check_package("cupy", "cupy", "cupy-cuda13x", "CuPy programs and NCCL timing",
                      "pip install 'gpudiag[cupy]'"),
        check_tool("nsys", "Nsight Systems backend",
                   "install Nsight Systems (CUDA toolkit or https://developer.nvidia.com/nsight-systems)"),
        check_tool("ncu", "Nsight Compute backend",
                   "install Nsight Compute (CUDA toolkit or https://developer.nvidia.com/nsight-compute)"),
        check_ncu_permission(),
    ]


def render(results: list[Check]) -> Table:
    """A rich table: collector, ok/missing, what was found, how to get what is missing.

    Text is escaped: install hints such as `gpudiag[nvml]` would otherwise read as markup.
    """
    table = Table(title="gpudiag doctor", show_lines=False)
    for column in ("collector", "status", "detail", "how to get it"):
        table.add_column(column, overflow="fold")
    for check in results:
        status = "[green]ok[/]" if check.available else "[red]missing[/]"
        how = "" if check.available else check.how_to_get
        table.add_row(escape(check.name), status, escape(check.detail), escape(how))
    return table


def render_text(results: list[Check]) -> str:
    """The same report as plain text (logs, `--no-color`, tests)."""
    lines = []
    for check in results:
        mark = "ok     " if check.available else "missing"
        lines.append(f"{mark} {check.name}: {check.detail}")
        if not check.available and check.how_to_get:
            lines.append(f"        -> {check.how_to_get}")
    return "\n".join(lines)


def missing_line(results: list[Check]) -> str:
    """One line naming what is missing ("" when nothing is), for `gpudiag profile`."""
    missing = [check.name for check in results if not check.available]
    if not missing:
        return ""
    return f"not available: {', '.join(missing)} (`gpudiag doctor` says how to get them)"
