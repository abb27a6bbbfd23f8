"""The reduce of a diagnosis: the parts (`analyzers.parts`) into one Diagnosis.

One part (a trace diagnosed whole in this process) or a job's hundreds, the same code.
What needs every rank is computed here, from the parts alone: the arrival skew and each
rank's waits from the collective rows (then each device's comm_wait, carved from its
comm-only intervals, and its `useful` time less it), every analyzer's `combine` of its
parts, the ranking of the findings and the steps' notes. A job read rank by rank gets
the Diagnosis that `diagnose(gpudiag.load(files))` gives for the same files, to the
nanosecond (tests/test_jobs.py holds the two side by side).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag.analyzers import findings as findings_mod
from gpudiag.analyzers.frameworks import formats_of, framework_of
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.losses.waterfall import (
    LossTimeline,
    by_device,
    clip_window,
    comm_wait_layer,
    loss_rows,
    losses_frame,
)
from gpudiag.analyzers.pipeline import notes as notes_mod
from gpudiag.analyzers.pipeline import ranking, registry
from gpudiag.analyzers.pipeline.answer import Diagnosis
from gpudiag.analyzers.pipeline.parts import (
    GAP_TABLES,
    ROW_TABLES,
    GroupPart,
    Options,
    comm_wait_ns,
    no_gaps,
)
from gpudiag.analyzers.steps import training as steps_mod
from gpudiag.analyzers.window import Window
from gpudiag.trace import Trace, merge, merge_meta

Placed = tuple[int, GroupPart]  # a batch's ranks' part and the kernel-id offset of its files
RowMap = Callable[[str, np.ndarray], np.ndarray]


class Read(Protocol):
    """What a batch of files read together gives the reduce (`jobs.rank_map.BatchPart`):
    its ranks' part (None: nothing read), its files' metas, and how many kernel ids and
    rows of each of `ROW_TABLES` its merged trace holds (the merge numbers them on)."""

    group: GroupPart | None
    metas: list[dict[str, Any]]
    kernel_span: int
    rows: dict[str, int]


@dataclass
class Whole:
    """A trace diagnosed whole in this process, read by the reduce as a job's one batch."""

    group: GroupPart | None
    metas: list[dict[str, Any]]
    kernel_span: int = 0
    rows: dict[str, int] = field(default_factory=dict)


def placed(batches: Sequence[Read]) -> list[Placed]:
    """Every batch's part with its kernel-id offset, in file order (the merge's); its gap
    pieces and row-labelled parts renumbered to name events by their merged rows."""
    out, offset = [], 0
    rows = dict.fromkeys(ROW_TABLES, 0)
    for batch in batches:
        part = batch.group
        if part is None:
            continue
        if any(rows.values()):  # the first batch's rows are the merged job's
            if part.gaps is not None:
                part.gaps = _merged_rows(part.gaps, rows)
            _shift_rows(part, _row_map(rows))
        out.append((offset, part))
        offset += batch.kernel_span
        rows = {name: rows[name] + batch.rows.get(name, 0) for name in ROW_TABLES}
    return out


def _row_map(offsets: dict[str, int]) -> RowMap:
    """A batch's row labels of a table -> the merged job's (after the batches before it)."""
    def rows(table: str, local: np.ndarray) -> np.ndarray:
        return np.asarray(local, dtype=np.int64) + offsets[table]
    return rows


def _shift_rows(part: GroupPart, rows: RowMap) -> None:
    """Parts holding row labels of the batch's tables (`Contract.shift_rows`), renumbered."""
    for name, piece in part.parts.items():
        if piece is not None:
            part.parts[name] = registry.BY_NAME[name].contract().shift_rows(piece, rows)


def _merged_rows(gaps: pd.DataFrame, offsets: dict[str, int]) -> pd.DataFrame:
    """`next_row` of the merged trace: the batch's row after the rows of the batches before."""
    row = gaps["next_row"].to_numpy(dtype=np.float64, na_value=np.nan)
    for name in GAP_TABLES:
        mine = (gaps["next_table"] == name).fillna(False).to_numpy(bool) & ~np.isnan(row)
        row[mine] += offsets[name]
    return gaps.assign(next_row=pd.array(np.where(np.isnan(row), None, row), dtype="Int64")
                       .astype("Int64"))


