"""Many-rank jobs: where the per-rank work runs (`executors`: in this process, a local
process pool, or a Dask cluster), one interface for the analysis written on top of it.

    dx = gpudiag.diagnose_job("traces/")              # one worker per core
    dx = gpudiag.diagnose_job(paths, workers=1)       # in this process
    dx = gpudiag.diagnose_job(paths, client=client)   # on a Dask cluster

This module imports no pandas: `diagnose_job` starts a local pool's workers first, and
they import the analysis while this process does (`job.run` does the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS

if TYPE_CHECKING:
    from gpudiag.jobs.executors import Outcome
    from gpudiag.jobs.job import JobDiagnosis
    from gpudiag.readers.sources import PathLike

#: what a worker imports before its first batch: the map (`rank_map.read_batch`), the
#: readers and analyzers it loads (`jobs/worker.py`)
WORKER_IMPORTS = "gpudiag.jobs.worker"


def diagnose_job(paths: PathLike | Sequence[PathLike], *, workers: int | None = None,
                 scheduler: str | None = None, client: Any = None, steps: bool = False,
                 window: str | tuple[int, int] | None = None,
                 launch_gap_ns: int = LAUNCH_GAP_NS, sync_tolerance_ns: int = SYNC_TOLERANCE_NS,
                 progress: Callable[[Outcome, int, int], None] | None = None,
                 rows: bool = True, rank_by: str = "saving",
                 savings: bool = True) -> JobDiagnosis:
    """The diagnosis of the job whose rank files are `paths` (files, or folders of them).

    `workers`, `scheduler`, `client`: where the ranks are read (`executors.executor`);
    `steps`, `window`, `launch_gap_ns`, `sync_tolerance_ns`: as for `diagnose`; a window
    spec (`START:END`, a range name) is resolved from the files first (`window_pass`: one
    more read of each), absolute (start_ns, end_ns) bounds are used as they are.
    `progress(outcome, files, total)` is called as each batch of `files` files finishes.
    `rows=False`: the Diagnosis leaves out the row-level results (`gaps`, the `host_gaps`
    table), so the coordinator holds only what the findings and waterfall need.
    `savings`, `rank_by`: as for `diagnose`; the savings take one more read of the files
    (with the warm-up pass, when there is one: `replay_pass`).
    """
    from gpudiag.jobs.executors import executor

    with executor(workers=workers, scheduler=scheduler, client=client) as pool:
        pool.start(WORKER_IMPORTS)  # a local pool's workers import while this process does
        from gpudiag.jobs.job import run

        return run(pool, paths, steps=steps, window=window, launch_gap_ns=launch_gap_ns,
                   sync_tolerance_ns=sync_tolerance_ns, progress=progress, rows=rows,
                   rank_by=rank_by, savings=savings)
