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

__all__ = ["Check", "checks", "missing_line", "render", "render_text", "summary"]


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
        check_package("ncu reader", "ncu_report", "ncu-report",
                      "reads .ncu-rep files without Nsight Compute installed",
                      "pip install 'gpudiag[ncu]'"),
    ]


#: what each collector gives `gpudiag profile` when its checks pass (names of `checks()`)
_COLLECTS = (
    (("GPU / driver (NVML)", "cupti"), "GPU kernels, copies, syncs and memory (CUPTI)"),
    (("GPU / driver (NVML)",), "GPU utilization, memory, clock and power samples (NVML)"),
    (("torch", "torch CUDA"), "torch ops, host steps and GPU kernels (torch.profiler)"),
    (("jax",), "jax host ops and device activity (jax.profiler)"),
    (("nsys",), "Nsight Systems timelines (--backend nsys)"),
    (("ncu", "ncu counter permission"), "Nsight Compute metrics (--backend ncu)"),
)
#: the readers that need something this machine may lack; every other format always reads
_READS = (("ncu reader", "Nsight Compute reports (.ncu-rep)"),
          ("nsys", "Nsight Systems reports (.nsys-rep, exported through nsys)"))
ALWAYS_READ = ("PyTorch profiler (Kineto) traces, Nsight Systems SQLite exports, JAX XSpace "
               "and Perfetto traces, CUDA memory snapshots and timelines, nccl-tests logs, "
               "saved traces and gpudiag run directories")


def summary(results: list[Check]) -> list[str]:
    """What this machine can collect and read, in words: the lines under the table (the
    table says what is missing; these say what a user gets with what is here)."""
    ok = {check.name for check in results if check.available}
    can = [text for needs, text in _COLLECTS if set(needs) <= ok]
    cannot = [text for needs, text in _COLLECTS if not set(needs) <= ok]
    if "torch" in ok and "torch CUDA" not in ok:  # half of torch.profiler's entry
        can.append("torch ops and host steps on the CPU (torch.profiler)")
        cannot[cannot.index(_COLLECTS[2][1])] = "GPU kernels through torch.profiler"
    reads = [ALWAYS_READ, *(text for name, text in _READS if name in ok)]
    lines = [f"Collects here: {'; '.join(can) or 'nothing yet'}",
             f"Reads here: {'; '.join(reads)}"]
    if cannot:
        lines.insert(1, f"Not here (see the table): {'; '.join(cannot)}")
    unread = [text for name, text in _READS if name not in ok]
    if unread:
        lines.append(f"Not read here (see the table): {'; '.join(unread)}")
    return lines


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
