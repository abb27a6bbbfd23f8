"""`diagnose(trace)`: run every analyzer that applies and rank what they found.

The registry below lists each analyzer with the tables it needs; an analyzer runs when
one of them has rows (and, for timeline analyses, when the trace's times are a real
timeline — Nsight Compute's serialized replays are not). What did not run is said in
`Diagnosis.notes`, never silently dropped.
"""

from __future__ import annotations

import html
import importlib
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gpudiag.analyzers import findings as findings_mod
from gpudiag.analyzers import window as window_mod
from gpudiag.analyzers.gaps import idle_gaps
from gpudiag.analyzers.losses import LossTimeline, loss_timeline, losses_frame
from gpudiag.trace import Trace


@dataclass(frozen=True)
class Analyzer:
    """One analyzer module: `findings(trace)` plus detail tables `name -> function`."""

    name: str
    module: str
    requires: tuple[str, ...]
    tables: tuple[str, ...]
    timeline: bool = True


ANALYZERS = (
    Analyzer("sync", "gpudiag.analyzers.sync", ("syncs", "api"), ("sync_points",)),
    Analyzer("launch", "gpudiag.analyzers.launch", ("kernels",),
             ("small_grid", "launch_rate"), timeline=False),
    Analyzer("copies", "gpudiag.analyzers.copies", ("copies",), ("copy_stats",)),
    Analyzer("collectives", "gpudiag.analyzers.collectives", ("collectives",),
             ("collective_stats", "overlap", "arrival_skew"), timeline=False),
    Analyzer("memory", "gpudiag.analyzers.memory", ("memory", "memory_blocks"),
             ("fragmentation",), timeline=False),
    Analyzer("kernel_metrics", "gpudiag.analyzers.kernel_metrics", ("metrics",),
             ("kernel_metrics",), timeline=False),
    Analyzer("gpu_samples", "gpudiag.analyzers.gpu_samples", ("samples",),
             ("sample_summary",), timeline=False),
)


@dataclass
class Diagnosis:
    """What `diagnose` found: the waterfall, the ranked findings, the detail tables."""

    losses: pd.DataFrame
    findings: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    window_ns: tuple[int, int] | None = None
    by_step: pd.DataFrame | None = None
    timeline: LossTimeline | None = field(default=None, repr=False)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """Plain JSON-ready data (what `gpudiag analyze --json` prints)."""
        found = self.findings if top is None else self.findings.head(top)
        out: dict[str, Any] = {
            "window_ns": list(self.window_ns) if self.window_ns else None,
            "losses": _records(self.losses), "findings": _records(found), "notes": self.notes,
        }
        if self.by_step is not None:
            out["by_step"] = _records(self.by_step)
        return out

    def _repr_html_(self) -> str:
        waterfall = self.losses.pivot_table(index="cause", columns="device", values="share",
                                            aggfunc="sum", observed=True) if len(self.losses) \
            else pd.DataFrame()
        shown = self.findings.head(10).copy()
        shown["lost_ms"] = (shown["lost_ns"] / 1e6).round(3)
        parts = ["<h4>gpudiag diagnosis</h4>",
                 waterfall.map(lambda v: f"{v:.1%}").to_html(escape=True)
                 if len(waterfall) else "",
                 shown[["cause", "lost_ms", "share", "where", "count", "evidence", "advice"]]
                 .to_html(index=False, escape=True, na_rep="")]
        parts += [f"<p>{html.escape(n)}</p>" for n in self.notes]
        return "\n".join(parts)


