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

**Clocks.** Per-device anchors put event times on `time.time_ns()`: see `nccl_clock`, which
holds the GPU side; `nccl_rows` holds what a row says and writes the chunks.

**CPU tensors (gloo)** and `barrier` (which blocks the host on every backend): `time.time_ns()`
around the call, device NA; async calls end when the Work's future completes (its callback's
clock). A Work without a future is not timed (counted in `meta["warnings"]`). `seq` counts every
call of this process per communicator, timed or not (paused, captured, coalesced), so it matches
across ranks. At exit, pending events are polled for at most `final_wait_s` (default 2 s) rather
than `torch.cuda.synchronize()`, which would hang forever behind a collective whose peer died.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from gpudiag.collectors.nccl import cupy_comm as nccl_cupy
from gpudiag.collectors.nccl.clock import GpuClock
from gpudiag.collectors.nccl.rows import (
    CALLS,
    MARK,
    W_CAPTURE,
    W_REPATCHED,
    Call,
    Row,
    Token,
    call_arg,
    collectives_table,
    comm_of,
    dtype_of,
    import_writer,
    nbytes_of,
    tensors_of,
    works_of,
    write_chunk,
)
from gpudiag.errors import CollectorError

# collectives_table lives in nccl_rows; the tests import it from here
__all__ = ["NcclTiming", "collectives_table", "create"]

MODULE = "torch.distributed"
CUPY_MODULE = "cupy.cuda.nccl"  # NcclCommunicator: see nccl_cupy
FORMAT = "gpudiag-nccl-timing"
FINAL_WAIT_S = 2.0
W_FAILED = "nccl timing: internal failures (swallowed; the calls ran normally)"
W_COALESCED = "nccl timing: collectives inside a coalescing manager (not timed)"
W_NO_FUTURE = "nccl timing: async collectives without a future (not timed)"
W_UNFINISHED = "nccl timing: collectives still running at exit (not written)"
W_OTHER_DEVICE = "nccl timing: collectives on devices other than CUDA and CPU (not timed)"

OnImport = Callable[[str, Callable[[ModuleType], None]], None]


def create(out_dir: Path, settings: dict[str, Any], **options: Any) -> NcclTiming:
    """The collector the bootstrap starts (options: on_import, cuda, clock, final_wait_s)."""
    return NcclTiming(out_dir, settings, **options)