def job_meta(batches: Sequence[Read]) -> dict[str, Any]:
    """The meta of the merged job (one file: its own, as `gpudiag.load` keeps it)."""
    metas = [meta for batch in batches for meta in batch.metas]
    return dict(metas[0]) if len(metas) == 1 else merge_meta(metas)


def collectives_trace(ranks: list[Placed], meta: dict[str, Any]) -> Trace:
    """The job's collective rows and devices: all the cross-rank analyses read (of a trace
    diagnosed whole here, the trace itself, whose arrival skew the analyzers share)."""
    if len(ranks) == 1 and ranks[0][1].kept and ranks[0][1].window is not None:
        return ranks[0][1].window.whole
    rows = [part.collectives.assign(kernel_id=part.collectives["kernel_id"] + offset)
            if offset and len(part.collectives) else part.collectives
            for offset, part in ranks]
    return Trace(meta=meta, collectives=_concat(rows),
                 devices=_concat([part.devices for _, part in ranks]))


def job_waits(calls: Trace, notes: list[str]) -> pd.DataFrame | None:
    """Each rank's waits for its peers (`collectives.wait_intervals`), None without calls."""
    if calls.collectives.empty:
        return None
    from gpudiag.analyzers.collectives.skew import wait_intervals, wait_note

    waits = wait_intervals(calls)
    note = wait_note(calls)
    if note is not None:
        notes.append(note)
    return waits


def losses(ranks: list[Placed], waits: pd.DataFrame | None,
           bounds: tuple[int, int] | None) -> pd.DataFrame:
    """The waterfall of every device, comm_wait carved from its comm-only time."""
    rows: list[dict[str, object]] = []
    devices = {key: part for _, part in ranks for key in part.windows}
    waiting = {} if waits is None else by_device(waits)
    for key in sorted(devices):
        part = devices[key]
        start, end = clip_window(part.windows[key], bounds)
        comm = 0 if waits is None else comm_wait_ns(
            part.comm_only[key], waiting.get(key, waits.iloc[0:0]), start, end)
        rows += loss_rows(key, max(end - start, 0), {**part.lost[key], "comm_wait": comm})
    return losses_frame(rows)


