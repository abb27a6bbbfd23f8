"""The `nccl` plugin's second source: CuPy's NCCL calls, timed like torch.distributed's.

    undo = install(timing, sys.modules["cupy.cuda.nccl"])  # timing: nccl_timing.create(...)
    comm.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, s.ptr)
    undo()  # the originals are back; wrappers others still hold call straight through

Why: CuPy programs (cupyx.distributed, Chainer-style multi-node code) call NCCL through
`cupy.cuda.nccl.NcclCommunicator`, which torch.distributed's wrappers never see. Rows, pending
events, the drain in the program's thread and the final flush are `nccl_timing`'s; this module
only knows CuPy: which methods are collectives, their sizes, communicators and streams.

**What is wrapped.** The `METHODS` of NcclCommunicator, its `__init__` and `initAll` (to name
communicators), and `groupStart`/`groupEnd`. NcclCommunicator is a Cython extension type, which
CPython refuses to change; then a subclass of the same name with the wrapped methods replaces
`NcclCommunicator` in `cupy.cuda.nccl` and `cupy_backends.cuda.libs.nccl`. Communicators made
through those names (as cupyx.distributed makes them) are timed; ones made through a reference
to the class taken before the patch are not.

**A row.** S as nccl-tests defines it: count x element size; all_gather's output and
reduce_scatter's input are count x ranks x size (CuPy passes the per-rank count). `comm`:
`cupy-<12 hex of the NCCL unique id>` for `NcclCommunicator(n, unique_id, rank)`, the same on
every rank, so (comm, seq) matches calls across ranks; `cupy-<pid>-all<k>` for the ranks of one
`initAll` (all in this process); `cupy-<pid>-<id>` for any other. `rank`: `$RANK`, else
torch.distributed's, else `comm.rank_id()` (always that after `initAll`); `seq` counts per
(comm, rank). `stream`: the `cudaStream_t` the call passed; `device`: `comm.device_id()`.

**Events.** Two CUDA events on the call's stream (`ExternalStream(ptr)`, with the communicator's
device current) around the call, queried like torch's: in the program's thread at its next
timed collective, and at the final flush. CuPy events cannot be compared with torch's, so each
device has its own CuPy anchor (taken by `nccl_clock` as torch's are); the largest error and
drift of both go to `meta["nccl_timing"]`. Calls on a capturing stream are counted, not timed.

**Groups.** Between `groupStart()` and `groupEnd()` NCCL only queues calls; the outermost
`groupEnd()` launches them. So grouped calls get their events just before and after that
`groupEnd()`, on their own streams: grouped calls on one stream share one span (NCCL fuses
them); `initAll` communicators on their own streams get one each. A group opened through a
`groupStart` taken before the patch is not seen: its calls end, wrongly, before their launch.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudiag.collectors.nccl.clock import Anchor, GpuClock
from gpudiag.collectors.nccl.cupy_patch import DATATYPES, Method, Patcher
from gpudiag.collectors.nccl.rows import W_CAPTURE, Token, call_arg

_COUNTED = object()  # a call counted in seq but not timed


def install(timing: Any, cupy_module: Any) -> Callable[[], None]:
    """Wrap CuPy's NCCL calls for `timing` (an `NcclTiming`); returns the unpatch function.

        undo = install(timing, importlib.import_module("cupy.cuda.nccl"))
        undo()

    `cupy_module`: `cupy.cuda.nccl` (what the import hook passes), or `cupy` once the program
    imported `cupy.cuda.nccl`. Never raises (it runs inside the program's import statement): a
    failure is counted in the collector's warnings, and then nothing stays patched.
    """
    patcher: Patcher | None = None
    try:
        cuda, nccl = _modules(cupy_module)
        if cuda is None or not isinstance(getattr(nccl, "NcclCommunicator", None), type):
            return _nothing  # no NCCL in this CuPy build (cupy.cuda.nccl.available is False)
        patcher = Patcher(CupyTiming(_Shared(timing), _CupyCuda(cuda), nccl))
        patcher.patch(nccl)
        return patcher.unpatch
    except Exception as exc:
        _Shared(timing).fail(exc)
        if patcher is not None:
            patcher.unpatch()
        return _nothing


def _nothing() -> None:
    return None


def _modules(module: Any) -> tuple[Any, Any]:
    """(cupy.cuda, cupy.cuda.nccl) from either; never imports cupy.cuda.nccl (libnccl)."""
    if hasattr(module, "NcclCommunicator"):
        return getattr(sys.modules.get("cupy"), "cuda", None), module
    cuda = getattr(module, "cuda", None)
    return cuda, vars(cuda).get("nccl") if cuda is not None else None


@dataclass
class _Comm:
    """A communicator's row fields, read (NCCL calls) once, at its first collective."""

    key: str
    own_ranks: bool = False  # initAll: all its ranks in this process, rank = rank_id()
    rank: int | None = None
    size: int | None = None
    device: int = 0


class _Shared:
    """What this module uses of NcclTiming, in one place: its clock, seq counters, pause flag,
    rank, warnings, pending queue and drain (all private there)."""

    def __init__(self, timing: Any) -> None:
        self.t = timing
        self.warn, self.fail = timing._warn, timing._fail
        self.queue, self.drain = timing._queue, timing._drain

    def clock(self) -> int:
        return int(self.t._clock())

    def paused(self) -> bool:
        return bool(self.t._paused)

    def pid(self) -> int:
        return int(self.t.pid)

    def torch_rank(self) -> int | None:
        rank = self.t._rank
        return None if rank is None else int(rank)

    def next_seq(self, key: str) -> int:
        with self.t._lock:
            seq = int(self.t._seq.get(key, 0))
            self.t._seq[key] = seq + 1
        return seq

    def note_clock(self, anchors: GpuClock) -> None:
        """This module's anchor error and drift join torch's in meta["nccl_timing"]."""
        gpu = self.t._gpu
        gpu.error_ns = max(gpu.error_ns, anchors.error_ns)
        gpu.drift_ns = max(gpu.drift_ns, anchors.drift_ns)


class _Event:
    """A cupy.cuda.Event under the names GpuClock and `_gpu_row` use (torch.cuda.Event's)."""

    __slots__ = ("_elapsed", "event")

    def __init__(self, event: Any, elapsed: Callable[[Any, Any], float]) -> None:
        self.event, self._elapsed = event, elapsed

    def record(self, stream: Any) -> None:
        self.event.record(stream)

    def synchronize(self) -> None:
        self.event.synchronize()

    def query(self) -> bool:
        return bool(self.event.done)

    def elapsed_time(self, end: _Event) -> float:
        return float(self._elapsed(self.event, end.event))  # ms


class _CupyCuda:
    """The cupy.cuda calls, in one place; `event` and `new_stream` are what GpuClock.anchor
    asks of a CUDA API."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda

    def event(self) -> _Event:
        return _Event(self.cuda.Event(), self.cuda.get_elapsed_time)

    def new_stream(self, device: int) -> Any:
        with self.cuda.Device(device):  # idle and non-blocking: the anchor waits for nothing
            return self.cuda.Stream(non_blocking=True)

    def on(self, device: int) -> Any:
        """`device` made current: an event is recorded only on a stream of its own device."""
        return self.cuda.Device(device)

    def record(self, stream: int) -> _Event:
        event = self.event()
        event.record(self.cuda.ExternalStream(stream))
        return event

    def capturing(self, stream: int) -> bool:
        if getattr(getattr(self.cuda, "runtime", None), "is_hip", False):
            return False  # HIP has no capture query
        check = getattr(self.cuda.ExternalStream(stream), "is_capturing", None)
        return bool(check()) if check is not None else False


class CupyTiming:
    """Per call, in the program's thread: names and counts it, records its events, queues it."""

    def __init__(self, shared: _Shared, cuda: _CupyCuda, nccl: Any) -> None:
        self.shared, self.cuda = shared, cuda
        self.dtypes = {int(getattr(nccl, name, value)): (dtype, size)
                       for name, (value, dtype, size) in DATATYPES.items()}
        self.comms: dict[int, _Comm] = {}
        self.enabled = True
        self.local = threading.local()  # busy (in a wrapped call), depth and grouped (groups)
        self._pid = shared.pid()
        self._anchors = GpuClock(cuda, shared.clock)
        self._init_alls = 0

    def named(self, comm: Any, unique_id: Any) -> None:
        """A communicator made from an NCCL unique id: the id names it on every rank."""
        try:
            digest = hashlib.blake2b(bytes(int(byte) & 0xFF for byte in unique_id), digest_size=6)
            self.comms[id(comm)] = _Comm(f"cupy-{digest.hexdigest()}")
        except Exception as exc:
            self.shared.fail(exc)

    def named_all(self, comms: list[Any]) -> None:
        self._init_alls += 1
        for comm in comms:
            self.comms[id(comm)] = _Comm(f"cupy-{os.getpid()}-all{self._init_alls}", True)

    def _comm(self, comm: Any) -> _Comm:
        info = self.comms.get(id(comm))
        if info is None:
            info = self.comms[id(comm)] = _Comm(f"cupy-{os.getpid()}-{id(comm):x}")
        if info.size is None:  # the process's rank; initAll's ranks all share this process
            info.rank, env = int(comm.rank_id()), os.environ.get("RANK", "").strip()
            if not info.own_ranks and env.isdigit():
                info.rank = int(env)
            elif not info.own_ranks and (torch_rank := self.shared.torch_rank()) is not None:
                info.rank = torch_rank
            info.device, info.size = int(comm.device_id()), int(comm.size())
        return info

    # -- one call ---------------------------------------------------------------------------

    def enter(self, method: Method, comm: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> object:
        """None: call straight through (disabled, or nested in a wrapped call); else a token."""
        local = self.local
        if not self.enabled or getattr(local, "busy", False):
            return None
        local.busy = True
        try:
            return self._begin(method, comm, args, kwargs)
        except Exception as exc:
            self.shared.fail(exc)
            return _COUNTED

    def leave(self) -> None:
        self.local.busy = False

    def _begin(self, method: Method, comm: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> object:
        info = self._comm(comm)
        seq = self.shared.next_seq(f"{info.key}@{info.rank}")
        if self.shared.paused():
            return _COUNTED
        count = int(call_arg(args, kwargs, method.count))
        dtype, size = self.dtypes.get(int(call_arg(args, kwargs, method.datatype)), (None, None))
        ranks = (info.size or 1) if method.per_rank else 1
        nbytes = None if size is None else count * size * ranks
        token = Token(method.call, info.rank, info.key, info.size, seq, nbytes, dtype)
        token.device, token.stream = info.device, int(call_arg(args, kwargs, method.stream))
        if self.cuda.capturing(token.stream):
            self.shared.warn(W_CAPTURE)
            return _COUNTED
        if getattr(self.local, "depth", 0) == 0:  # in a group: events at its groupEnd
            with self.cuda.on(token.device):
                token.anchor = self._anchor(token.device)
                token.start = self.cuda.record(token.stream)
        return token

    def finish(self, token: object) -> None:
        """After the call returned: its end event, or its place in the open group. Never raises."""
        if not isinstance(token, Token):
            return
        try:
            if token.start is None:
                self._grouped().append(token)
                return
            with self.cuda.on(token.device or 0):
                token.ends.append(self.cuda.record(token.stream or 0))
            self.shared.queue(token)
            self.shared.drain()
        except Exception as exc:
            self.shared.fail(exc)

    def _anchor(self, device: int) -> Anchor:
        if self._pid != self.shared.pid():  # a forked child: the parent's anchors are not its own
            self._pid, self._anchors = self.shared.pid(), GpuClock(self.cuda, self.shared.clock)
        anchor = self._anchors.anchor(self.cuda, device)
        self.shared.note_clock(self._anchors)
        return anchor

    # -- groups -----------------------------------------------------------------------------

    def _grouped(self) -> list[Token]:
        grouped: list[Token] | None = getattr(self.local, "grouped", None)
        if grouped is None:
            grouped = self.local.grouped = []
        return grouped

    def group_start(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        self.local.depth = getattr(self.local, "depth", 0) + 1
        return result

    def group_end(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The outermost groupEnd launches the group: its calls' events go around it."""
        depth = getattr(self.local, "depth", 0)
        tokens: list[Token] = []
        if depth == 1:
            tokens, self.local.grouped = self._grouped(), []
        spans = self._open(tokens)
        try:
            result = original(*args, **kwargs)
        finally:
            self.local.depth = max(depth - 1, 0)
        self._close(spans)
        return result

    def _open(self, tokens: list[Token]) -> dict[tuple[int, int], list[Token]]:
        """Start events, one per (device, stream) of the group; {} after a failure."""
        spans: dict[tuple[int, int], list[Token]] = {}
        try:
            for token in tokens:
                spans.setdefault((token.device or 0, token.stream or 0), []).append(token)
            for (device, stream), group in spans.items():
                with self.cuda.on(device):
                    anchor, start = self._anchor(device), self.cuda.record(stream)
                for token in group:
                    token.anchor, token.start = anchor, start
        except Exception as exc:
            self.shared.fail(exc)
            return {}
        return spans

    def _close(self, spans: dict[tuple[int, int], list[Token]]) -> None:
        try:
            for (device, stream), group in spans.items():
                with self.cuda.on(device):
                    end = self.cuda.record(stream)
                for token in group:
                    token.ends.append(end)
                    self.shared.queue(token)
            if spans:
                self.shared.drain()
        except Exception as exc:
            self.shared.fail(exc)
