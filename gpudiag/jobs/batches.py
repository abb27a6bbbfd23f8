"""How a job's files are grouped into map tasks.

Each task reads its files, merges them and runs every analyzer once on the merge
(`rank_map.read_batch`). The analyzers cost a fixed ~0.24 s per call whatever the size of
what they read (pandas' per-operation overhead over a dozen tables), about what 10 MB of
Kineto JSON costs to analyze, so a job of many small rank files analyzed one file per task
spends most of its time on that fixed cost: 64 DLRM ranks of 120 KB took 3x longer than
analyzing their merge. So a job has as few batches as it can: as many as its bytes need
under the cap (a worker's memory), rounded up to a multiple of the workers so each worker
gets the same number, every batch about the same bytes.

    plan(files, workers=2)     # [("rank0.json.gz", "rank1.json.gz", ...), (...), ...]
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from pathlib import Path

from gpudiag.readers.files import decoded_size

#: a batch holds files of at most this many bytes read (uncompressed), unless one file is
#: larger alone: a worker's peak memory is its imports (~140 MB) and 3-4x what it reads
#: (DLRM ranks: 241 MB reading 27 MB, 267 MB reading 48 MB)
BATCH_BYTES = 48 * 2**20
#: how many more batch counts `plan` tries when an even share of uneven files is over the
#: cap, before it cuts the batches over it (leaving a smaller batch beside them)
TRIES = 8
#: what a directory (a saved trace or run directory) counts as: a batch of its own
DIRECTORY_BYTES = BATCH_BYTES


def plan(files: Sequence[str], workers: int, *, batch_bytes: int = BATCH_BYTES
         ) -> list[tuple[str, ...]]:
    """Consecutive files grouped into batches (in file order, every file once).

    As many batches as `batch_bytes` per batch needs, rounded up to a multiple of
    `workers` (each worker the same share; no more, since every batch pays the analyzers'
    fixed cost again), at most one per file. The files are cut where the bytes read reach
    each batch's even share; where files of uneven sizes put a share over `batch_bytes`,
    more batches are tried, and a batch still over it is cut. 64 DLRM ranks of 1.7 MB
    read on 2 workers: 4 batches of 16 ranks; 16 of them: 2 batches of 8."""
    if not files:
        return []
    weights = [read_bytes(Path(file)) for file in files]
    step = max(1, workers)
    count = step * math.ceil(max(1, math.ceil(sum(weights) / batch_bytes)) / step)
    for _ in range(TRIES):
        even = _even(weights, min(count, len(files)))
        if count >= len(files) or all(len(batch) == 1 or sum(weights[i] for i in batch)
                                      <= batch_bytes for batch in even):
            break
        count += step  # an even share over the cap (files of uneven sizes): more batches
    return [tuple(files[i] for i in cut) for batch in even
            for cut in _capped(batch, weights, batch_bytes)]


def _even(weights: list[int], count: int) -> list[list[int]]:
    """The files' indexes in `count` consecutive batches of about the same bytes: each file
    in the batch whose even share holds its middle byte (empty batches left out)."""
    share = sum(weights) / count or 1.0
    even: list[list[int]] = [[] for _ in range(count)]
    before = 0
    for index, weight in enumerate(weights):
        even[min(count - 1, int((before + weight / 2) / share))].append(index)
        before += weight
    return [batch for batch in even if batch]


def _capped(batch: list[int], weights: list[int], batch_bytes: int) -> list[list[int]]:
    """`batch` cut where its bytes would pass `batch_bytes` (a larger file alone)."""
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in batch:
        if current and size + weights[index] > batch_bytes:
            out.append(current)
            current, size = [], 0
        current.append(index)
        size += weights[index]
    out.append(current)
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
