"""The analyzers `diagnose` runs, in one place: each module with the tables it needs.

An analyzer module offers its `CONTRACT` (`findings.Contract`); it is registered here, by
the one line that names its module, and nowhere else. An analyzer runs when one of the
tables it requires has rows (and, for timeline analyses, when the trace's times are a real
timeline — Nsight Compute's serialized replays are not); what did not run is said in the
Diagnosis' notes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpudiag.analyzers.findings import Contract
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.window import Window
from gpudiag.trace import Trace


@dataclass(frozen=True)
class Analyzer:
    """One analyzer module and when it applies: `module.CONTRACT`.

    `requires`: trace tables of which one must have rows; `timeline`: needs real times
    (else skipped with a note); `needs_gaps`: runs only beside a waterfall and is given its
    idle gaps; `gap_options`: takes diagnose's gap thresholds; `whole_trace`: reads the
    whole trace (its gaps' next events are the whole trace's rows) and is given the
    window's gaps, not the window's trace.
    """

    name: str
    module: str
    requires: tuple[str, ...]
    timeline: bool = True
    needs_gaps: bool = False
    gap_options: bool = False
    whole_trace: bool = False

    def contract(self) -> Contract:
        """What the analyzer's module offers (its `CONTRACT`), the module imported on first
        use: most traces need a few of them."""
        contract = importlib.import_module(self.module).CONTRACT
        assert isinstance(contract, Contract), self.module
        return contract


ANALYZERS = (
    Analyzer("host_gaps", "gpudiag.analyzers.host.bound", ("kernels", "copies"),
             needs_gaps=True, whole_trace=True),
    Analyzer("timeline", "gpudiag.analyzers.timeline", ("kernels", "copies"), needs_gaps=True),
    Analyzer("sync", "gpudiag.analyzers.sync", ("syncs", "api"), gap_options=True),
    Analyzer("launch", "gpudiag.analyzers.kernels.launch", ("kernels",), timeline=False),
    Analyzer("copies", "gpudiag.analyzers.copies", ("copies",)),
    Analyzer("collectives", "gpudiag.analyzers.collectives.calls", ("collectives",),
             timeline=False),
    Analyzer("memory", "gpudiag.analyzers.memory.allocator", ("memory", "memory_blocks"),
             timeline=False),
    Analyzer("kernel_metrics", "gpudiag.analyzers.kernels.metrics", ("metrics",),
             timeline=False),
    Analyzer("gpu_samples", "gpudiag.analyzers.gpu_samples", ("samples",), timeline=False),
    Analyzer("host_steps", "gpudiag.analyzers.host.steps", ("ranges",)),
)

#: each analyzer by its name
BY_NAME = {analyzer.name: analyzer for analyzer in ANALYZERS}
#: analyzers whose findings are host time (a share of step time), ranked after GPU time
HOST_ANALYZERS = frozenset({"host_steps"})
#: analyzers left out of the warm-up window's findings: host time and the stream table
WARM_SKIPPED = HOST_ANALYZERS | {"timeline"}


def applies(trace: Trace, analyzer: Analyzer, notes: list[str]) -> bool:
    """Whether a (non-gap) analyzer runs on the trace; a note when its times are not a
    timeline."""
    counts = {name: len(getattr(trace, name)) for name in analyzer.requires}
    return applies_to(counts, bool(trace.meta.get("timeline", True)), analyzer, notes)


def applies_to(row_counts: dict[str, int], timeline: bool, analyzer: Analyzer,
               notes: list[str]) -> bool:
    """`applies` from the rows of each table (a job's, summed over its ranks)."""
    if not any(row_counts.get(name, 0) for name in analyzer.requires):
        return False
    if analyzer.timeline and not timeline:
        notes.append(f"{analyzer.name}: skipped, the source's times are not a timeline")
        return False
    return True


def analyzer_inputs(analyzer: Analyzer, seen: Window, gaps: pd.DataFrame | None,
                    gap_options: GapOptions) -> tuple[Trace, dict[str, Any]]:
    """What the analyzer is called with: the window's trace (host_gaps: the whole trace and
    the window's gaps) and its options."""
    if analyzer.whole_trace:
        return seen.whole, {"gaps": gaps}
    return seen.trace, (dict(gap_options.kwargs()) if analyzer.gap_options else {})


def has_host_ops(trace: Trace) -> bool:
    """Whether the trace has host ops (where training steps are looked for)."""
    return bool(trace.ranges["source"].isin(["torch_op", "host", "annotation"]).any())
