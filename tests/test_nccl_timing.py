"""The `nccl` plugin: torch.distributed collectives timed in-process.

Real torch.distributed (gloo, CPU tensors) for the host path, the patching and the trip through
merge and the analyzers; a fake torch.distributed module and fake CUDA events (query() False,
then True) for the GPU path, which this machine cannot run.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.collectives.calls import arrival_skew, collective_stats
from gpudiag.collectors.nccl import clock as nccl_clock
from gpudiag.collectors.nccl import timing as nccl_timing
from gpudiag.collectors.nccl.timing import (
    W_CAPTURE,
    W_FAILED,
    W_UNFINISHED,
    collectives_table,
)
from gpudiag.trace import Trace, merge
from tests.conftest import framework

torch = framework("torch")
dist = framework("torch.distributed")


def _already_imported(name: str, callback: Any) -> None:
    """The bootstrap's on_import for a module that is already imported: call back at once
    (one that is not installed here, such as cupy.cuda.nccl, is never imported: no call)."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return
    callback(module)


def _chunks(out: Path) -> list[Trace]:
    return [Trace.load_dir(p) for p in sorted(out.glob("chunk-*"))]


def _rows(out: Path) -> pd.DataFrame:
    return merge(_chunks(out)).collectives


# -- real torch.distributed, gloo, world size 1 ---------------------------------------------------


@pytest.fixture
def gloo(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.fixture
def timed(tmp_path: Path) -> Any:
    out = tmp_path / "nccl"
    out.mkdir()
    collector = nccl_timing.create(out, {"flush_interval_s": 1.0},
                                   on_import=_already_imported)
    collector.start()
    yield collector
    collector.unpatch()


def _five_collectives() -> list[torch.Tensor]:
    """all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, barrier."""
    x = torch.arange(16, dtype=torch.float32)
    gathered = torch.zeros(16, dtype=torch.float32)
    scattered = torch.zeros(16, dtype=torch.float32)
    h = torch.arange(8, dtype=torch.float16)
    with warnings.catch_warnings():  # torch 2.13 deprecates the *_into_tensor / *_tensor names
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x)
        dist.reduce_scatter_tensor(scattered, x)
        dist.broadcast(h, src=0)
        dist.barrier()
    return [x, gathered, scattered, h]


def test_gloo_collectives_give_one_row_each_with_nccl_tests_sizes(gloo: Any, timed: Any,
                                                                  tmp_path: Path) -> None:
    before = time.time_ns()
    _five_collectives()
    after = time.time_ns()
    timed.flush(final=True)
    rows = _rows(tmp_path / "nccl")
    assert rows["name"].astype(str).tolist() == [
        "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier"]
    assert rows["op"].astype(str).tolist() == [
        "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"]
    # S: all_reduce the tensor, all_gather the output, reduce_scatter the input (16 x 4 bytes)
    assert rows["bytes"].tolist()[:4] == [64, 64, 64, 16]
    assert rows["bytes"].isna().tolist() == [False] * 4 + [True]
    assert rows["dtype"].astype(str).tolist()[:4] == ["float32"] * 3 + ["float16"]
    assert rows["group_size"].tolist() == [1] * 5
    assert rows["seq"].tolist() == [0, 1, 2, 3, 4]
    assert set(rows["comm"].astype(str)) == {"0"}  # the default group's name, as Kineto's
    assert rows["rank"].tolist() == [0] * 5
    assert rows["device"].isna().all() and rows["stream"].isna().all()
    start, end = rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()
    assert (before <= start).all() and (end <= after).all() and (start <= end).all()
    assert (start[1:] >= end[:-1]).all()  # one after the other, in call order


def test_patched_calls_return_what_the_originals_return(gloo: Any, tmp_path: Path) -> None:
    plain = _five_collectives()
    plain_work = dist.all_reduce(torch.ones(4), async_op=True)
    collector = nccl_timing.create(tmp_path, {}, on_import=_already_imported)
    collector.start()
    try:
        patched = _five_collectives()
        work = dist.all_reduce(torch.ones(4), async_op=True)
        assert dist.all_reduce(torch.ones(4)) is None
    finally:
        collector.unpatch()
    for a, b in zip(plain, patched, strict=True):
        assert torch.equal(a, b)
    assert type(work) is type(plain_work)
    work.wait()
    assert work.is_completed()


