"""One choke point for the heavy optional packages (torch, jax, cupy, cupti, ncu_report, pynvml).

`import gpudiag` must stay light: these packages are imported here, on first use, and a
missing one becomes a `MissingDependencyError` that says which extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from gpudiag.errors import MissingDependencyError

#: module name -> the gpudiag extra that installs it
EXTRAS: dict[str, str] = {
    "ncu_report": "ncu",
    "cupti": "cupti",
    "pynvml": "nvml",
    "torch": "torch",
    "jax": "jax",
    "cupy": "cupy",
    "nvtx": "cupti",
    "distributed": "dask",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` or raise `MissingDependencyError` naming the extra to install.

    `purpose` completes the sentence "<purpose> needs the Python package ...", e.g.
    "Reading an Nsight Compute report".
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".", maxsplit=1)[0], "all")
        raise MissingDependencyError(module, extra, purpose) from exc


def available(module: str) -> bool:
    """True when `module` can be imported (imports it: use only where that is wanted)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
