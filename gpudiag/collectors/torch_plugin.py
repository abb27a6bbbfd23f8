"""The torch backend of `gpudiag profile`: torch.profiler (Kineto) inside the program.

Started by the bootstrap when the program first imports torch, so the profile begins at the
program's first tensor. On a CPU-only machine it records the host side (torch ops with
Python stacks, CPU memory); with CUDA, Kineto's own CUPTI session adds kernels, copies, syncs
and runtime calls. The allocator snapshot is the separate `torch_snapshot` plugin, which
also runs beside the CUPTI backend.

torch.profiler keeps its events in memory until it is stopped, so the trace is written as
*segments* (`segment-NNNN.pt.trace.json`): one per collection window, plus a new one
whenever stopping the open one would cost more than `segment_bytes`, checked ten times a
second by the bootstrap's thread (`check`). Once steps run, segments hold as many steps as a
stop measured to fit, and a new one begins when the process grew by `segment_bytes`. Before
the first step (a start-up that imports large libraries, tokenizes text, builds a model) the
process's growth is weighed by what a stop costs per byte recorded (`STOP_COST_PER_BYTE`:
about 40 with Python stacks, whose millions of calls are small while recorded and large
once stopped), so the profiler's memory stays bounded from the first second.

Kineto must be started and stopped on one thread: edges crossed elsewhere (timers, the flush
thread) are applied on the program's main thread at its next bytecode
(`inproc.main_thread_call`), else at its next step. A SIGKILL loses the open segment; the
host markers and NVML samples of the same run survive.

Two hooks serve the rest of the session: the end of every optimizer step is a step boundary
for a program that marks none (`bootstrap.optimizer_stepped`), and the open segment is
written before `torch.distributed.destroy_process_group` (a gloo process group torn down
while the profiler runs can deadlock on the GIL in its worker threads' teardown).

    plugin = create(out_dir, {"memory": True})
    plugin.start(); plugin.resume(); ...; plugin.flush(final=True)      # the bootstrap
"""

from __future__ import annotations

import atexit
import functools
import gc
import importlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.collectors import torch_host as host
from gpudiag.collectors import torch_program as program
from gpudiag.optional import require
from gpudiag.profiler.inproc import shielded

#: a new segment begins once the process grew by this much since the open one began, and
#: segments hold as many steps as stopping them costs in memory within this much
DEFAULT_SEGMENT_BYTES = 256 * 2**20
#: ... or once the open one is this old (a SIGKILL or a crash loses at most the open one)
DEFAULT_SEGMENT_S = 30.0
#: ... or once it holds this many steps, before the first stop measured what a step costs
DEFAULT_STEPS_PER_SEGMENT = 10
#: what stopping a segment costs in memory per byte the process grew while it recorded, until
#: a stop measured more (torch 2.13 on CPU, a Python-heavy start-up: 164 MB recorded with
#: Python stacks took 5.6 GB more to stop; without stacks, 130 MB took 0.8-1.0 GB). Program
#: allocations in a segment make a stop look cheaper than its events are, so a measurement
#: only ever raises these.
STOP_COST_PER_BYTE = {True: 40.0, False: 8.0}
#: how far ahead a start-up segment's growth is projected (the bootstrap's check interval)
CHECK_AHEAD_S = 0.1
#: a stop's cost per byte recorded is learned only from segments that grew at least this much
LEARN_FROM_BYTES = 2 * 2**20


def create(out_dir: Path, settings: dict[str, Any]) -> TorchCollector:
    """The collector for one process (called by the bootstrap when torch was imported)."""
    return TorchCollector(out_dir, memory=bool(settings.get("memory", True)),
                          segment_bytes=int(settings.get("segment_bytes")
                                            or DEFAULT_SEGMENT_BYTES),
                          segment_s=float(settings.get("segment_s") or DEFAULT_SEGMENT_S))


#: Kineto's log level above all of its outputs (USDT, its highest, is 5 in torch 2.13)
QUIET_KINETO = "6"


