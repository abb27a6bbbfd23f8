"""The one line `gpudiag profile` prints on what a run collected."""

from __future__ import annotations

from typing import Any

import pandas as pd

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
    sources = trace.ranges["source"].value_counts()
    return _line(trace.meta.get("processes", []), step_windows(trace),
                 {str(source): int(count) for source, count in sources.items()},
                 {table: len(getattr(trace, table)) for table in _TABLE_WORDS})


def describe_job(job: Any) -> str:
    """`describe` of a run analyzed process by process (a `JobDiagnosis`): the same line,
    from the processes' summary parts instead of the merged tables."""
    parts = job.summary_parts
    sources: dict[str, int] = {}
    for piece in parts:
        for source, count in piece.range_sources.items():
            sources[source] = sources.get(source, 0) + count
    rows = {table: sum(piece.rows.get(table, 0) for piece in parts) for table in _TABLE_WORDS}
    steps = job.steps if job.steps is not None else step_windows(Trace())
    return _line(job.meta.get("processes", []), steps, sources, rows)


def _line(processes: list[dict[str, Any]], steps: pd.DataFrame, sources: dict[str, int],
          rows: dict[str, int]) -> str:
    """The line: processes (with data), steps, ops by framework, rows of each table."""
    with_data = sum(1 for p in processes if p.get("data", True))
    parts = [_count(len(processes), "process", "processes") if with_data == len(processes)
             else f"{with_data:,} of {_count(len(processes), 'process', 'processes')}"]
    found = summary(steps)
    if found["count"]:
        warm = f", {found['warmup']} warm-up" if found["warmup"] else ""
        parts.append(f"{_count(found['count'], 'step')} (median {format_ns(found['median_ns'])}"
                     f"{warm})")
    for label, source in (("torch op", "torch_op"), ("XLA op", "host")):
        parts.append(_count(sources.get(source, 0), label))
    for table, (one, many) in _TABLE_WORDS.items():
        parts.append(_count(rows.get(table, 0), one, many))
    return ", ".join(p for p in parts if not p.startswith("0 "))


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"