def test_async_gloo_call_ends_when_its_future_completes(gloo: Any, timed: Any,
                                                        tmp_path: Path) -> None:
    before = time.time_ns()
    x = torch.ones(1024)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    timed.flush(final=True)
    rows = _rows(tmp_path / "nccl")
    assert rows["name"].astype(str).tolist() == ["all_reduce"]
    assert rows.loc[0, "bytes"] == 4096
    assert before <= rows.loc[0, "start_ns"] <= rows.loc[0, "end_ns"] <= time.time_ns()


def test_unpatch_restores_the_originals_on_both_modules(gloo: Any, tmp_path: Path) -> None:
    c10d = dist.distributed_c10d
    originals = {name: getattr(dist, name) for name in ("all_reduce", "barrier", "broadcast")}
    collector = nccl_timing.create(tmp_path, {}, on_import=_already_imported)
    collector.start()
    for name, original in originals.items():
        wrapper = getattr(dist, name)
        assert wrapper is not original and getattr(c10d, name) is wrapper
        assert wrapper.__wrapped__ is original
        assert inspect.signature(wrapper) == inspect.signature(original)
    collector.unpatch()
    for name, original in originals.items():
        assert getattr(dist, name) is original and getattr(c10d, name) is original


def test_call_inside_a_wrapped_call_is_recorded_once(gloo: Any, timed: Any,
                                                     tmp_path: Path) -> None:
    # torch 2.13's all_gather_into_tensor calls all_gather_single through the module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(torch.zeros(4), torch.ones(4))
    dist.all_gather_object([None], {"step": 1})  # unwrapped: its two all_gathers are seen
    timed.flush(final=True)
    rows = _rows(tmp_path / "nccl")
    assert rows["name"].astype(str).tolist() == ["all_gather_into_tensor", "all_gather",
                                                 "all_gather"]
    assert rows["seq"].tolist() == [0, 1, 2]


def test_paused_calls_keep_counting_seq_but_write_no_rows(gloo: Any, timed: Any,
                                                          tmp_path: Path) -> None:
    timed.pause()
    dist.all_reduce(torch.ones(2))
    timed.resume()
    dist.all_reduce(torch.ones(2))
    timed.flush(final=True)
    assert _rows(tmp_path / "nccl")["seq"].tolist() == [1]


def test_start_uses_the_bootstrap_on_import_hook(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    asked: list[str] = []
    boot = ModuleType("gpudiag.profiler.bootstrap")
    boot.on_import = lambda name, cb: asked.append(name)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpudiag.profiler.bootstrap", boot)
    nccl_timing.create(tmp_path, {}).start()
    assert asked == ["torch.distributed", "cupy.cuda.nccl"]


# -- two ranks: merge, match by (comm, seq), diagnose ---------------------------------------------


def _rank_main(rank: int, world: int, store: str, root: str) -> None:
    """One rank of the spawned pair: rank 1 reaches the second all_reduce 0.2 s late."""
    out = Path(root) / f"rank{rank}"
    out.mkdir()
    collector = nccl_timing.create(out, {}, on_import=_already_imported)
    collector.start()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x = torch.ones(256)
    dist.all_reduce(x)
    if rank == 1:
        time.sleep(0.2)
    dist.all_reduce(x)
    dist.all_gather(list(torch.zeros(world, 256).unbind()), x)
    dist.broadcast(x, src=0)
    collector.flush(final=True)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    import torch.multiprocessing as mp

    root = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank_main, args=(2, str(root / "store"), str(root)), nprocs=2, join=True)
    return merge([t for r in (0, 1) for t in _chunks(root / f"rank{r}")])


def test_two_rank_chunks_match_across_ranks_by_comm_and_seq(two_ranks: Trace) -> None:
    c = two_ranks.collectives
    assert sorted(c["rank"].tolist()) == [0] * 4 + [1] * 4
    skew = arrival_skew(two_ranks)
    assert set(skew["matched_by"]) == {"seq"}
    per_call = skew.groupby("match_id").agg(ranks=("rank", "nunique"), seq=("seq", "first"),
                                            op=("op", "first"), last=("last_rank", "first"))
    assert per_call["ranks"].tolist() == [2, 2, 2, 2]
    assert per_call["op"].tolist() == ["all_reduce", "all_reduce", "all_gather", "broadcast"]
    late = skew[(skew["seq"] == 1) & (skew["rank"] == 0)].iloc[0]
    assert late["last_rank"] == 1
    assert late["wait_ns"] >= 150_000_000  # rank 0 waited for rank 1's 0.2 s sleep


