"""`gpudiag.capture()`: collect a block of code in this process (notebooks, scripts, tests).

    with gpudiag.capture() as cap:
        train_one_epoch()
    gpudiag.diagnose(cap.trace).findings

The same collectors as `gpudiag profile`, run in the current process instead of injected
into a child: the host markers (`gpudiag.step()`, `gpudiag.region()`), and the backend's
plugin (torch.profiler, jax.profiler or CUPTI) started now if its framework is already
imported, or when the block imports it. The output is a run directory like the
session's (`cap.run_dir`, a temporary one unless `out_dir` is given), merged into
`cap.trace` when the block ends — also when it raises, so a failing step can be inspected.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from gpudiag.errors import CollectorError
from gpudiag.profiler import bootstrap
from gpudiag.profiler.backends import EXTERNAL, resolve
from gpudiag.readers.run_dir import merge_run
from gpudiag.trace import Trace


class capture:
    """Collect the `with` block in this process; `cap.trace` is the Trace afterwards."""

    def __init__(self, backend: str = "auto", *, memory: bool = True,
                 out_dir: str | os.PathLike[str] | None = None,
                 flush_interval_s: float = 1.0) -> None:
        if backend in EXTERNAL:
            raise CollectorError(f"capture() runs in this process; --backend {backend} wraps "
                                 "a whole command: use `gpudiag profile --backend "
                                 f"{backend} -- CMD`")
        self.plan = resolve(backend)
        self.memory = memory
        self.flush_interval_s = flush_interval_s
        self._keep = out_dir is not None
        self.run_dir = Path(out_dir) if out_dir is not None else Path(
            tempfile.mkdtemp(prefix="gpudiag-capture-"))
        self._trace: Trace | None = None
        self._collector: bootstrap.HostCollector | None = None
        self._previous: bootstrap.HostCollector | None = None

    def __enter__(self) -> capture:
        if self._collector is not None:
            raise CollectorError("a capture() object collects once: make a new one")
        (self.run_dir / "procs").mkdir(parents=True, exist_ok=True)
        (self.run_dir / bootstrap.ERRORS_LOG).touch()
        settings = {"backend": self.plan.backend, "memory": self.memory,
                    "flush_interval_s": self.flush_interval_s}
        self._write_meta(start_ns=time.time_ns(), end_ns=None)
        collector = bootstrap.HostCollector(
            self.run_dir, self.flush_interval_s, list(self.plan.collectors), settings)
        self._previous = bootstrap.swap_active(collector)
        self._collector = collector
        collector.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._collector is not None
        from gpudiag.markers import end_step

        end_step()  # a step left open by a plain gpudiag.step() ends with the block
        self._collector.stop()
        bootstrap.swap_active(self._previous)
        self._write_meta(end_ns=time.time_ns())
        self._trace = merge_run(self.run_dir)

    @property
    def trace(self) -> Trace:
        """What the block collected (after it ended)."""
        if self._trace is None:
            raise CollectorError("cap.trace is ready when the `with gpudiag.capture()` block "
                                 "has ended")
        return self._trace

    @property
    def not_collected(self) -> list[str]:
        """What this machine could not collect (no GPU, no CUPTI...), one line each."""
        return list(self.plan.not_collected)

    def cleanup(self) -> None:
        """Delete a temporary run directory (the Trace stays in memory)."""
        if not self._keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _write_meta(self, **times: Any) -> None:
        path = self.run_dir / "meta.json"
        meta = json.loads(path.read_text()) if path.exists() else {
            "command": ["capture()", *sys.argv[:1]], "backend": self.plan.backend,
            "collectors": list(self.plan.collectors), "options": {"memory": self.memory},
        }
        meta.update(times)
        path.write_text(json.dumps(meta, indent=1))
