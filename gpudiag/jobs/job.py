"""A job of many ranks diagnosed rank by rank, in parallel, then reduced (`run`, on the
executor `gpudiag.jobs.diagnose_job` opened).

The files (a rank's trace each, or run directories) are read in batches of consecutive
files where the map runs (`batches.plan`, `rank_map.read_batch`) and only each batch's
compact part comes back; `reduce` makes the job's
Diagnosis from the parts: the same Diagnosis as `diagnose(gpudiag.load(paths))`, with
`timeline` left None (a job's layers stay with its ranks). A file that cannot be read is
listed in `JobDiagnosis.failed` with its one-line error and the others are analyzed.
When warm-up steps are found, their findings need the warm-up window of the whole job:
the files are read a second time for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS, GapOptions
from gpudiag.analyzers.pipeline import reduce
from gpudiag.analyzers.pipeline.answer import Diagnosis, add_views
from gpudiag.analyzers.pipeline.ranking import RANKINGS, joined, rank_findings
from gpudiag.diagnosis_schema import conform_frame
from gpudiag.errors import InputError
from gpudiag.jobs import batches, replay_pass, window_pass
from gpudiag.jobs.executors import Outcome
from gpudiag.jobs.rank_map import BatchPart, Options, read_batch
from gpudiag.readers.run_dir import finish_meta, is_run_dir
from gpudiag.readers.sources import PathLike, units_of
from gpudiag.trace import is_trace_dir

#: called as each batch finishes: its outcome (`outcome.item[0]`: the batch's files), the
#: files of the batch and the job's count of files
Progress = Callable[[Outcome, int, int], None]


@dataclass
class JobDiagnosis(Diagnosis):
    """A Diagnosis of a many-rank job: what it adds is its files, `units` (as given) and
    `failed`, those that could not be read (path, one-line error); the rest were
    analyzed."""

    failed: list[tuple[str, str]] = field(default_factory=list)
    units: list[str] = field(default_factory=list)


def run(pool: Any, paths: PathLike | Sequence[PathLike], *, steps: bool = False,
        window: str | tuple[int, int] | None = None, launch_gap_ns: int = LAUNCH_GAP_NS,
        sync_tolerance_ns: int = SYNC_TOLERANCE_NS, progress: Progress | None = None,
        rows: bool = True, rank_by: str = "saving", savings: bool = True) -> JobDiagnosis:
    """`gpudiag.jobs.diagnose_job` on an open executor `pool` (its options, its answer)."""
    if rank_by not in RANKINGS:  # before the files are read, not after
        raise ValueError(f"rank_by must be one of {', '.join(RANKINGS)}, not {rank_by!r}")
    files = [str(path) for path in units_of(paths, split_runs=True)]
    units = [os.path.abspath(file) for file in files]  # a worker's cwd is not this one's
    run_dir = _run_dir(paths)
    failed: list[tuple[str, str]] = []
    if isinstance(window, str):
        units, failed, window = _resolve_window(pool, units, window)
    options = Options(bounds=window, steps=steps,
                      gap_options=GapOptions(launch_gap_ns, sync_tolerance_ns), rows=rows)
    planned = batches.plan(units, pool.workers)
    done, more = _run(pool, planned, options, progress, len(units))
    done, more, shared, read_files = _rejoined(pool, planned, done, more, options=options,
                                               progress=progress, total=len(units))
    failed += _in_order(more)
    parts = [done[index] for index in sorted(done)]
    if not any(part.group is not None for part in parts):
        raise _none_read(files, failed)
    given = dict(zip(units, files, strict=True))
    _as_given(parts, given)
    meta = reduce.job_meta(parts)
    if run_dir is not None:  # the run directory's meta (session, processes) completes it
        finish_meta(meta, run_dir, [part for batch in parts for part in batch.metas])
    first, found, host = reduce.reduced(parts, options, meta, pool)
    dx = JobDiagnosis(**vars(first))
    read = [part for part in parts if part.files]
    warm = reduce.warm_window(dx, found)
    job = replay_pass.plan(read, joined(found, host), dx) if savings and dx.waterfall \
        else None
    saved = None
    if warm is not None or job is not None:  # one more read: warm-up parts and savings
        asked = [replace(options, warm=warm, steps=False,
                         savings=None if job is None else job.asks[index])
                 for index in range(len(read))]
        again_files = [part.files for part in read]  # progress goes on over the second read
        again, more = _run(pool, again_files, asked, progress,
                           read_files + sum(len(files) for files in again_files))
        failed += _in_order(more)
        if warm is not None:
            found = reduce.warm_flagged(found, dx, [again[index] for index in sorted(again)],
                                        options, pool)
        if job is not None:
            saved = replay_pass.replayed(job, [again.get(index) for index in range(len(read))],
                                         read, dx)
    dx.findings = conform_frame("findings", rank_findings(
        found, host, rank_by=rank_by, framework=dx.framework,
        savings=None if saved is None else _with_savings(saved)))
    if shared:
        dx.notes.append(shared)
    dx.failed = [(given.get(file, file), error) for file, error in failed]
    dx.units = files
    add_views(dx)
    return dx


def _with_savings(saved: pd.DataFrame) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """What `rank_findings` calls for the savings of the joined findings: those replayed
    already, on the same findings before the warm-up flags (which move no row)."""
    def savings(both: pd.DataFrame) -> pd.DataFrame:
        assert len(both) == len(saved)
        return both.assign(**{column: saved[column].to_numpy() for column in SAVING_COLUMNS})
    return savings


#: the columns `critical.savings.expected_savings` adds to the findings
SAVING_COLUMNS = ("saving_ns", "saving_share", "saving_step_share", "fix")


def _as_given(parts: list[BatchPart], given: dict[str, str]) -> None:
    """Each file's sources named as the job was given them, as `gpudiag.load` names them:
    the workers read the files by their absolute paths (`given`: absolute -> given)."""
    for part in parts:
        for unit, meta in zip(part.files, part.metas, strict=True):
            spelled = given.get(unit, unit)
            for source in meta.get("sources") or []:
                path = source.get("path")
                if isinstance(path, str) and (path == unit or path.startswith(unit + os.sep)):
                    source["path"] = spelled + path[len(unit):]


def _none_read(units: list[str], failed: list[tuple[str, str]]) -> InputError:
    return InputError(units[0] if len(units) == 1 else None,
                      f"none of the job's {len(units)} files could be read "
                      f"(first: {failed[0][1]})", "check the files listed")


def _resolve_window(pool: Any, units: list[str], spec: str
                    ) -> tuple[list[str], list[tuple[str, str]], tuple[int, int]]:
    """The files that could be read, those that could not, and the job's window bounds."""
    edges: dict[int, window_pass.Edges] = {}
    failed = []
    for outcome in pool.map(window_pass.edges_of, [(unit, spec) for unit in units]):
        if outcome.ok:
            edges[outcome.index] = outcome.value
        else:
            failed.append((units[outcome.index], str(outcome.error)))
    if not edges:
        raise _none_read(units, failed)
    read = sorted(edges)
    return ([units[index] for index in read], failed,
            window_pass.resolve([edges[index] for index in read], spec))


