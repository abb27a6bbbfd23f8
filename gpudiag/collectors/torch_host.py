"""What the torch collector asks of the process around it, apart from torch.profiler itself.

The bootstrap (markers for the time gpudiag spent, lines for the session, problems for
bootstrap-errors.log), calls on the program's main thread, the process's resident memory
and giving it back after a segment, where the program's thread is (inside
`Optimizer.step`), and the repair of the bare quotes Kineto writes into names.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.collectors import torch_program as program
from gpudiag.readers.kineto import repair as kineto_repair


def stop(profiler: Any) -> None:
    """Stop a profiler, then give the program back the profile function torch's stack
    tracing cleared (torch_program)."""
    hook = program.program_profile_hook()
    profiler.stop()
    program.restore_profile_hook(hook)


def note_pause(name: str, started_ns: int, ended_ns: int | None = None) -> None:
    """Mark the time the program's thread spent in gpudiag (stopping, writing a segment),
    so step times can be read with it in view. Never while a profiler records: the first
    range imports what writing ranges needs (pandas, pyarrow), millions of Python calls
    that a profiler with stacks would record and take seconds to stop."""
    boot = bootstrap()
    if boot is not None:
        boot.record_range(name, started_ns, ended_ns or time.time_ns(), "annotation")


def release_memory() -> None:
    """Give a written segment's memory back: torch.profiler's results sit in reference
    cycles (freed only by a full collection) and glibc keeps freed arenas unless trimmed;
    without both, each segment's gigabyte stays and the process grows segment by segment."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the collection alone
        pass


def resident_bytes() -> int:
    """This process's resident set (Linux /proc; 0 elsewhere: segments then follow the window
    edges only)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def inside_optimizer_step() -> bool:
    """Whether this thread is inside torch's `Optimizer.step` wrapper (its record_function)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("torch", "optim", "optimizer.py")):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


#: the parts of torch whose Python runs while one of its RecordFunction ranges is open: an
#: op called from Python (`_ops.py`) and what it dispatches to (tensor subclasses, fake
#: tensors), autograd, the optimizer's `Optimizer.step#...`, the DataLoader's
#: `enumerate(DataLoader)#...`, FSDP's, DDP's and the profiler's own ranges, amp, dynamo
RANGE_CODE = tuple(os.path.join(*part.split("/")) for part in (
    "_ops.py", "_tensor.py", "_subclasses/", "autograd/", "optim/", "utils/data/",
    "distributed/", "nn/parallel/", "amp/", "profiler/", "_dynamo/", "_inductor/"))
#: the hooks through which any tensor subclass's Python runs inside an op's dispatch
DISPATCH_HOOKS = ("__torch_dispatch__", "__torch_function__")


def inside_torch_range() -> bool:
    """Whether this thread's Python stack is inside code that runs with a torch
    RecordFunction range open (`RANGE_CODE`, `DISPATCH_HOOKS`).

    A main-thread call lands at whatever bytecode runs next; a profiler stopped inside
    an open range crashes the process when that range ends: one rank of a 4-rank FSDP2 run
    segfaulted in `to_empty` (DTensor's sharding propagation under `empty_like`), and
    torch warned "Requested callback is not found" at each such range's end. Torch's
    import (module-level code, of those files too) and its modules' forward code hold no
    range: a start-up rotation may land there (during `import torch` is where a
    Python-heavy start-up grows fastest; kept from rotating through it, the segment's
    stop at exit ran out of memory under `ulimit -v 1000000`)."""
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", None) or "") + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in DISPATCH_HOOKS:
            return True
        if root != os.sep and code.co_name != "<module>" \
                and code.co_filename.startswith(root) \
                and code.co_filename[len(root):].startswith(RANGE_CODE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def bootstrap() -> Any:
    """The bootstrap module of this process (loaded by path under its package name)."""
    return sys.modules.get("gpudiag.profiler.bootstrap")


def prepare_writer() -> None:
    """Have the bootstrap import what writing ranges needs (pandas, pyarrow) now, before a
    profiler records: imported by the first range, they were the program's step time.

    Not under a limited address space (`ulimit -v`): mapped this early, pyarrow took what
    the program's own imports needed next (a MemoryError in the program); left to the
    first range, it fails there, alone, and markers are simply not kept."""
    boot = bootstrap()
    if boot is not None and hasattr(boot, "prepare_writer") and not _address_space_limited():
        boot.prepare_writer()


def _address_space_limited() -> bool:
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):  # not POSIX: no such limit
        return False


def note_error(message: str) -> None:
    boot = bootstrap()
    if boot is not None:
        boot.report_problem(message)


def note_process(message: str) -> None:
    """A line the session prints about this process (what gpudiag gave way to)."""
    boot = bootstrap()
    if boot is not None and hasattr(boot, "note_process"):
        boot.note_process(message)


def main_thread_call(function: Callable[[], None]) -> bool:
    from gpudiag.profiler import inproc  # the bootstrap's instance when it loaded one

    return inproc.main_thread_call(function)


def escape_bare_quotes(path: Path) -> int:
    """Escape the bare quotes Kineto leaves in event names in place; the lines repaired.

    Done at export, so the segment gpudiag merges is valid JSON for every other tool too
    (`readers/kineto/repair.py` says why it happens).
    """
    fixed, repaired = kineto_repair.escape_bare_quotes(path.read_bytes())
    if repaired:
        path.write_bytes(fixed)
    return repaired


class SegmentLock:
    """The lock around starting, stopping and writing a torch segment (never re-entered).

    It knows its holder, so a SIGTERM whose handler interrupted a segment write on the
    holder's own thread can have the final flush run once the write is done
    (`when_released`), instead of ending the process with the segment half written.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None
        self._then: list[Callable[[], None]] = []

    def acquire(self, blocking: bool = True) -> bool:
        if not self._lock.acquire(blocking):
            return False
        self._holder = threading.get_ident()
        return True

    def release(self) -> None:
        self._holder = None
        self._lock.release()
        then, self._then = self._then, []
        for function in then:
            function()

    def __enter__(self) -> SegmentLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def when_released(self, function: Callable[[], None]) -> bool:
        """Run `function` once this thread releases the lock; False when it holds none."""
        if self._holder != threading.get_ident():
            return False
        self._then.append(function)
        return True
