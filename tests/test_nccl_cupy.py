"""The `nccl` plugin's CuPy source: NcclCommunicator calls timed with CUDA events.

CuPy is not installed here and there is no GPU: a fake `cupy` module with CuPy's real call
signatures (cupy_backends/cuda/libs/nccl.pyx, cupy/cuda/stream.pyx) stands in. Its GPU has one
clock (`now_ms`, set by the test; a collective takes `kernel_ms`), events complete only when the
test says so, and recording an event on a stream of another device fails as CUDA's does.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from gpudiag.collectors.nccl import cupy_comm as nccl_cupy
from gpudiag.collectors.nccl import cupy_patch as nccl_cupy_patch
from gpudiag.collectors.nccl import timing as nccl_timing
from gpudiag.collectors.nccl.timing import W_CAPTURE, W_FAILED
from gpudiag.trace import Trace, merge

UID = tuple(range(-64, 64))  # a 128-byte NCCL unique id, as get_unique_id() returns it
UID_KEY = "cupy-" + hashlib.blake2b(bytes(b & 0xFF for b in UID), digest_size=6).hexdigest()
METHOD_NAMES = ("allReduce", "reduce", "broadcast", "bcast", "reduceScatter", "allGather",
                "send", "recv")


class NcclError(RuntimeError):
    pass


class FakeGpu:
    """The fake GPUs' shared state: one clock, the current device, every event."""

    def __init__(self) -> None:
        self.now_ms, self.kernel_ms, self.device = 0.0, 3.0, 0
        self.events: list[Any] = []
        self.queries = 0
        self.stream_device: dict[int, int] = {}  # stream pointer -> its device
        self.capturing: set[int] = set()
        self.group_depth, self.queued = 0, 0
        self.broken_events = False
        self.fail_next: BaseException | None = None
        self.result: Any = None
        self.old_nccl = False  # NCCL < 2.2: broadcast calls bcast

    def complete_all(self) -> None:
        for event in self.events:
            event.complete = True

    def run(self) -> Any:
        """One collective: queued inside a group, else it takes kernel_ms on the GPU."""
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if self.group_depth:
            self.queued += 1
        else:
            self.now_ms += self.kernel_ms
        return self.result


