"""Assembling whole pages from the figure builders, the report and the comparison: what
`gpudiag report`, `gpudiag heatmap` and `gpudiag compare -o` write. No diagnosis here: the
caller passes the Diagnosis (or Comparison) it already has.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpudiag.analyzers.compare import Comparison
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.names import short_names
from gpudiag.reports import figures, figures_samples, ncu_heatmap
from gpudiag.reports.html import Section, page
from gpudiag.reports.html_report import report
from gpudiag.reports.html_tables import Table
from gpudiag.trace import Trace


def report_figures(trace: Trace, dx: Diagnosis) -> dict[str, Any]:
    """Every figure that applies to this trace, by the report's slot names.

        figs = report_figures(trace, gpudiag.diagnose(trace))
        sorted(figs)                      # e.g. ['utilization', 'waterfall']
    """
    figs: dict[str, Any] = {}
    if len(dx.losses):
        figs["waterfall"] = figures.waterfall(dx)
        figs["utilization"] = figures.utilization(trace, dx)
    waits = figures.collective_waits(dx) if "arrival_skew" in dx.tables else None
    if waits is not None:
        figs["collective_waits"] = waits
    memory = figures.memory(trace)
    if memory is not None:
        figs["memory"] = memory
    if len(trace.metrics):
        figs["ncu_heatmap"] = ncu_heatmap.figure(trace)
    samples = figures_samples.gpu_samples(trace)
    if samples is not None:
        figs["gpu_samples"] = samples
    return figs


def report_page(trace: Trace, dx: Diagnosis, *, cdn: bool = False,
                generated_for: str | None = None) -> str:
    """The full HTML report of a trace (issue 4's sections), plotly.js inlined once.

        html = report_page(trace, gpudiag.diagnose(trace))
        Path("report.html").write_text(html, encoding="utf-8")
    """
    return report(trace, dx, figures=report_figures(trace, dx), cdn=cdn,
                  generated_for=generated_for)


def heatmap_page(trace: Trace, dx: Diagnosis | None, *, cdn: bool = False,
                 **ncu_options: Any) -> str:
    """The heatmaps alone: the kernel x metric heatmap of an Nsight Compute report, else the
    time x stream utilization, collective waits and allocator occupancy of a trace.

        html = heatmap_page(gpudiag.load("report.ncu-rep"), None)
    """
    if len(trace.metrics):
        found = _rule_findings(trace)
        sections = [Section("Kernel x metric (Nsight Compute)",
                            figures=(ncu_heatmap.figure(trace, **ncu_options),)),
                    Section("Nsight Compute's rule findings per kernel", tables=[found])
                    if found is not None else
                    Section("Nsight Compute's rule findings per kernel",
                            text="None: ncu reported no warnings or optimization hints "
                                 "for these kernels.")]
        return page("gpudiag heatmap", sections, cdn=cdn)
    figs = report_figures(trace, dx) if dx is not None else {}
    titles = {"utilization": "Utilization per stream, and the loss cause of idle time",
              "collective_waits": "Collective wait per rank",
              "memory": "Allocator occupancy by address and time"}
    sections = [Section(title, figures=(figs[name],)) for name, title in titles.items()
                if name in figs]
    if not sections:
        sections = [Section("Nothing to draw", text="This source has no GPU timeline, "
                            "collectives or allocator snapshot to draw as a heatmap.")]
    return page("gpudiag heatmap", sections, cdn=cdn)


def _rule_findings(trace: Trace) -> Table | None:
    """ncu's warnings and optimization hints, one row per kernel and rule, most speedup
    first (the heatmap shows them on hover; this lists them). Kernels by their short
    name, the full demangled one on hover (a template-heavy name fills a cell 40 lines
    tall)."""
    from gpudiag.analyzers.kernels.metrics import rules

    found = rules(trace)
    found = found[found["type"].isin(["warning", "optimization"])]
    if found.empty:
        return None
    found = found.sort_values("speedup_pct", ascending=False, na_position="last")
    full = found["name"].astype(str).reset_index(drop=True)
    frame = found[["rule", "title", "speedup_type", "speedup_pct", "message"]].reset_index(
        drop=True).rename(columns={"speedup_type": "speedup of", "speedup_pct": "speedup"})
    frame.insert(0, "kernel", short_names(full).astype(str))
    empty = [c for c in ("title", "speedup of", "speedup") if frame[c].isna().all()]
    return Table(frame.drop(columns=empty), {"speedup": "pct"}, titles={"kernel": full})


def compare_page(cmp: Comparison, lines: list[str] | None = None, *,
                 cdn: bool = False) -> str:
    """The comparison as HTML: the same tables as the terminal, plus broken budgets.

        html = compare_page(compare([a, b], ["fp32", "bf16"]))
    """
    tables: list[tuple[str, pd.DataFrame]] = [
        ("Summary", cmp.summary), ("Loss waterfall (ns)", cmp.losses),
        ("Loss shares", cmp.shares), ("Kernels by time delta", cmp.kernels),
        ("Collectives", cmp.collectives), ("Syncs", cmp.syncs)]
    sections = [Section(title, tables=[_short_kernels(frame.reset_index())])
                for title, frame in tables if len(frame)]
    if lines:
        sections.insert(0, Section("Budgets broken", notes=tuple(lines)))
    if cmp.notes:
        sections.append(Section("Notes", notes=tuple(cmp.notes)))
    return page("gpudiag compare: " + " vs ".join(cmp.labels), sections, cdn=cdn)


def _short_kernels(frame: pd.DataFrame) -> Table:
    """A comparison table; where it names kernels both ways, the short name is shown and
    the full one is its hover."""
    if not {"name", "short_name"} <= set(frame.columns):
        return Table(frame)
    full = frame["name"].astype(str)
    shown = frame.drop(columns=["name"]).rename(columns={"short_name": "kernel"})
    return Table(shown, titles={"kernel": full.tolist()})
