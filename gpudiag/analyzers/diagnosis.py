"""`diagnose(trace)`: run every analyzer that applies and rank what they found.

The registry below lists each analyzer with the tables it needs; an analyzer runs when
one of them has rows (and, for timeline analyses, when the trace's times are a real
timeline — Nsight Compute's serialized replays are not). What did not run is said in
`Diagnosis.notes`, never silently dropped.

Each analyzer is called once, `analyze(trace) -> findings.Result`, and its findings and
tables go into the Diagnosis as they are: a report or export reads a table from there and
never computes it again. The waterfall's own inputs are named results too: the loss
layers (`Diagnosis.timeline`) and the idle gap pieces (`Diagnosis.gaps`), which the
analyzers that explain idle time (`needs_gaps`) are given rather than finding again.
"""

from __future__ import annotations

import functools
import html
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag.analyzers import findings as findings_mod
from gpudiag.analyzers import window as window_mod
from gpudiag.analyzers.findings import Contract
from gpudiag.analyzers.frameworks import framework, in_words_of
from gpudiag.analyzers.losses.gaps import idle_gaps
from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS, GapOptions
from gpudiag.analyzers.losses.waterfall import LossTimeline, loss_timeline, losses_frame
from gpudiag.trace import Trace


@dataclass(frozen=True)
class Analyzer:
    """One analyzer module and when it applies: `module.analyze(trace) -> Result`.

    `requires`: trace tables of which one must have rows; `timeline`: needs real times
    (else skipped with a note); `needs_gaps`: runs only beside a waterfall and is given its
    idle gaps (`analyze(whole_trace, gaps)`); `gap_options`: takes diagnose's gap thresholds.
    """

    name: str
    module: str
    requires: tuple[str, ...]
    timeline: bool = True
    needs_gaps: bool = False
    gap_options: bool = False
    #: reads the whole trace (its gaps' next events are the whole trace's rows) and is
    #: given the window's gaps, not the window's trace
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

#: analyzers whose findings are host time (a share of step time), ranked after GPU time
HOST_ANALYZERS = frozenset({"host_steps"})
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


def diagnose(trace: Trace, *, window: str | tuple[int, int] | None = None,
             steps: bool = False, launch_gap_ns: int = LAUNCH_GAP_NS,
             sync_tolerance_ns: int = SYNC_TOLERANCE_NS, rank_by: str = "saving",
             savings: bool = True) -> Diagnosis:
    """Every analyzer that applies, the loss waterfall and the ranked findings.

        dx = gpudiag.diagnose(trace)
        dx.losses                      # device x cause -> lost_ns, share
        dx.findings.head()             # ranked, with call sites and advice

    `window`: a time range or a range name (see `analyzers.window`); `steps`: also the
    waterfall of each training step (`by_step`). The thresholds go to the gap rules.
    `savings`: replay the schedule without each finding's cause (`critical.savings`) for
    its expected saving; `rank_by`: "saving" (default) or "lost" (see `rank_findings`).
    """
    from gpudiag.analyzers.steps import training as steps_mod

    bounds = bounds_of(trace, window)
    whole = trace  # the waterfall's rules see the whole trace, then its layers are cut
    if bounds is not None:
        trace = window_mod.within(trace, bounds)
    gap_options = GapOptions(launch_gap_ns, sync_tolerance_ns)
    notes: list[str] = []
    tables: dict[str, pd.DataFrame] = {}
    timeline, all_gaps = _timeline(whole, gap_options, notes)
    gaps = declared.conform_frame("gaps", cut_gaps(all_gaps, bounds))
    gpu, host = _findings(trace, whole, gaps, notes, tables, gap_options=gap_options)
    loss = timeline.totals(bounds) if timeline is not None else losses_frame()
    total = int(loss.groupby(["rank", "device"], dropna=False)["lost_ns"].sum().sum())
    found = findings_mod.combine(gpu, total)
    training = steps_mod.training_steps(trace)
    notes.extend(step_notes(training, has_host_ops(trace)))
    warm = steps_mod.warmup_window(training)
    if warm is not None and timeline is not None and len(found):
        warm_bounds = (max(warm[0], bounds[0]), min(warm[1], bounds[1])) if bounds else warm
        if warm_bounds[1] > warm_bounds[0]:
            early = warm_findings(whole, all_gaps, warm_bounds, gap_options=gap_options)
            found = flag_warmup(found, early, training)
    replay = None
    if savings and timeline is not None:
        from gpudiag.analyzers.critical.savings import expected_savings

        def replay(joined: pd.DataFrame) -> pd.DataFrame:
            return expected_savings(whole, trace, joined, tables, bounds=bounds,
                                    gap_options=gap_options, steps=training, notes=notes)
    ranked = rank_findings(found, host, rank_by=rank_by, savings=replay,
                           framework=framework(trace))
    dx = Diagnosis(losses=declared.conform_frame("losses", loss),
                   findings=declared.conform_frame("findings", ranked),
                   tables=tables, notes=notes, window_ns=bounds, timeline=timeline, gaps=gaps,
                   steps=declared.conform_frame("steps", training), per_step=steps,
                   paths_of=functools.cache(lambda: drawn_paths(whole)))
    if steps and timeline is not None:
        dx.by_step = declared.conform_frame("by_step", steps_mod.losses_by_step(trace, timeline))
    add_views(dx)
    return dx


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