def _run(pool: Any, planned: list[tuple[str, ...]], options: Options | list[Options],
         progress: Progress | None, total: int
         ) -> tuple[dict[int, BatchPart], dict[int, list[tuple[str, str]]]]:
    """Each batch's part, and the files of each batch that failed with their error (a batch
    whose worker died fails all its files), by the batch's index in `planned`."""
    done: dict[int, BatchPart] = {}
    failed: dict[int, list[tuple[str, str]]] = {}
    each = options if isinstance(options, list) else [options] * len(planned)
    for outcome in pool.map(read_batch, list(zip(planned, each, strict=True))):
        if progress is not None:
            progress(outcome, len(planned[outcome.index]), total)
        if outcome.ok and outcome.value.refused is not None:
            raise outcome.value.refused  # files that are not one job: every answer wrong
        if outcome.ok:
            done[outcome.index] = outcome.value
            failed[outcome.index] = outcome.value.failed
        else:
            failed[outcome.index] = [(file, str(outcome.error))
                                     for file in planned[outcome.index]]
    return done, failed


def _in_order(failed: dict[int, list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The failed files of every batch, in batch order."""
    return [item for index in sorted(failed) for item in failed[index]]


def _rejoined(pool: Any, planned: list[tuple[str, ...]], done: dict[int, BatchPart],
              failed: dict[int, list[tuple[str, str]]], *, options: Options,
              progress: Progress | None, total: int
              ) -> tuple[dict[int, BatchPart], dict[int, list[tuple[str, str]]], str | None, int]:
    """The parts again, where batches shared a rank or a device: those spans read again as
    one batch each (`batches.rejoin`, progress counting the files read again on top of the
    job's), with the note that says so (None when none did) and the files read so far
    (the progress' total, which the second read goes on from)."""
    joined = batches.rejoin(planned, {index: _held(part) for index, part in done.items()})
    if len(joined) == len(planned):
        return done, failed, None, total
    first = {batch: index for index, batch in enumerate(planned)}
    again = [batch for batch in joined if batch not in first]
    total += sum(len(batch) for batch in again)
    parts, errors = _run(pool, again, options, progress, total)
    redone = {batch: index for index, batch in enumerate(again)}
    out: dict[int, BatchPart] = {}
    out_failed: dict[int, list[tuple[str, str]]] = {}
    for position, batch in enumerate(joined):
        source, errs, index = ((done, failed, first[batch]) if batch in first
                               else (parts, errors, redone[batch]))
        if index in source:
            out[position] = source[index]
        out_failed[position] = errs.get(index, [])
    spans = ", ".join(f"{Path(batch[0]).name} to {Path(batch[-1]).name}" for batch in again)
    return out, out_failed, (
        "the same rank or device is in several of the job's files (two runs in one folder, "
        f"or one rank profiled twice?): {spans} were analyzed together, as one merged trace"), \
        total


def _held(part: BatchPart) -> set[Any]:
    """What the reduce keys a batch's results by: its files' ranks and its devices."""
    ranks = {("rank", meta["rank"]) for meta in part.metas if meta.get("rank") is not None}
    return ranks | set(part.group.windows if part.group is not None else ())


def _run_dir(paths: PathLike | Sequence[PathLike]) -> Path | None:
    """The run directory the job is, when it is one (read process by process)."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if len(items) == 1 and is_run_dir(Path(items[0])) and not is_trace_dir(Path(items[0])):
        return Path(items[0])
    return None