def test_two_rank_trace_gives_collective_stats_through_diagnose(two_ranks: Trace) -> None:
    dx = gpudiag.diagnose(two_ranks)
    stats = dx.tables["collective_stats"]
    counts = dict(zip(stats["op"].astype(str), stats["count"], strict=True))
    assert counts == {"all_reduce": 4, "all_gather": 2, "broadcast": 2}
    gather = stats[stats["op"] == "all_gather"].iloc[0]
    assert gather["bytes"] == 2 * 256 * 4 and gather["group_size"] == 2
    assert collective_stats(two_ranks)["busbw_gbps"].notna().all()


# -- the GPU path, with a fake torch.distributed and fake CUDA events -----------------------------


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.t_ms, self.done, self.stream = cuda, -1.0, False, None

    def record(self, stream: Any) -> None:
        self.t_ms, self.stream = self.cuda.now_ms, stream

    def synchronize(self) -> None:
        self.done = True

    def query(self) -> bool:
        self.cuda.queries += 1
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time on an event that did not complete"
        return end.t_ms - self.t_ms


class FakeCuda:
    """Stands in for nccl_clock._TorchCuda: GPU time is `now_ms`, set by the test."""

    def __init__(self, capturing: bool = False) -> None:
        self.now_ms, self.queries, self.is_capturing = 0.0, 0, capturing
        self.events: list[FakeEvent] = []
        self.user_stream = SimpleNamespace(stream_id=3)

    def event(self) -> FakeEvent:
        self.events.append(FakeEvent(self))
        return self.events[-1]

    def current_stream(self, device: int) -> Any:
        return self.user_stream

    def new_stream(self, device: int) -> Any:
        return SimpleNamespace(stream_id=99)

    def current_device(self) -> int:
        return 0

    def capturing(self) -> bool:
        return self.is_capturing


class FakeTensor:
    is_cuda = True
    device = SimpleNamespace(index=0)
    dtype = "torch.bfloat16"

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 2


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_done_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def complete(self) -> None:
        for callback in self.callbacks:
            callback(self)


class FakeWork:
    def __init__(self) -> None:
        self.future = FakeFuture()

    def get_future(self) -> FakeFuture:
        return self.future


def fake_dist() -> ModuleType:
    """A torch.distributed stand-in: all_reduce(tensor, op, group, async_op), one group."""
    group = SimpleNamespace(group_name="7", size=lambda: 4)
    c10d = ModuleType("fake_c10d")
    c10d._get_default_group = lambda: group  # type: ignore[attr-defined]
    c10d._rank_not_in_group = lambda g: False  # type: ignore[attr-defined]
    module = ModuleType("fake_dist")
    module.distributed_c10d = c10d  # type: ignore[attr-defined]
    module.get_rank = lambda: 2  # type: ignore[attr-defined]
    module.get_world_size = lambda: 4  # type: ignore[attr-defined]
    module.works = []  # type: ignore[attr-defined]

    def all_reduce(tensor: Any, op: Any = None, group: Any = None,
                   async_op: bool = False) -> Any:
        if async_op:
            module.works.append(FakeWork())  # type: ignore[attr-defined]
            return module.works[-1]  # type: ignore[attr-defined]
        return None

    def batch_isend_irecv(p2p_op_list: list[Any]) -> list[FakeWork]:
        return [FakeWork() for _ in p2p_op_list]

    module.all_reduce = all_reduce  # type: ignore[attr-defined]
    module.batch_isend_irecv = batch_isend_irecv  # type: ignore[attr-defined]
    return module


def fake_collector(tmp_path: Path, cuda: Any, **options: Any) -> tuple[Any, ModuleType]:
    module = fake_dist()
    clock = itertools.count(1_000_000, 10).__next__  # anchor: t0 1_000_000, t1 1_000_010
    collector = nccl_timing.create(tmp_path, {}, on_import=lambda name, cb: cb(module),
                                   cuda=cuda, clock=clock, **options)
    collector.start()
    return collector, module