class Immutable(type):
    """Stands in for a compiled extension type: CPython refuses new attributes on its class."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise TypeError(f"cannot set {name!r} attribute of immutable type {cls.__name__!r}")


def fake_cupy(immutable: bool = False) -> tuple[ModuleType, ModuleType, FakeGpu]:
    """(cupy, cupy.cuda.nccl, its GPU): CuPy's names and signatures, fake behaviour."""
    gpu = FakeGpu()

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False,
                     interprocess: bool = False) -> None:
            if gpu.broken_events:
                raise RuntimeError("cudaErrorMemoryAllocation: out of memory")
            self.device, self.t_ms, self.stream, self.complete = gpu.device, -1.0, None, False
            gpu.events.append(self)

        def record(self, stream: Any = None) -> None:
            if gpu.stream_device.get(stream.ptr, self.device) != self.device:
                raise RuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle")
            self.t_ms, self.stream = gpu.now_ms, stream.ptr

        @property
        def done(self) -> bool:
            gpu.queries += 1
            return self.complete

        def synchronize(self) -> None:
            self.complete = True

    def get_elapsed_time(start: Event, end: Event) -> float:
        assert start.complete and end.complete, "cudaErrorNotReady"
        assert start.device == end.device, "events of two devices"
        return end.t_ms - start.t_ms

    class ExternalStream:
        def __init__(self, ptr: int, device_id: int = -1) -> None:
            self.ptr, self.device_id = ptr, device_id

        def is_capturing(self) -> bool:
            return self.ptr in gpu.capturing

    class Stream(ExternalStream):
        def __init__(self, null: bool = False, non_blocking: bool = False,
                     ptds: bool = False) -> None:
            assert non_blocking, "the anchor's stream must not wait for the legacy stream"
            super().__init__(0x9000 + len(gpu.stream_device), gpu.device)
            gpu.stream_device[self.ptr] = gpu.device

    class Device:
        def __init__(self, device: int | None = None) -> None:
            self.id = gpu.device if device is None else device

        def __enter__(self) -> Device:
            self.previous, gpu.device = gpu.device, self.id
            return self

        def __exit__(self, *exc: Any) -> None:
            gpu.device = self.previous

    metaclass: Any = Immutable if immutable else type

    class NcclCommunicator(metaclass=metaclass):
        def __init__(self, ndev: int, commId: tuple[int, ...], rank: int) -> None:
            self._ndev, self._rank, self._device = ndev, rank, gpu.device

        @staticmethod
        def initAll(devices: Any) -> list[Any]:
            devlist = list(range(devices)) if isinstance(devices, int) else devices
            comms = [NcclCommunicator.__new__(NcclCommunicator) for _ in devlist]
            NcclCommunicator._initAll(comms, len(devlist), devlist)
            return comms

        @staticmethod
        def _initAll(comms: list[Any], ndev: int, devlist: list[int]) -> None:
            for rank, (comm, device) in enumerate(zip(comms, devlist, strict=True)):
                assert isinstance(comm, NcclCommunicator)
                comm._ndev, comm._rank, comm._device = ndev, rank, device

        def device_id(self) -> int:
            return int(self._device)

        def rank_id(self) -> int:
            return int(self._rank)

        def size(self) -> int:
            return int(self._ndev)

        def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                      op: int, stream: int) -> Any:
            return gpu.run()

        def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                   root: int, stream: int) -> Any:
            return gpu.run()

        def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                      stream: int) -> Any:
            if gpu.old_nccl:
                return self.bcast(recvbuff, count, datatype, root, stream)
            return gpu.run()

        def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> Any:
            return gpu.run()

        def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int,
                          datatype: int, op: int, stream: int) -> Any:
            return gpu.run()

        def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                      stream: int) -> Any:
            return gpu.run()

        def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> Any:
            return gpu.run()

        def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> Any:
            return gpu.run()

    def groupStart() -> None:
        gpu.group_depth += 1

    def groupEnd() -> None:
        if gpu.fail_next is not None:
            error, gpu.fail_next = gpu.fail_next, None
            gpu.group_depth, gpu.queued = gpu.group_depth - 1, 0
            raise error
        gpu.group_depth -= 1
        if gpu.group_depth == 0:
            gpu.now_ms += gpu.kernel_ms * gpu.queued
            gpu.queued = 0

    nccl = ModuleType("cupy.cuda.nccl")
    for name, (value, _dtype, _size) in nccl_cupy.DATATYPES.items():
        if name.startswith(("NCCL_INT", "NCCL_UINT", "NCCL_FLOAT1", "NCCL_FLOAT3",
                            "NCCL_FLOAT6", "NCCL_BF")):  # the ones CuPy defines
            setattr(nccl, name, value)
    nccl.__dict__.update(NCCL_SUM=0, NcclCommunicator=NcclCommunicator, groupStart=groupStart,
                         groupEnd=groupEnd, NcclError=NcclError)
    cuda = ModuleType("cupy.cuda")
    cuda.__dict__.update(Event=Event, get_elapsed_time=get_elapsed_time, Stream=Stream,
                         ExternalStream=ExternalStream, Device=Device, nccl=nccl)
    cupy = ModuleType("cupy")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    return cupy, nccl, gpu


class Rig(SimpleNamespace):
    """One test's fake CuPy, its collector and the unpatch function."""

    cupy: ModuleType
    nccl: Any
    gpu: FakeGpu
    timing: Any
    undo: Any
    out: Path


def make_timing(tmp_path: Path) -> Any:
    """A collector whose clock reads 1_000_000, 1_000_010, ...: an anchor's midpoint is ...005."""
    clock = itertools.count(1_000_000, 10).__next__
    return nccl_timing.create(tmp_path, {}, on_import=lambda name, cb: None, clock=clock,
                              final_wait_s=0.01)