class TorchCollector:
    """torch.profiler around the program, written as bounded segments."""

    def __init__(self, out_dir: Path, *, memory: bool = True,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 segment_s: float = DEFAULT_SEGMENT_S) -> None:
        self.out_dir = out_dir
        self.memory = memory
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.torch = require("torch", "The torch backend of gpudiag profile")
        self.cuda = bool(self.torch.cuda.is_available())
        self._profiler: Any = None
        self._segments = 0
        self._finished = False
        self._lock = host.SegmentLock()  # never re-entered: see flush()
        self._owner = threading.get_ident()  # the thread that imported torch: the program's
        self._pending: list[str] = []  # edges waiting for the owner thread (_deferred)
        # the list is changed from three threads (the program's, the flush thread's checks,
        # the window's timers): an edge appended while the owner took the list was lost, and
        # a capped start-up then recorded on (the owner never saw its pause)
        self._pending_lock = threading.Lock()
        self._scheduled = False  # a main-thread call to apply them is queued
        self._in_hook = False  # inside the optimizer-step hook (inside Optimizer.step#)
        self._segment_rss = 0  # the process's resident bytes when the open segment began
        self._segment_start_s = 0.0
        self._segment_steps = 0  # steps opened while the open segment records
        self._steps_per_segment = DEFAULT_STEPS_PER_SEGMENT  # until a stop measured it
        self._optimizer: int | None = None  # id() of the optimizer whose steps are counted
        self._own = program.OwnCalls()  # set around gpudiag's own profiler starts
        self._gave_way = False  # the program started a profiler of its own (torch_program)
        self._forked = False  # a forked child: the parent's profiler state looks enabled
        self._shapes = True  # record shapes in the next segment (off from a swap to a step)
        self._segment_shapes = False  # the open segment records shapes
        self._segment_stacks = False  # the open segment records Python stacks
        self._stop_cost = dict(STOP_COST_PER_BYTE)  # by stacks: bytes a stop takes per byte
        self._stepped = False  # a step opened: segments are bounded by steps from then on
        self._restarting_since = 0  # time.time_ns() of the discard the next start follows
        self._start_pause = (0, 0)  # when the running profiler's start began and ended

    def start(self) -> None:
        """Get ready; the first segment begins at `resume()`, when the window is open.

        The final export is registered with atexit now, after torch's own hooks, so it runs
        before them (atexit is last-in, first-out); then the two hooks of the docstring, and
        what gives way to the program (`torch_program`: its own profiler, and the end of
        the thread that imported torch when that is not the main thread).
        """
        atexit.register(self._at_exit)  # before torch's atexit hooks (registered earlier)
        # Kineto writes a 'USDT: ... profiler_start/stop' line (and 'STAGE:' lines) to the
        # program's stderr at every segment, read where the profiler starts: left to itself
        # it interleaves gpudiag's segments with the program's output. No level keeps its
        # errors and drops these, and what a lost collection means gpudiag says itself;
        # a KINETO_LOG_LEVEL the user set is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO)
        program.watch_program_profilers(self.torch, self._own, self._program_started)
        program.watch_tensor_swaps(self.torch, self._before_swap)
        if self._owner != threading.main_thread().ident \
                and not program.on_thread_end(self._owner_ending):
            self._finished = True  # a thread of C's or _thread's: its end cannot be seen
            host.note_process("torch: torch was imported on a thread that Python's threading "
                              "did not start, whose end gpudiag cannot see: no torch profile "
                              "(Kineto must be stopped on the thread that started it)")
        try:  # the package deletes its `optimizer` attribute: import the module by name
            hooks = importlib.import_module("torch.optim.optimizer")
        except ImportError:
            hooks = None
        if hooks is not None and hasattr(hooks, "register_optimizer_step_post_hook"):
            hooks.register_optimizer_step_post_hook(self._optimizer_stepped)
        self._wrap_process_group_teardown()

    @shielded
    def _program_started(self) -> None:
        """The program starts a torch profiler of its own: write what gpudiag recorded and
        stop for good, before the program's starts (Kineto runs one per process)."""
        if self._gave_way:
            return
        self._gave_way = True
        host.note_process("torch: the program started its own torch.profiler: gpudiag's "
                          "torch profile ends there (what it recorded before is kept); the "
                          "program's profiler and its files are as they would be without "
                          "gpudiag")
        if threading.get_ident() != self._owner or not self._lock.acquire(blocking=False):
            self._finished = True  # stopped only on its own thread: it ends with the process
            return
        try:
            self._finished = True
            self._export_segment()
        finally:
            self._lock.release()

    @shielded
    def _before_swap(self) -> None:
        """The program swaps tensors (`torch_program.watch_tensor_swaps`): the open segment
        records shapes, whose references would make the swap fail, so it is written now and
        the next records without shapes until the next step opens."""
        if not self._segment_shapes or threading.get_ident() != self._owner or self._in_hook:
            return
        with self._lock:
            if self._profiler is None or not self._segment_shapes:
                return
            self._shapes = False
            host.note_process("torch: the program swaps tensors (torch.utils.swap_tensors: "
                              "Module.to_empty, fully_shard), which fails while torch.profiler"
                              " records shapes: from each swap to the next step, ops are "
                              "recorded without their input shapes")
            self._export_segment()
            # the stopped profiler's results keep weak references to the recorded tensors
            # in reference cycles; a small stop leaves them to the collector, and the swap
            # then failed ("Expected no weakrefs") whenever it had not run yet
            gc.collect()
            self._start_segment()

    @shielded
    def _owner_ending(self) -> None:
        """The thread that imported torch (not the main one) ends: write the open segment on
        it, then the main thread owns the profiler and goes on recording."""
        with self._lock:
            running = self._profiler is not None
            self._export_segment()
            self._owner = threading.main_thread().ident or self._owner
            with self._pending_lock:
                self._pending = [action for action in self._pending if action != "rotate"]
        if running and not self._finished:
            self._deferred("resume")

    @shielded
    def _at_exit(self) -> None:
        """The process's whole final flush, now (this segment with it): so a SIGTERM that
        arrives while it runs (a Pool terminating its workers) sees the flush under way and
        lets it end, instead of flushing again and dying in the middle of the export."""
        boot = host.bootstrap()
        if boot is not None and boot.is_active():
            boot.final_flush()
        self.flush(True)  # outside a session (capture()), or already done: a no-op then

    @shielded
    def _optimizer_stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        """Every optimizer's step ends here; one optimizer's (the first seen) count as steps,
        so two optimizers per iteration (a GAN) or accumulation still give one per step."""
        if self._optimizer is None:
            self._optimizer = id(optimizer)
        if id(optimizer) != self._optimizer:
            return
        boot = host.bootstrap()
        if boot is not None:
            self._in_hook = threading.get_ident() == self._owner
            try:
                boot.optimizer_stepped(time.time_ns())
            finally:
                self._in_hook = False
        self._wrap_step_outside(type(optimizer))

    def _wrap_step_outside(self, cls: type) -> None:
        """Wrap the class's `step` around torch's own wrapper (its `Optimizer.step#...`
        record_function), so the edges the hook crossed run right after that range closed.

        torch wraps a class's step once and marks it `hooked`; the outer wrapper keeps the
        mark (functools.wraps copies it), so torch does not wrap it again. The step that
        installs it applies its edges at the next step's end (or a main-thread call).
        """
        inner = cls.__dict__.get("step")
        if inner is None or getattr(inner, "_gpudiag_outer", False):
            return

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            if self._pending and threading.get_ident() == self._owner:
                shielded(self._apply_pending)()
            return result

        step._gpudiag_outer = True  # type: ignore[attr-defined]
        cls.step = step  # type: ignore[attr-defined]

    def _wrap_process_group_teardown(self) -> None:
        """Write the last segment before `destroy_process_group`.

        Collection ends there: a profiler started again after the teardown crashed the
        process at exit (SIGSEGV, torch 2.13, gloo), and programs end soon after it anyway.
        """
        dist: Any = getattr(self.torch, "distributed", None)
        c10d: Any = getattr(dist, "distributed_c10d", None)
        original = getattr(c10d, "destroy_process_group", None)
        if original is None or getattr(original, "_gpudiag_wrapped", False):
            return

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._owner:
                shielded(self.flush)(True)  # the last one: a profiler restarted after it crashes
            return original(*args, **kwargs)

        destroy_process_group._gpudiag_wrapped = True  # type: ignore[attr-defined]
        c10d.destroy_process_group = destroy_process_group
        if getattr(dist, "destroy_process_group", None) is original:
            dist.destroy_process_group = destroy_process_group

    def resume(self) -> None:
        if self._deferred("resume"):
            return
        with self._lock:
            self._start_segment()

    def _start_segment(self) -> None:
        """Start a profiler unless one runs or collection ended (the caller holds the lock).

        Without Python stacks while the program has a profile function of its own (torch's
        stack tracing would replace it), and never over a profiler the program started.
        """
        if self._profiler is not None or self._finished:
            return
        if not self._forked and program.program_profiler_running(self.torch):
            self._gave_way = True
            self._finished = True
            host.note_process("torch: the program's own torch.profiler was running when "
                              "gpudiag's would start: gpudiag's torch profile is left out")
            return
        started, self._restarting_since = self._restarting_since or time.time_ns(), 0
        host.prepare_writer()  # never under the profiler; its time is this start's pause
        profiler = self.torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(profiler.ProfilerActivity.CUDA)
        self._segment_steps = 0
        stack = not program.program_profiles() and program.stack_names_utf8()
        self._segment_stacks = bool(stack)
        self._own.active = True
        self._segment_shapes = self._shapes
        try:
            running = program.start_profiler(profiler, activities, stack, self.memory,
                                             shapes=self._segment_shapes)
        except Exception:
            self._finished = True  # a failed start leaves Kineto unusable in this process
            raise
        finally:
            self._own.active = False
        self._start_pause = (started, time.time_ns())  # noted once this profiler stopped
        # the segment's bounds before _profiler is set (the flush thread reads them then),
        # after the start: Kineto's own set-up (tens of MB at the first) is not recorded
        self._segment_rss = host.resident_bytes()
        self._segment_start_s = time.monotonic()
        self._profiler = running

    def pause(self) -> None:
        """Close the open segment and write it (the window closed)."""
        if self._deferred("pause"):
            return
        with self._lock:
            self._export_segment()

    def discard(self) -> None:
        """Drop what was recorded so far (the provisional start-up and warm-up): stop the
        open segment without writing it and remove the segments already written."""
        if self._deferred("discard"):
            return
        with self._lock:
            if self._gave_way:
                return  # what was written before the program's profiler is all there is
            profiler, self._profiler = self._profiler, None
            # from here to the next start (removing large segments takes a while too), the
            # time is gpudiag's: one pause, noted when the profiler starts again
            self._restarting_since = started = time.time_ns()
            if profiler is not None:
                before = host.resident_bytes()
                host.stop(profiler)
                self._learn_stop_cost(before, host.resident_bytes())
                self._note_start()  # after the measure: the first range imports pandas
                del profiler
                release_memory(before)
                host.note_pause("gpudiag: profiler stopped (warm-up dropped)", started)
            for old in self.out_dir.glob("segment-*.pt.trace.json"):
                old.unlink(missing_ok=True)
            self._segments = 0  # the window's segments are numbered from 1 again

    def rotate(self) -> None:
        """Write the open segment and go on in a new one (bounded memory)."""
        with self._lock:
            if self._profiler is None or self._finished:
                return
            self._export_segment()
            self._start_segment()

    def _deferred(self, action: str) -> bool:
        """Kineto must be started and stopped on one thread (else it aborts the process),
        and never inside a torch `record_function` (the optimizer hook runs inside
        `Optimizer.step#...`: a profiler stopped there crashes the process later, when that
        range's handle is collected).

        An edge from the hook is applied by the outer step wrapper as soon as
        `Optimizer.step` returned. One from another thread is queued for the program's main
        thread when that is the owner, at its next bytecode (`inproc.main_thread_call`; if
        that falls inside `Optimizer.step`, the outer wrapper applies it); otherwise it waits
        for `on_step` at the program's next `gpudiag.step()`, or for exit.
        """
        if threading.get_ident() == self._owner and not self._in_hook:
            return False
        self._queue(action, once=False)
        if not self._in_hook:  # in the hook, the outer step wrapper applies it (no queue)
            self._schedule()
        return True

    def _queue(self, action: str, once: bool = True) -> bool:
        """Add an edge for the owner thread (`once`: unless it waits already); whether it was
        added."""
        with self._pending_lock:
            if once and action in self._pending:
                return False
            self._pending.append(action)
            return True

    def _schedule(self) -> None:
        if self._owner == threading.main_thread().ident and not self._scheduled:
            self._scheduled = host.main_thread_call(self._at_bytecode)

    def _at_bytecode(self) -> None:
        """The queued edges, at the main thread's next bytecode: only outside torch code
        that runs inside one of its ranges (`torch_host.inside_torch_range`); else the
        next check (ten times a second) or the next step asks again."""
        if host.inside_torch_range():
            self._scheduled = False
            return
        self._apply_pending()

    def _apply_pending(self) -> None:
        self._scheduled = False
        if threading.get_ident() != self._owner or self._in_hook or host.inside_optimizer_step():
            return  # the outer step wrapper applies them once Optimizer.step# closed
        if self._lock.when_released(self._at_bytecode):
            return  # a pending call that landed inside this thread's own start, stop or
            # write (its Python): taking the lock again there hung the program for good
        with self._pending_lock:
            actions, self._pending = self._pending, []
        for action in actions:
            getattr(self, action)()

    def on_step(self) -> None:
        """A step opened: apply waiting edges, or rotate when the open segment grew past
        its bound (a step edge is the cheapest place to cut)."""
        if threading.get_ident() != self._owner:
            return
        self._segment_steps += 1
        self._stepped = True
        if not self._shapes:  # a swap turned shapes off: back on from this step
            self._shapes = True
            if self._profiler is not None:
                self._queue("rotate")
        too_many = self._profiler is not None and self._segment_steps > self._steps_per_segment
        if too_many or self._too_big():
            self._queue("rotate")
        if self._pending and not self._in_hook:  # in the hook: the outer wrapper applies
            self._apply_pending()

    def _note_start(self) -> None:
        """The stopped profiler's start, as a pause of gpudiag's (noted now that no profiler
        records: see `torch_host.note_pause`)."""
        started, ended = self._start_pause
        if started:
            host.note_pause("gpudiag: profiler started", started, ended)
        self._start_pause = (0, 0)

    def _learn_stop_cost(self, before: int, after: int) -> None:
        """What this stop cost (`after - before`, resident bytes around it) teaches: the
        steps a segment can hold, and the cost per byte recorded that bounds the next ones."""
        recorded = before - self._segment_rss
        if self._segment_rss > 0 and recorded >= LEARN_FROM_BYTES:
            per_byte = (after - before) / recorded
            stacks = self._segment_stacks
            self._stop_cost[stacks] = max(self._stop_cost[stacks], per_byte)
        self._learn_segment_size(after - before)

    def _learn_segment_size(self, grown_bytes: int) -> None:
        """Size the next segments from what stopping this one cost: torch.profiler keeps
        its events compactly while it records, but turning them into results at stop takes
        several times that (about 15 MB per step of a 4-layer transformer with stacks and
        shapes), so segments are cut by steps, as many as fit in `segment_bytes` at stop."""
        steps = max(self._segment_steps, 1)
        if grown_bytes > 0:
            per_step = grown_bytes / steps
            self._steps_per_segment = int(min(max(self.segment_bytes // per_step, 1), 1000))
        self._segment_steps = 0

    def _too_big(self) -> bool:
        """Whether the open segment should be written now: stopping it would cost more than
        `segment_bytes` (its growth times the cost per byte), or it is older than
        `segment_s` (a later kill then loses at most that much). Before the first step,
        the growth is weighed by the cost per byte (the start-up's Python calls); after it,
        a step's events cost about what they grew (steps bound the segments)."""
        if self._profiler is None:
            return False
        age = time.monotonic() - self._segment_start_s
        if age > self.segment_s:
            return True
        grown = host.resident_bytes() - self._segment_rss
        if self._stepped:
            return self._segment_rss > 0 and grown > self.segment_bytes
        # before the first step: what the stop would cost by the next check, at the rate
        # the segment grew so far (a faster machine records more between two checks)
        ahead = grown * (1 + CHECK_AHEAD_S / max(age, CHECK_AHEAD_S))
        cost = ahead * self._stop_cost[self._segment_stacks]
        return self._segment_rss > 0 and cost > self.segment_bytes

    def check(self) -> None:
        """The bootstrap's thread, ten times a second: ask the owner's thread to write the
        open segment once it grew past its bound (a second of Python-heavy start-up with
        stacks records enough to take gigabytes to stop)."""
        if self._too_big():
            self._queue("rotate")
        if self._pending:  # asked again until it lands outside torch's code (`_at_bytecode`)
            self._schedule()

    def flush(self, final: bool) -> None:
        """At exit: write the open segment. Periodically (the flush thread): rotate when the
        open segment grew past its bound, on the owner's thread.

        A periodic flush cannot take events out of a running torch.profiler without stopping
        it. The final flush runs on the main thread (atexit, SIGTERM); from another thread
        it is left to them.
        """
        if not final:
            self.check()
            return
        if threading.get_ident() != self._owner:
            return
        # Never wait here: from a SIGTERM handler the interrupted code may be this very
        # thread in the middle of writing a segment (the lock is not re-entrant on purpose).
        if not self._lock.acquire(blocking=False):
            host.note_error("torch: the open segment was lost: the process was stopped while "
                        "gpudiag was writing a segment")
            return
        try:
            if self._finished:
                return
            self._finished = True
            self._export_segment()
        finally:
            self._lock.release()

    def when_written(self, function: Callable[[], None]) -> bool:
        """A signal's final flush that interrupted this thread inside a segment's start,
        stop or write: `function` runs once that is done, and True; False otherwise (the
        flush may run now). The segment of a spawn Pool worker that SIGTERM reached while
        it wrote was lost."""
        return self._lock.when_released(function)

    def after_fork(self, out_dir: Path) -> None:
        """A forked child: the parent's profiler state is not ours; start afresh if on CPU.

        CUDA cannot be used in a forked child anyway (torch refuses), so only the host
        profile restarts there.
        """
        self.out_dir = out_dir
        self._profiler = None
        self._segments = 0
        self._finished = False
        self._lock = host.SegmentLock()  # never re-entered: see flush()
        self._owner = threading.get_ident()
        self._pending_lock = threading.Lock()  # the flush thread may have held it at the fork
        self._pending = []
        self._scheduled = False
        self.cuda = False
        self._forked = True
        self.resume()

    def _export_segment(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        started, before = time.time_ns(), host.resident_bytes()
        host.stop(profiler)
        self._learn_stop_cost(before, host.resident_bytes())
        self._note_start()  # after the measure: the first range imports pandas
        if not self.out_dir.is_dir():  # the program deleted the run: nothing to write into
            host.note_error("torch: the segment was not written: its folder was deleted")
            return
        self._segments += 1
        final = self.out_dir / f"segment-{self._segments:04d}.pt.trace.json"
        tmp = final.with_name(f".{final.name}.tmp")
        with program.torch_path(tmp) as name:
            profiler.export_chrome_trace(name)
        escape_bare_quotes(tmp)
        os.replace(tmp, final)
        del profiler
        release_memory(before)
        host.note_pause("gpudiag: profiler segment written", started)


def release_memory(before: int) -> None:
    """Give a stopped profiler's memory back when stopping it grew the process from `before`
    by a measurable amount; a small one is left to the garbage collector (a full collection
    on every small segment of a start-up would slow the program's model loading)."""
    if host.resident_bytes() - before >= LEARN_FROM_BYTES:
        host.release_memory()


#: kept here for its callers: the Kineto name repair done at export (`torch_host`)
escape_bare_quotes = host.escape_bare_quotes
