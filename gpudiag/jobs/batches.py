"""How a job's files are grouped into map tasks.

Each task reads its files, merges them and runs every analyzer once on the merge
(`rank_map.read_batch`). The analyzers cost a fixed ~0.2 s per call whatever the size of
what they read (pandas' per-operation overhead over a dozen tables), so a job of many small
rank files analyzed one file per task spends most of its time on that fixed cost: 64 DLRM
ranks of 120 KB took 3x longer than analyzing their merge. Grouping consecutive files pays
it once per batch; a batch stays small enough for one worker's memory, and there are
enough batches to keep every worker busy to the end.

    plan(files, workers=2)     # [("rank0.json.gz", "rank1.json.gz", ...), (...), ...]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from pathlib import Path

from gpudiag.readers.files import decoded_size

#: a batch holds files of at most this many bytes read (uncompressed), unless one file is
#: larger alone: a worker's peak memory is about 8x what it reads
BATCH_BYTES = 48 * 2**20
#: batches per worker at least (when there are files enough): a worker that finishes early
#: takes another instead of idling while the last batch runs
BATCHES_PER_WORKER = 2
#: what a directory (a saved trace or run directory) counts as: a batch of its own
DIRECTORY_BYTES = BATCH_BYTES


def plan(files: Sequence[str], workers: int, *, batch_bytes: int = BATCH_BYTES
         ) -> list[tuple[str, ...]]:
    """Consecutive files grouped into batches (in file order, every file once): at most
    `batch_bytes` read per batch and at least `BATCHES_PER_WORKER` batches per worker."""
    if not files:
        return []
    spread = 1 if workers <= 1 else BATCHES_PER_WORKER * workers
    most = max(1, math.ceil(len(files) / spread))
    out: list[tuple[str, ...]] = []
    batch: list[str] = []
    size = 0
    for file in files:
        weight = read_bytes(Path(file))
        if batch and (len(batch) >= most or size + weight > batch_bytes):
            out.append(tuple(batch))
            batch, size = [], 0
        batch.append(file)
        size += weight
    out.append(tuple(batch))
    return out


def read_bytes(path: Path) -> int:
    """About how many bytes reading `path` decodes (`files.decoded_size`); a directory is a
    batch of its own."""
    try:
        if path.is_dir():
            return DIRECTORY_BYTES
    except OSError:
        return 0  # the reader will say what is wrong with it
    return decoded_size(path)


def rejoin(planned: Sequence[tuple[str, ...]], keys: dict[int, set[Hashable]]
           ) -> list[tuple[str, ...]]:
    """`planned` with every span of batches that share a key read as one batch.

    `keys[i]`: what batch `i` holds that the reduce keys by (its ranks, its devices). The
    reduce takes each device's window, losses and steps from one batch; a rank whose files
    fell in two batches (two runs in one folder, one rank profiled twice) would keep only
    one of them. Such batches, and every batch between them (so files stay in the merge's
    order), become one batch: the job's answer is then the merged one, at the cost of one
    worker reading the span."""
    seen: dict[Hashable, int] = {}
    reach = list(range(len(planned)))  # the last batch each batch must be read with
    for index in sorted(keys):
        for key in keys[index]:
            first = seen.setdefault(key, index)
            reach[first] = max(reach[first], index)
    out: list[tuple[str, ...]] = []
    start = 0
    while start < len(planned):
        end = reach[start]
        step = start
        while step <= end:  # a batch inside the span may reach further
            end = max(end, reach[step])
            step += 1
        out.append(tuple(file for batch in planned[start:end + 1] for file in batch))
        start = end + 1
    return out
