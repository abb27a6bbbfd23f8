"""The map of a many-rank job: what a batch of its files contributes, computed where read.

`read_batch((files, options))` reads a few consecutive files of the job (`batches.plan`
groups them so that small rank files share the analyzers' fixed cost), merges them as
`gpudiag.load` would, and returns a `BatchPart` holding one `GroupPart` for the ranks in
them. Only compact results leave the worker: the ranks' devices, metas and collective rows,
each device's window and its losses except comm_wait (which needs every rank's collectives)
with the intervals comm_wait is carved from, the idle gap pieces, the steps, and each
analyzer's `part` (what `combine` of the analyzer needs: classified waits, gap pieces with
call sites, ...). Never the event tables, except for an analyzer that has no `part` yet:
its trace travels (`GroupPart.fallback`), so the job's answer is still the merged one.

A file of the batch that cannot be read is listed in `BatchPart.failed` and the others
are analyzed. `read_batch` must be importable by name: the executors' workers import it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag import intervals
from gpudiag.analyzers import diagnosis
from gpudiag.analyzers import window as window_mod
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.losses.waterfall import DeviceKey, LossTimeline, clip_window
from gpudiag.analyzers.steps import training as steps_mod
from gpudiag.errors import InputError
from gpudiag.jobs.executors import failure
from gpudiag.readers.claims import refusal
from gpudiag.readers.sources import read_file, read_together
from gpudiag.trace import Trace, merge


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
    row_counts: dict[str, int]
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
    fallback: Trace | None = None  # for analyzers without a part
    fallback_whole: Trace | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class BatchPart:
    """What one batch of the job's files gives: the files read (and those that could not
    be, with their one-line errors), each file's meta, the kernel ids and the kernels,
    copies and memory rows the batch used (the merge numbers them across files,
    `trace.merge`), and its ranks' `GroupPart` (None when no file could be read)."""

    files: tuple[str, ...]
    failed: list[tuple[str, str]]
    metas: list[dict[str, Any]]
    kernel_span: int
    group: GroupPart | None
    rows: dict[str, int] = field(default_factory=dict)
    #: why these files are not one job (`readers.claims`: a copy of a rank's file, two
    #: runs in one folder); the coordinator raises it
    refused: InputError | None = None


def read_batch(job: tuple[tuple[str, ...], Options]) -> BatchPart:
    """Read a batch of the job's files, merged in order, and compute its ranks' part."""
    files, options = job
    failed = [(file, not_here(file)) for file in files if not os.path.exists(file)]
    files = tuple(file for file in files if os.path.exists(file))
    together = read_together([Path(file) for file in files])
    if together is not None:  # Kineto files: their tables built once for the batch
        trace, metas = together
        read = list(files)
    else:
        traces, read = [], []
        for file in files:
            try:
                traces.append(read_file(Path(file)))
            except Exception as exc:  # one unreadable file (or a reader's bug) keeps its own
                failed.append((file, failure(exc)))
                continue
            read.append(file)
        if not traces:
            return BatchPart((), failed, [], 0, None)
        metas = [dict(trace.meta) for trace in traces]
        trace = merge(traces)
    trace.fill_rank()
    refused = refusal(trace, [(file, meta.get("rank")) for file, meta
                              in zip(read, metas, strict=True) if os.path.isfile(file)])
    if refused is not None:  # the job stops: what it would say of that rank is wrong
        return BatchPart(tuple(read), failed, metas, 0, None, refused=refused)
    span = int(trace.kernels["kernel_id"].max()) + 1 if len(trace.kernels) else 0
    return BatchPart(tuple(read), failed, metas, span, group_part(trace, options),
                     {name: len(getattr(trace, name)) for name in ROW_TABLES})


def not_here(file: str) -> str:
    """Why a job's file is missing where its worker runs: the job lists files where it is
    started, and a Dask worker on another host (or a file deleted meanwhile) does not see
    them."""
    return (f"{file}: not found on {socket.gethostname()}, where the job's worker read it "
            "(workers must see the job's files at the same paths: on Dask, a shared file "
            "system)")


#: the tables a gap piece's next event (`next_table`, `next_row`) comes from
GAP_TABLES = ("kernels", "copies")
#: tables whose row labels an analyzer's part holds (gap pieces; fragmentation's `event`)
ROW_TABLES = (*GAP_TABLES, "memory")


