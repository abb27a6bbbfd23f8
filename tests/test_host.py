"""Host-side findings: where launch-bound and host-bound idle time comes from."""

from __future__ import annotations

import pandas as pd

from gpudiag.analyzers.findings import ADVICE
from gpudiag.analyzers.host import bound as host
from tests.builders import api_call, kernel, trace

U = 1_000


def _ranges(rows: list[tuple[str, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"pid": 100, "tid": 100, "name": n, "source": "python",
                          "start_ns": a * U, "end_ns": b * U, "depth": d}
                         for n, a, b, d in rows])


def _loop(gap_us: int, frame: str) -> object:
    """Three steps: a kernel, then `frame` runs on the host for gap_us before the next
    launch (from train.py:30)."""
    kernels, api, ranges = [], [], []
    for i in range(3):
        t0 = i * (gap_us + 100)
        api.append(api_call(t0 * U, (t0 + 2) * U, correlation=i + 1))
        kernels.append(kernel((t0 + 5) * U, (t0 + 50) * U, correlation=i + 1))
        ranges += [("train.py(30): step", t0 - 1, t0 + 3, 0),
                   (frame, t0 + 51, t0 + 99 + gap_us - 50, 0)]
    return trace(kernels=kernels, api=api, ranges=_ranges(ranges))


def test_long_gap_in_a_data_loader_gets_data_advice() -> None:
    found = host.findings(_loop(5_000, "data/loader.py(88): __next__"))
    top = found.iloc[0]
    assert (top["cause"], top["where"]) == ("host_bound", "data/loader.py:88 (__next__)")
    assert top["advice"] == ADVICE["host_data"]
    assert top["count"] == 2


def test_short_gaps_in_model_code_get_graph_advice() -> None:
    found = host.findings(_loop(300, "model.py(12): forward"))
    top = found.iloc[0]
    assert (top["cause"], top["where"]) == ("host_bound", "model.py:12 (forward)")
    assert top["advice"] == ADVICE["host_python"]


def test_launch_bound_piece_names_the_launching_call_site() -> None:
    found = host.findings(_loop(300, "model.py(12): forward"))
    launch = found[found["cause"] == "launch_bound"].iloc[0]
    assert launch["where"] == "train.py:30 (step)"
    assert launch["lost_ns"] == 2 * 5 * U   # from each launch call to its kernel's start


def test_without_stacks_where_is_the_next_kernel() -> None:
    t = trace(kernels=[kernel(0, 10 * U, "a"), kernel(500 * U, 510 * U, "void gemm<float>(int)")])
    found = host.findings(t)
    assert found.loc[0, "where"] == "gemm<float>"
    assert "no launch calls" in found.loc[0, "evidence"]  # no claim about the host
    assert found.loc[0, "advice"] == ADVICE["host_bound"]


def test_empty() -> None:
    assert host.findings(trace()).empty


def test_queued_work_waiting_on_a_dependency_is_said_so() -> None:
    t = trace(kernels=[kernel(0, 10 * U, "a", correlation=1),
                       kernel(200 * U, 210 * U, "softmax_kernel", correlation=2)],
              api=[api_call(0, 1, correlation=1), api_call(2 * U, 4 * U, correlation=2)])
    found = host.findings(t)
    top = found.iloc[0]
    assert top["cause"] == "host_bound" and top["advice"] == ADVICE["dependency"]
    assert "already queued" in top["evidence"] and "host ran" not in top["evidence"]


def test_a_gap_split_in_pieces_counts_once() -> None:
    t = trace(kernels=[kernel(0, 10 * U, "a", correlation=1),
                       kernel(25 * U, 30 * U, "b", correlation=2)],
              api=[api_call(0, 1, correlation=1), api_call(20 * U, 22 * U, correlation=2)])
    found = host.findings(t)
    assert found["count"].tolist() == [1]            # one 15 µs gap, in two pieces
    assert found.loc[0, "lost_ns"] == 15 * U
    assert "median 15 µs" in found.loc[0, "evidence"]


def test_launch_bound_evidence_counts_kernels_shorter_than_their_launch() -> None:
    kernels, api = [], []
    for i in range(4):  # 2 µs kernels behind 8 µs launch calls: the host can never keep up
        api.append(api_call(i * 10 * U, (i * 10 + 8) * U, correlation=i + 1))
        kernels.append(kernel((i * 10 + 9) * U, (i * 10 + 11) * U, correlation=i + 1))
    found = host.findings(trace(kernels=kernels, api=api))
    assert found.loc[0, "cause"] == "launch_bound"
    assert "3 of the kernels after them ran shorter than their launch call" in \
        found.loc[0, "evidence"]
