"""Analyzers: functions of a Trace that attribute lost GPU time and find its causes.

Each module is usable alone in a notebook (`gpudiag.analyzers.sync.sync_points(trace)`);
`diagnose()` (diagnosis.py) runs every one that applies and ranks their findings. Analyzers
never plot, print or write files. See docs/analysis.md for the rules.

| module | answers |
|---|---|
| `losses`, `gaps`, `waits` (`losses/`) | the waterfall: every nanosecond of a window, one cause |
| `timeline` | per-stream busy/idle (HTA's definitions) and the idle gaps with causes |
| `sync` | blocking sync points by kind and call site |
| `host` (`host/`) | launch-bound and host-bound gaps by call site; each step's host time |
| `launch`, `occupancy` (`kernels/`) | occupancy, waves, small grids and tails, launch overhead |
| `kernel_metrics` (`kernels/`) | Nsight Compute per-kernel bottlenecks and rules |
| `copies` | pageable / synchronous / small copies, bandwidth |
| `collectives` (`collectives/`) | bus bandwidth, overlap, cross-rank arrival skew |
| `memory` (`memory/`) | allocator fragmentation over time, OOM verdicts, sites |
| `steps` (`steps/`) | training steps, found or marked, and warm-up |
| `gpu_samples` | NVML samples: utilization vs kernel-busy, memory, power, throttling |
| `compare`, `budgets`, `summary` | runs side by side; `--fail-on` budgets; what a trace holds |
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: the analyzer modules, importable as attributes (`gpudiag.analyzers.sync`) on first use:
#: the short names users know, mapped to where each module lives in the families
MODULES = {
    "budgets": "gpudiag.analyzers.budgets",
    "callsites": "gpudiag.analyzers.callsites",
    "collectives": "gpudiag.analyzers.collectives",
    "compare": "gpudiag.analyzers.compare",
    "copies": "gpudiag.analyzers.copies",
    "diagnosis": "gpudiag.analyzers.diagnosis",
    "findings": "gpudiag.analyzers.findings",
    "gaps": "gpudiag.analyzers.losses.gaps",
    "gpu_samples": "gpudiag.analyzers.gpu_samples",
    "host": "gpudiag.analyzers.host",
    "intervals": "gpudiag.intervals",
    "kernel_metrics": "gpudiag.analyzers.kernels.metrics",
    "kernels": "gpudiag.analyzers.kernels",
    "keys": "gpudiag.analyzers.keys",
    "launch": "gpudiag.analyzers.kernels.launch",
    "losses": "gpudiag.analyzers.losses",
    "memory": "gpudiag.analyzers.memory",
    "occupancy": "gpudiag.analyzers.kernels.occupancy",
    "steps": "gpudiag.analyzers.steps",
    "summary": "gpudiag.analyzers.summary",
    "sync": "gpudiag.analyzers.sync",
    "timeline": "gpudiag.analyzers.timeline",
    "waits": "gpudiag.analyzers.losses.waits",
    "window": "gpudiag.analyzers.window",
}


def __getattr__(name: str) -> ModuleType:
    if name in MODULES:
        return importlib.import_module(MODULES[name])
    raise AttributeError(f"module 'gpudiag.analyzers' has no attribute {name!r}")
