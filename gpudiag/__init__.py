"""gpudiag: where did my GPU time go, and what do I change?

    import gpudiag
    trace = gpudiag.load("rank0.pt.trace.json.gz")   # Kineto, nsys, ncu, JAX, memory snapshots
    dx = gpudiag.diagnose(trace)                       # the loss waterfall and the findings
    dx.findings.head()
    job = gpudiag.diagnose_job("traces/", workers=8)   # many ranks, rank by rank, in parallel

Heavy optional packages (torch, jax, cupy, cupti, ncu_report) are never imported here.
"""

from __future__ import annotations

from typing import Any

from gpudiag.analyzers.diagnosis import Diagnosis, diagnose
from gpudiag.errors import (
    CollectorError,
    GpudiagError,
    InputError,
    MissingDependencyError,
    SchemaError,
)
from gpudiag.jobs.job import JobDiagnosis, diagnose_job
from gpudiag.markers import end_step, region, step
from gpudiag.readers.sources import load
from gpudiag.trace import Trace, merge

__version__ = "0.1.0"


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
