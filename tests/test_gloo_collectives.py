"""Collectives that launch no kernel (gloo): one row per torch.distributed call, read from
the `c10d::*` op and its `gloo:*` work, matched across ranks like NCCL's.

The recorded pair (tests/data/gloo_rank{0,1}, `record_gloo_collectives.py`) is a 2-rank CPU
job whose calls are known; the synthetic traces plant exact times and sizes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.collectives import calls as C
from gpudiag.readers.kineto.collectives import fifo
from tests.builders import KinetoTrace
from tests.conftest import fixture

DATA = Path(__file__).parent / "data"
RECORDED = [DATA / "gloo_rank0.pt.trace.json.gz", DATA / "gloo_rank1.pt.trace.json.gz"]
#: what record_gloo_collectives.py calls on each rank while profiled (its CALLS)
CALLS = {"all_reduce": 5, "broadcast": 1, "all_gather": 1, "barrier": 1}
MAIN, WORKER = 1000, 1001  # the program's thread and a gloo worker thread
PG = {"backend": "gloo", "rank": 0, "world_size": 4, "pg_config": [
    {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo",
     "pg_size": 4, "ranks": [0, 1, 2, 3]}]}


# -- the recorded 2-rank job ------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded() -> gpudiag.Trace:
    return gpudiag.load(RECORDED)


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def test_recorded_files_hold_calls_and_gloo_works_but_no_kernel() -> None:
    for path in RECORDED:
        names = [e.get("name", "") for e in _events(path) if e.get("ph") == "X"]
        assert sum(n.startswith("c10d::") for n in names) == sum(CALLS.values())
        assert sum(n.startswith("gloo:") for n in names) == sum(CALLS.values())
        assert not any(e.get("cat") == "kernel" for e in _events(path))


def test_recorded_pair_has_one_row_per_call(recorded: gpudiag.Trace) -> None:
    c = recorded.collectives
    recorded.validate()
    assert len(c) == 2 * sum(CALLS.values())  # 16: not one per nested or worker event
    for rank in (0, 1):
        mine = c[c["rank"] == rank]
        assert mine["op"].astype(str).value_counts().to_dict() == CALLS
        assert mine["seq"].tolist() == list(range(sum(CALLS.values())))
    assert set(c["comm"].astype(str)) == {"0"} and set(c["group_size"]) == {2}
    assert c["kernel_id"].isna().all() and c["device"].isna().all()
    first = c[c["rank"] == 0].set_index("seq")
    # DDP's one bucket: 16x32 + 32 + 32x1 + 1 = 577 floats; then 1000 floats, 64 int64,
    # all_gather's output 2 ranks x 10 doubles; a barrier carries no payload
    assert first["bytes"].tolist()[:7] == [2308] * 4 + [4000, 512, 160]
    assert pd.isna(first.loc[7, "bytes"])
    assert first["name"].astype(str).tolist() == (
        ["gloo:all_reduce"] * 5 + ["gloo:broadcast", "gloo:all_gather", "gloo:barrier"])


def test_recorded_rows_take_the_gloo_works_time(recorded: gpudiag.Trace) -> None:
    works = sorted((e["ts"], e["dur"]) for e in _events(RECORDED[0])
                   if e.get("name", "").startswith("gloo:"))
    c = recorded.collectives
    mine = c[c["rank"] == 0].sort_values("seq")
    base = json.loads(gzip.decompress(RECORDED[0].read_bytes()))["baseTimeNanoseconds"]
    starts_us = ((mine["start_ns"] - base) / 1000).tolist()
    assert starts_us == pytest.approx([ts for ts, _ in works], abs=1e-3)
    durations_us = ((mine["end_ns"] - mine["start_ns"]) / 1000).tolist()
    assert durations_us == pytest.approx([dur for _, dur in works], abs=1e-3)


def test_recorded_pair_is_matched_by_seq_and_the_late_rank_found(
        recorded: gpudiag.Trace) -> None:
    skew = C.arrival_skew(recorded)
    assert set(skew["matched_by"]) == {"seq"}
    assert skew["match_id"].nunique() == sum(CALLS.values())
    assert (skew.groupby("match_id")["rank"].nunique() == 2).all()
    late = skew[skew["bytes"] == 4000].set_index("rank")  # rank 1 slept 20 ms before it
    assert set(late["last_rank"]) == {1}
    assert late.loc[0, "skew_ns"] >= 20_000_000 and late.loc[0, "wait_ns"] >= 20_000_000
    assert late.loc[1, "wait_ns"] == 0
    waits = C.wait_intervals(recorded)
    assert len(waits) == (skew["wait_ns"] > 0).sum()


def test_recorded_pair_blames_rank1_for_the_all_reduce_waits(recorded: gpudiag.Trace) -> None:
    f = C.findings(recorded)
    wait = f[(f["cause"] == "comm_wait") & f["where"].str.startswith("all_reduce")]
    assert len(wait) == 1 and "rank 1 arrives last" in wait.iloc[0]["where"]
    assert wait.iloc[0]["lost_ns"] >= 20_000_000
    # compute here is GPU kernels: what hides a host-side gloo call is not measured
    assert not (f["cause"] == "comm").any()
    assert C.overlap(recorded).empty


# -- synthetic traces with exact answers ------------------------------------------------------


def kineto(distributed: dict[str, Any] | None = None) -> KinetoTrace:
    kt = KinetoTrace()
    kt.header["deviceProperties"] = []
    if distributed is not None:
        kt.header["distributedInfo"] = distributed
    return kt


def call(kt: KinetoTrace, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
    kt._x("cpu_op", name, ts, dur, kt.pid, tid)


def work(kt: KinetoTrace, name: str, ts: float, dur: float, dims: list[Any] | None = None,
         types: list[str] | None = None, tid: int = WORKER) -> None:
    args = {} if dims is None else {"Input Dims": dims, "Input type": types}
    kt._x("user_annotation", name, ts, dur, kt.pid, tid, args)


def load(kt: KinetoTrace, tmp_path: Path, name: str = "t.json") -> pd.DataFrame:
    return gpudiag.load(kt.write(tmp_path / name)).collectives


def test_async_call_takes_its_worker_threads_time_and_size(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "c10d::allreduce_", 10, 5)
    call(kt, "record_param_comms", 11, 3)  # nested: the same call
    work(kt, "gloo:all_reduce", 12, 100, [[16, 16]], ["float"])
    row = load(kt, tmp_path).iloc[0]
    assert len(load(kt, tmp_path)) == 1
    assert (row["start_ns"] - 0, row["end_ns"]) == (12_000, 112_000)
    assert (row["op"], row["bytes"], row["dtype"], row["group_size"], row["comm"],
            row["seq"], row["name"]) == ("all_reduce", 1024, "float", 4, "0", 0,
                                         "gloo:all_reduce")
    assert row["rank"] == 0 and pd.isna(row["kernel_id"])


def test_outermost_call_stands_for_the_nested_ops(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "_c10d_functional::all_reduce", 10, 20)
    call(kt, "c10d::allreduce_", 12, 10)
    call(kt, "_c10d_functional::wait_tensor", 40, 30)  # a wait, not a call
    work(kt, "gloo:all_reduce", 15, 50, [[8]], ["double"])
    rows = load(kt, tmp_path)
    assert len(rows) == 1
    assert (rows.loc[0, "op"], rows.loc[0, "bytes"]) == ("all_reduce", 64)


def test_works_serve_calls_first_in_first_out(tmp_path: Path) -> None:
    kt = kineto(PG)
    work(kt, "gloo:broadcast", 1, 4, [[3]], ["long int"])  # enqueued before the profiler
    call(kt, "c10d::allreduce_", 10, 2)
    call(kt, "c10d::allreduce_", 13, 2)  # issued before the first one's work started
    work(kt, "gloo:all_reduce", 20, 10, [[1]], ["float"])
    work(kt, "gloo:all_reduce", 31, 10, [[2]], ["float"], tid=WORKER + 1)
    rows = load(kt, tmp_path)
    assert rows["op"].astype(str).tolist() == ["broadcast", "all_reduce", "all_reduce"]
    assert rows["bytes"].tolist() == [24, 4, 8]
    assert rows["start_ns"].tolist() == [1_000, 20_000, 31_000]
    assert rows["seq"].tolist() == [0, 1, 2]


def test_fifo_gives_extra_works_to_the_last_call() -> None:
    assert fifo(pd.Series([10, 20]).to_numpy(), pd.Series([5, 12, 13, 25]).to_numpy()).tolist() \
        == [-1, 0, 0, 1]
    assert fifo(pd.Series([10, 11, 12]).to_numpy(), pd.Series([15, 16, 17]).to_numpy()).tolist() \
        == [0, 1, 2]


def test_reduce_scatter_run_as_several_all_reduces_is_one_call(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "c10d::reduce_scatter_", 10, 5)
    work(kt, "gloo:all_reduce", 12, 30, [[3]], ["float"])
    work(kt, "gloo:all_reduce", 13, 40, [[3]], ["float"], tid=WORKER + 1)
    rows = load(kt, tmp_path)
    assert len(rows) == 1
    assert (rows.loc[0, "op"], rows.loc[0, "bytes"], rows.loc[0, "name"]) == (
        "reduce_scatter", 24, "c10d::reduce_scatter_")
    assert (rows.loc[0, "start_ns"], rows.loc[0, "end_ns"]) == (12_000, 53_000)


def test_works_nested_in_their_call_belong_to_it(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "c10d::monitored_barrier_", 10, 100)
    work(kt, "gloo:recv", 20, 30, [[1]], ["int"], tid=MAIN)
    work(kt, "gloo:send", 60, 10, [[1]], ["int"], tid=MAIN)
    call(kt, "c10d::allreduce_", 200, 5)
    work(kt, "gloo:all_reduce", 210, 10, [[4]], ["float"])
    rows = load(kt, tmp_path)
    assert rows["op"].astype(str).tolist() == ["barrier", "all_reduce"]
    assert (rows.loc[0, "start_ns"], rows.loc[0, "end_ns"]) == (20_000, 70_000)
    assert pd.isna(rows.loc[0, "bytes"]) and rows.loc[1, "bytes"] == 16


def test_all_gather_size_is_its_output(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "c10d::_allgather_base_", 10, 5)
    work(kt, "gloo:all_gather", 12, 30, [[5]], ["c10::BFloat16"])
    assert load(kt, tmp_path).loc[0, "bytes"] == 5 * 2 * 4
    unknown = kineto({"backend": "gloo", "rank": 0, "world_size": 4})  # no pg_config
    call(unknown, "c10d::_allgather_base_", 10, 5)
    work(unknown, "gloo:all_gather", 12, 30, [[5]], ["c10::BFloat16"])
    rows = load(unknown, tmp_path, "u.json")
    assert pd.isna(rows.loc[0, "bytes"]) and pd.isna(rows.loc[0, "group_size"])
    assert rows.loc[0, "comm"] == "gloo"  # no group recorded: the backend's name


def test_several_process_groups_count_together_under_the_backend(tmp_path: Path) -> None:
    two = {**PG, "pg_config": [*PG["pg_config"], {**PG["pg_config"][0], "pg_name": "1"}]}
    kt = kineto(two)
    call(kt, "c10d::allreduce_", 10, 5)
    work(kt, "gloo:all_reduce", 12, 30, [[5]], ["float"])
    rows = load(kt, tmp_path)
    assert (rows.loc[0, "comm"], rows.loc[0, "group_size"]) == ("gloo", 4)


def test_call_without_work_keeps_its_host_time(tmp_path: Path) -> None:
    kt = kineto(PG)
    call(kt, "c10d::barrier", 10, 7)  # its work fell after the end of the window
    rows = load(kt, tmp_path)
    assert (rows.loc[0, "op"], rows.loc[0, "name"]) == ("barrier", "c10d::barrier")
    assert (rows.loc[0, "start_ns"], rows.loc[0, "end_ns"]) == (10_000, 17_000)


def _nccl_call(kt: KinetoTrace, ts: float) -> None:
    call(kt, "c10d::allreduce_", ts, 20)
    call(kt, "record_param_comms", ts + 1, 18)
    kt._x("user_annotation", "nccl:all_reduce", ts + 2, 15, kt.pid, MAIN)
    c = kt.correlation()
    kt._x("cuda_runtime", "cudaLaunchKernel", ts + 3, 5, kt.pid, MAIN, {"correlation": c})
    kt.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
              "ncclWork*)", ts + 30, 50, c, **{"Collective name": "allreduce",
                                               "In msg nelems": 256, "Out msg nelems": 256,
                                               "dtype": "Float", "Process Group Name": "0"})


def test_nccl_calls_stay_one_kernel_row_beside_gloo_calls(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.header["distributedInfo"] = {**PG, "pg_config": [
        {**PG["pg_config"][0], "backend_config": "cpu:gloo,cuda:nccl"}]}
    kt.tid = MAIN
    _nccl_call(kt, 100)                              # issued first, its kernel runs at 130
    call(kt, "c10d::allreduce_", 110, 5)             # a CPU tensor: gloo, work at 112
    work(kt, "gloo:all_reduce", 112, 10, [[2]], ["float"])
    rows = load(kt, tmp_path)
    assert rows["name"].astype(str).str[:14].tolist() == ["gloo:all_reduc", "ncclDevKernel_"]
    assert rows["kernel_id"].notna().tolist() == [False, True]
    assert rows["seq"].tolist() == [1, 0]  # in the order the host issued them
    assert rows["bytes"].tolist() == [8, 1024]


def test_a_call_without_work_is_dropped_where_the_process_ran_nccl(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.tid = MAIN
    _nccl_call(kt, 100)
    call(kt, "c10d::broadcast_", 300, 5)  # an NCCL call whose annotation fell outside
    rows = load(kt, tmp_path)
    assert len(rows) == 1 and rows["kernel_id"].notna().all()


def _rank(rank: int, start_us: float, end_us: float, tmp_path: Path) -> Path:
    kt = kineto({**PG, "rank": rank, "world_size": 2,
                 "pg_config": [{**PG["pg_config"][0], "pg_size": 2}]})
    kt.pid = 100 + rank
    call(kt, "c10d::allreduce_", start_us - 5, 2)
    work(kt, "gloo:all_reduce", start_us, end_us - start_us, [[1 << 20]], ["float"])
    return kt.write(tmp_path / f"r{rank}.json")


def test_two_ranks_exact_skew_wait_and_finding(tmp_path: Path) -> None:
    trace = gpudiag.load([_rank(0, 100, 400, tmp_path), _rank(1, 300, 400, tmp_path)])
    skew = C.arrival_skew(trace).set_index("rank")
    assert set(skew["matched_by"]) == {"seq"} and set(skew["skew_ns"]) == {200_000}
    assert skew["wait_ns"].to_dict() == {0: 200_000, 1: 0}
    assert set(skew["last_rank"]) == {1}
    waits = C.wait_intervals(trace)
    assert waits[["rank", "start_ns", "end_ns"]].values.tolist() == [[0, 100_000, 300_000]]
    f = C.findings(trace, min_lost_ns=0)
    assert f["cause"].tolist() == ["comm_wait"] and f["lost_ns"].tolist() == [200_000]
    calls = C.collective_calls(trace)
    assert C._wait_of(calls, C.arrival_skew(trace)).tolist() == [200_000, 0]


# -- the NCCL fixtures are untouched ----------------------------------------------------------


@pytest.mark.parametrize("name", [
    "kineto/v100_rank1of2_nccl_profile_memory.json.gz",
    "kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz",
    "kineto/world128_sampled_rank0.json.gz",
    "kineto/b200_rank0of8_nccl_allgather_pystack.json.gz",
])
def test_nccl_fixtures_c10d_calls_add_no_rows(name: str) -> None:
    path = fixture(name)
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name", "").startswith("c10d::") for e in events)  # calls are there
    c = gpudiag.load(path).collectives
    assert len(c) and c["kernel_id"].notna().all()
