"""What this machine can collect: each collector's probe, and the one NVML choke point.

Every check is read-only, bounded in time (external tools get `--version` with a 5 s
timeout) and never raises: a machine without a GPU, driver or any optional package gets a
`Check` that says what to install or change. `gpudiag doctor` lists them all
(`profiler/doctor.py`); `gpudiag profile` and the collectors ask the ones they need.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag.errors import MissingDependencyError
from gpudiag.optional import require

log = logging.getLogger(__name__)

#: seconds an external tool gets to answer `--version` (a hung driver must not hang doctor)
VERSION_TIMEOUT_S = 5.0
#: where the NVIDIA kernel module publishes RmProfilingAdminOnly (ncu's ERR_NVGPUCTRPERM)
PROFILING_PARAMS = Path("/proc/driver/nvidia/params")

NCU_PERMISSION_FIX = (
    "ncu needs GPU performance counters, which the driver restricts to admin users by default "
    "(ERR_NVGPUCTRPERM): run ncu as root (sudo), or allow all users with "
    "`options nvidia NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d/nvidia.conf "
    "and a reboot (or reload of the nvidia module); in a container, add --cap-add=SYS_ADMIN"
)
DRIVER_FIX = (
    "install the NVIDIA driver (https://www.nvidia.com/drivers); `nvidia-smi` must list the GPU"
)


@dataclass(frozen=True)
class Check:
    """One collector or tool: whether it can run here, what was found, how to get it if not."""

    name: str
    available: bool
    detail: str
    how_to_get: str = ""


# --- NVML: every call goes through nvml_call ---------------------------------------------

_unknown_nvml: set[str] = set()


def nvml_call(module: Any, call: str, *args: Any) -> Any:
    """Call `pynvml.<call>(*args)`; any failure becomes None ("not available").

    The one choke point for NVML: an old driver lacks functions and a GPU-less machine fails
    them all, and neither is an error for doctor. A function missing from pynvml is logged
    once, because that means a pynvml too old for this code, not a missing GPU.
    """
    function = getattr(module, call, None)
    if function is None:
        if call not in _unknown_nvml:
            _unknown_nvml.add(call)
            log.warning("pynvml has no %s (old nvidia-ml-py?)", call)
        return None
    try:
        return function(*args)
    except Exception as exc:  # NVMLError and its many subclasses, or a broken library
        log.debug("NVML %s failed: %s", call, exc)
        return None


def nvml_text(value: Any) -> str:
    """NVML strings are bytes in old pynvml releases and str in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def check_gpu() -> Check:
    """GPUs and driver through NVML (what the nvml sampler and every GPU collector need)."""
    smi = shutil.which("nvidia-smi")
    smi_hint = f"; nvidia-smi is at {smi}, so a driver is installed" if smi else ""
    try:
        pynvml = require("pynvml", "Reading GPU state")
    except MissingDependencyError:
        return Check("GPU / driver (NVML)", False, "pynvml is not installed",
                     f"pip install 'gpudiag[nvml]'{smi_hint}")
    nvml_call(pynvml, "nvmlInit")  # returns None either way: the driver query below tells
    try:
        driver = nvml_call(pynvml, "nvmlSystemGetDriverVersion")
        if driver is None:
            return Check("GPU / driver (NVML)", False, "NVML could not start: no NVIDIA driver",
                         DRIVER_FIX)
        names = []
        for index in range(nvml_call(pynvml, "nvmlDeviceGetCount") or 0):
            handle = nvml_call(pynvml, "nvmlDeviceGetHandleByIndex", index)
            name = nvml_call(pynvml, "nvmlDeviceGetName", handle) if handle is not None else None
            names.append(nvml_text(name) if name is not None else f"GPU {index}")
    finally:
        nvml_call(pynvml, "nvmlShutdown")
    driver = nvml_text(driver)
    if not names:
        return Check("GPU / driver (NVML)", False, f"driver {driver}, but no GPU visible",
                     "check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and `nvidia-smi`")
    return Check("GPU / driver (NVML)", True, f"driver {driver}: {', '.join(names)}")