def make_rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, immutable: bool = False,
             timing: Any = None) -> Rig:
    cupy, nccl, gpu = fake_cupy(immutable)
    for name, module in (("cupy", cupy), ("cupy.cuda", cupy.cuda), ("cupy.cuda.nccl", nccl)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("RANK", raising=False)
    timing = make_timing(tmp_path) if timing is None else timing
    undo = nccl_cupy.install(timing, nccl)
    return Rig(cupy=cupy, nccl=nccl, gpu=gpu, timing=timing, undo=undo, out=tmp_path)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    rig = make_rig(tmp_path, monkeypatch)
    yield rig
    rig.undo()


def _chunks(out: Path) -> list[Trace]:
    return [Trace.load_dir(p) for p in sorted(out.glob("chunk-*"))]


def _flushed(rig: Rig) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Every event completes, the final flush: (the rows, the last chunk's meta)."""
    rig.gpu.complete_all()
    rig.timing.flush(final=True)
    chunks = _chunks(rig.out)
    return merge(chunks).collectives, chunks[-1].meta


def _strs(column: pd.Series) -> list[Any]:
    return [None if pd.isna(v) else v for v in column.astype(object)]


# -- rows ---------------------------------------------------------------------------------------


def test_each_method_gives_one_row_with_nccl_tests_size_and_dtype(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    s = 0x51
    gpu.device = gpu.stream_device[s] = 1  # the communicator and its stream on device 1
    comm = nccl.NcclCommunicator(4, UID, 2)
    gpu.device = 0  # the program's current device is another one
    comm.allReduce(1, 2, 1000, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s)
    comm.allGather(1, 2, 100, nccl.NCCL_FLOAT16, s)  # S: output, 100 x 4 ranks x 2 bytes
    comm.reduceScatter(1, 2, 100, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, s)  # S: input
    comm.broadcast(1, 2, 10, nccl.NCCL_INT8, 0, s)
    comm.bcast(1, 10, nccl.NCCL_BFLOAT16, 0, s)
    comm.reduce(1, 2, 5, nccl.NCCL_INT64, nccl.NCCL_SUM, 0, s)
    comm.send(1, 3, nccl.NCCL_UINT8, 1, s)
    comm.recv(2, 7, nccl.NCCL_INT32, 3, s)
    comm.allReduce(sendbuf=1, recvbuf=2, count=8, datatype=nccl.NCCL_UINT64, op=0, stream=s)
    rows, _meta = _flushed(rig)
    assert _strs(rows["name"]) == ["allReduce", "allGather", "reduceScatter", "broadcast",
                                   "bcast", "reduce", "send", "recv", "allReduce"]
    assert _strs(rows["op"]) == ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                 "broadcast", "reduce", "send", "recv", "all_reduce"]
    assert rows["bytes"].tolist() == [4000, 800, 3200, 10, 20, 40, 3, 28, 64]
    assert _strs(rows["dtype"]) == ["float32", "float16", "float64", "int8", "bfloat16",
                                    "int64", "uint8", "int32", "uint64"]
    assert rows["seq"].tolist() == list(range(9))
    assert set(rows["group_size"]) == {4} and set(rows["rank"]) == {2}
    assert set(rows["device"]) == {1} and set(rows["stream"]) == {s}
    assert set(_strs(rows["comm"])) == {UID_KEY}  # from the unique id: the same on every rank
    assert rows["pid"].tolist() == [os.getpid()] * 9


def test_rows_take_their_times_from_events_on_the_calls_stream(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    gpu.now_ms = 2.0
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0x70)  # the anchor at 2.0 ms; runs to 5.0
    gpu.now_ms = 10.0
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0x70)  # 10.0 -> 13.0
    timed = [e for e in gpu.events if e.stream == 0x70]
    assert [e.t_ms for e in timed] == [2.0, 5.0, 10.0, 13.0]
    rows, meta = _flushed(rig)
    anchor_ns = 1_000_005  # the midpoint of the clock's readings around the anchor
    assert rows["start_ns"].tolist() == [anchor_ns, anchor_ns + 8_000_000]
    assert (rows["end_ns"] - rows["start_ns"]).tolist() == [3_000_000, 3_000_000]
    assert meta["nccl_timing"]["clock_error_ns"] == 5
    assert meta["warnings"] == {}


def test_unknown_datatype_gives_a_row_without_size(rig: Rig) -> None:
    comm = rig.nccl.NcclCommunicator(2, UID, 1)
    comm.allReduce(1, 2, 4, 99, 0, 0)
    rows, _meta = _flushed(rig)
    assert pd.isna(rows.loc[0, "bytes"]) and pd.isna(rows.loc[0, "dtype"])
    assert rows.loc[0, "op"] == "all_reduce"


def test_communicators_are_named_so_ranks_match(rig: Rig) -> None:
    nccl = rig.nccl
    rank0, rank1 = nccl.NcclCommunicator(2, UID, 0), nccl.NcclCommunicator(2, UID, 1)
    other = nccl.NcclCommunicator(2, tuple(reversed(UID)), 0)
    unnamed = nccl.NcclCommunicator.__new__(nccl.NcclCommunicator)  # no __init__ seen
    unnamed._ndev, unnamed._rank, unnamed._device = 2, 0, 0
    for comm in (rank0, rank1, other, unnamed, rank0):
        comm.send(1, 1, nccl.NCCL_INT8, 1, 0)
    rows, _meta = _flushed(rig)
    comms = _strs(rows["comm"])
    assert comms[0] == comms[1] == comms[4] == UID_KEY
    assert comms[2].startswith("cupy-") and comms[2] != UID_KEY
    assert comms[3] == f"cupy-{os.getpid()}-{id(unnamed):x}"
    assert rows["rank"].tolist() == [0, 1, 0, 0, 0]
    assert rows["seq"].tolist() == [0, 0, 0, 0, 1]  # per (comm, rank)


def test_rank_comes_from_the_rank_variable_when_set(rig: Rig,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "6")  # a process of 8, in a sub-communicator of 2
    rig.nccl.NcclCommunicator(2, UID, 1).allReduce(1, 2, 1, rig.nccl.NCCL_INT8, 0, 0)
    rows, _meta = _flushed(rig)
    assert rows["rank"].tolist() == [6]


# -- the program sees no difference ---------------------------------------------------------------


def test_results_and_errors_reach_the_program_unchanged(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    gpu.result = sentinel = object()
    assert comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0) is sentinel
    gpu.fail_next = error = NcclError("NCCL_ERROR_INVALID_ARGUMENT: invalid argument")
    with pytest.raises(NcclError) as raised:
        comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)
    assert raised.value is error
    nccl.groupStart()
    comm.send(1, 4, nccl.NCCL_FLOAT32, 1, 0)
    gpu.fail_next = group_error = NcclError("NCCL_ERROR_INVALID_USAGE")
    with pytest.raises(NcclError) as raised_in_group:
        nccl.groupEnd()
    assert raised_in_group.value is group_error
    assert comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0) is sentinel  # not in a group now
    rows, meta = _flushed(rig)
    assert rows["seq"].tolist() == [0, 3]  # the failed call (1) and the failed group's (2)
    assert meta["warnings"] == {}


