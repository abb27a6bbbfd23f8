"""Which collectors a `--backend` means on this machine, and what it leaves uncollected.

    plan = resolve("auto")
    plan.collectors      # ('host', 'torch', 'jax') on a machine without GPU/CUPTI
    plan.not_collected   # ['GPU kernels, copies and syncs: no NVIDIA driver (...)', ...]

`auto` takes CUPTI when a GPU and cupti-python are both there (framework-agnostic, lowest
overhead), else the framework profilers, each started only if the program imports its
framework (torch.profiler on CPU still gives ops, stacks and memory). An explicit backend
that cannot run here is an error with the fix, never a silent downgrade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.collectors import probes
from gpudiag.errors import CollectorError

BACKENDS = ("auto", "cupti", "torch", "jax", "nsys", "ncu")
EXTERNAL = ("nsys", "ncu")


@dataclass(frozen=True)
class Plan:
    """The in-process collectors to start, the external tool (if any), and what is missing."""

    backend: str
    collectors: tuple[str, ...]
    external: str | None = None
    not_collected: list[str] = field(default_factory=list)


def gpu_present() -> bool:
    """An NVIDIA driver with a visible GPU (cheap: /proc first, NVML only if it is there)."""
    if not Path("/proc/driver/nvidia").exists():
        return False
    return probes.check_gpu().available


def resolve(backend: str) -> Plan:
    """The plan for `backend` on this machine; CollectorError when it cannot run here."""
    if backend not in BACKENDS:
        raise CollectorError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    gpu = gpu_present()
    cupti = probes.check_package("cupti", "cupti", "cupti-python", "", "").available
    missing = [] if gpu else ["GPU activity (kernels, copies, syncs, NVML): no NVIDIA GPU or "
                              "driver here"]
    if backend in EXTERNAL:
        return Plan(backend, ("host",), external=backend, not_collected=missing)
    if backend == "cupti" or (backend == "auto" and gpu and cupti):
        if not cupti:
            raise CollectorError("--backend cupti needs cupti-python: pip install "
                                 "'gpudiag[cupti]' (or use --backend torch)")
        if not gpu:
            raise CollectorError("--backend cupti needs an NVIDIA GPU and driver; none is "
                                 "visible here (`gpudiag doctor`); --backend torch runs on CPU")
        return Plan(backend, ("host", "cupti", "nccl", "torch_memory"))
    if backend == "auto" and gpu and not cupti:
        missing.append("CUPTI activity (pip install 'gpudiag[cupti]'): using the framework "
                       "profilers instead")
    # no `nccl` here: Kineto already records torch.distributed's collectives (on CPU too),
    # and two sources of one call would be counted twice
    frameworks = {"auto": ("torch", "jax"), "torch": ("torch",), "jax": ("jax",)}[backend]
    snapshot = ("torch_memory",) if gpu and "torch" in frameworks else ()
    return Plan(backend, ("host", *frameworks, *snapshot), not_collected=missing)
