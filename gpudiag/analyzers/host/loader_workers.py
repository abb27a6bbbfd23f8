"""What the DataLoader's worker processes take per batch: the other half of an input-bound
verdict.

The trainer's wait in `enumerate(DataLoader)#...__next__` says *that* it waits for input;
the workers say *why* and what fixes it. Each worker's `fetch` (torch's
`_utils/fetch.py`, one call per batch it builds) is a batch's whole cost in that worker,
and the dataset's own `__getitem__` frames under it name the code that costs it. With W
workers the loader yields a batch every `batch / W`; a step whose own work takes `C`
keeps up once W reaches `batch / C`.

    loader_workers(trace)   # per worker process: pid, ppid, batches, batch_ns, where
    summary(table, step_work_ns)  # one sentence for the data-loading finding
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.analyzers.findings import format_ns
from gpudiag.trace import Trace

#: one call per batch a worker builds (torch.utils.data's map- and iterable-style fetchers)
FETCH = r"torch/utils/data/_utils/fetch\.py\(\d+\): fetch$"
#: the dataset's own code under a fetch: its `__getitem__` / `__getitems__`, not torch's
#: or the standard library's
DATASET = r"^(?!<frozen)(?!.*torch/).*\(\d+\): __getitems?__$"
#: what a worker process says it is (`profiler/process_facts.py`)
WORKER_ROLE = "dataloader worker"
#: more workers than this many times the current ones is no longer a setting to change
FAR = 4

COLUMNS = {"pid": "int64", "ppid": "Int64", "batches": "int64", "batch_ns": "int64",
           "where": "object"}


def loader_workers(trace: Trace) -> pd.DataFrame:
    """One row per DataLoader worker process of a `gpudiag profile` run that recorded a
    batch: `pid`, `ppid` (the process it loads for), `batches` (fetches recorded, whole or
    cut by the window), `batch_ns` (the median fetch: a batch's cost in one worker) and
    `where` (the dataset frame most of the fetch time ran under, "" when none is named).

        loader_workers(gpudiag.load("run"))[["pid", "batches", "batch_ns", "where"]]
    """
    workers = {int(process["pid"]): process.get("ppid")
               for process in trace.meta.get("processes") or []
               if process.get("role") == WORKER_ROLE and process.get("pid") is not None}
    ranges = trace.ranges
    if not workers or ranges.empty:
        return _empty()
    mine = ranges[ranges["pid"].isin(list(workers)).to_numpy(bool)
                  & (ranges["source"] == "python").to_numpy(bool)]
    fetches = mine[keys.matches(mine["name"], FETCH)]
    dataset = mine[keys.matches(mine["name"], DATASET)]
    rows = []
    for pid, batches in fetches.groupby("pid", sort=True):
        took = (batches["end_ns"] - batches["start_ns"]).to_numpy(np.int64)
        own = dataset[dataset["pid"] == pid]
        spent = (own["end_ns"] - own["start_ns"]).groupby(own["name"].astype(str)).sum()
        rows.append({"pid": int(pid), "ppid": workers.get(int(pid)), "batches": len(took),
                     "batch_ns": int(np.median(took)),
                     "where": str(spent.idxmax()) if len(spent) else ""})
    return pd.DataFrame(rows, columns=list(COLUMNS)).astype(COLUMNS) if rows else _empty()


def _empty() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in COLUMNS.items()})


def summary(workers: pd.DataFrame, step_work_ns: float) -> str | None:
    """`2 loader workers took 805 ms per batch (...): one batch every 402 ms, while a step's
    own work took 12 ms; about 68 workers would keep up`, or None without workers.

    `step_work_ns`: what a steady step takes besides waiting for its batch. The workers of
    the process with the most are counted (one trainer's loader); a batch's cost is the
    median over all of them."""
    if workers.empty:
        return None
    per_parent = workers.groupby(workers["ppid"].fillna(-1)).size()
    count = int(per_parent.max())
    batch = float(np.median(workers["batch_ns"]))
    batches = int(workers["batches"].sum())
    where = workers["where"][workers["where"] != ""]
    frame_said = f", most of it in `{where.mode().iloc[0]}`" if len(where) else ""
    said = (f"{count} loader worker{'s' if count != 1 else ''} took {format_ns(batch)} per "
            f"batch (median of {batches} batches{frame_said}): one batch every "
            f"{format_ns(batch / count)}, while a step's own work took "
            f"{format_ns(step_work_ns)}")
    if step_work_ns <= 0:
        return said
    needed = math.ceil(batch / step_work_ns)
    if needed > FAR * count:
        return (f"{said}; keeping up would take about {needed} workers: the work per batch "
                "itself has to shrink (cache decoded samples, batch the transforms, or move "
                "them to the GPU)")
    if needed > count:
        return f"{said}; about {needed} workers would keep up, if the machine has the cores"
    return (f"{said}; {count} workers would keep up on paper, so they were short of CPU "
            "(more workers than cores, or the trainer's threads) or started late "
            "(persistent_workers=True keeps them between epochs)")
