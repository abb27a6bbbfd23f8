"""Several Kineto traces read into one Trace, each table built once.

A job's batch of rank files (`jobs.rank_map.read_batch`) is merged as soon as it is read.
Reading each file into a Trace of its own costs about 16 ms of table building per file
whatever its size (a dozen tables of a dozen columns, a few pandas steps each), and the
merge 3 ms more: most of the time of a 120 KB DLRM rank. Here each file's events are
decoded on their own (`Events`), then joined (`Events.joined`), and each table is built
once over all of them.

    trace, metas = read_joined([Path("rank0.json.gz"), Path("rank1.json.gz")])

The result equals `merge([read_file(path) for path in paths])`, table for table, and
`metas` are the files' own metas:
- rows are in file order, each file's in time order; kernel ids count on across files
  (the merge's offsets);
- what a file decides for itself stays its own: its meta and repairs counted, its devices
  and rank, the host pid its GPU rows fall back to, its API calls (a correlation id is
  per process), its threads' nesting, its collectives (a few NCCL kernels per step, built
  per file as the reader builds them) and its names' categories (joined as the merge
  joins them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.readers.kineto import collectives as kineto_collectives
from gpudiag.readers.kineto.events import Events
from gpudiag.readers.kineto.reader import (
    RANGE_SOURCES,
    Calls,
    api_table,
    copies_table,
    devices_table,
    host_pid_fallback,
    join_host,
    kernels_table,
    memory_table,
    ranges_table,
    read_meta,
    syncs_table,
)
from gpudiag.readers.registry import note_source
from gpudiag.schema import TABLES
from gpudiag.trace import Trace, concat_tables, merge_meta


def read_joined(paths: list[Path]) -> tuple[Trace, list[dict[str, Any]]]:
    """The merged Trace of the Kineto traces `paths` (two or more) and each file's meta.
    A file that cannot be read raises its InputError (the caller reads them one by one
    to list it)."""
    parts = [Events(path) for path in paths]
    metas = [read_meta(part) for part in parts]
    for meta, path in zip(metas, paths, strict=True):
        note_source(meta, path, "chrome-trace")
    ranks = [meta.get("rank") for meta in metas]
    ev = Events.joined(parts)
    built, api = _tables(ev)
    tables = {name: _with_ranks(TABLES[name].conform(frame), ev, name, ranks)
              for name, frame in built.items()}
    tables["collectives"] = _per_file_collectives(ev, tables["kernels"], api, ranks)
    tables["devices"] = concat_tables([
        _ranked(TABLES["devices"].conform(devices_table(part.header)), rank)
        for part, rank in zip(parts, ranks, strict=True)])
    return Trace(meta=merge_meta(metas), **tables), metas


#: the event groups each table's rows come from (in `where` order: file, then time)
ROWS = {"api": ("runtime", "driver"), "copies": ("memcpy", "memset"), "syncs": ("sync",),
        "ranges": tuple(RANGE_SOURCES), "memory": ("memory",),
        "kernels": ("kernel",)}


def _tables(ev: Events) -> tuple[dict[str, Any], pd.DataFrame]:
    """Every table built over the joined events (collectives apart), and the API table
    before conforming (the per-file collectives look their calls up in it)."""
    api = api_table(ev)
    files = {name: ev.file_of(ev.where(*groups)) for name, groups in ROWS.items()}
    calls = Calls(api, files["api"])
    fallback = np.array([np.nan if pid is None else pid
                         for pid in map(host_pid_fallback, ev.parts)], dtype=np.float64)

    def joined(frame: pd.DataFrame | None, table: str) -> pd.DataFrame | None:
        rows = files[table]
        assert rows is not None
        return join_host(frame, calls, fallback[rows], rows)

    kernel_idx = ev.where("kernel")
    return {"api": api, "copies": joined(copies_table(ev), "copies"),
            "syncs": joined(syncs_table(ev), "syncs"),
            "ranges": ranges_table(ev), "memory": memory_table(ev),
            "kernels": joined(kernels_table(ev, kernel_idx, ev.args(kernel_idx)),
                              "kernels")}, api


def _per_file_collectives(ev: Events, kernels: pd.DataFrame, api: pd.DataFrame,
                          ranks: list[int | None]) -> pd.DataFrame:
    """Each file's collectives as its reader builds them (from its rows of the joined
    kernels and API tables), conformed, ranked and concatenated as the merge does."""
    offsets = np.r_[0, np.cumsum([len(part.group_code) for part in ev.parts])]
    kernel_idx = ev.where("kernel")
    kernel_files = ev.file_of(kernel_idx)
    api_files = ev.file_of(ev.where(*ROWS["api"]))
    assert kernel_files is not None and api_files is not None
    files = np.arange(len(ev.parts) + 1)
    kernel_at = np.searchsorted(kernel_files, files)  # each file's rows are one run
    api_at = np.searchsorted(api_files, files)
    frames = []
    for file, part in enumerate(ev.parts):
        mine = slice(kernel_at[file], kernel_at[file + 1])
        calls = Calls(api.iloc[api_at[file]:api_at[file + 1]].reset_index(drop=True))
        made = kineto_collectives.collectives(part, kernels.iloc[mine].reset_index(drop=True),
                                              kernel_idx[mine] - offsets[file], calls)
        frames.append(_ranked(TABLES["collectives"].conform(made), ranks[file]))
    return concat_tables(frames)


def _with_ranks(frame: pd.DataFrame, ev: Events, table: str,
                ranks: list[int | None]) -> pd.DataFrame:
    """Each row's rank: its file's, as `Trace.fill_rank` gives a file read alone."""
    if not len(frame):
        return frame
    files = ev.file_of(ev.where(*ROWS[table]))
    assert files is not None and len(files) == len(frame)
    return frame.assign(rank=_rank_array(ranks)[files])


def _rank_array(ranks: list[int | None]) -> pd.arrays.IntegerArray:
    known = np.array([rank is not None for rank in ranks], dtype=bool)
    values = np.array([rank or 0 for rank in ranks], dtype=np.int64)
    return pd.arrays.IntegerArray(values, ~known)


def _ranked(frame: pd.DataFrame, rank: int | None) -> pd.DataFrame:
    """`Trace.fill_rank` of one file's frame."""
    if rank is None or not len(frame) or not frame["rank"].isna().any():
        return frame
    return frame.assign(rank=frame["rank"].fillna(int(rank)))
