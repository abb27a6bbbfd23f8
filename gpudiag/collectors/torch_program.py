"""What the profiled program does with torch that the torch backend must give way to.

The program's result must not change under `gpudiag profile`, and four things it may do
collide with gpudiag's own torch.profiler:

- **Its own profiler.** Kineto holds one profiling session per process: a program that
  starts `torch.profiler.profile` (or `torch.autograd.profiler.profile`, `emit_nvtx`,
  `emit_itt`) while gpudiag's runs breaks both, and the process crashed at exit (SIGSEGV).
  Every start goes through two functions of `torch.autograd.profiler`, `_prepare_profiler`
  and `_enable_profiler`; `watch_program_profilers` wraps them so that a start that is not
  gpudiag's first lets gpudiag write what it has and stop for good. The program's profiler
  then runs as it would alone.
- **Its own profile function** (`sys.setprofile`, `threading.setprofile`). torch.profiler's
  Python stacks (`with_stack`) install a profile function of their own at start and clear
  the thread's at stop, so every segment gpudiag began or ended silently removed the
  program's. `program_profile_hook` says whether the program has one: gpudiag then records
  without Python stacks, and puts the program's function back after each start and stop.
- **The thread that imported torch ending.** Kineto must be stopped on the thread that
  started it; a profiler left running when that thread ended crashed the process at exit.
  `on_thread_end` runs a callback on that thread just before it ends (the last thing
  `threading.Thread` does there), where the open segment is written.
- **Swapping tensors.** `record_shapes` keeps a weak reference to every tensor a recorded op
  saw until the profiler is deleted, and `torch.utils.swap_tensors` refuses a tensor with
  any ("Expected no weakrefs to t1's Tensor object"): the FSDP2 example failed on every rank
  in `model.to_empty()`, and `fully_shard` swaps every parameter. `watch_tensor_swaps` calls
  back before each swap, where the plugin writes the open segment (which drops those
  references) and records without shapes until the next step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: the functions of torch.autograd.profiler through which every profiler starts
STARTS = ("_prepare_profiler", "_enable_profiler")


class OwnCalls(threading.local):
    """Whether the calling thread is inside one of gpudiag's own profiler starts."""

    active = False


def watch_program_profilers(torch: Any, own: OwnCalls,
                            on_program_start: Callable[[], None]) -> bool:
    """Call `on_program_start()` before any profiler start that is not gpudiag's own (`own`
    is set around gpudiag's). False when this torch has no such functions (not watched)."""
    module = getattr(getattr(torch, "autograd", None), "profiler", None)
    if module is None or not all(hasattr(module, name) for name in STARTS):
        return False
    for name in STARTS:
        original = getattr(module, name)
        if getattr(original, "_gpudiag_watched", False):
            continue

        @functools.wraps(original)
        def start(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            if not own.active:
                on_program_start()
            return _original(*args, **kwargs)

        start._gpudiag_watched = True  # type: ignore[attr-defined]
        setattr(module, name, start)
    return True


def watch_tensor_swaps(torch: Any, before_swap: Callable[[], None]) -> bool:
    """Call `before_swap()` before every `torch.utils.swap_tensors` (how `Module._apply`,
    `to_empty`, parametrizations and `fully_shard` reach it). False when this torch has none."""
    utils: Any = getattr(torch, "utils", None)
    original = getattr(utils, "swap_tensors", None)
    if original is None or getattr(original, "_gpudiag_watched", False):
        return False

    @functools.wraps(original)
    def swap_tensors(*args: Any, **kwargs: Any) -> Any:
        before_swap()
        return original(*args, **kwargs)

    swap_tensors._gpudiag_watched = True  # type: ignore[attr-defined]
    utils.swap_tensors = swap_tensors
    return True


def program_profiler_running(torch: Any) -> bool:
    """A profiler is running that gpudiag did not start (it started before gpudiag would)."""
    enabled = getattr(getattr(torch, "autograd", None), "_profiler_enabled", None)
    try:
        return bool(enabled()) if enabled is not None else False
    except Exception:  # an older torch: nothing to ask
        return False


def program_profile_hook() -> Any:
    """The program's own profile function on this thread, or None (torch.profiler's own, a
    `TraceContext` while it records Python stacks, is not the program's)."""
    hook = sys.getprofile()
    return hook if hook is not None and type(hook).__name__ != "TraceContext" else None


def program_profiles() -> bool:
    """The program set a profile function: on this thread, or for the threads it starts."""
    threads_hook = getattr(threading, "getprofile", lambda: None)()
    return program_profile_hook() is not None or threads_hook is not None


def restore_profile_hook(hook: Any) -> None:
    """Put the program's profile function back on this thread if torch removed it."""
    if hook is not None and sys.getprofile() is not hook:
        sys.setprofile(hook)


def stack_names_utf8() -> bool:
    """Whether torch can record Python stacks here: its stack tracer takes every frame's
    file name as UTF-8, and one that is not (a folder named in latin-1) failed the start
    ("error unpacking string as utf-8"), after which Kineto crashed the process at exit
    whatever was tried. The program's folder, the path and the frames running now."""
    names = [os.getcwd(), *sys.argv[:1], *sys.path]
    names += [frame.f_code.co_filename for frame in sys._current_frames().values()]
    try:
        for name in names:
            name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def start_profiler(profiler: Any, activities: list[Any], stack: bool, memory: bool,
                   shapes: bool = True) -> Any:
    """A started `torch.profiler.profile`, the program's profile function kept; a start
    that failed is stopped again before the error goes on (a profiler left half-started
    crashed the process at exit)."""
    hook = program_profile_hook()
    started = profiler.profile(activities=activities, record_shapes=shapes, with_stack=stack,
                               profile_memory=memory)
    try:
        started.start()
    except Exception:
        with contextlib.suppress(Exception):
            started.stop()
        raise
    finally:
        restore_profile_hook(hook)
    return started


@contextlib.contextmanager
def torch_path(path: Path) -> Iterator[str]:
    """`path` as a string torch takes: torch encodes it as UTF-8 and refused one that is not
    (a run under a folder named in latin-1), so such a path is given as the same file
    through `/proc/self/fd`, whose name is ASCII (`path.name` is gpudiag's own, ASCII)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            yield f"/proc/self/fd/{folder}/{path.name}"
        finally:
            os.close(folder)
        return
    yield text


def on_thread_end(callback: Callable[[], None]) -> bool:
    """Run `callback` on the calling thread just before it ends; False for a thread that
    `threading` did not start (one started from C or `_thread`), whose end cannot be seen.

    `Thread._bootstrap_inner` ends with `self._delete()` (CPython 3.10 to 3.13), looked up
    on the instance: an instance attribute runs first, still on that thread, after `run()`.
    """
    thread = threading.current_thread()
    if isinstance(thread, threading._DummyThread) or thread is threading.main_thread():
        return False
    original = getattr(thread, "_delete", None)
    if original is None:
        return False

    def delete() -> None:
        try:
            callback()
        finally:
            original()

    thread._delete = delete  # type: ignore[attr-defined]  # private, see the docstring
    return True