def timeline_notes(ranks: list[Placed], meta: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether the job has a waterfall, and the notes `diagnose` writes about it."""
    made, notes = notes_mod.timeline_notes(has_gpu=any(part.has_gpu for _, part in ranks),
                                           timeline=bool(meta.get("timeline", True)))
    if not made:
        return False, notes
    unknown = sum(part.occupancy[0] for _, part in ranks)
    kernels = sum(part.occupancy[1] for _, part in ranks)
    reason = next((part.occupancy[2] for _, part in ranks if part.occupancy[2]), None)
    return True, notes_mod.occupancy_notes(unknown, kernels, reason)


def gaps(ranks: list[Placed]) -> pd.DataFrame:
    """The job's idle gap pieces, numbered as the merged trace numbers them (every rank's
    in rank order, a batch's ranks interleaved with other batches'), and the gap-indexed
    parts of each batch (host_gaps) renumbered with them."""
    if len(ranks) == 1 and ranks[0][1].kept and ranks[0][1].gaps is not None:
        return ranks[0][1].gaps  # numbered as its trace numbers them already
    runs = sorted(((rank, index, first, count) for index, (_, part) in enumerate(ranks)
                   if part.gaps is not None for rank, first, count in part.gap_runs),
                  key=lambda run: run[0])
    labels: dict[int, np.ndarray] = {}  # batch -> the job's label of each of its labels
    frames, offset = [], 0
    for _, index, first, count in runs:
        part = ranks[index][1]
        if index not in labels:
            labels[index] = np.full(max(f + c for _, f, c in part.gap_runs), -1, np.int64)
        labels[index][first:first + count] = np.arange(offset, offset + count)
        assert part.gaps is not None
        label = part.gaps.index.to_numpy()
        mine = part.gaps[(label >= first) & (label < first + count)]
        frames.append(mine.set_axis(labels[index][mine.index.to_numpy()]))
        offset += count
    for index, table in labels.items():
        part = ranks[index][1]
        for name, piece in part.parts.items():  # parts indexed like the gaps (host_gaps)
            if piece is not None and part.gaps is not None:
                part.parts[name] = registry.BY_NAME[name].contract().renumber_gaps(piece, table,
                                                                            part.gaps)
    if not frames:
        return declared.conform_frame("gaps", no_gaps())
    return declared.conform_frame("gaps", pd.concat(frames))


#: analyzers whose combine runs on the job's workers while this process combines the others
#: (a local pool's or a cluster's workers idle once the map is done): their combine is slow
#: beside the size of their parts (64 DLRM ranks: collectives 128 ms from 0.4 MB of parts,
#: host_gaps 42 ms, host_steps 23 ms, copies 20 ms); launch (44 ms), the waits and the
#: losses, about as long together, stay here
ELSEWHERE = ("collectives", "host_gaps", "host_steps", "copies")


def findings(ranks: list[Placed], job_gaps: pd.DataFrame | None, meta: dict[str, Any],
             notes: list[str], tables: dict[str, pd.DataFrame] | None, *,
             gap_options: GapOptions, waterfall: bool,
             skip: frozenset[str] = frozenset(), pool: Any = None
             ) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
    """Every analyzer that applies to the job, combined from its parts (or run on the
    merged inputs of an analyzer without parts); findings split into GPU and host.
    `pool`: the job's executor; with workers of its own, the `ELSEWHERE` analyzers combine
    there, in parallel with the rest here."""
    chosen = [analyzer for analyzer in registry.ANALYZERS if analyzer.name not in skip
              and (waterfall if analyzer.needs_gaps  # no waterfall: the note says why
                   else _applies(ranks, analyzer, meta, notes))]
    inputs = {analyzer.name: _renumbered(analyzer.name, [
        part.parts[analyzer.name] for _, part in ranks
        if part.parts.get(analyzer.name) is not None], ranks)
        for analyzer in chosen if analyzer.contract().combine is not None}
    away = [name for name in ELSEWHERE
            if name in inputs and pool is not None and pool.workers > 1]
    pending = pool.map(combine_part, [(name, inputs[name]) for name in away]) if away \
        else iter(())
    results: dict[str, Any] = {}
    fallback: Window | None = None
    for analyzer in chosen:
        if analyzer.name in away:
            continue
        if analyzer.name in inputs:
            results[analyzer.name] = combine_part((analyzer.name, inputs[analyzer.name]))
            continue
        fallback = fallback or _fallback(ranks, meta)
        target, options = registry.analyzer_inputs(analyzer, fallback, job_gaps, gap_options)
        results[analyzer.name] = analyzer.contract().analyze(target, **options)
    for outcome in pending:  # one lost there (a dead worker) is combined here: a bug raises
        name = away[outcome.index]
        results[name] = outcome.value if outcome.ok else combine_part((name, inputs[name]))
    gpu: list[pd.DataFrame] = []
    host: list[pd.DataFrame] = []
    for analyzer in chosen:
        result = results[analyzer.name]
        (host if analyzer.name in registry.HOST_ANALYZERS else gpu).append(result.findings)
        if tables is not None:
            tables.update({name: declared.conform_table(name, table, analyzer.name)
                           for name, table in result.tables.items()})
    return gpu, host


def combine_part(job: tuple[str, list[Any]]) -> Any:
    """`combine` of the analyzer named `job[0]` on its parts `job[1]` (its Result); where
    the reduce runs it on a worker, importable by name."""
    name, parts = job
    combine = registry.BY_NAME[name].contract().combine
    assert combine is not None, name  # only analyzers with parts are combined
    return combine(parts)


def _renumbered(name: str, parts: list[Any], ranks: list[Placed]) -> list[Any]:
    """Parts whose kernel ids are their file's, shifted as the merge shifts them."""
    shift = registry.BY_NAME[name].contract().shift_kernels
    offsets = [offset for offset, part in ranks if part.parts.get(name) is not None]
    return [shift(piece, offset) if offset else piece
            for piece, offset in zip(parts, offsets, strict=True)]