def test_failures_inside_the_timing_are_counted_and_swallowed(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    gpu.broken_events, gpu.result = True, "done"
    assert comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0) == "done"
    nccl.groupStart()
    comm.send(1, 4, nccl.NCCL_FLOAT32, 1, 0)
    nccl.groupEnd()  # its start events fail: the group runs, untimed
    broken = nccl.NcclCommunicator(2, UID, 1)
    broken.device_id = lambda: 1 / 0
    gpu.broken_events = False
    assert broken.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0) == "done"
    gpu.result = None
    rows, meta = _flushed(rig)
    assert rows.empty
    assert meta["warnings"] == {W_FAILED: 3}
    assert "out of memory" in meta["nccl_timing"]["first_error"]


def test_install_never_raises_and_patches_nothing_it_cannot_use(tmp_path: Path) -> None:
    timing = nccl_timing.create(tmp_path, {}, on_import=lambda name, cb: None)
    no_nccl = ModuleType("cupy")
    no_nccl.cuda = ModuleType("cupy.cuda")  # type: ignore[attr-defined]
    assert nccl_cupy.install(timing, no_nccl)() is None  # cupy.cuda.nccl not imported
    unavailable = ModuleType("cupy.cuda.nccl")
    unavailable.available = False  # type: ignore[attr-defined]  # built without NCCL
    assert nccl_cupy.install(timing, unavailable)() is None
    assert timing._warnings == {}


