"""The one line `gpudiag profile` prints on what a run collected."""

from __future__ import annotations

from gpudiag.analyzers.findings import format_ns
from gpudiag.analyzers.steps.training import step_windows, summary
from gpudiag.trace import Trace

_TABLE_WORDS = {
    "kernels": ("kernel", "kernels"), "copies": ("copy", "copies"), "syncs": ("sync", "syncs"),
    "collectives": ("collective", "collectives"), "memory": ("memory event", "memory events"),
    "samples": ("NVML sample", "NVML samples"),
}


def describe(trace: Trace) -> str:
    """One line on what a run collected, e.g. '2 processes, 40 steps (median 12.3 ms), ...'.

    Printed after every `gpudiag profile`, so a run without GPU activity still shows what
    it did record (step times come from the host markers alone).
    """
    processes = trace.meta.get("processes", [])
    with_data = sum(1 for p in processes if p.get("data", True))
    parts = [_count(len(processes), "process", "processes") if with_data == len(processes)
             else f"{with_data:,} of {_count(len(processes), 'process', 'processes')}"]
    steps = summary(step_windows(trace))
    if steps["count"]:
        warm = f", {steps['warmup']} warm-up" if steps["warmup"] else ""
        parts.append(f"{_count(steps['count'], 'step')} (median {format_ns(steps['median_ns'])}"
                     f"{warm})")
    ranges = trace.ranges
    for label, source in (("torch op", "torch_op"), ("XLA op", "host")):
        parts.append(_count(int((ranges["source"] == source).sum()), label))
    for table, (one, many) in _TABLE_WORDS.items():
        parts.append(_count(len(getattr(trace, table)), one, many))
    return ", ".join(p for p in parts if not p.startswith("0 "))


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"
