"""The jax backend of `gpudiag profile`: jax.profiler inside the program.

Started by the bootstrap when the program first imports jax. `jax.profiler.start_trace`
writes an XSpace (`<out>/plugins/profile/<run>/<host>.xplane.pb`) when stopped, which
gpudiag's XPlane reader loads: XLA ops and, on a GPU, kernels, copies and the device's
memory. As with torch.profiler the events stay in memory until the trace stops, so one
XSpace is written per collection window and at exit; a SIGKILL loses the open one.

jax runs one trace per process: a program that starts its own (`jax.profiler.trace(dir)`,
`start_trace`) failed with "Profile has already been started". Both functions reach
`jax._src.profiler.start_trace`, which is wrapped: a start that is not gpudiag's first stops
gpudiag's trace (its XSpace is written) for good, and the program's runs as it would alone.

`start_trace` initializes jax's backends, after which the program can no longer configure
them: a program that sets `jax_num_cpu_devices` or calls `jax.distributed.initialize()` right
after `import jax` (the documented order) failed when gpudiag started its trace at import.
So the trace starts only once the backends are up: at once if they are, else when the
program's own first use initializes them (`when_backends_ready` wraps `xla_bridge.backends`,
through which every device query and computation initializes them).

    plugin = create(out_dir, {})
    plugin.start(); plugin.resume(); ...; plugin.flush(final=True)
"""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.optional import require
from gpudiag.profiler.inproc import shielded


def create(out_dir: Path, settings: dict[str, Any]) -> JaxCollector:
    """The collector for one process (called by the bootstrap when jax was imported)."""
    return JaxCollector(out_dir)


class JaxCollector:
    """jax.profiler.start_trace / stop_trace around each collection window."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.jax = require("jax", "The jax backend of gpudiag profile")
        self._tracing = False
        self._finished = False
        self._gave_way = False  # the program started a trace of its own
        self._waiting = False  # the window is open but the program has not initialized jax
        self._lock = threading.Lock()
        self._start_trace, self._stop_trace = watch_program_traces(self.jax,
                                                                   self._program_started)
        when_backends_ready(self._backends_ready)

    def start(self) -> None:
        """Nothing to prepare; the final stop is registered after jax's own atexit hooks."""
        atexit.register(shielded(self.flush), True)

    def resume(self) -> None:
        with self._lock:
            if self._tracing or self._finished:
                return
            if not backends_initialized():
                self._waiting = True  # `_backends_ready` starts it
                return
            self._start()

    @shielded
    def _backends_ready(self) -> None:
        """The program's first use of jax initialized its backends: start the waiting trace."""
        if not self._waiting:
            return
        with self._lock:
            if self._waiting:
                self._start()

    def _start(self) -> None:
        """Start gpudiag's trace (the caller holds the lock)."""
        self._waiting = False
        if self._tracing or self._finished:
            return
        try:
            self._start_trace(str(self.out_dir))
        except RuntimeError:  # "Profile has already been started": the program's runs
            self._give_way("the program's own jax trace was running when gpudiag's "
                           "would start: gpudiag's jax profile is left out")
            return
        self._tracing = True

    @shielded
    def _program_started(self) -> None:
        """The program starts a trace of its own: gpudiag's stops first (its XSpace kept)."""
        if self._gave_way or not self._lock.acquire(timeout=5.0):
            return
        try:
            self._give_way("the program started its own jax trace: gpudiag's jax profile "
                           "ends there (what it recorded before is kept); the program's "
                           "trace and its files are as they would be without gpudiag")
            self._stop()
        finally:
            self._lock.release()

    def _give_way(self, message: str) -> None:
        self._gave_way = self._finished = True
        boot = sys.modules.get("gpudiag.profiler.bootstrap")
        if boot is not None and hasattr(boot, "note_process"):
            boot.note_process(f"jax: {message}")

    def pause(self) -> None:
        with self._lock:
            self._waiting = False
            self._stop()

    def discard(self) -> None:
        """Drop the start-up and warm-up recorded so far (the step window opened): stop
        the open trace and remove every XSpace written until now."""
        with self._lock:
            if self._gave_way:
                return  # what was written before the program's trace is all there is
            self._stop()
            for old in self.out_dir.glob("plugins/profile/*"):
                shutil.rmtree(old, ignore_errors=True)

    def flush(self, final: bool) -> None:
        """At exit: stop the open trace (which writes its XSpace); periodic flushes cannot."""
        if not final:
            return
        with self._lock:
            self._finished = True
            self._waiting = False
            self._stop()

    def after_fork(self, out_dir: Path) -> None:
        """jax does not survive fork (its runtime threads stay in the parent): stop here."""
        self.out_dir = out_dir
        self._tracing = False
        self._finished = True
        self._lock = threading.Lock()

    def _stop(self) -> None:
        if self._tracing:
            self._tracing = False
            self._stop_trace()


def backends_initialized() -> bool:
    """Whether jax's backends are up (the program ran or queried something on a device)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    ready = getattr(bridge, "backends_are_initialized", None)
    if ready is not None:
        return bool(ready())
    return bool(getattr(bridge, "_backends", True))  # an older jax: its dict, else assume up


def when_backends_ready(callback: Callable[[], None]) -> None:
    """Call `callback()` after each call of `xla_bridge.backends` that returns initialized
    backends (a cheap flag check once the trace started)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    original = getattr(bridge, "backends", None)
    if original is None or getattr(original, "_gpudiag_watched", False):
        return

    @functools.wraps(original)
    def backends(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if result:
            callback()
        return result

    backends._gpudiag_watched = True  # type: ignore[attr-defined]
    setattr(bridge, "backends", backends)  # noqa: B010 -- a module mypy cannot see


def watch_program_traces(jax: Any, on_program_start: Callable[[], None]
                         ) -> tuple[Callable[..., Any], Callable[[], Any]]:
    """Wrap jax's `start_trace` (where `jax.profiler.trace` starts too) so that the
    program's start first calls `on_program_start()`; returns the unwrapped start and stop,
    which are gpudiag's own."""
    module = sys.modules.get("jax._src.profiler")
    current = getattr(module, "start_trace", None) or jax.profiler.start_trace
    original = getattr(current, "_gpudiag_original", current)
    stop = jax.profiler.stop_trace
    if module is None or current is not original:  # no such module, or watched already
        return original, stop

    @functools.wraps(original)
    def start_trace(*args: Any, **kwargs: Any) -> Any:
        on_program_start()
        return original(*args, **kwargs)

    start_trace._gpudiag_original = original  # type: ignore[attr-defined]
    setattr(module, "start_trace", start_trace)  # noqa: B010 -- a module mypy cannot see
    if getattr(jax.profiler, "start_trace", None) is original:
        jax.profiler.start_trace = start_trace
    return original, stop
