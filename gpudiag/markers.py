"""`gpudiag.step()` and `gpudiag.region(name)`: name the parts of a program for every profiler.

Both open a range that goes two places, each only when it exists:

- NVTX, through the `nvtx` package (domain "gpudiag"), so that the cupti backend, Nsight
  Systems and Nsight Compute all see the same names;
- the in-process collector of `gpudiag profile` (`gpudiag.profiler.bootstrap.record_range`,
  `time.time_ns()` clock), looked up in `sys.modules` so that marking code never imports the
  profiler: the bootstrap is loaded only in processes that `gpudiag profile` started.

Marked code must cost nothing when it is not profiled, so `nvtx` is imported once, on the
first marker, and remembered in a module-level flag; a call then costs two clock reads and a
dict lookup. Example::

    for batch in loader:
        gpudiag.step()                  # closes the previous step, opens the next
        with gpudiag.region("forward"):
            loss = model(batch)
"""

from __future__ import annotations

import atexit
import itertools
import sys
import threading
import time
from types import ModuleType, TracebackType
from typing import Any

__all__ = ["end_step", "region", "step"]

#: NVTX domain of every gpudiag marker (filter on it in Nsight Systems)
DOMAIN = "gpudiag"
_BOOTSTRAP = "gpudiag.profiler.bootstrap"



class _Flags:
    """Process-wide marker state, in one object rather than module globals rebound in functions."""

    nvtx_checked = False  # True once `nvtx` was looked for (the module-level "first call" flag)
    nvtx: ModuleType | None = None
    atexit_registered = False


_flags = _Flags()
_state = threading.local()  # .pending: the step opened by a plain `step()` call on this thread
_step_numbers = itertools.count()  # next() on a count is atomic under the GIL


def _nvtx_module() -> ModuleType | None:
    """The `nvtx` package, imported on the first marker only (None when not installed)."""
    if not _flags.nvtx_checked:
        try:
            import nvtx as module
        except ImportError:
            module = None
        _flags.nvtx = module
        _flags.nvtx_checked = True
    return _flags.nvtx


def _recorder() -> Any:
    """`record_range` of the profiler bootstrap when it is loaded and collecting, else None.

    Looked up on every range end rather than cached: a collector may start after the first
    marker (`gpudiag.capture`), and a plain dict lookup is cheaper than any invalidation.
    """
    bootstrap = sys.modules.get(_BOOTSTRAP)
    if bootstrap is None:
        return None
    is_active = getattr(bootstrap, "is_active", None)
    if is_active is not None and not is_active():
        return None
    return getattr(bootstrap, "record_range", None)


class _Range:
    """One open marker range: pushed to NVTX on open, popped and recorded on close."""

    __slots__ = ("closed", "cpu_ns", "name", "nvtx", "source", "start_ns", "thread")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.closed = False
        self.nvtx = _nvtx_module()
        if self.nvtx is not None:
            self.nvtx.push_range(message=name, domain=DOMAIN)
        self.thread = threading.get_ident()
        self.cpu_ns = time.thread_time_ns()  # on-CPU vs waiting or descheduled, per step
        self.start_ns = time.time_ns()

    def close(self) -> None:
        """End the range once (a second close is a no-op, so exit paths may overlap)."""
        if self.closed:
            return
        self.closed = True
        end_ns = time.time_ns()
        if self.nvtx is not None:
            self.nvtx.pop_range(domain=DOMAIN)
        record = _recorder()
        if record is not None:
            on_cpu = (time.thread_time_ns() - self.cpu_ns
                      if threading.get_ident() == self.thread else None)
            record(self.name, self.start_ns, end_ns, self.source, on_cpu)


class region:
    """Context manager naming a region of code, e.g. `with gpudiag.region("data"): ...`.

    The range opens on `__enter__` (not at construction) so that a region object built
    ahead of time measures only the block it wraps; a region may be re-entered.
    """

    __slots__ = ("_range", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._range: _Range | None = None

    def __enter__(self) -> region:
        self._range = _Range(self.name, "annotation")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._range is not None:
            self._range.close()
            self._range = None


class _Step:
    """A step opened by `step()`: closed by the next `step()` call or by leaving a `with`."""

    __slots__ = ("_range",)

    def __init__(self, opened: _Range) -> None:
        self._range = opened

    @property
    def name(self) -> str:
        """The step's range name ("step N" unless given)."""
        return self._range.name

    def __enter__(self) -> _Step:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._range.close()
        if getattr(_state, "pending", None) is self._range:
            _state.pending = None


def _next_step_name() -> str:
    """ "step N", numbered from 0 per process, so the steps of every rank line up by name."""
    return f"step {next(_step_numbers)}"


def step(name: str | None = None) -> _Step:
    """Mark a training step: call it at the top of each iteration, or use it as `with step():`.

    A plain call closes this thread's previous step and opens the next, so a loop needs one
    line; the step still open when the interpreter exits is closed then (`end_step()` closes
    it earlier, e.g. before evaluation). Close regions opened inside a step before the next
    `step()`: NVTX ranges nest per thread. The range is recorded with source "step".
    """
    end_step()
    bootstrap = sys.modules.get(_BOOTSTRAP)
    if bootstrap is not None:  # the --steps window of `gpudiag profile` counts opened steps
        step_opened = getattr(bootstrap, "step_opened", None)
        if step_opened is not None:
            step_opened()
    opened = _Range(name if name is not None else _next_step_name(), "step")
    _state.pending = opened
    if not _flags.atexit_registered and threading.current_thread() is threading.main_thread():
        _flags.atexit_registered = True
        atexit.register(end_step)  # runs before the bootstrap's final flush (registered later)
    return _Step(opened)


def end_step() -> None:
    """Close the step that a plain `step()` call left open on this thread (no-op if none)."""
    pending: _Range | None = getattr(_state, "pending", None)
    if pending is not None:
        _state.pending = None
        pending.close()
