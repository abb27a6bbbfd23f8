"""The Diagnosis: what `diagnose` found, one type whether a trace was diagnosed whole in
this process or a job was read rank by rank (a job's only additions are its files:
`jobs.job.JobDiagnosis`). Reports, exports and the terminal read it and compute nothing
of the analysis again.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag.analyzers.losses.waterfall import LossTimeline
from gpudiag.trace import Trace

#: tables `diagnose` derives from the Diagnosis' own tables once the analyzers ran (not from
#: the trace), so a job diagnosed rank by rank derives them the same way
VIEWS = frozenset({"stragglers"})
STRAGGLER_TABLES = ("rank_losses", "late_arrivals", "step_stragglers")


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
    gaps: pd.DataFrame | None = field(default=None, repr=False)  # idle gap pieces, in window
    steps: pd.DataFrame | None = None  # `steps.training_steps`: found how, warm-up flagged
    per_step: bool = False             # diagnose(steps=True): per-step tables in to_dict
    #: each rank's critical path, computed when first asked (`critical_paths`) and kept:
    #: only the reports draw it, and its longest-path pass over the whole trace is not free
    paths_of: Callable[[], pd.DataFrame | None] | None = field(default=None, repr=False)
    #: the merged trace's (or job's) meta
    meta: dict[str, Any] = field(default_factory=dict, repr=False)
    waterfall: bool = False  # kernels or copies on a timeline: the losses are a waterfall
    #: the framework whose profiler recorded it ('torch', 'jax', ...: `frameworks`), in
    #: whose words the advice is put
    framework: str | None = None
    #: the trace diagnosed, where it was diagnosed whole in this process (what `summary`
    #: and the reports read); None for a job read rank by rank, whose events stay there
    source: Trace | None = field(default=None, repr=False)
    #: a job's ranks' shares of `summary` (`summary.part`), where there is no `source`
    summary_parts: list[Any] = field(default_factory=list, repr=False)

    def summary(self, top: int = 10, window_spec: str | None = None) -> dict[str, Any]:
        """`summarize` of what was diagnosed (what `gpudiag analyze` prints above the
        diagnosis): of the trace, or combined from a job's ranks' parts."""
        from gpudiag.analyzers import summary

        if self.source is not None:
            return summary.summarize(self.source, top, window_ns=self.window_ns,
                                     window_spec=window_spec)
        return summary.combine(self.summary_parts, self.meta, top, window_ns=self.window_ns,
                               window_spec=window_spec)

    def critical_paths(self) -> pd.DataFrame | None:
        """Each rank's critical path (`critical.path.rank_paths`), None where the trace has
        none to draw (no launch calls, past `critical.path.DRAW_LIMIT`, a job read rank by
        rank)."""
        return self.paths_of() if self.paths_of is not None else None

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """Plain JSON-ready data (what `gpudiag analyze --json` prints)."""
        found = self.findings if top is None else self.findings.head(top)
        out: dict[str, Any] = {
            "window_ns": list(self.window_ns) if self.window_ns else None,
            "losses": _records(self.losses), "findings": _records(found), "notes": self.notes,
        }
        if self.by_step is not None:
            out["by_step"] = _records(self.by_step)
        if self.steps is not None:
            from gpudiag.analyzers.steps.training import summary

            out["steps"] = summary(self.steps)
        host = {name.removeprefix("host_"): _records(self.tables[name])
                for name in ("host_breakdown", "host_top_ops", "host_memory")
                if name in self.tables}
        if host:
            host["top_ops"] = host["top_ops"][:top or 10]
            if self.per_step and "host_by_step" in self.tables:
                host["by_step"] = _records(self.tables["host_by_step"])
            out["host"] = host
        ranks = {name: _records(self.tables[name]) for name in STRAGGLER_TABLES
                 if name in self.tables}
        if ranks:
            out["stragglers"] = ranks
        if self.losses.empty:
            out |= _untimed(self.tables)
        return out

    def _repr_html_(self) -> str:
        waterfall = self.losses.pivot_table(index="cause", columns="device", values="share",
                                            aggfunc="sum", observed=True) if len(self.losses) \
            else pd.DataFrame()
        shown = self.findings.head(10).copy()
        shown["lost_ms"] = (shown["lost_ns"] / 1e6).round(3)
        shown["saving_ms"] = (shown["saving_ns"].astype("Float64") / 1e6).round(3)
        parts = ["<h4>gpudiag diagnosis</h4>",
                 waterfall.map(lambda v: f"{v:.1%}").to_html(escape=True)
                 if len(waterfall) else "",
                 shown[["cause", "lost_ms", "share", "saving_ms", "where", "count", "evidence",
                        "advice"]].to_html(index=False, escape=True, na_rep="")]
        parts += [f"<p>{html.escape(n)}</p>" for n in self.notes]
        return "\n".join(parts)



def drawn_paths(trace: Trace) -> pd.DataFrame | None:
    """Each rank's critical path where the reports draw it (`critical.path.drawable`)."""
    from gpudiag.analyzers.critical.path import drawable, rank_paths

    return rank_paths(trace) if drawable(trace) else None



def add_views(dx: Diagnosis) -> None:
    """The `VIEWS` tables into `dx.tables`: the stragglers of a job of two or more ranks,
    from its waterfall, steps and arrival skew."""
    from gpudiag.analyzers import stragglers

    for name, table in stragglers.tables(dx.losses, dx.steps,
                                         dx.tables.get("arrival_skew")).items():
        dx.tables[name] = declared.conform_table(name, table, "stragglers")



#: what `to_dict` shows of a file without a timeline (an nccl-tests log, a memory snapshot
#: or timeline), whose tables are then the answer: the columns of each
UNTIMED_COLLECTIVES = ["op", "bytes", "group_size", "dtype", "count", "mean_ns", "algbw_gbps",
                       "busbw_gbps"]


def _untimed(tables: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """The collectives' bandwidth by size and the allocator's peaks, where the diagnosis
    has no loss waterfall to show."""
    out: dict[str, Any] = {}
    stats = tables.get("collective_stats")
    if stats is not None and len(stats):
        out["collectives"] = _records(stats[UNTIMED_COLLECTIVES])
    frag = tables.get("fragmentation")
    if frag is not None and len(frag):
        from gpudiag.analyzers.memory.allocator import peaks

        out["memory"] = _records(peaks(frag))
    return out


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    clean = frame.astype(object).where(frame.notna(), None)
    return [dict(zip(clean.columns, row, strict=True))  # already bounded by `top`
            for row in clean.itertuples(index=False, name=None)]