def _applies(ranks: list[Placed], analyzer: registry.Analyzer, meta: dict[str, Any],
             notes: list[str]) -> bool:
    """`registry.applies` on the merged job, from the ranks' row counts."""
    counts = {name: sum(part.row_counts.get(name, 0) for _, part in ranks)
              for name in analyzer.requires}
    return registry.applies_to(counts, bool(meta.get("timeline", True)), analyzer, notes)


def _fallback(ranks: list[Placed], meta: dict[str, Any]) -> Window:
    """The merged window of the ranks that sent theirs (one part's own)."""
    sent = [(offset, part.window) for offset, part in ranks if part.window is not None]
    if len(sent) == 1 and sent[0][0] == 0:
        seen = sent[0][1]
    else:
        offsets = [offset for offset, _ in sent]
        seen = Window(merge([window.whole for _, window in sent], offsets),
                      sent[0][1].bounds, merge([window.trace for _, window in sent], offsets))
    if seen.trace.meta != meta:
        seen.trace.meta.update(meta)
        seen.whole.meta.update(meta)
    return seen


def steps(ranks: list[Placed]) -> pd.DataFrame:
    """The training steps of every process (training_steps sorts by rank, pid, start)."""
    frames = [part.steps for _, part in ranks if part.steps is not None]
    out = _concat(frames).sort_values(["rank", "pid", "start_ns"], kind="stable",
                                      ignore_index=True, na_position="first")
    return declared.conform_frame("steps", out)


def by_step(ranks: list[Placed], waits: pd.DataFrame | None) -> pd.DataFrame:
    """The per-step waterfall of every device, comm_wait carved as in `losses`."""
    frames = []
    waiting = None if waits is None else by_device(waits)
    for _, part in ranks:
        table = part.by_step
        if table is None or table.empty:
            continue
        if waits is not None and waiting is not None:
            table = _carve_steps(table, part, waiting, waits.iloc[0:0])
        frames.append(table)
    if not frames:
        return declared.conform_frame("by_step", steps_mod.losses_by_step(Trace(), _empty()))
    out = pd.concat(frames, ignore_index=True).sort_values(
        ["rank", "device", "start_ns"], kind="stable", ignore_index=True, na_position="first")
    return declared.conform_frame("by_step", out)


def _carve_steps(table: pd.DataFrame, part: GroupPart,
                 waiting: dict[tuple[int, int], pd.DataFrame], no_waits: pd.DataFrame
                 ) -> pd.DataFrame:
    """The comm_wait of each step, taken from its `useful` (rows of one cause list the
    device's steps in the same order, `losses_by_step`)."""
    lost = table["lost_ns"].to_numpy(np.int64).copy()
    share = table["share"].to_numpy(np.float64).copy()
    cause = table["cause"].astype(str).to_numpy()
    rank, device = _keyed(table["rank"]), _keyed(table["device"])
    for key, (first, last) in part.windows.items():
        mine = (rank == key[0]) & (device == key[1])
        wait = waiting.get(key, no_waits)
        for comm_row, useful_row in zip(np.flatnonzero(mine & (cause == "comm_wait")),
                                        np.flatnonzero(mine & (cause == "useful")), strict=True):
            start = int(np.clip(table["start_ns"].to_numpy()[comm_row], first, last))
            end = int(np.clip(table["end_ns"].to_numpy()[comm_row], first, last))
            comm = comm_wait_ns(part.comm_only[key], wait, start, end)
            lost[comm_row] += comm
            lost[useful_row] -= comm
            for row in (comm_row, useful_row):
                share[row] = lost[row] / max(end - start, 1) if end > start else np.nan
    return table.assign(lost_ns=lost, share=share)