def test_install_undoes_a_half_done_patch(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rig = make_rig(tmp_path, monkeypatch)
    rig.undo()
    original = rig.nccl.groupEnd
    monkeypatch.setattr(nccl_cupy_patch, "_wrap_group", lambda hook, fn: 1 / 0)
    undo = nccl_cupy.install(rig.timing, rig.nccl)
    assert vars(rig.nccl.NcclCommunicator)["allReduce"].__name__ == "allReduce"
    assert not hasattr(vars(rig.nccl.NcclCommunicator)["allReduce"], "__wrapped__")
    assert rig.nccl.groupEnd is original and undo() is None
    assert rig.timing._warnings == {W_FAILED: 1}


# -- patching ----------------------------------------------------------------------------------


def test_unpatch_restores_the_originals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cupy, nccl, _gpu = fake_cupy()
    cls = nccl.NcclCommunicator
    names = (*METHOD_NAMES, "__init__", "initAll")
    before = {name: vars(cls)[name] for name in names}
    groups = nccl.groupStart, nccl.groupEnd
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    timing = make_timing(tmp_path)
    undo = nccl_cupy.install(timing, nccl)
    for name in METHOD_NAMES:
        assert vars(cls)[name] is not before[name]
        assert vars(cls)[name].__wrapped__ is before[name]
    assert nccl.groupStart.__wrapped__ is groups[0] and nccl.groupEnd.__wrapped__ is groups[1]
    assert nccl_cupy.install(timing, nccl)() is None  # installed already: nothing more
    assert vars(cls)["allReduce"].__wrapped__ is before["allReduce"]
    held = nccl.NcclCommunicator(2, UID, 0).allReduce  # a wrapper the program still holds
    undo()
    assert {name: vars(cls)[name] for name in names} == before
    assert (nccl.groupStart, nccl.groupEnd) == groups
    held(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)  # calls straight through
    nccl.NcclCommunicator(2, UID, 0).allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)
    timing.flush(final=True)
    assert not list(tmp_path.glob("chunk-*"))


def test_an_extension_type_is_timed_through_a_subclass_of_the_same_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cupy, nccl, gpu = fake_cupy(immutable=True)
    base = nccl.NcclCommunicator
    backend = ModuleType("cupy_backends.cuda.libs.nccl")  # where cupy.cuda.nccl imports from
    backend.__dict__.update(NcclCommunicator=base, groupStart=nccl.groupStart,
                            groupEnd=nccl.groupEnd)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nccl", backend)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    timing = make_timing(tmp_path)
    undo = nccl_cupy.install(timing, nccl)
    timed = nccl.NcclCommunicator
    assert timed is not base and issubclass(timed, base) and backend.NcclCommunicator is timed
    assert (timed.__name__, timed.__qualname__, timed.__module__) == (
        base.__name__, base.__qualname__, base.__module__)
    assert not hasattr(vars(base)["allReduce"], "__wrapped__")  # the base class is untouched
    assert backend.groupStart is nccl.groupStart  # one wrapper for both modules
    comm = nccl.NcclCommunicator(2, UID, 1)
    assert isinstance(comm, base)
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)
    pair = nccl.NcclCommunicator.initAll(2)
    assert [type(c) for c in pair] == [timed, timed] and [c.rank_id() for c in pair] == [0, 1]
    gpu.stream_device[0x61] = 1
    pair[1].allGather(1, 2, 4, nccl.NCCL_FLOAT32, 0x61)
    gpu.complete_all()
    timing.flush(final=True)
    rows = merge(_chunks(tmp_path)).collectives
    assert _strs(rows["name"]) == ["allReduce", "allGather"]
    assert _strs(rows["comm"]) == [UID_KEY, f"cupy-{os.getpid()}-all1"]
    assert rows["rank"].tolist() == [1, 1] and rows["device"].tolist() == [0, 1]
    undo()
    assert nccl.NcclCommunicator is base and backend.NcclCommunicator is base


