"""The jax backend of `gpudiag profile`: jax.profiler inside the program.

Started by the bootstrap when the program first imports jax. `jax.profiler.start_trace`
writes an XSpace (`<out>/plugins/profile/<run>/<host>.xplane.pb`) when stopped, which
gpudiag's XPlane reader loads: XLA ops and, on a GPU, kernels, copies and the device's
memory. As with torch.profiler the events stay in memory until the trace stops, so one
XSpace is written per collection window and at exit; a SIGKILL loses the open one.

    plugin = create(out_dir, {})
    plugin.start(); plugin.resume(); ...; plugin.flush(final=True)
"""

from __future__ import annotations

import atexit
import shutil
import threading
from pathlib import Path
from typing import Any

from gpudiag.optional import require


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
        self._lock = threading.Lock()

    def start(self) -> None:
        """Nothing to prepare; the final stop is registered after jax's own atexit hooks."""
        atexit.register(self.flush, True)

    def resume(self) -> None:
        with self._lock:
            if self._tracing or self._finished:
                return
            self.jax.profiler.start_trace(str(self.out_dir))
            self._tracing = True

    def pause(self) -> None:
        with self._lock:
            self._stop()

    def discard(self) -> None:
        """Drop the start-up and warm-up recorded so far (the step window opened): stop
        the open trace and remove every XSpace written until now."""
        with self._lock:
            self._stop()
            for old in self.out_dir.glob("plugins/profile/*"):
                shutil.rmtree(old, ignore_errors=True)

    def flush(self, final: bool) -> None:
        """At exit: stop the open trace (which writes its XSpace); periodic flushes cannot."""
        if not final:
            return
        with self._lock:
            self._finished = True
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
            self.jax.profiler.stop_trace()
