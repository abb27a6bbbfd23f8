"""The map of a diagnosis: what one trace contributes, computed where it is read.

A trace here is one part of what is diagnosed: the whole of a trace `diagnose` was given,
or a batch of a job's rank files read together on a worker. `group_part(trace, options)`
returns a `GroupPart` for the ranks in it, and `analyzers.reduce` makes the Diagnosis from
the parts: one path, whether there is one part or hundreds. A part holds compact results:
the ranks' devices, metas and collective rows, each device's window and its losses except
comm_wait (which needs every rank's collectives) with the intervals comm_wait is carved
from, the idle gap pieces, the steps, and each analyzer's `part` (what `combine` of the
analyzer needs: classified waits, gap pieces with call sites, ...). Never the event
tables, except for an analyzer that has no `part` yet: its traces travel
(`GroupPart.window`), so the answer is still the merged one; and in this process
(`Options.keep`), where the part keeps its window and the loss layers for the Diagnosis of
a trace diagnosed whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag import intervals
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.losses.waterfall import DeviceKey, LossTimeline, clip_window
from gpudiag.analyzers.pipeline import registry
from gpudiag.analyzers.steps import training as steps_mod
from gpudiag.analyzers.window import Window
from gpudiag.trace import Trace


@dataclass(frozen=True)
class Options:
    """What the job is asked: the window (absolute ns, resolved by the coordinator), the
    per-step waterfall, the gap thresholds, and (second pass) the warm-up window."""

    bounds: tuple[int, int] | None = None
    steps: bool = False
    gap_options: GapOptions = field(default_factory=GapOptions)
    warm: tuple[int, int] | None = None
    #: keep the row-level results (gap pieces, host_gaps rows) for the job's Diagnosis;
    #: False sends only what the findings need, so the coordinator stays small
    rows: bool = True
    #: the part stays in this process: it keeps its `window` (the whole trace, the window's)
    #: and the loss layers (`layers`), what a trace diagnosed whole is given
    keep: bool = False
    #: the part's share of `summarize` (a job's; a trace diagnosed whole summarizes itself)
    summary: bool = True
    #: (second pass) the findings whose events the part selects for the job's replay
    savings: SavingsAsk | None = None



@dataclass
class GroupPart:
    """The ranks of one batch: their share of the job's diagnosis (see the module
    docstring). Keyed by device (rank, device) where it is per device; the gap pieces are
    numbered as `idle_gaps` numbers them on the batch, in device order, so each rank's
    are one run of labels (`gap_runs`)."""

    meta: dict[str, Any]
    devices: pd.DataFrame
    collectives: pd.DataFrame
    timeline: bool  # the source's times are a timeline
    has_gpu: bool   # kernels or copies
    has_host_ops: bool
    torch_ops: bool  # the framework's words: torch's where torch ops were recorded
    row_counts: dict[str, int]
    kernel_names: tuple[str, ...] = ()  # in the order of the trace's categories
    windows: dict[DeviceKey, tuple[int, int]] = field(default_factory=dict)
    lost: dict[DeviceKey, dict[str, int]] = field(default_factory=dict)  # no comm_wait yet
    comm_only: dict[DeviceKey, intervals.Spans] = field(default_factory=dict)
    occupancy: tuple[int, int, str | None] = (0, 0, None)  # unknown, kernels, why unknown
    timeline_made: bool = False  # a waterfall (kernels or copies on a timeline)
    gaps: pd.DataFrame | None = None
    #: each rank's idle gaps before the window cut them: (rank key, first label, count),
    #: in label order (the merged job numbers every rank's gaps in rank order)
    gap_runs: list[tuple[int, int, int]] = field(default_factory=list)
    steps: pd.DataFrame | None = None
    by_step: pd.DataFrame | None = None
    parts: dict[str, Any] = field(default_factory=dict)
    summary: Any = None  # `summary.part`: devices, windows, rows, kernels by name
    #: what the part was computed from, for analyzers without a part (and kept in this
    #: process, `Options.keep`)
    window: Window | None = None
    layers: LossTimeline | None = None  # the loss layers, kept in this process
    #: the events of the analyzed window (`critical.sample.extent`): the job's replay
    #: sample is chosen from its ranks' together
    extent: Any = None
    idle: pd.DataFrame | None = None  # the idle gaps, uncut, kept in this process
    kept: bool = False  # the part of a trace diagnosed whole here (`Options.keep`)
    notes: list[str] = field(default_factory=list)



@dataclass(frozen=True)
class SavingsAsk:
    """What a job asks each batch for its findings' expected savings (second pass): the
    findings to select events for (`critical.savings.selections`) and which of them are
    planned, the replay's sample, the job's arrival skew of the batch's kernels (ids of
    the batch's own numbering; what comm_wait findings' fixes read) and its kernel names."""

    findings: pd.DataFrame
    planned: np.ndarray
    sample: Any  # critical.sample.Sample
    skew: pd.DataFrame | None = None
    #: the job's short names of its kernels' full names (`names.job_short_names`): what
    #: the findings name a kernel by where it has no call site
    shorts: dict[str, str] | None = None


@dataclass
class SavingsPart:
    """A batch's answer to a `SavingsAsk`: each finding's selection of the batch's events
    (by the finding's position), the rows its replay needs over the sample
    (`critical.events.replay_rows`; None when nothing was selected) and how many events
    of the sample it holds."""

    chosen: dict[int, Any]
    rows: Trace | None
    count: int


def savings_part(seen: Window, options: Options, ask: SavingsAsk) -> SavingsPart:
    """The batch's `SavingsPart`: its events of each asked finding, selected as
    `critical.savings.expected_savings` selects them on a trace diagnosed whole (the same
    window, gaps, host_gaps pieces and arrival skew), and its rows of the replay."""
    from gpudiag.analyzers.critical import savings
    from gpudiag.analyzers.critical.events import replay_rows
    from gpudiag.analyzers.critical.sample import count_in
    from gpudiag.analyzers.host import bound
    from gpudiag.analyzers.losses.gaps import idle_gaps

    whole, sample = seen.whole, ask.sample.window
    gaps = declared.conform_frame("gaps", cut_gaps(
        idle_gaps(whole, **options.gap_options.kwargs()), seen.bounds))
    pieces = bound.part(whole, gaps=gaps)
    tables = {"host_gaps": bound.named_pieces(pieces, ask.shorts) if ask.shorts is not None
              else bound.combine([pieces]).tables["host_gaps"]}
    if ask.skew is not None:
        tables["arrival_skew"] = ask.skew
    chosen = savings.selections(savings.Inputs(seen, tables, options.gap_options, sample,
                                               ask.shorts), ask.findings, ask.planned)
    return SavingsPart(chosen, replay_rows(whole, sample) if chosen else None,
                       count_in(whole, sample))


#: the tables a gap piece's next event (`next_table`, `next_row`) comes from
GAP_TABLES = ("kernels", "copies")
#: tables whose row labels an analyzer's part holds (gap pieces; fragmentation's `event`)
ROW_TABLES = (*GAP_TABLES, "memory")


def group_part(seen: Window, options: Options) -> GroupPart:
    """The part of a batch's ranks, `seen` (its bounds: `options.bounds`; the first pass),
    or only its warm-up parts (`options.warm`)."""
    whole, window = seen.whole, seen.trace
    part = GroupPart(meta=dict(whole.meta),
                     devices=whole.devices, collectives=whole.collectives,
                     timeline=bool(whole.meta.get("timeline", True)),
                     has_gpu=not (whole.kernels.empty and whole.copies.empty),
                     has_host_ops=registry.has_host_ops(window),
                     torch_ops=bool((whole.ranges["source"] == "torch_op").any()),
                     kernel_names=tuple(str(name) for name in whole.kernels["name"].astype(
                         "category").cat.categories),
                     row_counts=window.row_counts())
    if options.keep:
        part.window, part.kept = seen, True
    gaps = _timeline_part(part, seen, options)
    if options.keep:
        part.idle = gaps
    if options.warm is not None:
        return warm_part(part, seen.cut(options.warm), gaps, options)
    _keep_gaps(part, gaps, seen.bounds)
    part.parts = _analyzer_parts(part, seen, part.gaps, options)
    if not options.rows:
        _compact(part)
    part.steps = declared.conform_frame("steps", steps_mod.training_steps(window))
    if options.summary:
        from gpudiag.analyzers import summary

        part.summary = summary.part(whole, window_ns=seen.bounds)
    return part


def warm_part(part: GroupPart, warm: Window, gaps: pd.DataFrame | None, options: Options
              ) -> GroupPart:
    """`part` given the analyzers' parts of the warm-up window `options.warm` alone (what
    the findings of the whole window are matched against, `ranking.flag_warmup`), `warm`
    (its bounds: `options.warm`); `gaps`: the idle gaps of the whole trace, uncut."""
    part.row_counts = warm.trace.row_counts()
    _keep_gaps(part, gaps, warm.bounds)
    part.parts = _analyzer_parts(part, warm, part.gaps, options,
                                 skip=registry.WARM_SKIPPED)
    if not options.rows:
        _compact(part)
    return part


def _compact(part: GroupPart) -> None:
    """Only what the findings need travels: no gap pieces, parts made compact
    (`Contract.compact`: host_gaps' sums)."""
    part.gaps = None
    for name, piece in part.parts.items():
        if piece is not None:
            part.parts[name] = registry.BY_NAME[name].contract().compact(piece)


def _keep_gaps(part: GroupPart, gaps: pd.DataFrame | None, bounds: tuple[int, int] | None
               ) -> None:
    """The ranks' idle gap pieces cut to the window, and each rank's run of labels uncut."""
    part.gap_runs = [] if gaps is None else gap_runs(gaps)
    part.gaps = None if gaps is None else declared.conform_frame(
        "gaps", cut_gaps(gaps, bounds))


def gap_runs(gaps: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(rank key, first label, count) of each rank's gaps (`idle_gaps` lists a rank's
    devices one after another, so a rank's labels are consecutive)."""
    from gpudiag.analyzers import keys

    ranks = keys.key_array(gaps["rank"])
    if not len(ranks):
        return []
    starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
    counts = np.diff(np.r_[starts, len(ranks)])
    labels = gaps.index.to_numpy()
    return [(int(ranks[first]), int(labels[first]), int(count))
            for first, count in zip(starts, counts, strict=True)]


def _timeline_part(part: GroupPart, seen: Window, options: Options) -> pd.DataFrame | None:
    """The rank's waterfall without comm_wait (its totals, per-step amounts and the
    comm-only intervals to carve it from; its layers where the part is kept); its idle
    gaps, uncut, None without a waterfall."""
    if not part.has_gpu or not part.timeline:
        return None
    from gpudiag.analyzers.kernels import launch
    from gpudiag.analyzers.losses.gaps import idle_gaps
    from gpudiag.analyzers.losses.waterfall import loss_timeline

    whole = seen.whole
    occupancy = launch.occupancy(whole)
    unknown = occupancy["tail_efficiency"].isna()
    reason = occupancy["unavailable"].dropna()
    part.occupancy = (int(unknown.sum()), len(unknown),
                      str(reason.iloc[0]) if len(reason) else None)
    timeline = loss_timeline(whole, efficiency=occupancy["tail_efficiency"],
                             **options.gap_options.kwargs())
    part.timeline_made = True
    if options.warm is None:
        from gpudiag.analyzers.critical.sample import extent

        part.extent = extent(whole, options.bounds)
        _keep_losses(part, timeline, options.bounds)
        if options.steps:  # the steps of the window's trace, as the waterfall's window
            part.by_step = steps_mod.losses_by_step(seen.trace, timeline)
        if options.keep:
            part.layers = timeline
    return idle_gaps(whole, **options.gap_options.kwargs())


def _keep_losses(part: GroupPart, timeline: LossTimeline, bounds: tuple[int, int] | None
                 ) -> None:
    """Each device's window and lost time in the analyzed window; comm-only intervals."""
    for key, window in timeline.windows.items():
        start, end = clip_window(window, bounds)
        if bounds is not None and end - start <= 0:
            continue
        amounts = timeline.amounts(key, [start, max(start, end)])
        part.windows[key] = window
        part.lost[key] = {cause: round(float(amounts.get(cause, [0.0])[0]))
                          for cause in LOSS_CAUSES if cause not in ("useful", "comm_wait")}
        part.comm_only[key] = intervals.clip(timeline.comm_only[key], window[0], window[1])


def _analyzer_parts(part: GroupPart, seen: Window, gaps: pd.DataFrame | None,
                    options: Options, *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Each analyzer's part on this rank: `Contract.part(...)`, or the analyzer's inputs
    when it has none yet (its window travels, `GroupPart.window`)."""
    out: dict[str, Any] = {}
    trace = seen.trace
    empty_gaps = declared.conform_frame("gaps", no_gaps()) if gaps is None else gaps
    for analyzer in registry.ANALYZERS:
        if analyzer.name in skip:
            continue
        if not analyzer.needs_gaps and not _could_apply(trace, analyzer):
            continue
        contract = analyzer.contract()
        has_rows = any(len(getattr(trace, name)) for name in analyzer.requires)
        if contract.part is None:
            if has_rows and part.window is None:
                part.window = seen
            out[analyzer.name] = None
            continue
        if not has_rows and not analyzer.needs_gaps:
            continue  # nothing of this batch to combine (an allocator pass costs ~25 ms)
        target, kwargs = registry.analyzer_inputs(analyzer, seen, empty_gaps,
                                                   options.gap_options)
        out[analyzer.name] = contract.part(target, **kwargs)
    return out


def _could_apply(trace: Trace, analyzer: registry.Analyzer) -> bool:
    """An analyzer that needs real times does not run on a rank without them."""
    return not analyzer.timeline or bool(trace.meta.get("timeline", True))


def no_gaps() -> pd.DataFrame:
    from gpudiag.analyzers.losses.gaps import idle_gaps

    return idle_gaps(Trace()).iloc[0:0]


def comm_wait_ns(comm_only: intervals.Spans, waits: pd.DataFrame, start: int, end: int
                 ) -> int:
    """The comm_wait of a device between start and end (what its waterfall lacks)."""
    spans = intervals.intersect(intervals.clip(comm_only, start, end),
                                intervals.union(waits["start_ns"], waits["end_ns"]))
    return int(np.sum(spans[1] - spans[0]))


def cut_gaps(gaps: pd.DataFrame | None, bounds: tuple[int, int] | None
             ) -> pd.DataFrame | None:
    """Gap pieces inside the window, cut to it."""
    if bounds is None or gaps is None:
        return gaps
    inside = gaps[(gaps["end_ns"] > bounds[0]) & (gaps["start_ns"] < bounds[1])]
    return inside.assign(start_ns=inside["start_ns"].clip(lower=bounds[0]),
                         end_ns=inside["end_ns"].clip(upper=bounds[1]))