def diagnose(trace: Trace, *, window: str | tuple[int, int] | None = None,
             steps: bool = False, launch_gap_ns: int = 50_000,
             sync_tolerance_ns: int = 2_000) -> Diagnosis:
    """Every analyzer that applies, the loss waterfall and the ranked findings.

        dx = gpudiag.diagnose(trace)
        dx.losses                      # device x cause -> lost_ns, share
        dx.findings.head()             # ranked, with call sites and advice

    `window`: a time range or a range name (see `analyzers.window`); `steps`: also the
    waterfall of each training step (`by_step`). The thresholds go to the gap rules.
    """
    bounds = window_mod.resolve(trace, window) if window is not None else None
    whole = trace  # the waterfall's rules see the whole trace, then its layers are cut
    if bounds is not None:
        trace = window_mod.within(trace, bounds)
    gap_options: dict[str, Any] = {"launch_gap_ns": launch_gap_ns,
                                   "sync_tolerance_ns": sync_tolerance_ns}
    notes: list[str] = []
    tables: dict[str, pd.DataFrame] = {}
    parts: list[pd.DataFrame] = []
    timeline = _timeline(whole, gap_options, notes, tables)
    if timeline is not None:
        gaps = _cut(tables.pop("_gaps"), bounds)
        from gpudiag.analyzers import host
        from gpudiag.analyzers.timeline import stream_summary
        parts.append(host.findings(whole, gaps))
        tables["stream_summary"] = stream_summary(trace)
    for analyzer in ANALYZERS:
        if not _applies(trace, analyzer, notes):
            continue
        module = importlib.import_module(analyzer.module)
        parts.append(module.findings(trace))
        for name in analyzer.tables:
            tables[name] = getattr(module, name)(trace)
    loss = timeline.totals(bounds) if timeline is not None else losses_frame()
    total = int(loss.groupby(["rank", "device"], dropna=False)["lost_ns"].sum().sum())
    dx = Diagnosis(losses=loss, findings=findings_mod.combine(parts, total), tables=tables,
                   notes=notes, window_ns=bounds, timeline=timeline)
    if steps and timeline is not None:
        from gpudiag.analyzers.steps import losses_by_step
        dx.by_step = losses_by_step(trace, timeline)
    return dx


def _cut(gaps: pd.DataFrame, bounds: tuple[int, int] | None) -> pd.DataFrame:
    """Gap pieces inside the window, cut to it."""
    if bounds is None:
        return gaps
    inside = gaps[(gaps["end_ns"] > bounds[0]) & (gaps["start_ns"] < bounds[1])]
    return inside.assign(start_ns=inside["start_ns"].clip(lower=bounds[0]),
                         end_ns=inside["end_ns"].clip(upper=bounds[1]))


def _timeline(trace: Trace, gap_options: dict[str, Any], notes: list[str],
              tables: dict[str, pd.DataFrame]) -> LossTimeline | None:
    """The waterfall's layers, or None with a note saying why there is no timeline."""
    if trace.kernels.empty and trace.copies.empty:
        notes.append("no loss waterfall: the trace has no kernels or copies on a timeline")
        return None
    if not trace.meta.get("timeline", True):
        notes.append("no loss waterfall: the times in this source are not a timeline "
                     "(e.g. Nsight Compute replays kernels one by one)")
        return None
    from gpudiag.analyzers import collectives, launch
    occupancy = launch.occupancy(trace)
    unknown = occupancy["tail_efficiency"].isna()
    if unknown.all():
        reason = occupancy["unavailable"].dropna()
        notes.append("small_grid not measured: " + (str(reason.iloc[0]) if len(reason)
                                                      else "no launch configuration"))
    elif unknown.any():
        notes.append(f"small_grid not measured for {int(unknown.sum())} of {len(unknown)} "
                     "kernels (launch configuration or device properties missing)")
    waits = collectives.wait_intervals(trace) if len(trace.collectives) else None
    if waits is not None and waits.empty:
        notes.append("comm_wait needs collectives from two or more ranks; not measured")
    tables["_gaps"] = idle_gaps(trace, **gap_options)
    return loss_timeline(trace, efficiency=occupancy["tail_efficiency"], comm_waits=waits,
                         **gap_options)


def _applies(trace: Trace, analyzer: Analyzer, notes: list[str]) -> bool:
    if not any(len(getattr(trace, t)) for t in analyzer.requires):
        return False
    if analyzer.timeline and not trace.meta.get("timeline", True):
        notes.append(f"{analyzer.name}: skipped, the source's times are not a timeline")
        return False
    return True


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    clean = frame.astype(object).where(frame.notna(), None)
    return [dict(zip(clean.columns, row, strict=True))  # already bounded by `top`
            for row in clean.itertuples(index=False, name=None)]
