"""What runs inside every Python process that `gpudiag profile` starts.

The session's `sitecustomize.py` loads this file by path (so interpreter start-up stays
light: stdlib only until there is data to write) and calls `start_from_env()`. It reads
`GPUDIAG_RUN_DIR` / `GPUDIAG_COLLECTORS` / `GPUDIAG_FLUSH_INTERVAL_S` and starts the named
collectors that exist; unknown names are noted in the process meta, never fatal: the user's
program must run exactly as it would without gpudiag.

Each process writes a Trace directory of its own, `<run>/procs/<host>-<pid>[-rank<R>]/`,
so eight workers never collide. Files are replaced atomically (temp file + `os.replace`)
by a flush thread every interval and at exit: a crash or SIGKILL loses at most the last
interval. A forked child (torch.multiprocessing with fork) restarts the collector under its
own pid and flushes at multiprocessing's exit; other code that leaves through `os._exit`
skips atexit and keeps its last periodic flush. An `os.exec*` flushes first, and the new
image (same pid) writes beside it, in `<host>-<pid>.2` (`procdir.py`).

Whatever gpudiag does inside the program's own calls (markers, the optimizer hook, atexit)
never raises into it (`inproc.shielded`), and never imports from the program's folder
(`isolation.py`): its result is what it would be without gpudiag.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ENV_RUN_DIR = "GPUDIAG_RUN_DIR"
ENV_COLLECTORS = "GPUDIAG_COLLECTORS"
ENV_FLUSH_INTERVAL = "GPUDIAG_FLUSH_INTERVAL_S"
#: JSON of the collectors' settings (delay_s, duration_s, steps, memory, backend)
ENV_SETTINGS = "GPUDIAG_SETTINGS"
#: host markers kept open (rewritten each flush) before they are sealed into a chunk
SEAL_ROWS = 50_000
#: a kept range: native thread id, start and end (ns), name, source, the thread's CPU time
#: in it (None: not measured)
Row = tuple[int, int, int, str, str, "int | None"]
#: the domain of this collector's ranges (steps, markers, gpudiag's pauses), as their NVTX
#: ranges have it (`gpudiag.markers.DOMAIN`): they cover the whole run, not only the window
MARKER_DOMAIN = "gpudiag"
#: how often the flush thread asks the collectors whether a buffer outgrew its bound (`check`)
CHECK_INTERVAL_S = 0.1
#: matches gpudiag.trace.FORMAT_NAME / FORMAT_VERSION (not imported: that pulls in pandas)
_FORMAT = {"gpudiag_format": "gpudiag-trace", "gpudiag_format_version": 1}

#: the signal on which a profiled process writes every thread's Python stack (faulthandler):
#: a real-time one, which programs leave alone (SIGUSR1/2 belong to them and their launchers)
STACK_SIGNAL = int(getattr(signal, "SIGRTMIN", 34)) + 6
_active: HostCollector | None = None


def _load_inproc() -> ModuleType:
    """`inproc.py` beside this file, by path (the gpudiag package would pull in pandas)."""
    return _load_sibling("inproc")


def _load_sibling(stem: str) -> ModuleType:
    """The stdlib-only module `<stem>.py` beside this file, loaded by path once."""
    name = f"gpudiag.profiler.{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: wraps the functions the program's own code calls into (markers, hooks): never raise there
_shielded = _load_inproc().shielded
_procdir = _load_sibling("procdir")  # the process's directory and files in the run
_env_int, proc_dir_name, claim_dir = _procdir.env_int, _procdir.proc_dir_name, _procdir.claim_dir
_write_atomic, _note_error = _procdir.write_atomic, _procdir.note_error
ERRORS_LOG = _procdir.ERRORS_LOG


class OwnedLock:
    """A lock that knows its holder, so a signal handler never waits on its own thread.

    `take(from_signal)`: from a signal handler, fail at once when this thread holds it (the
    handler interrupted the holder: waiting would deadlock), else wait at most 5 s for
    another thread (a flush in progress there) before giving up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None

    def take(self, from_signal: bool = False) -> bool:
        if from_signal:
            if self._holder == threading.get_ident():
                return False
            if not self._lock.acquire(timeout=5.0):
                return False
        else:
            self._lock.acquire()
        self._holder = threading.get_ident()
        return True

    def release(self) -> None:
        self._holder = None
        self._lock.release()

    def __enter__(self) -> OwnedLock:
        self.take()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class HostCollector:
    """Process info and host ranges (step/region markers) of one process.

    Ranges are kept in memory as tuples and written as the `ranges` table at each flush
    when new ones arrived; pandas (through gpudiag.trace) is imported only then.
    """

    def __init__(self, run_dir: Path, interval_s: float, names: list[str],
                 settings: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.interval_s = interval_s
        inproc = _load_inproc()
        self.skipped = [name for name in names if name != "host" and name not in inproc.PLUGINS]
        if inproc.is_launcher():  # torchrun: its workers are profiled, not the launcher
            self.skipped += [f"{name} (launcher process)" for name in names
                             if name in inproc.PLUGINS]
            names = ["host"]
        self.plugins = inproc.Plugins(names, settings, self.report,
                                      imports=_load_sibling("isolation").private_imports)
        self.window = _load_sibling("collection_window").Window(settings, self.plugins.edge)
        self._reset_for_process()

    def _reset_for_process(self) -> None:
        """State that belongs to one pid (called again in a forked child)."""
        self.pid = os.getpid()
        self.dir = self.run_dir / "procs" / proc_dir_name(self.pid)
        self._claimed = False  # the directory is made (exclusively) by _claim
        self.start_ns = time.time_ns()
        self.ranges: list[Row] = []
        self._flushed_ranges = 0  # rows of the open tail already in ranges.parquet
        self._sealed = 0  # marker chunks written
        self._writer_ready = False
        self._writer_failed = False
        self._lock = OwnedLock()
        self._flush_lock = OwnedLock()  # the flush thread and the final flush share temp files
        self._in_signal = False  # the final flush runs from a signal handler
        self._wake = threading.Event()  # wakes the flush thread to end
        # Taken once, by the first stop, never released: a stop that a signal handler or a
        # pending call re-enters on the same thread (a second SIGTERM, the forwarded one,
        # landing inside the first stop) sees it taken and returns. `_wake.is_set()` could
        # not say so: Event.set() holds its condition's lock before the flag is set, and the
        # re-entered stop's set() waited forever on the lock its own thread held.
        self._stop_claim = threading.Lock()
        self._thread: threading.Thread | None = None
        self._boundary_ns: int | None = None  # the last optimizer step's end
        self._boundary_cpu = (0, 0)  # its thread and that thread's CPU time then
        self._stack_file: str | None = None
        self._auto_steps = 0
        self.notes: list[str] = []  # lines the session prints about this process
        self.exception: str | None = None  # the uncaught exception that ended it
        self.ended_by: str | None = None  # the signal whose handler wrote the last flush

    def start(self) -> None:
        self._claim()
        self._stack_file = _procdir.register_stack_dump(self.dir, STACK_SIGNAL)
        self.flush()
        self._thread = threading.Thread(target=self._loop, name="gpudiag-flush", daemon=True)
        self._thread.start()
        self.plugins.arm(_load_inproc().ImportWatcher.install(), lambda: self.dir)
        self.window.begin()

    def _claim(self) -> None:
        """This process's own directory, made once (`claim_dir`)."""
        if not self._claimed:
            self.dir = claim_dir(self.dir)
            self._claimed = True

    def _loop(self) -> None:
        """Flush every interval; a failure (a full disk) is reported once, never printed into
        the program's stderr as a thread traceback, and the next interval tries again. Ends
        when the process's directory is gone (the program deleted the run)."""
        failed = False
        flush_at = time.monotonic() + self.interval_s
        while not self._wake.wait(self._until_next(flush_at)):
            if not self.dir.is_dir():
                return  # the program deleted the run: write nothing into its rmtree
            if self.plugins.defines("check"):
                self.plugins.call("check", optional=True)
            if time.monotonic() < flush_at:
                continue
            flush_at = time.monotonic() + self.interval_s
            try:
                self.flush()
            except Exception as exc:
                if not failed:
                    self.report(f"periodic flush failed: {exc.__class__.__name__}: {exc}")
                failed = True

    def _until_next(self, flush_at: float) -> float:
        """Seconds to the next flush, or to the next check while a collector asks for them
        (the torch plugin's buffer bound: `CHECK_INTERVAL_S`); a process without one wakes
        once per flush, as it always did."""
        until_flush = max(flush_at - time.monotonic(), 0.0)
        if self.plugins.defines("check"):
            return min(CHECK_INTERVAL_S, until_flush)
        return until_flush

    def died_of(self, exception: str) -> None:
        """The uncaught exception that ends this process (`process_facts.watch`), for its
        meta."""
        self.exception = exception

    def report(self, message: str) -> None:
        """A collector problem: into `<run>/bootstrap-errors.log` (the session points at it)."""
        _note_error(self.run_dir, message)

    def prepare_writer(self) -> bool:
        """Import what writing ranges needs, once; whether ranges can be kept.

        The torch plugin asks before its profiler first starts: the first range otherwise
        imported pandas and pyarrow inside the program's first optimizer step, under the
        stack tracer (hundreds of thousands of Python calls, seconds on a loaded machine,
        read as the program's optimizer time)."""
        if self._writer_ready or self._writer_failed:
            return self._writer_ready  # a failure is said once
        try:
            _import_writer()
        except Exception as exc:  # an address-space limit, a module the program shadows
            self._writer_failed = True
            _load_inproc().report_failure("host markers are not recorded: importing pandas",
                                          exc)
            return False
        self._writer_ready = True
        return True

    def add_range(self, name: str, start_ns: int, end_ns: int, source: str,
                  cpu_ns: int | None = None) -> None:
        if not self.prepare_writer():
            return  # markers are not kept without a way to write them
        if not name.isascii():
            name = _utf8(name)
        if not self._lock.take(self._in_signal):
            return  # a signal interrupted this very thread while it held the lock
        try:
            self.ranges.append((threading.get_native_id(), start_ns, end_ns, name, source,
                                cpu_ns))
        finally:
            self._lock.release()

    def optimizer_stepped(self, at_ns: int) -> None:
        """An optimizer step ended at `at_ns` (the torch plugin's hook), in a program that
        marks no steps itself: the time since the previous one is a step, and a step opens.

        Steps are whole iterations between two optimizer-step ends, named "step N" from 1
        (iteration 0's start is not known: it is never recorded).
        """
        if self.window.step_source == "marker":
            return
        previous, self._boundary_ns = self._boundary_ns, at_ns
        thread, cpu = threading.get_ident(), time.thread_time_ns()
        (last_thread, last_cpu), self._boundary_cpu = self._boundary_cpu, (thread, cpu)
        if previous is not None:
            self._auto_steps += 1
            on_cpu = cpu - last_cpu if thread == last_thread else None
            self.add_range(f"step {self._auto_steps}", previous, at_ns, "step", on_cpu)
        self.window.step("optimizer")
        self.plugins.call("on_step", optional=True)

    def own_thread_ids(self) -> list[int]:
        """Native ids of gpudiag's threads here (the merge drops their Python events)."""
        threads = [self._thread, *self.window.threads()]
        return sorted({thread.native_id for thread in threads
                       if thread is not None and thread.native_id})

    def meta(self, end_ns: int | None) -> dict[str, Any]:
        """The per-process Trace meta (what merge_run and the report show per process)."""
        process = {
            "pid": self.pid, "ppid": os.getppid(), "host": socket.gethostname(),
            "argv": list(sys.argv), "executable": sys.executable,
            "start_ns": self.start_ns, "end_ns": end_ns,
            "rank": _env_int("RANK"), "local_rank": _env_int("LOCAL_RANK"),
            "collectors": ["host", *self.plugins.started],
            "collectors_failed": self.plugins.failed, "collectors_skipped": self.skipped,
            "window": self.window.info(), "gpudiag_thread_ids": self.own_thread_ids(),
            "notes": list(self.notes), "exception": self.exception,
            "ended_by": self.ended_by,
            "role": _load_sibling("process_facts").role(),
        }
        if self._stack_file is not None:  # what the session's watchdog signals for stacks
            process.update(stack_signal=STACK_SIGNAL, stack_file=self._stack_file)
        return {
            **_FORMAT, "sources": [{"format": "gpudiag-host", "pid": self.pid}],
            "warnings": {}, "timeline": True, "rank": _env_int("RANK"),
            "world_size": _env_int("WORLD_SIZE"), "process": process,
        }

    def flush(self, final: bool = False) -> None:
        """Write meta.json, and the markers when some were added since the last flush.

        The open markers (at most `SEAL_ROWS`) are rewritten to `ranges.parquet`; a full
        tail is sealed into `markers/chunk-NNNNNN/` and dropped from memory, so a long run
        never rewrites more than one tail per flush.
        """
        if os.getpid() != self.pid:  # a forked child before its fork hook ran
            return
        if not self._flush_lock.take(self._in_signal):
            self.report("final flush skipped: the process was stopped while this thread was "
                        "flushing (markers and meta since the previous flush are lost)")
            return
        try:
            self._flush_locked(final)
        finally:
            self._flush_lock.release()

    def _flush_locked(self, final: bool) -> None:
        if not self._lock.take(self._in_signal):
            return  # a signal interrupted a marker on this thread: meta as last written
        try:
            tail = list(self.ranges)
        finally:
            self._lock.release()
        if len(tail) >= SEAL_ROWS:
            self._seal(tail)
            tail = []
        if len(tail) != self._flushed_ranges:
            self._write_ranges(tail, self.dir / "ranges.parquet")
            self._flushed_ranges = len(tail)
        self.plugins.call("flush", final)
        end_ns = time.time_ns() if final else None
        meta = json.dumps(self.meta(end_ns), indent=1).encode()
        _write_atomic(self.dir / "meta.json", meta)

    def _seal(self, tail: list[Row]) -> None:
        """Move a full tail into its own chunk (written before the tail is cleared, so a
        kill in between leaves the rows twice, which `merge_run` drops, never zero times)."""
        self._sealed += 1
        chunk = self.dir / "markers" / f"chunk-{self._sealed:06d}"
        tmp = chunk.with_name(f".{chunk.name}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self._write_ranges(tail, tmp / "ranges.parquet")
        _write_atomic(tmp / "meta.json", json.dumps(
            {**_FORMAT, "sources": [], "warnings": {}, "rank": _env_int("RANK")}).encode())
        os.replace(tmp, chunk)
        with self._lock:
            del self.ranges[:len(tail)]

    def _write_ranges(self, ranges: list[Row], path: Path) -> None:
        import pandas as pd

        from gpudiag.trace import Trace, write_parquet

        tid, start, end, name, source, cpu = zip(*ranges, strict=True) if ranges else ([],) * 6
        frame = pd.DataFrame({
            "pid": self.pid, "tid": list(tid), "start_ns": list(start), "end_ns": list(end),
            "name": list(name), "source": list(source), "rank": _env_int("RANK"),
            "cpu_time": pd.array(list(cpu), dtype="Int64"),
            "domain": MARKER_DOMAIN,  # what sets them apart from what the profiler recorded
        })
        table = Trace(ranges=frame).ranges
        tmp = path.with_name(f".{path.name}.{self.pid}.tmp")
        write_parquet(table, tmp)
        os.replace(tmp, path)

    @property
    def stopping(self) -> bool:
        """The final flush has begun (or is done)."""
        return self._stop_claim.locked()

    def postpone(self, function: Callable[[], None]) -> bool:
        """A signal handler asks before the final flush: when it interrupted a collector's
        segment write on this thread, `function` runs once that is written (True)."""
        return self.plugins.postpone(function)

    def stop(self, from_signal: bool = False) -> None:
        """Final flush at exit; never raises into the interpreter's shutdown.

        `from_signal`: called from a signal handler, which may have interrupted this thread
        inside a flush or a marker: then nothing waits for a lock this thread holds (what
        that flush had not written is lost and reported, the process still ends). The
        program's own SIGINT/SIGTERM handlers wait until the flush is written
        (`sigterm.held_signals`).
        """
        if not self._stop_claim.acquire(blocking=False):  # one C call: no handler runs
            return  # in it; stopped already or stopping (SIGTERM flush, then atexit)
        self._in_signal = from_signal
        if from_signal:  # only the SIGTERM guard stops from a handler (sigterm.finish)
            self.ended_by = "SIGTERM"
        try:
            with _load_sibling("sigterm").held_signals():
                self._wake.set()
                self.window.cancel()
                self.plugins.close()
                self.flush(final=True)
                if self._stack_file is not None and os.path.getsize(self._stack_file) == 0:
                    os.unlink(self._stack_file)  # never asked for: leave no empty file
        except Exception as exc:  # exit must not fail because of gpudiag
            _note_error(self.run_dir, exc)

    def after_fork(self) -> None:
        """In a forked child: a fresh directory, no inherited ranges, a new flush thread.

        A multiprocessing child leaves through `os._exit` (no atexit): its own exit hook,
        registered here for the finalizers it runs before that, does the final flush.
        """
        self._reset_for_process()
        self._claim()  # before the plugins make their folders in it
        self.window.after_fork()
        self.plugins.after_fork(self.dir)
        self.start()
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:  # the child clears finalizers first, then runs after-forkers
            mp_util.register_after_fork(self, _finalize_at_mp_exit)


def _utf8(name: str) -> str:
    """`name` as text Parquet can hold: a name made from bytes that are not UTF-8 (a file
    name, `gpudiag.region(path.name)`) has lone surrogates, which failed the whole flush
    and lost every marker with it; those bytes are written as escapes (`\\xff`)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = name.encode("utf-8", "surrogateescape")  # the file system's own bytes
        except UnicodeEncodeError:
            raw = name.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "backslashreplace")
    return name


def _finalize_at_mp_exit(collector: HostCollector) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, collector.stop, exitpriority=0)


def _import_writer() -> None:
    """Import what writing Parquet needs, before the first range is kept.

    Done eagerly (once, on the first range) because a first import during interpreter
    shutdown fails: pandas and pyarrow register atexit hooks, refused after shutdown began.
    Never from the program's folder (`isolation.private_imports`), and all of it now: one
    empty table is written to memory, so the modules pandas imports only when it first
    writes Parquet (its arrow extension types import json) are loaded while the program's
    own json.py is not yet in `sys.modules`.
    """
    with _load_sibling("isolation").private_imports():
        import io

        import pyarrow.parquet  # noqa: F401 -- loaded lazily by pandas.to_parquet otherwise

        from gpudiag.trace import Trace

        Trace().ranges.to_parquet(io.BytesIO(), index=False)


def release_shadowed(before: set[str]) -> None:
    """Called by sitecustomize once the bootstrap started: the standard modules it imported
    that the program's folder shadows are dropped from `sys.modules`, so the program imports
    its own (`isolation.release_shadowed`). Never raises: the program runs on regardless."""
    try:
        isolation = _load_sibling("isolation")
        isolation.remember_program_dir()
        isolation.release_shadowed(before)
    except Exception as exc:
        if _active is not None:
            _active.report(f"start-up imports not released: {exc.__class__.__name__}: {exc}")


@_shielded
def record_range(name: str, start_ns: int, end_ns: int, source: str = "annotation",
                 cpu_ns: int | None = None) -> None:
    """Record a named host time range (`time.time_ns()` clock) in this process's trace,
    with the time its thread ran on a CPU within it (`cpu_ns`, None: not measured).

    This is what `gpudiag.step()` (source "step") and `gpudiag.region(name)` (source
    "annotation") call; without an active collector it does nothing, so marked code costs
    one global lookup when it is not profiled.
    """
    collector = _active
    if collector is not None:
        collector.add_range(name, int(start_ns), int(end_ns), source, cpu_ns)


def swap_active(collector: HostCollector | None) -> HostCollector | None:
    """Make `collector` the one markers record into; returns the previous (capture())."""
    global _active
    previous, _active = _active, collector
    return previous


def is_active() -> bool:
    """True inside a process that `gpudiag profile` is collecting from."""
    return _active is not None


@_shielded
def step_opened() -> None:
    """Called by `gpudiag.step()` when a step opens: the step window counts them."""
    collector = _active
    if collector is not None:
        collector.window.step("marker")
        collector.plugins.call("on_step", optional=True)


@_shielded
def final_flush() -> None:
    """The final flush now (atexit hooks of plugins that must run before their framework's
    own call it); later calls, the bootstrap's own atexit included, do nothing."""
    collector = _active
    if collector is not None:
        collector.stop()


def note_process(message: str) -> None:
    """A line the session prints about this process: what gpudiag gave way to (the program's
    own profiler, another `gpudiag profile` inside this one). Not a problem: the program
    ran as it would have."""
    collector = _active
    if collector is not None and message not in collector.notes:
        collector.notes.append(message)


def prepare_writer() -> None:
    """Import what writing ranges needs now (`HostCollector.prepare_writer`)."""
    collector = _active
    if collector is not None:
        collector.prepare_writer()


def report_problem(message: str) -> None:
    """A plugin's problem, into bootstrap-errors.log (the session points at it)."""
    collector = _active
    if collector is not None:
        collector.report(message)


@_shielded
def optimizer_stepped(at_ns: int) -> None:
    """Called by the torch plugin's optimizer-step hook (`HostCollector.optimizer_stepped`)."""
    collector = _active
    if collector is not None:
        collector.optimizer_stepped(at_ns)


def settings_from_env() -> dict[str, Any]:
    """The session's settings for the plugins (GPUDIAG_SETTINGS JSON; {} when unset)."""
    raw = os.environ.get(ENV_SETTINGS, "")
    settings = json.loads(raw) if raw else {}
    settings.setdefault("flush_interval_s", float(os.environ.get(ENV_FLUSH_INTERVAL, "1.0")))
    return settings


def start_from_env() -> None:
    """Start the collectors the session named in the environment; a no-op outside a session."""
    global _active  # noqa: PLW0603 -- one collector per process, set once here
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir or _active is not None:
        return
    names = [name for name in os.environ.get(ENV_COLLECTORS, "host").split(",") if name]
    try:
        settings = settings_from_env()
        collector = HostCollector(Path(run_dir), settings["flush_interval_s"], names, settings)
        _active = collector  # before start: a plugin started by an import may mark steps
        collector.start()
    except Exception as exc:  # the user's program runs even when collection cannot
        _active = None
        _note_error(Path(run_dir), exc)
        return
    atexit.register(collector.stop)
    _load_sibling("process_facts").watch(collector.died_of)
    os.register_at_fork(after_in_child=_after_fork)
    _procdir.watch_exec(_before_exec)
    _load_sibling("sigterm").flush_on_sigterm(collector, _load_inproc().main_thread_call,
                                              receipts=collector.run_dir / "signals",
                                              pipe=_load_sibling("wakeup").WakeupPipe)


@_shielded
def _before_exec(path: Any) -> None:
    """The final flush before an exec that will succeed (an `execvp` tries each PATH entry:
    the ones that fail leave the process, and its collection, running)."""
    collector = _active
    if collector is None or collector.pid != os.getpid():
        return
    if isinstance(path, int) or (os.path.isfile(path) and os.access(path, os.X_OK)):
        collector.stop()


def _after_fork() -> None:
    if _active is not None:
        try:
            _active.after_fork()
        except Exception as exc:  # as in start_from_env: never break the child
            _note_error(_active.run_dir, exc)