_COUNTED = object()  # a call that was counted in seq but is not timed


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
        self._unpatch_cupy: list[Callable[[], None]] = []
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
        self._gpu = GpuClock(self._cuda, self._clock)  # anchors, streams, pending events
        self._host_waiting: set[Token] = set()
        self._seq: dict[str, int] = {}
        self._warnings: Counter[str] = Counter()
        self._chunks = 0
        self._last_chunk_s = float("-inf")
        self._paused = False
        self._rank: int | None = None
        self._world_size: int | None = None
        self._first_error: str | None = None

    # -- the collector contract -------------------------------------------------------------

    def start(self) -> None:
        """Have the wrappers installed once torch.distributed or cupy.cuda.nccl is imported."""
        hook = self._on_import or _bootstrap_hook()
        if hook is not None:
            hook(MODULE, self._install)
            hook(CUPY_MODULE, self._install_cupy)
            return
        module, cupy = sys.modules.get(MODULE), sys.modules.get(CUPY_MODULE)
        if module is None and cupy is None:
            raise CollectorError("nccl timing needs gpudiag.profiler.bootstrap.on_import (or "
                                 "torch.distributed or cupy.cuda.nccl imported first); "
                                 "collectives not timed")
        if module is not None:
            self._install(module)
        if cupy is not None:
            self._install_cupy(cupy)

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
            self._write_chunk(number, rows, {kind: int(count) for kind, count in warnings.items()})

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
                if not callable(current) or getattr(current, MARK, False):
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
            import_writer()
        except Exception as exc:  # then the flushes fail and say so; the program runs on
            self._fail(exc)

    def _install_cupy(self, module: ModuleType) -> None:
        """CuPy's NcclCommunicator calls, timed into this collector (never raises)."""
        self._unpatch_cupy.append(nccl_cupy.install(self, module))
        try:
            import_writer()
        except Exception as exc:  # then the flushes fail and say so; the program runs on
            self._fail(exc)

    def unpatch(self) -> None:
        """Put the original functions back (wrappers others already hold just call through)."""
        while self._unpatch_cupy:
            self._unpatch_cupy.pop()()
        for target, name, original, wrapper in reversed(self._patched):
            if getattr(target, name, None) is wrapper:
                setattr(target, name, original)
            else:
                self._warn(W_REPATCHED)
        self._patched.clear()
        self._enabled = False

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        call = Call.of(name, original)
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

        setattr(wrapper, MARK, True)
        return wrapper

    # -- per call (the user's thread) -------------------------------------------------------

    def _enter(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
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

    def _begin(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        dist: Any = self._dist
        c10d = getattr(dist, "distributed_c10d", dist)
        value = call_arg(args, kwargs, call.arg)
        group = call_arg(args, kwargs, call.group)
        if call.kind == "p2p" and value:
            group = getattr(value[0], "group", None)
        group = c10d._get_default_group() if group is None else group
        if c10d._rank_not_in_group(group):
            return _COUNTED  # nothing runs on this rank
        comm, size = comm_of(group, c10d)
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
        tensors = tensors_of(call.kind, value)
        token = Token(call, self._rank, comm, size, seq,
                       None if call.kind == "none" else nbytes_of(tensors), dtype_of(tensors))
        if tensors and getattr(tensors[0], "is_cuda", False) and call.op != "barrier":
            return self._begin_gpu(token, tensors[0].device)
        if tensors and getattr(tensors[0].device, "type", "cpu") != "cpu" and call.op != "barrier":
            self._warn(W_OTHER_DEVICE)  # XPU, HPU...: the host sees only the enqueue
            return _COUNTED
        token.t0_ns = self._clock()
        return token

    def _begin_gpu(self, token: Token, device: Any) -> object:
        if not self._gpu.start(token, device):
            self._warn(W_CAPTURE)
            return _COUNTED
        return token

    def _finish(self, token: object, result: Any) -> None:
        """After the call returned: close its timing, convert what completed. Never raises."""
        end_ns = self._clock()
        try:
            if isinstance(token, Token):
                works = works_of(result)
                if works:
                    self._await(token, works)
                elif token.start is not None:
                    self._gpu.end(token)
                    self._queue(token)
                else:
                    self._keep(token.row(token.t0_ns, end_ns))
                if token.start is not None:  # not capturing (checked): CUDA calls are safe here
                    self._drain()
        except Exception as exc:
            self._fail(exc)

    def _await(self, token: Token, works: list[Any]) -> None:
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

    def _work_done(self, token: Token, _future: Any) -> None:
        try:
            if token.start is not None:
                self._gpu.end(token)
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

    # -- CUDA events --------------------------------------------------------------------------

    def _queue(self, token: Token) -> None:
        with self._lock:
            self._gpu.queue(token)

    def _drain(self) -> int:
        """Convert the pending calls whose events completed (oldest first per stream, where
        they complete in order); returns how many are still pending."""
        with self._lock:
            self._done += self._gpu.completed(self._fail)
            return self._gpu.waiting() + len(self._host_waiting)

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
        write_chunk(self.out_dir, f"chunk-{number:06d}", self.pid, rows, self._meta(warnings))
        self._last_chunk_s = time.monotonic()

    def _meta(self, warnings: dict[str, int]) -> dict[str, Any]:
        env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        return {
            "sources": [{"format": FORMAT, "pid": self.pid}], "warnings": warnings,
            "timeline": True, "rank": self._rank if env_rank is None else env_rank,
            "world_size": self._world_size if env_world is None else env_world,
            "nccl_timing": {"clock_error_ns": self._gpu.error_ns,
                            "clock_drift_ns": self._gpu.drift_ns, "first_error": self._first_error},
        }


# -- helpers (no state) -------------------------------------------------------------------------


def _bootstrap_hook() -> OnImport | None:
    boot = sys.modules.get("gpudiag.profiler.bootstrap")
    hook = getattr(boot, "on_import", None)
    return hook if callable(hook) else None


def _is_compiling() -> bool:
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    return compiler is not None and bool(compiler.is_compiling())


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None
