"""Files that claim one rank: a copy of a rank's trace, or two runs' files in one folder.

Merged as one job, such files make every number of that rank wrong without a word: a copy
counts its kernels, communication and host time twice; two runs give the rank one window
from the first run's first kernel to the second run's last (a day apart: a day of
"host_bound" time) and match the runs' collectives with each other. So `refusal` names them
and says what to do, for `gpudiag.load` and for a many-rank job alike (a job reads the files
of one rank in one batch, `jobs/batches.rejoin`). Two signs, over the rows of each rank that
two or more files claim:

- its kernels overlap on one stream (a stream runs one kernel at a time): the same time
  recorded twice (a copy), or two jobs writing that rank at once;
- its runtime calls come from two or more processes (pids): two runs, or a restarted rank.

One process profiled several times (torch.profiler's repeating schedule writes a file per
cycle: one rank, one pid, windows apart) is one run, and is merged as before.

    refused = refusal(trace, [("rank0.json", 0), ("rank0_copy.json", 0)])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.trace import Trace

#: a rank's files are copies (or two jobs at once) when at least this share of its kernels
#: start before the previous kernel of their stream is half done (a real trace has none:
#: at most a microsecond of rounding where one kernel follows another)
OVERLAP_SHARE = 0.01


def refusal(trace: Trace, claims: Sequence[tuple[str, Any]]) -> InputError | None:
    """Why `trace`, the merge of the files `claims` lists as (file, its meta's rank), is
    not one job (None when it is): a rank that several files claim, whose kernels overlap
    on a stream, or whose runtime calls come from several processes."""
    counts = Counter(rank for _, rank in claims if rank is not None)
    for rank in sorted(rank for rank, count in counts.items() if count > 1):
        files = [Path(file).name for file, claimed in claims if claimed == rank]
        named = ", ".join(files)
        if _overlapping(trace.kernels, rank):
            return InputError(named, f"{len(files)} files claim rank {rank} and its kernels "
                              "overlap in time on one stream: a copy of one file, or two "
                              "jobs writing that rank at once, which one job of them would "
                              "count twice", "keep one file per rank; put each job's files "
                              "in a folder of their own")
        pids = _processes(trace.api, rank)
        if len(pids) > 1:
            return InputError(named, f"{len(files)} files claim rank {rank} and come from "
                              f"{len(pids)} processes (pids {', '.join(map(str, pids))}): "
                              "two runs in one folder, or a restarted rank, which one job "
                              "of them would span from the first run's start to the last "
                              "one's end", "analyze each run's files apart, or compare the "
                              "runs: gpudiag compare RUN_A RUN_B")
    return None


def _overlapping(kernels: pd.DataFrame, rank: Any) -> bool:
    """Whether `rank`'s kernels overlap on their streams (`OVERLAP_SHARE` of them)."""
    mine = kernels[(kernels["rank"] == rank).fillna(False).to_numpy(bool)]
    if len(mine) < 2:
        return False
    device = mine["device"].fillna(-1).to_numpy(np.int64)
    stream = mine["stream"].fillna(-1).to_numpy(np.int64)
    start, end = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
    order = np.lexsort((start, stream, device))
    device, stream, start, end = device[order], stream[order], start[order], end[order]
    same = (device[1:] == device[:-1]) & (stream[1:] == stream[:-1])
    shorter = np.minimum(end[1:] - start[1:], end[:-1] - start[:-1])
    overlap = same & (end[:-1] - start[1:] > shorter // 2) & (shorter > 0)
    return int(overlap.sum()) >= max(1, OVERLAP_SHARE * len(mine))


def _processes(api: pd.DataFrame, rank: Any) -> list[int]:
    """The pids of `rank`'s runtime calls (a rank is one process)."""
    pids = api.loc[(api["rank"] == rank).fillna(False).to_numpy(bool), "pid"].dropna()
    return sorted(int(pid) for pid in pids.unique())
