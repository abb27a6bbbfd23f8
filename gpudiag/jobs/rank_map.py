"""The map of a many-rank job, where its files are read: a batch of them into its part.

`read_batch((files, options))` reads a few consecutive files of the job (`batches.plan`
groups them so that small rank files share the analyzers' fixed cost), merges them as
`gpudiag.load` would, and returns a `BatchPart` holding the `GroupPart` of the ranks in
them: the same map `diagnose` runs on one trace (`analyzers.parts.group_part`), whose
compact results alone leave the worker.

A file of the batch that cannot be read is listed in `BatchPart.failed` and the others
are analyzed. `read_batch` must be importable by name: the executors' workers import it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.analyzers.pipeline.parts import (
    ROW_TABLES,
    GroupPart,
    Options,
    SavingsPart,
    group_part,
    savings_part,
)
from gpudiag.analyzers.window import Window
from gpudiag.errors import InputError
from gpudiag.jobs.executors import failure
from gpudiag.readers.claims import refusal
from gpudiag.readers.sources import read_file, read_together
from gpudiag.trace import merge

__all__ = ["BatchPart", "Options", "read_batch"]


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
    savings: SavingsPart | None = None  # (second pass) what `Options.savings` asked


def read_batch(job: tuple[tuple[str, ...], Options]) -> BatchPart:
    """Read a batch of the job's files, merged in order, and compute its ranks' part (the
    second pass: its warm-up part, `Options.warm`, and its events of the findings whose
    savings are replayed, `Options.savings`)."""
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
    seen = Window(trace, options.bounds)
    group = group_part(seen, options) \
        if options.savings is None or options.warm is not None else None
    return BatchPart(tuple(read), failed, metas, span, group,
                     {name: len(getattr(trace, name)) for name in ROW_TABLES},
                     savings=None if options.savings is None
                     else savings_part(seen, options, options.savings))


def not_here(file: str) -> str:
    """Why a job's file is missing where its worker runs: the job lists files where it is
    started, and a Dask worker on another host (or a file deleted meanwhile) does not see
    them."""
    return (f"{file}: not found on {socket.gethostname()}, where the job's worker read it "
            "(workers must see the job's files at the same paths: on Dask, a shared file "
            "system)")
