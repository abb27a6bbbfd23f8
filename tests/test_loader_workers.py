"""The DataLoader workers' cost per batch, beside the trainer's wait for input (issue:
`gpudiag profile` on today's training programs: the input-bound verdict with the loader
workers' per-batch time)."""

from __future__ import annotations

import pandas as pd

from gpudiag.analyzers.host.loader_workers import loader_workers, summary
from tests.builders import trace

FETCH = "torch/utils/data/_utils/fetch.py(49): fetch"
MS = 1_000_000


def _python(pid: int, name: str, start_ms: int, end_ms: int) -> dict[str, object]:
    return {"pid": pid, "tid": pid, "start_ns": start_ms * MS, "end_ns": end_ms * MS,
            "name": name, "source": "python"}


def _run() -> pd.DataFrame:
    """Two workers of trainer 10, three batches each of 400 ms (one cut to 100 ms by the
    window), most of it in the dataset's `__getitem__`; the trainer's own fetch-like frame
    and a helper of another role are not counted."""
    rows = []
    for pid in (11, 12):
        for n, (start, end) in enumerate(((0, 400), (400, 800), (800, 900))):
            rows.append(_python(pid, FETCH, start, end))
            rows.append(_python(pid, "data.py(7): __getitem__", start + 1, end - 1 - n))
            rows.append(_python(pid, "<frozen os>(674): __getitem__", start + 1, start + 2))
    rows.append(_python(10, FETCH, 0, 5000))
    rows.append(_python(13, FETCH, 0, 5000))
    meta = {"processes": [{"pid": 10, "role": None}, {"pid": 11, "ppid": 10,
                                                       "role": "dataloader worker"},
                          {"pid": 12, "ppid": 10, "role": "dataloader worker"},
                          {"pid": 13, "ppid": 10, "role": "compile worker"}]}
    return loader_workers(trace(ranges=pd.DataFrame(rows), meta=meta))


def test_each_worker_says_its_batches_their_median_cost_and_the_datasets_frame() -> None:
    table = _run()
    assert table["pid"].tolist() == [11, 12] and table["ppid"].tolist() == [10, 10]
    assert table["batches"].tolist() == [3, 3]
    assert table["batch_ns"].tolist() == [400 * MS, 400 * MS]  # the cut batch is no median
    assert table["where"].tolist() == ["data.py(7): __getitem__"] * 2


def test_the_sentence_says_how_many_workers_would_keep_up() -> None:
    table = _run()
    said = summary(table, step_work_ns=100 * MS)
    assert said == ("2 loader workers took 400 ms per batch (median of 6 batches, most of it "
                    "in `data.py(7): __getitem__`): one batch every 200 ms, while a step's own "
                    "work took 100 ms; about 4 workers would keep up, if the machine has the "
                    "cores")
    far = summary(table, step_work_ns=10 * MS)
    assert far is not None and far.endswith(
        "keeping up would take about 40 workers: the work per batch itself has to shrink "
        "(cache decoded samples, batch the transforms, or move them to the GPU)")
    enough = summary(table, step_work_ns=300 * MS)
    assert enough is not None and "2 workers would keep up on paper" in enough


def test_no_workers_no_sentence() -> None:
    assert summary(loader_workers(trace()), 1.0) is None