def test_a_call_made_inside_a_wrapped_call_is_recorded_once(rig: Rig) -> None:
    rig.gpu.old_nccl = True  # CuPy's broadcast calls self.bcast before NCCL 2.2
    rig.nccl.NcclCommunicator(2, UID, 0).broadcast(1, 1, 4, rig.nccl.NCCL_FLOAT32, 0, 0)
    rows, _meta = _flushed(rig)
    assert _strs(rows["name"]) == ["broadcast"] and rows["bytes"].tolist() == [16]


# -- events -----------------------------------------------------------------------------------


def test_pending_events_wait_until_done_and_the_flush_thread_never_queries(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)
    rig.timing.flush()
    assert not list(rig.out.glob("chunk-*"))  # nothing completed
    gpu.complete_all()
    queries = gpu.queries
    rig.timing.flush()
    assert gpu.queries == queries and not list(rig.out.glob("chunk-*"))  # no CUDA off-thread
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)  # the program's next call drains the first
    rig.timing.flush()
    assert _chunks(rig.out)[0].collectives["seq"].tolist() == [0]
    rig.timing.flush(final=True)  # the second never completes
    assert _chunks(rig.out)[1].meta["warnings"] == {nccl_timing.W_UNFINISHED: 1}


def test_calls_on_a_capturing_stream_are_counted_not_timed(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    gpu.capturing.add(0x80)
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0x80)
    assert gpu.events == []  # nothing recorded into the graph
    comm.allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0x81)
    rows, meta = _flushed(rig)
    assert rows["seq"].tolist() == [1]
    assert meta["warnings"] == {W_CAPTURE: 1}


def test_paused_calls_keep_counting_seq_but_write_no_rows(rig: Rig) -> None:
    comm = rig.nccl.NcclCommunicator(2, UID, 0)
    rig.timing.pause()
    comm.allReduce(1, 2, 4, rig.nccl.NCCL_FLOAT32, 0, 0)
    rig.timing.resume()
    comm.allReduce(1, 2, 4, rig.nccl.NCCL_FLOAT32, 0, 0)
    rows, _meta = _flushed(rig)
    assert rows["seq"].tolist() == [1]


# -- groups -----------------------------------------------------------------------------------