def test_pending_gpu_events_wait_until_they_complete(tmp_path: Path) -> None:
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path, cuda)
    fake.all_reduce(FakeTensor(1024))
    anchor, start, end = cuda.events
    start.t_ms, end.t_ms = 2.0, 5.0  # GPU times: 2 and 5 ms after the anchor
    assert anchor.done and not start.done and not end.done
    collector.flush()
    assert not list(tmp_path.glob("chunk-*"))  # nothing completed yet
    start.done = end.done = True
    queries = cuda.queries
    collector.flush()
    assert cuda.queries == queries and not list(tmp_path.glob("chunk-*"))  # flush: no CUDA
    fake.all_reduce(FakeTensor(8))  # the program's next collective converts the first
    collector.flush()
    (chunk,) = _chunks(tmp_path)
    row = chunk.collectives.iloc[0]
    assert (row["start_ns"], row["end_ns"]) == (1_000_005 + 2_000_000, 1_000_005 + 5_000_000)
    assert (row["device"], row["stream"], row["rank"], row["comm"]) == (0, 3, 2, "7")
    assert (row["bytes"], row["dtype"], row["group_size"], row["seq"]) == (2048, "bfloat16", 4, 0)
    assert chunk.meta["nccl_timing"]["clock_error_ns"] == 5


def test_final_flush_writes_completed_and_counts_unfinished_events(tmp_path: Path) -> None:
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path, cuda, final_wait_s=0.01)
    fake.all_reduce(FakeTensor(4))
    for event in cuda.events:
        event.done = True
    fake.all_reduce(FakeTensor(4))  # never completes
    collector.flush(final=True)
    (chunk,) = _chunks(tmp_path)
    assert chunk.collectives["seq"].tolist() == [0]
    assert chunk.meta["warnings"] == {W_UNFINISHED: 1}


def test_async_gpu_call_waits_for_its_future_then_its_end_event(tmp_path: Path) -> None:
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path, cuda, final_wait_s=0.0)
    tensor = FakeTensor(16)
    work = fake.all_reduce(tensor, async_op=True)
    assert work is fake.works[-1]  # the very Work object the original returned
    for event in cuda.events:
        event.done = True
    collector.flush(final=True)  # the future has not run its callback: no end event yet
    assert _chunks(tmp_path)[0].meta["warnings"] == {W_UNFINISHED: 1}
    cuda.now_ms = 7.0
    work.future.complete()  # torch runs this once the collective is enqueued
    cuda.events[-1].done = True
    collector.flush(final=True)
    row = _chunks(tmp_path)[1].collectives.iloc[0]
    assert row["end_ns"] - row["start_ns"] == 7_000_000


def test_calls_inside_a_graph_capture_are_counted_not_timed(tmp_path: Path) -> None:
    cuda = FakeCuda(capturing=True)
    collector, fake = fake_collector(tmp_path, cuda)
    fake.all_reduce(FakeTensor(4))
    cuda.is_capturing = False
    fake.all_reduce(FakeTensor(4))
    for event in cuda.events:
        event.done = True
    collector.flush(final=True)
    (chunk,) = _chunks(tmp_path)
    assert chunk.collectives["seq"].tolist() == [1]
    assert chunk.meta["warnings"] == {W_CAPTURE: 1}


def test_timing_failures_are_swallowed_and_counted(tmp_path: Path) -> None:
    class BrokenCuda(FakeCuda):
        def event(self) -> FakeEvent:
            raise RuntimeError("CUDA error: out of events")

    collector, fake = fake_collector(tmp_path, BrokenCuda())
    assert fake.all_reduce(FakeTensor(4)) is None
    work = fake.all_reduce(FakeTensor(4), async_op=True)
    assert work is fake.works[-1]
    collector.flush(final=True)
    (chunk,) = _chunks(tmp_path)
    assert chunk.collectives.empty
    assert chunk.meta["warnings"] == {W_FAILED: 2}
    assert "out of events" in chunk.meta["nccl_timing"]["first_error"]


