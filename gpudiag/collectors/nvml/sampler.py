"""The NVML sampler of `gpudiag profile`: utilization, memory, clocks, power, PCIe and NVLink.

It runs in the session process, not in the profiled children: one daemon thread reads every
GPU the job can see each `--nvml-interval` and writes the Trace `samples` table (plus a
`devices` table) as chunk directories, so a killed session keeps all but the last second.
What each reading asks NVML, and which GPUs the job sees, is `nvml_source`'s part.

    sampler = start_sampler(run_dir / "nvml", 0.1, env=child_env, reasons=why_not)
    ...                                   # the job runs; sampler.stop() after it exits
    trace = load_samples(run_dir / "nvml")
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.collectors.nvml.source import ALL_LINKS, Gpu, NvmlSource, visible_indices
from gpudiag.errors import MissingDependencyError
from gpudiag.optional import require
from gpudiag.readers.run_dir import load_samples
from gpudiag.trace import Trace

# ALL_LINKS, Gpu and visible_indices live in nvml_source; the tests import them from here
__all__ = ["ALL_LINKS", "Gpu", "NvmlSampler", "NvmlSource", "load_samples", "start_sampler",
           "visible_indices"]

log = logging.getLogger(__name__)

Row = tuple[int, int, str, float, str]  # device, ts_ns, metric, value, unit


class NvmlSampler:
    """A daemon thread reading `source` every `interval_s` into `samples` rows.

    Rows stay in memory as tuples; every `flush_every_s` (and at stop) they are written as a
    Trace directory `out_dir/chunk-NNNNNN`, renamed into place whole. A chunk holds a segment
    of up to `segment_flushes` flushes: each flush writes the segment so far as a new chunk
    and removes the previous one, so a 10-hour job leaves ~600 chunks, not 36,000 (a kill
    between the two leaves duplicates, which `load_samples` drops). chunk-000000, written by
    start(), holds the `devices` table.
    """

    def __init__(self, source: NvmlSource, out_dir: Path, interval_s: float, *,
                 flush_every_s: float = 1.0, segment_flushes: int = 60,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.source = source
        self.out_dir = Path(out_dir)
        self.interval_s = max(float(interval_s), 0.001)
        self.flush_every_s = flush_every_s
        self.segment_flushes = segment_flushes
        self.clock = clock
        self.errors: list[str] = []
        self.chunks = 0  # written, including those a later flush of their segment replaced
        self._rows: list[Row] = []  # not yet written
        self._segment: list[Row] = []  # written in `_segment_chunk`
        self._segment_chunk: Path | None = None
        self._segment_count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        """Write the devices chunk, then start sampling in the background."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._write(Trace(meta=self._meta(), devices=self.source.devices()))
        self._thread = threading.Thread(target=self._loop, name="gpudiag-nvml", daemon=True)
        self._thread.start()

    def sample(self) -> int:
        """Read every GPU once (one timestamp for all); the number of rows added."""
        timestamp = self.clock()
        rows = [(gpu.device, timestamp, metric, value, unit) for gpu in self.source.gpus
                for metric, value, unit in self.source.read(gpu, timestamp)]
        with self._lock:
            self._rows += rows
        return len(rows)

    def flush(self) -> Path | None:
        """Write the segment with the rows since the last flush as the next chunk, then drop
        the segment's previous chunk; None when there was nothing new."""
        with self._lock:
            new, self._rows = self._rows, []
            if not new:
                return None
            segment = self._segment + new
            try:
                path = self._write(Trace(meta=self._meta(), samples=_samples_frame(segment)))
            except Exception:
                self._rows = new + self._rows  # kept for the next try
                raise
            if self._segment_chunk is not None:
                shutil.rmtree(self._segment_chunk, ignore_errors=True)
            self._segment_count += 1
            full = self._segment_count >= self.segment_flushes
            self._segment, self._segment_chunk = ([], None) if full else (segment, path)
            self._segment_count = 0 if full else self._segment_count
            return path

    def stop(self) -> None:
        """Stop the thread, write what is left and release NVML; never raises, safe twice."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(10.0, 5 * self.interval_s))
        if thread is None or thread.is_alive():  # never started, or stuck in a driver call
            self._guarded(self.flush)
        if thread is None or not thread.is_alive():
            self._guarded(self.source.close)

    def _loop(self) -> None:
        """Sample on a fixed grid (late ticks are skipped, not bunched); flush about every
        `flush_every_s`; the last flush runs when stop() is asked."""
        start = next_tick = last_flush = time.monotonic()
        while not self._stop.is_set():
            self._guarded(self.sample)
            now = time.monotonic()
            if now - last_flush >= self.flush_every_s:
                self._guarded(self.flush)
                last_flush = now
            ticks = int((now - start) / self.interval_s) + 1
            next_tick = max(next_tick + self.interval_s, start + ticks * self.interval_s)
            self._stop.wait(max(0.0, next_tick - time.monotonic()))
        self._guarded(self.flush)

    def _guarded(self, action: Callable[[], object]) -> None:
        """Run `action`; an error is kept (first ten) and logged once per kind, never raised:
        the job must not fail because a GPU could not be read or a disk filled up."""
        try:
            action()
        except Exception as exc:
            text = f"{getattr(action, '__name__', 'nvml')}: {exc.__class__.__name__}: {exc}"
            if len(self.errors) < 10 and text not in self.errors:
                self.errors.append(text)
                log.warning("NVML sampler: %s", text)

    def _write(self, trace: Trace) -> Path:
        """`Trace.save` to a hidden temp dir, then one rename: readers see whole chunks only."""
        final = self.out_dir / f"chunk-{self.chunks:06d}"
        tmp = self.out_dir / f".{final.name}.tmp"
        trace.save(tmp)
        os.replace(tmp, final)
        self.chunks += 1
        return final

    def _meta(self) -> dict[str, Any]:
        return {
            "sources": [{"format": "gpudiag-nvml", "path": str(self.out_dir)}],
            "vendor": "nvidia",
            "tool_versions": {"nvidia-driver": self.source.driver} if self.source.driver else {},
            "nvml": {**self.source.meta(), "interval_s": self.interval_s,
                     "errors": list(self.errors)},
        }


def _samples_frame(rows: list[Row]) -> pd.DataFrame:
    device, timestamps, metric, value, unit = zip(*rows, strict=True)
    return pd.DataFrame({
        "device": pd.array(device, dtype="Int64"), "ts_ns": np.asarray(timestamps, dtype=np.int64),
        "metric": pd.Categorical(metric), "value": np.asarray(value, dtype=np.float64),
        "unit": pd.Categorical(unit),
    })


def start_sampler(out_dir: Path, interval_s: float, *, env: Mapping[str, str] | None = None,
                  reasons: list[str] | None = None) -> NvmlSampler | None:
    """A started sampler of the GPUs `env` (the job's environment) sees, or None.

    None when pynvml is missing, NVML cannot start (no driver) or no GPU is visible; the
    reason, one line for the session's "not collected" message, is appended to `reasons`.
    Never raises.
    """
    why = ""
    try:
        source = NvmlSource(require("pynvml", "Sampling GPU utilization (NVML)"))
        why = source.open(os.environ if env is None else env) or ""
        if not why:
            sampler = NvmlSampler(source, out_dir, interval_s)
            try:
                sampler.start()
            except Exception:
                source.close()
                raise
            return sampler
    except MissingDependencyError as exc:
        why = str(exc)
    except Exception as exc:  # a broken pynvml or an unwritable run dir: profile without it
        why = f"NVML sampler failed to start: {exc.__class__.__name__}: {exc}"
    if reasons is not None:
        reasons.append(why)
    return None
