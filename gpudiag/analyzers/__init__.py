"""Analyzers: functions of a Trace that attribute lost GPU time and find its causes.

Each module is usable alone in a notebook (`gpudiag.analyzers.sync.sync_points(trace)`);
`diagnose()` (diagnosis.py) runs every one that applies and ranks their findings. Analyzers
never plot, print or write files. See docs/analysis.md for the rules.

| module | answers |
|---|---|
| `losses`, `gaps` | the waterfall: every nanosecond of each device's window, one cause |
| `timeline` | per-stream busy/idle (HTA's definitions) and the idle gaps with causes |
| `sync` | blocking sync points by kind and call site |
| `host` | launch-bound and host-bound gaps by call site |
| `launch`, `occupancy` | theoretical occupancy, waves, small grids and tails, launch overhead |
| `copies` | pageable / synchronous / small copies, bandwidth |
| `collectives` | bus bandwidth, overlap, cross-rank arrival skew |
| `memory` | allocator fragmentation over time, OOM verdicts, sites |
| `kernel_metrics` | Nsight Compute per-kernel bottlenecks |
| `gpu_samples` | NVML samples: utilization vs kernel-busy, memory, power, throttling |
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: the analyzer modules, importable as attributes (`gpudiag.analyzers.sync`) on first use
MODULES = ("callsites", "collectives", "copies", "diagnosis", "findings", "gaps",
           "gpu_samples", "host", "intervals", "kernel_metrics", "keys", "launch", "losses",
           "memory", "occupancy", "steps", "sync", "timeline", "waits", "window")


def __getattr__(name: str) -> ModuleType:
    if name in MODULES:
        return importlib.import_module(f"gpudiag.analyzers.{name}")
    raise AttributeError(f"module 'gpudiag.analyzers' has no attribute {name!r}")
