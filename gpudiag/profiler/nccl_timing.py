"""The `nccl` plugin of `gpudiag profile`: torch.distributed collectives timed in-process.

    collector = create(Path("run/procs/host-42-rank0/nccl"), {"flush_interval_s": 1.0})
    collector.start()            # wraps the collectives once torch.distributed is imported
    collector.flush(final=True)  # chunk-000001/ holding a `collectives` table

Why: Kineto and CUPTI see NCCL kernels, but only while a profiler runs and without the call
that launched them; these thin wrappers see every call with its message size, dtype, group
and order, for the whole run, at a few microseconds per call.

**What is wrapped.** The functions in `CALLS`, on `torch.distributed` and on
`torch.distributed.distributed_c10d` (so calls between them, such as `all_gather_object` ->
`all_gather`, are seen too; a call made inside another wrapped call is not recorded twice).
Not seen: code that did `from torch.distributed import all_reduce` before the patch keeps
the original; DDP's C++ reducer; functional collectives (`_functional_collectives`, DTensor,
FSDP2, compiled graphs). Under `torch.compile` the wrapper calls the original at once,
so Dynamo still maps it to a functional collective.

**GPU tensors.** Two CUDA events on the tensor's current stream around the call: NCCL's stream
waits for that stream before it starts and (`async_op=False`) that stream waits for NCCL after
it, so [start, end] runs from "inputs ready" to "collective done", including the wait for late
ranks (what `collectives_skew` measures) and any queue behind earlier collectives. For async
calls (a `Work`, or `batch_isend_irecv`'s list) the end event is recorded in a done-callback of
the Work's future, which torch runs on a stream that waits for the collective (the CUDA-aware
future DDP comm hooks rely on). Events are never waited for: they are `query()`ed when the
program calls its next collective on the GPU (in its own thread), and at the final flush. The
flush thread never touches CUDA: an event query from another thread invalidates a CUDA-graph
capture in progress (the NCCL watchdog crashed captures so, pytorch#104487). Calls inside a
capture are counted, not timed.

**Clocks.** Event times are relative; to place them on `time.time_ns()` each device has an
anchor: an event recorded on a private stream (nothing queued on it, so no user work is waited
for) and synchronized, between two `time.time_ns()` readings t0 <= GPU time <= t1; the anchor
is their midpoint, its error (t1 - t0) / 2, typically a few µs (best of 3 tries). It is taken
at the first collective on a device and again every 10 s (`REANCHOR_NS`): float32 `elapsed_time`
then rounds by < 0.5 µs, and the GPU timer's drift against the host clock can only build up for
10 s; each new anchor measures that drift (its time as the old anchor predicts it vs. as read).
Error of a start time <= clock_error_ns + clock_drift_ns (both the largest seen, in
`meta["nccl_timing"]`) + ~1 µs; durations come from the start/end pair alone (~0.5 µs).

**CPU tensors (gloo)** and `barrier` (which blocks the host on every backend): `time.time_ns()`
around the call, device NA; async calls end when the Work's future completes (its callback's
clock). A Work without a future is not timed (counted in `meta["warnings"]`). `seq` counts every
call of this process per communicator, timed or not (paused, captured, coalesced), so it matches
across ranks. At exit, pending events are polled for at most `final_wait_s` (default 2 s) rather
than `torch.cuda.synchronize()`, which would hang forever behind a collective whose peer died.
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from gpudiag.errors import CollectorError

if TYPE_CHECKING:
    import pandas as pd

MODULE = "torch.distributed"
FORMAT = "gpudiag-nccl-timing"
#: call name -> (op, the parameter holding the message, how its size S is read (nccl-tests'
#: S: all_gather output bytes, reduce_scatter and all_to_all input bytes, others the tensor))
CALLS: dict[str, tuple[str, str, str]] = {
    "all_reduce": ("all_reduce", "tensor", "tensor"),
    "all_gather": ("all_gather", "tensor_list", "list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "tensor"),
    "all_gather_single": ("all_gather", "output_tensor", "tensor"),
    "_all_gather_base": ("all_gather", "output_tensor", "tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list", "list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input", "tensor"),
    "_reduce_scatter_base": ("reduce_scatter", "input", "tensor"),
    "broadcast": ("broadcast", "tensor", "tensor"),
    "reduce": ("reduce", "tensor", "tensor"),
    "all_to_all": ("all_to_all", "input_tensor_list", "list"),
    "all_to_all_single": ("all_to_all", "input", "tensor"),
    "barrier": ("barrier", "", "none"),
    "send": ("send", "tensor", "tensor"),
    "recv": ("recv", "tensor", "tensor"),
    "isend": ("send", "tensor", "tensor"),
    "irecv": ("recv", "tensor", "tensor"),
    "batch_isend_irecv": ("send_recv", "p2p_op_list", "p2p"),
}
#: one collective as kept until it is written (the `collectives` columns, less pid and kernel_id)
ROW_FIELDS = ("rank", "device", "stream", "start_ns", "end_ns", "op", "bytes", "dtype",
              "group_size", "comm", "seq", "name")
_ROW_DTYPES = {"rank": "Int64", "device": "Int64", "stream": "Int64", "start_ns": "int64",
               "end_ns": "int64", "bytes": "Int64", "group_size": "Int64", "seq": "Int64"}
REANCHOR_NS = 10_000_000_000
ANCHOR_TRIES = 3
ANCHOR_GOOD_NS = 20_000
FINAL_WAIT_S = 2.0
_MARK = "_gpudiag_nccl_timing"
W_FAILED = "nccl timing: internal failures (swallowed; the calls ran normally)"
W_CAPTURE = "nccl timing: collectives inside a CUDA graph capture (not timed)"
W_COALESCED = "nccl timing: collectives inside a coalescing manager (not timed)"
W_NO_FUTURE = "nccl timing: async collectives without a future (not timed)"
W_UNFINISHED = "nccl timing: collectives still running at exit (not written)"
W_OTHER_DEVICE = "nccl timing: collectives on devices other than CUDA and CPU (not timed)"
W_REPATCHED = "nccl timing: wrappers replaced by other code (left in place at unpatch)"

Row = tuple[Any, ...]
OnImport = Callable[[str, Callable[[ModuleType], None]], None]


def create(out_dir: Path, settings: dict[str, Any], **options: Any) -> NcclTiming:
    """The collector the bootstrap starts (options: on_import, cuda, clock, final_wait_s)."""
    return NcclTiming(out_dir, settings, **options)


@dataclass(frozen=True)
class _Call:
    """Where a wrapped function keeps its message and group (positions read once)."""

    name: str
    op: str
    kind: str
    arg: tuple[int, str] | None
    group: tuple[int, str] | None

    @classmethod
    def of(cls, name: str, original: Callable[..., Any]) -> _Call:
        op, param, kind = CALLS[name]
        names = list(inspect.signature(original).parameters)

        def where(p: str) -> tuple[int, str] | None:
            return (names.index(p), p) if p in names else None

        return cls(name, op, kind, where(param) if param else None, where("group"))


@dataclass(frozen=True)
class _Anchor:
    event: Any
    ns: int
    error_ns: int
    taken_ns: int  # monotonic, to know when to take a new one


@dataclass(eq=False)
class _Token:
    """One outermost call being timed: what its row will say, and its clocks."""

    call: _Call
    rank: int | None
    comm: str
    group_size: int | None
    seq: int
    nbytes: int | None
    dtype: str | None
    device: int | None = None
    stream: int | None = None
    t0_ns: int = 0
    start: Any = None
    anchor: _Anchor | None = None
    ends: list[Any] = field(default_factory=list)  # events (GPU) or time_ns (host)
    expected: int = 1

    def row(self, start_ns: int, end_ns: int) -> Row:
        return (self.rank, self.device, self.stream, start_ns, end_ns, self.call.op,
                self.nbytes, self.dtype, self.group_size, self.comm, self.seq, self.call.name)


_COUNTED = object()  # a call that was counted in seq but is not timed


class _TorchCuda:
    """The torch.cuda calls of the GPU path, in one place (tests pass a fake instead)."""

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda

    def event(self) -> Any:
        return self._cuda.Event(enable_timing=True)

    def current_stream(self, device: int) -> Any:
        return self._cuda.current_stream(device)

    def new_stream(self, device: int) -> Any:
        return self._cuda.Stream(device=device, priority=-1)  # rarely shared with user streams

    def current_device(self) -> int:
        return int(self._cuda.current_device())

    def capturing(self) -> bool:
        return bool(self._cuda.is_current_stream_capturing())


class NcclTiming:
    """Wraps torch.distributed's collectives and writes what they took (see the module doc)."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], *,
                 on_import: OnImport | None = None, cuda: Any = None,
                 clock: Callable[[], int] = time.time_ns,
                 final_wait_s: float = FINAL_WAIT_S) -> None:
        self.settings = dict(settings)
        self._on_import = on_import
        self._cuda = cuda
        self._clock = clock
        self._final_wait_s = final_wait_s
        self._chunk_interval_s = float(settings.get("chunk_interval_s") or 0.0)
        self._patched: list[tuple[ModuleType, str, Any, Any]] = []
        self._dist: ModuleType | None = None
        self._enabled = False
        self._reset(out_dir)

    def _reset(self, out_dir: Path) -> None:
        """State that belongs to one process (again in a forked child)."""
        self.out_dir = Path(out_dir)
        self.pid = os.getpid()
        self._lock = threading.RLock()
        self._local = threading.local()
        self._done: list[Row] = []
        self._pending: dict[tuple[Any, Any], deque[_Token]] = {}
        self._host_waiting: set[_Token] = set()
        self._anchors: dict[int, _Anchor] = {}
        self._streams: dict[int, Any] = {}
        self._seq: dict[str, int] = {}
        self._warnings: Counter[str] = Counter()
        self._chunks = 0
        self._last_chunk_s = float("-inf")
        self._paused = False
        self._rank: int | None = None
        self._world_size: int | None = None
        self._clock_error_ns = 0
        self._drift_ns = 0
        self._first_error: str | None = None

    # -- the collector contract -------------------------------------------------------------

    def start(self) -> None:
        """Have the wrappers installed right after torch.distributed is imported."""
        hook = self._on_import or _bootstrap_hook()
        if hook is not None:
            hook(MODULE, self._install)
            return
        module = sys.modules.get(MODULE)
        if module is None:
            raise CollectorError("nccl timing needs gpudiag.profiler.bootstrap.on_import "
                                 "(or torch.distributed imported first); collectives not timed")
        self._install(module)

    def pause(self) -> None:
        self._paused = True  # seq keeps counting, so ranks stay matched

    def resume(self) -> None:
        self._paused = False

    def after_fork(self, out_dir: Path) -> None:
        """A forked child starts empty: the parent's events and rows are not its own."""
        self._reset(out_dir)

    def flush(self, final: bool = False) -> None:
        """Write the rows completed since the last chunk as one new chunk directory.

        `settings["chunk_interval_s"]` (default 0: every flush) spaces chunks out: each costs
        ~20 ms to write and ~30 ms to merge, which adds up over hours of 1 s flushes, at the
        price of losing up to that interval's rows on a SIGKILL. Only the final flush (at exit,
        in the exiting thread) polls pending CUDA events; the periodic ones never touch CUDA
        (see the module doc: graph captures).
        """
        if os.getpid() != self.pid:
            return
        if final:
            self._drain_until(time.monotonic() + self._final_wait_s)
        elif time.monotonic() - self._last_chunk_s < self._chunk_interval_s:
            return  # fewer, larger chunks for long runs (settings["chunk_interval_s"])
        with self._lock:  # a final flush may overlap the flush thread's: distinct chunks
            rows, self._done = self._done, []
            warnings, self._warnings = self._warnings, Counter()
            if rows or warnings:
                self._chunks += 1
            number = self._chunks
        if rows or warnings:
            self._write_chunk(number, rows, {k: int(v) for k, v in warnings.items()})

    # -- patching -----------------------------------------------------------------------------

    def _install(self, module: ModuleType) -> None:
        """Replace the collectives of `module` and its `distributed_c10d` by wrappers."""
        self._dist = module
        self._enabled = True
        c10d = getattr(module, "distributed_c10d", None)
        wrappers: dict[int, Any] = {}  # one wrapper per original, shared by both modules
        for target in [module] + ([c10d] if isinstance(c10d, ModuleType) else []):
            for name in CALLS:
                current = getattr(target, name, None)
                if not callable(current) or getattr(current, _MARK, False):
                    continue
                try:
                    wrapper = wrappers.get(id(current)) or self._wrap(name, current)
                except (TypeError, ValueError) as exc:  # no readable signature
                    self._fail(exc)
                    continue
                wrappers[id(current)] = wrapper
                setattr(target, name, wrapper)
                self._patched.append((target, name, current, wrapper))
        try:
            _import_writer()
        except Exception as exc:  # then the flushes fail and say so; the program runs on
            self._fail(exc)

    def unpatch(self) -> None:
        """Put the original functions back (wrappers others already hold just call through)."""
        for target, name, original, wrapper in reversed(self._patched):
            if getattr(target, name, None) is wrapper:
                setattr(target, name, original)
            else:
                self._warn(W_REPATCHED)
        self._patched.clear()
        self._enabled = False

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        call = _Call.of(name, original)
        enter, leave, finish = self._enter, self._leave, self._finish

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return original(*args, **kwargs)
            token = enter(call, args, kwargs)
            if token is None:
                return original(*args, **kwargs)
            try:
                result = original(*args, **kwargs)
            finally:
                leave()
            finish(token, result)
            return result

        setattr(wrapper, _MARK, True)
        return wrapper

    # -- per call (the user's thread) -------------------------------------------------------

    def _enter(self, call: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        """None: call straight through (disabled, or nested in a timed call); else a token."""
        local = self._local
        if not self._enabled or getattr(local, "busy", False):
            return None
        local.busy = True
        try:
            return self._begin(call, args, kwargs)
        except Exception as exc:
            self._fail(exc)
            return _COUNTED

    def _leave(self) -> None:
        self._local.busy = False

    def _begin(self, call: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        dist: Any = self._dist
        c10d = getattr(dist, "distributed_c10d", dist)
        value = _arg(args, kwargs, call.arg)
        group = _arg(args, kwargs, call.group)
        if call.kind == "p2p" and value:
            group = getattr(value[0], "group", None)
        group = c10d._get_default_group() if group is None else group
        if c10d._rank_not_in_group(group):
            return _COUNTED  # nothing runs on this rank
        comm, size = _comm_of(group, c10d)
        with self._lock:
            seq = self._seq.get(comm, 0)
            self._seq[comm] = seq + 1
        if self._paused:
            return _COUNTED
        if group in getattr(getattr(c10d, "_world", None), "pg_coalesce_state", ()):
            self._warn(W_COALESCED)
            return _COUNTED
        if self._rank is None:
            self._rank, self._world_size = int(dist.get_rank()), int(dist.get_world_size())
        tensors = _tensors(call.kind, value)
        token = _Token(call, self._rank, comm, size, seq,
                       None if call.kind == "none" else _nbytes(tensors), _dtype(tensors))
        if tensors and getattr(tensors[0], "is_cuda", False) and call.op != "barrier":
            return self._begin_gpu(token, tensors[0].device)
        if tensors and getattr(tensors[0].device, "type", "cpu") != "cpu" and call.op != "barrier":
            self._warn(W_OTHER_DEVICE)  # XPU, HPU...: the host sees only the enqueue
            return _COUNTED
        token.t0_ns = self._clock()
        return token

    def _begin_gpu(self, token: _Token, device: Any) -> object:
        cuda = self._cuda_api()
        if cuda.capturing():
            self._warn(W_CAPTURE)
            return _COUNTED
        index = cuda.current_device() if device.index is None else int(device.index)
        token.anchor = self._anchor(cuda, index)
        stream = cuda.current_stream(index)
        token.device, token.stream = index, int(stream.stream_id)
        token.start = cuda.event()
        token.start.record(stream)
        return token

    def _finish(self, token: object, result: Any) -> None:
        """After the call returned: close its timing, convert what completed. Never raises."""
        end_ns = self._clock()
        try:
            if isinstance(token, _Token):
                works = _works(result)
                if works:
                    self._await(token, works)
                elif token.start is not None:
                    self._end_event(token)
                    self._queue(token)
                else:
                    self._keep(token.row(token.t0_ns, end_ns))
                if token.start is not None:  # not capturing (checked): CUDA calls are safe here
                    self._drain()
        except Exception as exc:
            self._fail(exc)

    def _await(self, token: _Token, works: list[Any]) -> None:
        """Async: the end comes from each Work's future (GPU: an event on its callback stream)."""
        try:
            futures = [work.get_future() for work in works]
        except Exception:  # some Work types have no future
            self._warn(W_NO_FUTURE)
            return
        token.expected = len(futures)
        if token.start is None:
            with self._lock:
                self._host_waiting.add(token)
        try:
            for future in futures:  # may run at once; no child future, unlike then()
                future.add_done_callback(functools.partial(self._work_done, token))
        except Exception:  # neither wait for it at exit nor let it block its stream's queue
            with self._lock:
                self._host_waiting.discard(token)
            raise
        if token.start is not None:
            self._queue(token)

    def _work_done(self, token: _Token, _future: Any) -> None:
        try:
            if token.start is not None:
                self._end_event(token)
                return
            with self._lock:
                token.ends.append(self._clock())
                complete = len(token.ends) == token.expected
                if complete:
                    self._host_waiting.discard(token)
            if complete:
                self._keep(token.row(token.t0_ns, max(token.ends)))
        except Exception as exc:
            self._fail(exc)

    def _end_event(self, token: _Token) -> None:
        cuda = self._cuda_api()
        assert token.device is not None
        event = cuda.event()
        event.record(cuda.current_stream(token.device))
        token.ends.append(event)

    # -- CUDA events --------------------------------------------------------------------------

    def _cuda_api(self) -> Any:
        if self._cuda is None:
            self._cuda = _TorchCuda(sys.modules["torch"].cuda)
        return self._cuda

    def _anchor(self, cuda: Any, device: int) -> _Anchor:
        """The device's anchor, taken anew every REANCHOR_NS; the old one's prediction of the
        new one's time measures the GPU timer's drift against the host clock meanwhile."""
        old = self._anchors.get(device)
        if old is not None and time.monotonic_ns() - old.taken_ns <= REANCHOR_NS:
            return old
        if device not in self._streams:
            self._streams[device] = cuda.new_stream(device)
        anchor = _take_anchor(cuda, self._streams[device], self._clock)
        self._anchors[device] = anchor
        self._clock_error_ns = max(self._clock_error_ns, anchor.error_ns)
        if old is not None:
            predicted = old.ns + round(old.event.elapsed_time(anchor.event) * 1e6)
            self._drift_ns = max(self._drift_ns, abs(anchor.ns - predicted))
        return anchor

    def _queue(self, token: _Token) -> None:
        with self._lock:
            self._pending.setdefault((token.device, token.stream), deque()).append(token)

    def _drain(self) -> int:
        """Convert the pending calls whose events completed (oldest first per stream, where
        they complete in order); returns how many are still pending."""
        with self._lock:
            for fifo in self._pending.values():
                while fifo:
                    try:
                        row = _gpu_row(fifo[0])
                    except Exception as exc:  # a broken record must not block its stream
                        row = None
                        self._fail(exc)
                    if row == ():
                        break
                    fifo.popleft()
                    if row:
                        self._done.append(row)
            self._pending = {key: fifo for key, fifo in self._pending.items() if fifo}
            return sum(len(f) for f in self._pending.values()) + len(self._host_waiting)

    def _drain_until(self, deadline: float) -> None:
        left = self._drain()
        while left and time.monotonic() < deadline:
            time.sleep(0.002)
            left = self._drain()
        if left:
            self._warn(W_UNFINISHED, left)

    # -- bookkeeping and output -------------------------------------------------------------

    def _keep(self, row: Row) -> None:
        with self._lock:
            self._done.append(row)

    def _warn(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self._warnings[kind] += count

    def _fail(self, exc: BaseException) -> None:
        if self._first_error is None:
            self._first_error = f"{exc.__class__.__name__}: {exc}"
        self._warn(W_FAILED)

    def _write_chunk(self, number: int, rows: list[Row], warnings: dict[str, int]) -> None:
        from gpudiag.trace import Trace

        name = f"chunk-{number:06d}"
        tmp = self.out_dir / f".{name}.{self.pid}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        Trace(collectives=collectives_table(rows, self.pid), meta=self._meta(warnings)).save(tmp)
        os.replace(tmp, self.out_dir / name)
        self._last_chunk_s = time.monotonic()

    def _meta(self, warnings: dict[str, int]) -> dict[str, Any]:
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        return {
            "sources": [{"format": FORMAT, "pid": self.pid}], "warnings": warnings,
            "timeline": True, "rank": self._rank if env_rank is None else env_rank,
            "world_size": self._world_size if env_world is None else env_world,
            "nccl_timing": {"clock_error_ns": self._clock_error_ns,
                            "clock_drift_ns": self._drift_ns, "first_error": self._first_error},
        }


def collectives_table(rows: Sequence[Row], pid: int) -> pd.DataFrame:
    """Rows (in `ROW_FIELDS` order) as the schema's `collectives` table, sorted by start.

        table = collectives_table([(0, None, None, 10, 20, "all_reduce", 64, "float32", 2,
                                    "0", 0, "all_reduce")], pid=42)
        table.loc[0, "bytes"]   # 64
    """
    import pandas as pd

    from gpudiag.schema import TABLES

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in ROW_FIELDS]
    data: dict[str, Any] = {"pid": pd.array([pid] * len(rows), dtype="Int64")}
    for name, values in zip(ROW_FIELDS, columns, strict=True):
        data[name] = pd.array(list(values), dtype=_ROW_DTYPES.get(name, "object"))
    frame = pd.DataFrame(data).sort_values("start_ns", kind="stable", ignore_index=True)
    return TABLES["collectives"].conform(frame)


# -- helpers (no state) -------------------------------------------------------------------------


def _bootstrap_hook() -> OnImport | None:
    boot = sys.modules.get("gpudiag.profiler.bootstrap")
    hook = getattr(boot, "on_import", None)
    return hook if callable(hook) else None


def _import_writer() -> None:
    """Import what writing a chunk needs now, not first at interpreter shutdown (refused)."""
    import pyarrow.parquet  # noqa: F401 -- loaded lazily by pandas.to_parquet otherwise

    import gpudiag.trace  # noqa: F401 -- pandas and the schema


def _is_compiling() -> bool:
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    return compiler is not None and bool(compiler.is_compiling())


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[int, str] | None) -> Any:
    if where is None:
        return None
    index, name = where
    return args[index] if index < len(args) else kwargs.get(name)


def _comm_of(group: Any, c10d: Any) -> tuple[str, int | None]:
    """Process-group name ('0' for the default group, as Kineto's pg_name) and size."""
    name = getattr(group, "group_name", None)
    if not name:
        name = c10d._get_process_group_name(group)
    return str(name), int(group.size())


def _tensors(kind: str, value: Any) -> list[Any]:
    if value is None or kind == "none":
        return []
    if kind == "tensor":
        return [value]
    if kind == "p2p":  # S of a send/recv batch: the bytes sent (received when it only receives)
        sent = [op.tensor for op in value if "send" in getattr(op.op, "__name__", "")]
        return sent or [op.tensor for op in value]
    return list(value)


def _nbytes(tensors: list[Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def _dtype(tensors: list[Any]) -> str | None:
    return str(tensors[0].dtype).removeprefix("torch.") if tensors else None


def _works(result: Any) -> list[Any]:
    """The async Work objects a call returned (none for a synchronous call)."""
    if result is None:
        return []
    items = result if isinstance(result, list | tuple) else [result]
    return [w for w in items if hasattr(w, "get_future")]


def _take_anchor(cuda: Any, stream: Any, clock: Callable[[], int]) -> _Anchor:
    """The tightest of a few (event, epoch ns) pairs: record on an idle private stream and
    synchronize that event only, so t0 <= its GPU time <= t1."""
    best: _Anchor | None = None
    for _ in range(ANCHOR_TRIES):
        event = cuda.event()
        t0 = clock()
        event.record(stream)
        event.synchronize()
        t1 = clock()
        if best is None or (t1 - t0 + 1) // 2 < best.error_ns:
            best = _Anchor(event, (t0 + t1) // 2, (t1 - t0 + 1) // 2, time.monotonic_ns())
        if best.error_ns <= ANCHOR_GOOD_NS:
            break
    assert best is not None
    return best


def _gpu_row(token: _Token) -> Row:
    """The row of a GPU call whose events all completed; () while any is still pending."""
    if len(token.ends) < token.expected or not all(e.query() for e in token.ends):
        return ()
    anchor = token.anchor
    assert anchor is not None
    start_ns = anchor.ns + round(anchor.event.elapsed_time(token.start) * 1e6)
    dur_ns = max(round(token.start.elapsed_time(e) * 1e6) for e in token.ends)
    return token.row(start_ns, start_ns + max(dur_ns, 0))


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None
