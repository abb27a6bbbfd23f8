"""Assembling whole pages from the figure builders, the report and the comparison: what
`gpudiag report`, `gpudiag heatmap` and `gpudiag compare -o` write. No diagnosis here: the
caller passes the Diagnosis (or Comparison) it already has.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from gpudiag.analyzers.compare import Comparison
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.reports import figures, figures_ranks, figures_samples
from gpudiag.reports.compare.text import TextTable
from gpudiag.reports.html import Section, page
from gpudiag.reports.html_report import MAX_DEVICES, page_title, report
from gpudiag.reports.html_tables import Table
from gpudiag.reports.ncu import heatmap as ncu_heatmap
from gpudiag.reports.ncu.rules import rule_table
from gpudiag.trace import Trace


def report_figures(trace: Trace, dx: Diagnosis) -> dict[str, Any]:
    """Every figure that applies to this trace, by the report's slot names.

        figs = report_figures(trace, gpudiag.diagnose(trace))
        sorted(figs)                      # e.g. ['utilization', 'waterfall']
    """
    figs = diagnosis_figures(dx)
    if len(dx.losses):
        figs["utilization"] = figures.utilization(trace, dx)
    memory = figures.memory(trace, frag=dx.tables.get("fragmentation"))
    if memory is not None:
        figs["memory"] = memory
    if len(trace.metrics):
        figs["ncu_heatmap"] = ncu_heatmap.figure(trace, dx=dx)
    samples = figures_samples.gpu_samples(trace)
    if samples is not None:
        figs["gpu_samples"] = samples
    return figs


def diagnosis_figures(dx: Diagnosis) -> dict[str, Any]:
    """The figures drawn from the Diagnosis alone (a job diagnosed rank by rank has no
    trace to draw the rest from): the waterfall (as bars up to `MAX_DEVICES` devices; a
    larger job's ranks are the rank x cause heatmap), the collective waits, the ranks."""
    figs: dict[str, Any] = {}
    devices = len(dx.losses[["rank", "device"]].drop_duplicates())
    if len(dx.losses) and devices <= MAX_DEVICES:
        figs["waterfall"] = figures.waterfall(dx)
    waits = figures.collective_waits(dx) if "arrival_skew" in dx.tables else None
    if waits is not None:
        figs["collective_waits"] = waits
    ranks = figures_ranks.rank_causes(dx)
    if ranks is not None:
        figs["rank_causes"] = ranks
    return figs


def diagnosis_page(dx: Diagnosis, *, info: dict[str, Any] | None = None, cdn: bool = False,
                   generated_for: str | None = None) -> str:
    """The report of a Diagnosis, what `gpudiag report` and `gpudiag profile` write: every
    figure of the trace it was diagnosed from (`dx.source`), or, for a job diagnosed rank
    by rank, the figures drawn from the Diagnosis alone, a note naming those left out (the
    per-stream utilization, memory and samples need every event, which stayed with the
    ranks). `info`: its summary for the page's header (`dx.summary()`).

        dx = gpudiag.diagnose_job("traces/")          # or gpudiag.diagnose(trace)
        html = diagnosis_page(dx, info=dx.summary())
    """
    if dx.source is not None:
        return report(dx.source, dx, figures=report_figures(dx.source, dx), cdn=cdn,
                      generated_for=generated_for, info=info)
    noted = replace(dx, notes=[*dx.notes, JOB_NOTE])
    return report(Trace(meta=dx.meta), noted, figures=diagnosis_figures(dx), cdn=cdn,
                  generated_for=generated_for, info=info)


JOB_NOTE = ("analyzed rank by rank (--workers/--scheduler): the per-stream utilization, "
            "allocator and GPU-sample figures need every event in one process and are left "
            "out; `gpudiag report` without --workers draws them")


def report_page(trace: Trace, dx: Diagnosis, *, cdn: bool = False,
                generated_for: str | None = None) -> str:
    """The full HTML report of a trace and its Diagnosis, plotly.js inlined once.

        html = report_page(trace, gpudiag.diagnose(trace))
        Path("report.html").write_text(html, encoding="utf-8")
    """
    return diagnosis_page(replace(dx, source=trace), cdn=cdn, generated_for=generated_for)


def heatmap_page(trace: Trace, dx: Diagnosis | None, *, cdn: bool = False,
                 **ncu_options: Any) -> str:
    """The heatmaps alone: the kernel x metric heatmap of an Nsight Compute report, else the
    time x stream utilization, collective waits and allocator occupancy of a trace.

        html = heatmap_page(trace, gpudiag.diagnose(trace))

    An Nsight Compute report's rule findings are the Diagnosis' `ncu_rules` table, shown
    as the report page shows it (`ncu.rules.rule_table`); `dx=None` (a notebook drawing
    the heatmap alone) lists none and says so.
    """
    if len(trace.metrics):
        return page(page_title(trace, "heatmap"), [
            Section("Kernel x metric (Nsight Compute)",
                    figures=(ncu_heatmap.figure(trace, dx=dx, **ncu_options),)),
            _rule_section(dx)], cdn=cdn)
    figs = report_figures(trace, dx) if dx is not None else {}
    titles = {"utilization": "Utilization per stream, and the loss cause of idle time",
              "collective_waits": "Collective wait per rank",
              "memory": "Allocator occupancy by address and time"}
    sections = [Section(title, figures=(figs[name],)) for name, title in titles.items()
                if name in figs]
    if not sections:
        sections = [Section("Nothing to draw", text="This source has no GPU timeline, "
                            "collectives or allocator snapshot to draw as a heatmap.")]
    return page(page_title(trace, "heatmap"), sections, cdn=cdn)


def _rule_section(dx: Diagnosis | None) -> Section:
    """ncu's rule findings of the Diagnosis, or one line saying why none are listed."""
    title = "Nsight Compute's rule findings per kernel"
    if dx is None:
        return Section(title, text="Not listed: no diagnosis was given (heatmap_page(trace, "
                                   "gpudiag.diagnose(trace)) lists them).")
    notes: list[str] = []
    found = rule_table(dx, notes)
    if found is None:
        return Section(title, text="None: ncu reported no warnings, optimization hints or "
                                   "rule errors for these kernels.")
    return Section(title, notes=notes, tables=[found])


def compare_page(cmp: Comparison, lines: list[str] | None = None, *,
                 cdn: bool = False) -> str:
    """The comparison as HTML: the terminal's tables in the terminal's words
    (`compare.text`), the runs' waterfalls side by side, and any broken budgets.

        html = compare_page(compare([a, b], ["fp32", "bf16"]))
    """
    from gpudiag.reports.compare import text as compare_text
    from gpudiag.reports.compare.figures import runs_waterfall

    texts = compare_text.tables(cmp)
    figure = runs_waterfall(cmp)
    sections = [Section("Runs", text=f"Baseline A. {compare_text.legend(cmp)}.",
                        figures=[figure] if figure is not None else [],
                        tables=[_html_table(texts[0])])]
    sections += [Section(text.title, text=text.footer, tables=[_html_table(text)])
                 for text in texts[1:]]
    if lines:
        sections.insert(0, Section("Budgets broken", notes=tuple(lines)))
    if cmp.notes:
        sections.append(Section("Notes", notes=tuple(cmp.notes)))
    return page("gpudiag compare: " + " vs ".join(cmp.labels), sections, cdn=cdn)


_VERDICT_CLASS = {1: "good", -1: "bad", 0: ""}


def _html_table(text: TextTable) -> Table:
    """A `compare.text.TextTable` as a page table: the same text; numbers right-aligned,
    changes marked better or worse as the terminal colors them."""
    frame = pd.DataFrame([[cell.text for cell in row] for row in text.rows],
                         columns=text.header)
    classes = {head: [" ".join(filter(None, [
        "" if i == 0 or i in text.wide else "num", _VERDICT_CLASS[row[i].verdict]]))
        for row in text.rows] for i, head in enumerate(text.header)}
    titles = {text.header[0]: text.hover} if text.hover else None
    return Table(frame, sortable=False, classes=classes, titles=titles)