def group_part(trace: Trace, options: Options) -> GroupPart:
    """The part of a batch's ranks (the first pass), or only its warm-up parts
    (`options.warm`)."""
    whole, bounds = trace, options.bounds
    if bounds is not None:
        trace = window_mod.within(whole, bounds)
    part = GroupPart(meta=dict(whole.meta),
                    devices=whole.devices, collectives=whole.collectives,
                    timeline=bool(whole.meta.get("timeline", True)),
                    has_gpu=not (whole.kernels.empty and whole.copies.empty),
                    has_host_ops=diagnosis.has_host_ops(trace), row_counts=trace.row_counts())
    gaps = _timeline_part(part, whole, bounds, options)
    if options.warm is not None:
        inside = window_mod.within(whole, options.warm)
        part.row_counts = inside.row_counts()
        _keep_gaps(part, gaps, options.warm)
        part.parts = _analyzer_parts(part, inside, whole, part.gaps, options,
                                     skip=diagnosis.WARM_SKIPPED)
        if not options.rows:
            _compact(part)
        return part
    _keep_gaps(part, gaps, bounds)
    part.parts = _analyzer_parts(part, trace, whole, part.gaps, options)
    if not options.rows:
        _compact(part)
    part.steps = declared.conform_frame("steps", steps_mod.training_steps(trace))
    from gpudiag.analyzers import summary

    part.summary = summary.part(whole, window_ns=bounds)
    return part


def _compact(part: GroupPart) -> None:
    """Only what the findings need travels: no gap pieces, parts made compact
    (`Contract.compact`: host_gaps' sums)."""
    part.gaps = None
    for name, piece in part.parts.items():
        if piece is not None:
            part.parts[name] = _ANALYZERS[name].contract().compact(piece)


_ANALYZERS = {analyzer.name: analyzer for analyzer in diagnosis.ANALYZERS}


def _keep_gaps(part: GroupPart, gaps: pd.DataFrame | None, bounds: tuple[int, int] | None
               ) -> None:
    """The ranks' idle gap pieces cut to the window, and each rank's run of labels uncut."""
    part.gap_runs = [] if gaps is None else gap_runs(gaps)
    part.gaps = None if gaps is None else declared.conform_frame(
        "gaps", diagnosis.cut_gaps(gaps, bounds))


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


def _timeline_part(part: GroupPart, whole: Trace, bounds: tuple[int, int] | None,
                   options: Options) -> pd.DataFrame | None:
    """The rank's waterfall without comm_wait (its totals, per-step amounts and the
    comm-only intervals to carve it from); its idle gaps, None without a waterfall."""
    if not part.has_gpu or not part.timeline:
        return None
    from gpudiag.analyzers.kernels import launch
    from gpudiag.analyzers.losses.gaps import idle_gaps
    from gpudiag.analyzers.losses.waterfall import loss_timeline

    occupancy = launch.occupancy(whole)
    unknown = occupancy["tail_efficiency"].isna()
    reason = occupancy["unavailable"].dropna()
    part.occupancy = (int(unknown.sum()), len(unknown),
                      str(reason.iloc[0]) if len(reason) else None)
    timeline = loss_timeline(whole, efficiency=occupancy["tail_efficiency"],
                             **options.gap_options.kwargs())
    part.timeline_made = True
    if options.warm is None:
        _keep_losses(part, timeline, bounds)
        if options.steps:
            part.by_step = steps_mod.losses_by_step(whole if bounds is None else
                                                    _windowed_steps(whole, bounds), timeline)
    return idle_gaps(whole, **options.gap_options.kwargs())


def _windowed_steps(whole: Trace, bounds: tuple[int, int]) -> Trace:
    """`losses_by_step` reads the steps of the windowed trace (as diagnose does)."""
    return window_mod.within(whole, bounds)


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


def _analyzer_parts(part: GroupPart, trace: Trace, whole: Trace, gaps: pd.DataFrame | None,
                    options: Options, *, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Each analyzer's part on this rank: `Contract.part(...)`, or the analyzer's inputs
    when it has none yet (they travel as `fallback`)."""
    out: dict[str, Any] = {}
    empty_gaps = declared.conform_frame("gaps", no_gaps()) if gaps is None else gaps
    for analyzer in diagnosis.ANALYZERS:
        if analyzer.name in skip:
            continue
        if not analyzer.needs_gaps and not _could_apply(trace, analyzer):
            continue
        contract = analyzer.contract()
        has_rows = any(len(getattr(trace, name)) for name in analyzer.requires)
        if contract.part is None:
            if has_rows:
                part.fallback, part.fallback_whole = trace, whole
            out[analyzer.name] = None
            continue
        if not has_rows and not analyzer.needs_gaps:
            continue  # nothing of this batch to combine (an allocator pass costs ~25 ms)
        target, kwargs = diagnosis.analyzer_inputs(analyzer, trace, whole, empty_gaps,
                                                   options.gap_options)
        out[analyzer.name] = contract.part(target, **kwargs)
    return out


def _could_apply(trace: Trace, analyzer: diagnosis.Analyzer) -> bool:
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