def bounds_of(trace: Trace, window: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """A window spec as bounds; a name that only a detected step has (`step 3` of a run
    without markers) is that step's window."""
    if window is None:
        return None
    if isinstance(window, str) and not (trace.ranges["name"].astype(str) == window).any():
        from gpudiag.analyzers.steps.training import training_steps

        steps = training_steps(trace)
        named = steps[steps["step"].astype(str) == window]
        if len(named):
            return int(named["start_ns"].min()), int(named["end_ns"].max())
    return window_mod.resolve(trace, window)


def _findings(trace: Trace, whole: Trace, gaps: pd.DataFrame | None, notes: list[str],
              tables: dict[str, pd.DataFrame] | None, *, gap_options: GapOptions,
              skip: frozenset[str] = frozenset()
              ) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    """Every applicable analyzer's one result on `trace` (the window), its findings split
    into GPU-time findings and host-time ones; its tables go into `tables` (None: not
    wanted)."""
    gpu: list[pd.DataFrame] = []
    host: list[pd.DataFrame] = []
    for analyzer in ANALYZERS:
        if analyzer.name in skip:
            continue
        if analyzer.needs_gaps:
            if gaps is None:  # no waterfall: the note says why
                continue
        elif not applies(trace, analyzer, notes):
            continue
        target, options = analyzer_inputs(analyzer, trace, whole, gaps, gap_options)
        result = analyzer.contract().analyze(target, **options)
        (host if analyzer.name in HOST_ANALYZERS else gpu).append(result.findings)
        if tables is not None:  # each checked against gpudiag/diagnosis_schema.py
            tables.update({name: declared.conform_table(name, table, analyzer.name)
                           for name, table in result.tables.items()})
    return gpu, host


def has_host_ops(trace: Trace) -> bool:
    """Whether the trace has host ops (where training steps are looked for)."""
    return bool(trace.ranges["source"].isin(["torch_op", "host", "annotation"]).any())


def analyzer_inputs(analyzer: Analyzer, trace: Trace, whole: Trace,
                    gaps: pd.DataFrame | None, gap_options: GapOptions
                    ) -> tuple[Trace, dict[str, Any]]:
    """What the analyzer is called with: the window's trace (host_gaps: the whole trace and
    the window's gaps) and its options."""
    if analyzer.whole_trace:
        return whole, {"gaps": gaps}
    return trace, (dict(gap_options.kwargs()) if analyzer.gap_options else {})




def step_notes(steps: pd.DataFrame, has_ops: bool) -> list[str]:
    """What the steps are and how they were found; which are warm-up (`has_ops`: the
    trace has host ops, where steps were looked for)."""
    from gpudiag.analyzers.findings import format_ns
    from gpudiag.analyzers.steps.training import summary

    info = summary(steps)
    if not info["count"]:
        return ["no training steps found (no step markers, optimizer steps, jitted step "
                "executions or repeating ops): host tables cover the whole trace"] \
            if has_ops else []
    line = (f"steps: {info['count']} ({info['method_text']}: {info['detail']}); median "
            f"{format_ns(info['median_ns'])}")
    if info["warmup"]:
        warm = steps[steps["warmup"]]
        names = ", ".join(warm["step"].astype(str).head(3))
        line += (f"; warm-up: {names} ({format_ns(info['warmup_ns'])}), left out of the "
                 "median and of the ranking of findings")
    return [line]


def warm_findings(whole: Trace, gaps: pd.DataFrame | None, warm: tuple[int, int], *,
                  gap_options: GapOptions) -> pd.DataFrame:
    """The findings of the GPU analyzers on the warm-up window alone (what `flag_warmup`
    matches the findings of the whole window against)."""
    inside = window_mod.within(whole, warm)
    parts, _ = _findings(inside, whole, cut_gaps(gaps, warm), [], None,
                         gap_options=gap_options, skip=WARM_SKIPPED)
    return findings_mod.combine(parts, 0)


#: analyzers left out of the warm-up window's findings: host time and the stream table
WARM_SKIPPED = HOST_ANALYZERS | {"timeline"}


def flag_warmup(found: pd.DataFrame, early: pd.DataFrame, steps: pd.DataFrame, *,
                min_share: float = 0.5) -> pd.DataFrame:
    """Mark findings whose lost time lies mostly (`min_share`) inside the warm-up steps:
    `early` holds the same analyzers' findings on the warm-up window, matched by (cause,
    where, advice)."""
    if early.empty:
        return found
    key = ["cause", "where", "advice"]
    lost = early.groupby(key, dropna=False)["lost_ns"].sum().rename("warm_ns")
    joined = found.join(lost, on=key)
    share = joined["warm_ns"].fillna(0) / found["lost_ns"].where(found["lost_ns"] > 0)
    flagged = (share >= min_share).to_numpy(bool)
    names = ", ".join(steps.loc[steps["warmup"], "step"].astype(str).head(3))
    out = found.copy()
    out["evidence"] = out["evidence"].astype(object)
    out.loc[flagged, "evidence"] = [
        f"warm-up: {100 * min(s, 1):.0f}% of this time is in the warm-up step(s) {names} "
        f"(one-time costs: compilation, cuDNN autotuning, allocator growth); {e}"
        for s, e in zip(share[flagged], found.loc[flagged, "evidence"], strict=True)]
    out["evidence"] = out["evidence"].astype("string")
    out["_warmup"] = flagged
    return out


#: how findings can be ranked (`diagnose(rank_by=...)`, `--rank-by`)
RANKINGS = ("saving", "lost")


def rank_findings(found: pd.DataFrame, host: list[pd.DataFrame], *, rank_by: str = "saving",
                  savings: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
                  framework: str | None = None) -> pd.DataFrame:
    """The findings in the order a user fixes them: warm-up ones last (a one-time cost is
    never the top finding); `rank_by="saving"`: by expected saving first (findings without
    one after those with one), `"lost"`: GPU findings by lost time, then host findings
    (host time, their own share of step time). `savings` adds the saving columns to the
    joined findings (`critical.savings.expected_savings`); the advice is then put in the
    words of `framework` (`frameworks.in_words_of`)."""
    if rank_by not in RANKINGS:
        raise ValueError(f"rank_by must be one of {', '.join(RANKINGS)}, not {rank_by!r}")
    host_found = findings_mod.frame(pd.concat([h for h in host if len(h)], ignore_index=True)) \
        if any(len(h) for h in host) else findings_mod.frame()
    gpu = found if "_warmup" in found else found.assign(_warmup=False)
    both = pd.concat([gpu.assign(_group=0), host_found.assign(_group=1, _warmup=False)],
                     ignore_index=True)
    if both.empty:
        return findings_mod.frame()
    if savings is not None:
        both = savings(both)
    order = ["_warmup", "_group", "lost_ns", "count"]
    ascending = [True, True, False, False]
    if rank_by == "saving" and "saving_ns" in both:
        both = both.assign(_saved=both["saving_ns"].notna().to_numpy(bool),
                           _saving=both["saving_ns"].fillna(0).to_numpy(np.int64))
        order[1:1] = ["_saved", "_saving"]
        ascending[1:1] = [False, False]
    both = both.sort_values(order, ascending=ascending, kind="stable")
    return findings_mod.frame(in_words_of(both.drop(
        columns=["_warmup", "_group", "_saved", "_saving"], errors="ignore"), framework))


def cut_gaps(gaps: pd.DataFrame | None, bounds: tuple[int, int] | None
             ) -> pd.DataFrame | None:
    """Gap pieces inside the window, cut to it."""
    if bounds is None or gaps is None:
        return gaps
    inside = gaps[(gaps["end_ns"] > bounds[0]) & (gaps["start_ns"] < bounds[1])]
    return inside.assign(start_ns=inside["start_ns"].clip(lower=bounds[0]),
                         end_ns=inside["end_ns"].clip(upper=bounds[1]))


def _timeline(trace: Trace, gap_options: GapOptions, notes: list[str]
              ) -> tuple[LossTimeline | None, pd.DataFrame | None]:
    """The waterfall's layers and its idle gap pieces, or (None, None) with a note saying
    why there is no timeline."""
    made, said = timeline_notes(has_gpu=not (trace.kernels.empty and trace.copies.empty),
                                timeline=bool(trace.meta.get("timeline", True)))
    notes.extend(said)
    if not made:
        return None, None
    from gpudiag.analyzers.collectives import calls as collectives
    from gpudiag.analyzers.kernels import launch
    occupancy = launch.occupancy(trace)
    unknown = occupancy["tail_efficiency"].isna()
    reason = occupancy["unavailable"].dropna()
    notes.extend(occupancy_notes(int(unknown.sum()), len(unknown),
                                 str(reason.iloc[0]) if len(reason) else None))
    waits = collectives.wait_intervals(trace) if len(trace.collectives) else None
    note = collectives.wait_note(trace) if waits is not None else None
    if note is not None:
        notes.append(note)
    timeline = loss_timeline(trace, efficiency=occupancy["tail_efficiency"], comm_waits=waits,
                             **gap_options.kwargs())
    return timeline, idle_gaps(trace, **gap_options.kwargs())


def timeline_notes(*, has_gpu: bool, timeline: bool) -> tuple[bool, list[str]]:
    """Whether there is a loss waterfall (GPU work on a timeline), and the note when not."""
    if not has_gpu:
        return False, ["no loss waterfall: the trace has no kernels or copies on a timeline"]
    if not timeline:
        return False, ["no loss waterfall: the times in this source are not a timeline "
                       "(e.g. Nsight Compute replays kernels one by one)"]
    return True, []


def occupancy_notes(unknown: int, kernels: int, reason: str | None) -> list[str]:
    """The note when small grids could not be measured for `unknown` of the `kernels`."""
    if unknown == kernels:
        return ["small_grid not measured: " + (reason or "no launch configuration")]
    if unknown:
        return [f"small_grid not measured for {unknown} of {kernels} kernels (launch "
                "configuration or device properties missing)"]
    return []


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
