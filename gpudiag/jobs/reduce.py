"""The reduce of a many-rank job: the ranks' parts into one Diagnosis.

What needs every rank is computed here, from the parts alone: the arrival skew and each
rank's waits from the collective rows (then each device's comm_wait, carved from its
comm-only intervals, and its `useful` time less it), every analyzer's `combine` of its
parts, the ranking of the findings and the steps' notes. The result is the Diagnosis that
`diagnose(gpudiag.load(files))` gives for the same files, to the nanosecond
(tests/test_jobs.py holds the two side by side).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag.analyzers import diagnosis
from gpudiag.analyzers.losses.options import GapOptions
from gpudiag.analyzers.losses.waterfall import (
    by_device,
    clip_window,
    loss_rows,
    losses_frame,
)
from gpudiag.analyzers.steps import training as steps_mod
from gpudiag.jobs.rank_map import GAP_TABLES, ROW_TABLES, BatchPart, GroupPart, comm_wait_ns
from gpudiag.jobs.rank_map import no_gaps as rank_map_no_gaps
from gpudiag.trace import Trace, merge, merge_meta

Placed = tuple[int, GroupPart]  # a batch's ranks' part and the kernel-id offset of its files
RowMap = Callable[[str, np.ndarray], np.ndarray]


def placed(batches: list[BatchPart]) -> list[Placed]:
    """Every batch's part with its kernel-id offset, in file order (the merge's); its gap
    pieces and row-labelled parts renumbered to name events by their merged rows."""
    out, offset = [], 0
    rows = dict.fromkeys(ROW_TABLES, 0)
    for batch in batches:
        part = batch.group
        if part is None:
            continue
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
            part.parts[name] = _ANALYZER[name].contract().shift_rows(piece, rows)


def _merged_rows(gaps: pd.DataFrame, offsets: dict[str, int]) -> pd.DataFrame:
    """`next_row` of the merged trace: the batch's row after the rows of the batches before."""
    row = gaps["next_row"].to_numpy(dtype=np.float64, na_value=np.nan)
    for name in GAP_TABLES:
        mine = (gaps["next_table"] == name).fillna(False).to_numpy(bool) & ~np.isnan(row)
        row[mine] += offsets[name]
    return gaps.assign(next_row=pd.array(np.where(np.isnan(row), None, row), dtype="Int64")
                       .astype("Int64"))


def job_meta(batches: list[BatchPart]) -> dict[str, Any]:
    """The meta of the merged job (one file: its own, as `gpudiag.load` keeps it)."""
    metas = [meta for batch in batches for meta in batch.metas]
    return dict(metas[0]) if len(metas) == 1 else merge_meta(metas)


def collectives_trace(ranks: list[Placed], meta: dict[str, Any]) -> Trace:
    """The job's collective rows and devices: all the cross-rank analyses read."""
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
    made, notes = diagnosis.timeline_notes(has_gpu=any(part.has_gpu for _, part in ranks),
                                           timeline=bool(meta.get("timeline", True)))
    if not made:
        return False, notes
    unknown = sum(part.occupancy[0] for _, part in ranks)
    kernels = sum(part.occupancy[1] for _, part in ranks)
    reason = next((part.occupancy[2] for _, part in ranks if part.occupancy[2]), None)
    return True, diagnosis.occupancy_notes(unknown, kernels, reason)


def gaps(ranks: list[Placed]) -> pd.DataFrame:
    """The job's idle gap pieces, numbered as the merged trace numbers them (every rank's
    in rank order, a batch's ranks interleaved with other batches'), and the gap-indexed
    parts of each batch (host_gaps) renumbered with them."""
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
                part.parts[name] = _ANALYZER[name].contract().renumber_gaps(piece, table,
                                                                            part.gaps)
    if not frames:
        return declared.conform_frame("gaps", rank_map_no_gaps())
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
    chosen = [analyzer for analyzer in diagnosis.ANALYZERS if analyzer.name not in skip
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
    fallback: tuple[Trace, Trace] | None = None
    for analyzer in chosen:
        if analyzer.name in away:
            continue
        if analyzer.name in inputs:
            results[analyzer.name] = combine_part((analyzer.name, inputs[analyzer.name]))
            continue
        fallback = fallback or _fallback(ranks, meta)
        target, options = diagnosis.analyzer_inputs(analyzer, fallback[0], fallback[1],
                                                    job_gaps, gap_options)
        results[analyzer.name] = analyzer.contract().analyze(target, **options)
    for outcome in pending:  # one lost there (a dead worker) is combined here: a bug raises
        name = away[outcome.index]
        results[name] = outcome.value if outcome.ok else combine_part((name, inputs[name]))
    gpu: list[pd.DataFrame] = []
    host: list[pd.DataFrame] = []
    for analyzer in chosen:
        result = results[analyzer.name]
        (host if analyzer.name in diagnosis.HOST_ANALYZERS else gpu).append(result.findings)
        if tables is not None:
            tables.update({name: declared.conform_table(name, table, analyzer.name)
                           for name, table in result.tables.items()})
    return gpu, host


def combine_part(job: tuple[str, list[Any]]) -> Any:
    """`combine` of the analyzer named `job[0]` on its parts `job[1]` (its Result); where
    the reduce runs it on a worker, importable by name."""
    name, parts = job
    combine = _ANALYZER[name].contract().combine
    assert combine is not None, name  # only analyzers with parts are combined
    return combine(parts)


def _renumbered(name: str, parts: list[Any], ranks: list[Placed]) -> list[Any]:
    """Parts whose kernel ids are their file's, shifted as the merge shifts them."""
    shift = _ANALYZER[name].contract().shift_kernels
    offsets = [offset for offset, part in ranks if part.parts.get(name) is not None]
    return [shift(piece, offset) if offset else piece
            for piece, offset in zip(parts, offsets, strict=True)]


_ANALYZER = {analyzer.name: analyzer for analyzer in diagnosis.ANALYZERS}


def _applies(ranks: list[Placed], analyzer: diagnosis.Analyzer, meta: dict[str, Any],
             notes: list[str]) -> bool:
    """`diagnosis.applies` on the merged job, from the ranks' row counts."""
    counts = {name: sum(part.row_counts.get(name, 0) for _, part in ranks)
              for name in analyzer.requires}
    return diagnosis.applies_to(counts, bool(meta.get("timeline", True)), analyzer, notes)


def _fallback(ranks: list[Placed], meta: dict[str, Any]) -> tuple[Trace, Trace]:
    """The merged window and whole traces of the ranks that sent them."""
    sent = [(offset, part) for offset, part in ranks if part.fallback is not None]
    offsets = [offset for offset, _ in sent]
    window = merge([part.fallback for _, part in sent], offsets)  # type: ignore[misc]
    whole = merge([part.fallback_whole for _, part in sent], offsets)  # type: ignore[misc]
    window.meta.update(meta)
    whole.meta.update(meta)
    return window, whole


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


def _empty() -> Any:
    from gpudiag.analyzers.losses.waterfall import LossTimeline

    return LossTimeline()


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    from gpudiag.trace import concat_tables

    return concat_tables(frames)