# --- Python packages -----------------------------------------------------------------------


def _installed(module: str) -> bool:
    """True when `module` can be found, without importing it (torch takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package or a None entry in sys.modules
        return False


def _dist_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def check_package(name: str, module: str, distribution: str, purpose: str, fix: str) -> Check:
    """An optional Python package: found (with its version) or the command that installs it."""
    if _installed(module):
        return Check(name, True, f"{distribution} {_dist_version(distribution)}: {purpose}")
    return Check(name, False, f"{distribution} is not installed ({purpose})", fix)


def check_torch_cuda() -> Check:
    """Whether torch sees a GPU: imports torch, so only called when torch is installed."""
    name = "torch CUDA"
    if not _installed("torch"):
        return Check(name, False, "torch is not installed",
                     "pip install torch (CUDA build: https://pytorch.org/get-started/locally/)")
    try:
        torch = require("torch", "Checking torch's CUDA support")
        if torch.cuda.is_available():
            gpus = torch.cuda.device_count()
            return Check(name, True, f"CUDA {torch.version.cuda}, {gpus} GPU(s)")
        cuda = getattr(torch.version, "cuda", None)
    except Exception as exc:  # a torch whose native libraries fail to load
        return Check(name, False, f"importing torch failed: {exc}",
                     "reinstall torch (https://pytorch.org/get-started/locally/)")
    if cuda is None:
        return Check(name, False, "this torch is a CPU-only build (torch profiler runs on CPU)",
                     "install a CUDA build of torch (https://pytorch.org/get-started/locally/)")
    return Check(name, False, f"torch built for CUDA {cuda}, but no GPU is usable", DRIVER_FIX)


# --- external tools ------------------------------------------------------------------------


def tool_version(path: str) -> str | None:
    """The version line of `path --version`, or None when it fails, hangs or says nothing."""
    try:
        result = subprocess.run(
            [path, "--version"], capture_output=True, text=True,
            timeout=VERSION_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.debug("%s --version failed: %s", path, exc)
        return None
    lines = [line.strip() for line in (result.stdout or "").splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        return None
    versioned = [line for line in lines if "version" in line.lower()]
    return versioned[-1] if versioned else lines[0]


def check_tool(binary: str, purpose: str, fix: str) -> Check:
    """An external tool on PATH that answers `--version` (nsys, ncu, nvidia-smi)."""
    path = shutil.which(binary)
    if path is None:
        return Check(binary, False, f"{binary} is not on PATH ({purpose})", fix)
    version = tool_version(path)
    if version is None:
        return Check(binary, False, f"{path} did not answer --version within "
                     f"{VERSION_TIMEOUT_S:g} s", f"check that {path} runs; {fix}")
    return Check(binary, True, f"{version} ({path})")


def check_ncu_permission(
    params: Path | None = None, is_root: Callable[[], bool] | None = None
) -> Check:
    """Whether ncu may read GPU performance counters here (else ERR_NVGPUCTRPERM)."""
    name = "ncu counter permission"
    root = (is_root or _is_root)()
    try:
        text = (params or PROFILING_PARAMS).read_text()
    except OSError:
        return Check(name, False, "no NVIDIA driver loaded (/proc/driver/nvidia/params missing)",
                     DRIVER_FIX)
    admin_only = any(
        line.replace(" ", "") == "RmProfilingAdminOnly:1" for line in text.splitlines()
    )
    if not admin_only:
        return Check(name, True, "performance counters are open to all users")
    if root:
        return Check(name, True, "counters are admin-only, and this process runs as root")
    return Check(name, False, "counters are admin-only and this user is not root",
                 NCU_PERMISSION_FIX)


def _is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)  # absent on Windows
    return geteuid is not None and geteuid() == 0
