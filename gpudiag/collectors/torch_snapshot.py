"""The torch allocator plugin of `gpudiag profile`: a CUDA memory snapshot at exit.

`torch.cuda.memory._record_memory_history` keeps the caching allocator's recent events (a
ring of `MEMORY_HISTORY_ENTRIES`) with their Python stacks; `_dump_snapshot` at exit writes
them with the segment and block layout, which the snapshot reader turns into `memory` and
`memory_blocks` and the memory analyzer replays for fragmentation over time. It runs beside
any backend (torch.profiler, CUPTI) in programs that use torch on a GPU; on a CPU-only
machine it does nothing (there is no CUDA allocator to record).

    plugin = create(out_dir, {"memory": True})
    plugin.start(); ...; plugin.flush(final=True)      # <out_dir>/memory_snapshot.pickle
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

from gpudiag.optional import require

#: allocator events kept by _record_memory_history (its ring buffer: older ones drop off)
MEMORY_HISTORY_ENTRIES = 200_000
SNAPSHOT_NAME = "memory_snapshot.pickle"


def create(out_dir: Path, settings: dict[str, Any]) -> SnapshotCollector:
    """The collector for one process (called by the bootstrap when torch was imported)."""
    return SnapshotCollector(out_dir, enabled=bool(settings.get("memory", True)))


class SnapshotCollector:
    """Records the allocator's history from start and dumps one snapshot at exit.

    The history covers the whole run rather than the collection window: the snapshot's
    block layout at exit is the product of every allocation before it, and the replay
    needs the events that led there.
    """

    def __init__(self, out_dir: Path, *, enabled: bool = True) -> None:
        self.out_dir = out_dir
        self.torch = require("torch", "The CUDA memory snapshot of gpudiag profile")
        self.enabled = enabled and bool(self.torch.cuda.is_available())
        self._recording = False
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self.enabled:
            return
        self.torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self._recording = True
        atexit.register(self.flush, True)  # before torch's own atexit hooks

    def resume(self) -> None:
        """The history spans the whole run (see the class docstring)."""

    def pause(self) -> None:
        """The history spans the whole run (see the class docstring)."""

    def flush(self, final: bool) -> None:
        """At exit: write the snapshot and stop recording."""
        if not final:
            return
        with self._lock:
            if not self._recording:
                return
            self._recording = False
            final_path = self.out_dir / SNAPSHOT_NAME
            tmp = final_path.with_name(f".{final_path.name}.tmp")
            self.torch.cuda.memory._dump_snapshot(str(tmp))
            os.replace(tmp, final_path)
            self.torch.cuda.memory._record_memory_history(enabled=None)

    def after_fork(self, out_dir: Path) -> None:
        """CUDA is unusable in a forked child: nothing to record there."""
        self.out_dir = out_dir
        self.enabled = False
        self._recording = False
        self._lock = threading.Lock()
