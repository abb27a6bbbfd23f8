"""gpudiag: where did my GPU time go, and what do I change?

    import gpudiag
    trace = gpudiag.load("rank0.pt.trace.json.gz")   # Kineto, nsys, ncu, JAX, memory snapshots
    dx = gpudiag.diagnose(trace)                       # the loss waterfall and the findings
    dx.findings.head()
    job = gpudiag.diagnose_job("traces/", workers=8)   # many ranks, rank by rank, in parallel

Heavy optional packages (torch, jax, cupy, cupti, ncu_report) are never imported here,
and neither is pandas until a name below is first used: `diagnose_job` starts a local
pool's workers first, so they import the analysis while this process does.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from gpudiag.errors import (
    CollectorError,
    GpudiagError,
    InputError,
    MissingDependencyError,
    SchemaError,
)

if TYPE_CHECKING:
    from gpudiag.analyzers.diagnosis import Diagnosis, diagnose
    from gpudiag.jobs import diagnose_job
    from gpudiag.jobs.job import JobDiagnosis
    from gpudiag.markers import end_step, region, step
    from gpudiag.readers.sources import load
    from gpudiag.trace import Trace, merge

__version__ = "0.1.0"

#: where each public name lives
_HOMES = {
    "Diagnosis": "gpudiag.analyzers.diagnosis", "diagnose": "gpudiag.analyzers.diagnosis",
    "JobDiagnosis": "gpudiag.jobs.job", "diagnose_job": "gpudiag.jobs",
    "end_step": "gpudiag.markers", "region": "gpudiag.markers", "step": "gpudiag.markers",
    "load": "gpudiag.readers.sources", "Trace": "gpudiag.trace", "merge": "gpudiag.trace",
}


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (`gpudiag.analyzers`), imported on first use."""
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")


def __dir__() -> list[str]:
    """The public names with what is imported (tab completion sees the lazy ones)."""
    return sorted({*globals(), *__all__})


def capture(backend: str = "auto", **options: Any) -> Any:
    """Collect a block of code in this process; see `gpudiag.profiler.capture.capture`.

        with gpudiag.capture() as cap:
            train_one_epoch()
        gpudiag.diagnose(cap.trace)

    Imported on first use, so `import gpudiag` stays free of the profiler.
    """
    from gpudiag.profiler.capture import capture as _capture

    return _capture(backend, **options)


__all__ = [
    "CollectorError",
    "Diagnosis",
    "GpudiagError",
    "InputError",
    "JobDiagnosis",
    "MissingDependencyError",
    "SchemaError",
    "Trace",
    "__version__",
    "capture",
    "diagnose",
    "diagnose_job",
    "end_step",
    "load",
    "merge",
    "region",
    "step",
]