def test_errors_of_the_call_itself_reach_the_program_unchanged(tmp_path: Path) -> None:
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path, cuda)
    original = fake.all_reduce.__wrapped__

    def failing(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if tensor.n == 0:
            raise ValueError("empty tensor")
        return original(tensor, op, group, async_op)

    collector.unpatch()
    fake.all_reduce = failing
    collector.start()
    with pytest.raises(ValueError, match="empty tensor"):
        fake.all_reduce(FakeTensor(0))
    fake.all_reduce(FakeTensor(4))  # not mistaken for a call nested in the failed one
    for event in cuda.events:
        event.done = True
    collector.flush(final=True)
    (chunk,) = _chunks(tmp_path)
    assert chunk.collectives["seq"].tolist() == [1]  # the failed call had seq 0, no row
    assert chunk.meta["warnings"] == {}


def test_after_fork_drops_the_parents_records(tmp_path: Path) -> None:
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path / "parent", cuda)
    fake.all_reduce(FakeTensor(4))
    child = tmp_path / "child"
    child.mkdir()
    collector.after_fork(child)
    collector.flush(final=True)
    assert not list(child.glob("chunk-*"))
    fake.all_reduce(FakeTensor(4))
    for event in cuda.events:
        event.done = True
    collector.flush(final=True)
    assert _rows(child)["seq"].tolist() == [0]


def test_collectives_table_conforms_to_the_schema() -> None:
    row = (1, None, None, 10, 25, "all_gather", 512, "float32", 2, "0", 3, "all_gather")
    table = collectives_table([row], pid=42)
    Trace(collectives=table).validate()
    assert table.loc[0, "pid"] == 42 and table.loc[0, "bytes"] == 512
    assert pd.isna(table.loc[0, "device"]) and pd.isna(table.loc[0, "kernel_id"])
    assert collectives_table([], pid=42).empty


def test_new_anchor_measures_the_gpu_clock_drift(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_clock, "REANCHOR_NS", -1)  # a new anchor at every call
    cuda = FakeCuda()
    collector, fake = fake_collector(tmp_path, cuda)
    fake.all_reduce(FakeTensor(4))  # anchor read at 1_000_000..1_000_010 ns, GPU 0 ms
    cuda.now_ms = 1.0  # 1 ms of GPU time, but only 30 ns of host clock, pass
    fake.all_reduce(FakeTensor(4))  # anchor read at 1_000_030..1_000_040 ns
    for event in cuda.events:
        event.done = True
    collector.flush(final=True)
    (chunk,) = _chunks(tmp_path)
    assert chunk.meta["nccl_timing"]["clock_drift_ns"] == (1_000_005 + 1_000_000) - 1_000_035
    assert chunk.collectives["start_ns"].tolist() == [1_000_005, 1_000_035]


def test_chunk_interval_spaces_chunks_out_but_the_final_flush_writes(gloo: Any,
                                                                      tmp_path: Path) -> None:
    collector = nccl_timing.create(tmp_path, {"chunk_interval_s": 3600},
                                   on_import=_already_imported)
    collector.start()
    try:
        dist.all_reduce(torch.ones(2))
        collector.flush()
        dist.all_reduce(torch.ones(2))
        collector.flush()  # within the interval of the first chunk: kept for later
        dist.all_reduce(torch.ones(2))
        collector.flush(final=True)
    finally:
        collector.unpatch()
    assert [t.collectives["seq"].tolist() for t in _chunks(tmp_path)] == [[0], [1, 2]]


def test_batch_of_sends_and_receives_ends_when_its_last_work_completes(tmp_path: Path) -> None:
    collector, fake = fake_collector(tmp_path, FakeCuda())
    cpu = SimpleNamespace(type="cpu", index=None)
    send = SimpleNamespace(op=SimpleNamespace(__name__="isend"), group=None,
                           tensor=SimpleNamespace(is_cuda=False, device=cpu, dtype="torch.int8",
                                                  numel=lambda: 100, element_size=lambda: 1))
    recv = SimpleNamespace(op=SimpleNamespace(__name__="irecv"), group=None,
                           tensor=SimpleNamespace(is_cuda=False, device=cpu, dtype="torch.int8",
                                                  numel=lambda: 999, element_size=lambda: 1))
    works = fake.batch_isend_irecv([send, recv])  # host clock: 1_000_000 at the call
    works[0].future.complete()  # 1_000_020
    collector.flush()
    assert not list(tmp_path.glob("chunk-*"))  # one of its two Works is still running
    works[1].future.complete()  # 1_000_030
    collector.flush()
    row = _chunks(tmp_path)[0].collectives.iloc[0]
    assert (row["op"], row["name"], row["bytes"], row["dtype"]) == (
        "send_recv", "batch_isend_irecv", 100, "int8")  # S: the bytes sent
    assert (row["start_ns"], row["end_ns"]) == (1_000_000, 1_000_030)
    assert pd.isna(row["device"])
