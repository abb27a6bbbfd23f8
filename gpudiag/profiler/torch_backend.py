"""The torch backend of `gpudiag profile`: torch.profiler (Kineto) inside the program.

Started by the bootstrap when the program first imports torch, so the profile begins at the
program's first tensor. On a CPU-only machine it records the host side (torch ops with
Python stacks, CPU memory); with CUDA, Kineto's own CUPTI session adds kernels, copies, syncs
and runtime calls. The allocator snapshot is the separate `torch_snapshot` plugin, which
also runs beside the CUPTI backend.

torch.profiler keeps its events in memory until it is stopped, so the trace is written as
*segments*: one Kineto JSON per collection window (`--delay`, `--duration`, `--steps` pause
and resume it) and one at exit or SIGTERM. A SIGKILL loses the open segment; the host markers
and NVML samples of the same run survive (their flushes are periodic). Kineto timestamps are
Unix-epoch based (`baseTimeNanoseconds`), the clock of every other collector.

    plugin = create(out_dir, {"memory": True})
    plugin.start(); ...; plugin.flush(final=True)      # what the bootstrap does
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

from gpudiag.collectors import kineto_repair
from gpudiag.optional import require


def create(out_dir: Path, settings: dict[str, Any]) -> TorchCollector:
    """The collector for one process (called by the bootstrap when torch was imported)."""
    return TorchCollector(out_dir, memory=bool(settings.get("memory", True)))


class TorchCollector:
    """torch.profiler around the program, one exported segment per collection window."""

    def __init__(self, out_dir: Path, *, memory: bool = True) -> None:
        self.out_dir = out_dir
        self.memory = memory
        self.torch = require("torch", "The torch backend of gpudiag profile")
        self.cuda = bool(self.torch.cuda.is_available())
        self._profiler: Any = None
        self._segments = 0
        self._finished = False
        self._lock = threading.Lock()
        self._owner = threading.get_ident()  # the thread that imported torch: the program's
        self._pending: str | None = None

    def start(self) -> None:
        """Get ready; the first segment begins at `resume()`, when the window is open.

        The final export is registered with atexit now, after torch's own hooks, so it runs
        before them (atexit is last-in, first-out).
        """
        atexit.register(self.flush, True)  # before torch's atexit hooks (registered earlier)

    def resume(self) -> None:
        if self._deferred("resume"):
            return
        with self._lock:
            if self._profiler is not None or self._finished:
                return
            profiler = self.torch.profiler
            activities = [profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(profiler.ProfilerActivity.CUDA)
            self._profiler = profiler.profile(
                activities=activities, record_shapes=True, with_stack=True,
                profile_memory=self.memory,
            )
            self._profiler.start()

    def pause(self) -> None:
        """Close the open segment and write it (the window closed)."""
        if self._deferred("pause"):
            return
        with self._lock:
            self._export_segment()

    def _deferred(self, action: str) -> bool:
        """Kineto must be started and stopped on one thread (else it aborts the process).

        A window edge crossed on another thread (the --delay / --duration timers) is kept
        and applied by `on_step` at the program's next `gpudiag.step()`, or at exit.
        """
        if threading.get_ident() == self._owner:
            self._pending = None
            return False
        self._pending = action
        return True

    def on_step(self) -> None:
        """A step opened on some thread: apply a pending window edge if it is the owner's."""
        action = self._pending
        if action is not None and threading.get_ident() == self._owner:
            getattr(self, action)()

    def flush(self, final: bool) -> None:
        """At exit: write the open segment; otherwise nothing.

        A periodic flush cannot take events out of a running torch.profiler without stopping
        it, so segments are written only when a window closes and at exit. The final flush
        runs on the main thread (atexit, SIGTERM); from another thread it is left to them.
        """
        if not final or threading.get_ident() != self._owner:
            return
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self._export_segment()

    def after_fork(self, out_dir: Path) -> None:
        """A forked child: the parent's profiler state is not ours; start afresh if on CPU.

        CUDA cannot be used in a forked child anyway (torch refuses), so only the host
        profile restarts there.
        """
        self.out_dir = out_dir
        self._profiler = None
        self._segments = 0
        self._finished = False
        self._lock = threading.Lock()
        self._owner = threading.get_ident()
        self._pending = None
        self.cuda = False
        self.resume()

    def _export_segment(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        profiler.stop()
        self._segments += 1
        final = self.out_dir / f"segment-{self._segments:04d}.pt.trace.json"
        tmp = final.with_name(f".{final.name}.tmp")
        profiler.export_chrome_trace(str(tmp))
        escape_bare_quotes(tmp)
        os.replace(tmp, final)


def escape_bare_quotes(path: Path) -> int:
    """Escape the bare quotes Kineto leaves in event names in place; the lines repaired.

    Done at export, so the segment gpudiag merges is valid JSON for every other tool too
    (`collectors/kineto_repair.py` says why it happens).
    """
    fixed, repaired = kineto_repair.escape_bare_quotes(path.read_bytes())
    if repaired:
        path.write_bytes(fixed)
    return repaired