def test_grouped_calls_are_timed_around_the_outermost_group_end(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    gpu.stream_device.update({0xA0: 0, 0xA1: 1})
    comms = nccl.NcclCommunicator.initAll([0, 1])  # one process, two GPUs
    gpu.now_ms = 1.0
    nccl.groupStart()
    nccl.groupStart()  # nested: only the outermost groupEnd launches
    comms[0].allReduce(1, 2, 256, nccl.NCCL_FLOAT32, 0, 0xA0)
    comms[1].allReduce(1, 2, 256, nccl.NCCL_FLOAT32, 0, 0xA1)
    nccl.groupEnd()
    assert gpu.events == []  # nothing launched, nothing recorded
    gpu.now_ms = 4.0
    nccl.groupEnd()  # launches both: 4.0 -> 10.0
    assert sorted(e.t_ms for e in gpu.events) == [4.0] * 4 + [10.0] * 2  # 2 anchors, 2 pairs
    rows, _meta = _flushed(rig)
    assert rows["rank"].tolist() == [0, 1] and rows["device"].tolist() == [0, 1]
    assert rows["seq"].tolist() == [0, 0]  # one call per rank of the communicator
    assert set(_strs(rows["comm"])) == {f"cupy-{os.getpid()}-all1"}
    # each device's anchor read the host clock in turn: 1_000_005, then 1_000_025
    assert rows["start_ns"].tolist() == [1_000_005, 1_000_025]
    assert (rows["end_ns"] - rows["start_ns"]).tolist() == [6_000_000] * 2


def test_grouped_calls_on_one_stream_share_its_span(rig: Rig) -> None:
    nccl, gpu = rig.nccl, rig.gpu
    comm = nccl.NcclCommunicator(2, UID, 0)
    nccl.groupStart()
    comm.send(1, 100, nccl.NCCL_INT8, 1, 0x90)
    comm.recv(2, 100, nccl.NCCL_INT8, 1, 0x90)
    nccl.groupEnd()
    assert len([e for e in gpu.events if e.stream == 0x90]) == 2  # one start, one end
    comm.allReduce(1, 2, 1, nccl.NCCL_INT8, 0, 0x90)  # outside a group: its own pair
    rows, _meta = _flushed(rig)
    assert _strs(rows["name"]) == ["send", "recv", "allReduce"]
    assert rows.loc[0, "start_ns"] == rows.loc[1, "start_ns"]
    assert rows.loc[0, "end_ns"] == rows.loc[1, "end_ns"] == rows.loc[2, "start_ns"]
    assert (rows["end_ns"] - rows["start_ns"]).tolist() == [6_000_000, 6_000_000, 3_000_000]


# -- beside torch.distributed ---------------------------------------------------------------------


def test_torch_and_cupy_calls_share_one_collector_with_separate_anchors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_nccl_timing import FakeCuda, FakeTensor, fake_collector

    cuda = FakeCuda()
    timing, fake_dist = fake_collector(tmp_path, cuda)
    rig = make_rig(tmp_path, monkeypatch, timing=timing)
    fake_dist.all_reduce(FakeTensor(8))  # torch's anchor on device 0
    rig.nccl.NcclCommunicator(4, UID, 0).allReduce(1, 2, 8, rig.nccl.NCCL_FLOAT32, 0, 0)
    for event in cuda.events:
        event.done = True
    rig.gpu.complete_all()
    timing.flush(final=True)
    rig.undo()
    timing.unpatch()
    rows = merge(_chunks(tmp_path)).collectives
    assert _strs(rows["name"]) == ["all_reduce", "allReduce"]
    assert _strs(rows["comm"]) == ["7", UID_KEY]
    assert rows["bytes"].tolist() == [16, 32]
    assert rows["rank"].tolist() == [2, 2]  # the process's rank (torch's), not rank_id() 0
    assert _chunks(tmp_path)[0].meta["warnings"] == {}  # no event compared across APIs
def test_the_collector_installs_cupy_timing_when_cupy_nccl_is_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cupy, nccl, gpu = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.delenv("RANK", raising=False)
    hooks: dict[str, Any] = {}
    timing = nccl_timing.create(tmp_path, {}, on_import=hooks.__setitem__, final_wait_s=0.01)
    timing.start()
    assert set(hooks) == {"torch.distributed", "cupy.cuda.nccl"}
    hooks["cupy.cuda.nccl"](nccl)  # the program imports cupy.cuda.nccl
    nccl.NcclCommunicator(2, UID, 1).allReduce(1, 2, 4, nccl.NCCL_FLOAT32, 0, 0)
    gpu.complete_all()
    timing.flush(final=True)
    timing.unpatch()
    assert not hasattr(vars(nccl.NcclCommunicator)["allReduce"], "__wrapped__")
    rows = merge(_chunks(tmp_path)).collectives
    assert _strs(rows["name"]) == ["allReduce"] and rows["bytes"].tolist() == [16]