def _keyed(values: pd.Series) -> np.ndarray:
    from gpudiag.analyzers import keys

    return keys.key_array(values)


def _empty() -> LossTimeline:
    return LossTimeline()


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    from gpudiag.trace import concat_tables

    return concat_tables(frames)



def reduced(batches: Sequence[Read], options: Options, meta: dict[str, Any] | None = None,
            pool: Any = None) -> tuple[Diagnosis, pd.DataFrame, list[pd.DataFrame]]:
    """The Diagnosis of the parts, and its GPU findings and host findings before they are
    ranked (the warm-up flags and the savings come first). `meta`: the merged meta (None:
    the batches' merged); `pool`: a job's executor, whose workers combine some analyzers
    (`findings`)."""
    ranks = placed(batches)
    meta = job_meta(batches) if meta is None else meta
    calls = collectives_trace(ranks, meta)
    made, notes = timeline_notes(ranks, meta)
    waits = job_waits(calls, notes) if made else None
    gap_rows = gaps(ranks) if made and options.rows else None
    tables: dict[str, Any] = {}
    gpu, host = findings(ranks, gap_rows, meta, notes, tables,
                         gap_options=options.gap_options, waterfall=made, pool=pool)
    loss = losses(ranks, waits, options.bounds) if made else losses([], None, None)
    found = findings_mod.combine(gpu, int(loss["lost_ns"].sum()))
    training = steps(ranks)
    notes.extend(notes_mod.step_notes(training, any(p.has_host_ops for _, p in ranks)))
    dx = Diagnosis(losses=declared.conform_frame("losses", loss), findings=found,
                   tables=tables, notes=notes, window_ns=options.bounds, gaps=gap_rows,
                   steps=training, per_step=options.steps, meta=meta, waterfall=made,
                   summary_parts=[part.summary for _, part in ranks
                                  if part.summary is not None],
                   framework=framework_of(formats_of(meta),
                                          any(part.torch_ops for _, part in ranks)))
    if options.steps and made:
        dx.by_step = by_step(ranks, waits)
    if len(ranks) == 1 and ranks[0][1].layers is not None:
        dx.timeline = _with_waits(ranks[0][1].layers, waits)
    return dx, found, host


def _with_waits(timeline: LossTimeline, waits: pd.DataFrame | None) -> LossTimeline:
    """A part's loss layers with their comm_wait layer, carved as `losses` carves it."""
    if waits is None:
        return timeline
    waiting = by_device(waits)
    for key, layers in timeline.layers.items():
        layers["comm_wait"] = comm_wait_layer(timeline.comm_only[key],
                                              waiting.get(key, waits.iloc[0:0]))
    return timeline


def warm_window(dx: Diagnosis, found: pd.DataFrame) -> tuple[int, int] | None:
    """The warm-up window (every process's warm-up steps, in the analyzed window), when
    findings may lie in it."""
    warm = steps_mod.warmup_window(dx.steps) if dx.steps is not None else None
    if warm is None or not dx.waterfall or not len(found):
        return None
    if dx.window_ns is not None:
        warm = (max(warm[0], dx.window_ns[0]), min(warm[1], dx.window_ns[1]))
    return warm if warm[1] > warm[0] else None


def warm_flagged(found: pd.DataFrame, dx: Diagnosis, batches: Sequence[Read],
                 options: Options, pool: Any = None) -> pd.DataFrame:
    """The findings, those whose time lies mostly in the warm-up steps flagged, from the
    parts of the warm-up window (`parts.warm_part`)."""
    ranks = placed(batches)
    warm_gaps = gaps(ranks) if options.rows else None
    parts, _ = findings(ranks, warm_gaps, job_meta(batches), [], None, waterfall=True,
                        gap_options=options.gap_options, skip=registry.WARM_SKIPPED,
                        pool=pool)
    assert dx.steps is not None
    return ranking.flag_warmup(found, findings_mod.combine(parts, 0), dx.steps)
