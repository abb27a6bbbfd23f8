"""Run Holistic Trace Analysis on Kineto traces and print its breakdowns as JSON.

Run by tests/test_hta_oracle.py with an interpreter that has HTA installed (HTA pins its
own pandas and pulls in jupyterlab, so it usually lives in a venv of its own):

    python tests/hta_oracle_runner.py OUT.json TRACE.json.gz [TRACE ...]

Only the standard library and HTA are imported. For each trace and each time mode
(`rounded`: HTA's default whole-µs rounding; `exact`: HTA_DISABLE_NS_ROUNDING=1, float µs)
it writes the temporal breakdown and the idle-time breakdown (all streams of the trace's
rank, consecutive_kernel_delay=30, which HTA applies in µs), or the error HTA raised.

Three HTA behaviours that are not the arithmetic under test are switched off, so both
sides see the same events:
- the last-profiler-step filter (`Trace._filter_irrelevant_gpu_kernels`), which drops GPU
  events launched in the last ProfilerStep or with no CPU launch in the kept steps; our
  analyzers cover the whole trace;
- `cuda_sync` events, removed from HTA's copy of the trace: its temporal breakdown counts
  these host waits as GPU busy time, which ours do not;
- the `stream` arg of host events, removed likewise: HTA counts any event with a stream as
  GPU time, and torch.compile's triton launch ops (`cpu_op`) record the stream they use.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

MODES = {"rounded": "0", "exact": "1"}
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def main(out: str, paths: list[str]) -> None:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    import hta  # noqa: F401  (timed: the import cost is part of what CI pays)
    from hta.common.trace import Trace

    import_s = time.perf_counter() - started
    if not hasattr(Trace, "_filter_irrelevant_gpu_kernels"):
        raise SystemExit("this HTA has no Trace._filter_irrelevant_gpu_kernels: "
                         "update tests/hta_oracle_runner.py for its step filter")
    Trace._filter_irrelevant_gpu_kernels = lambda self, *args, **kwargs: None
    results: dict[str, Any] = {"import_s": import_s, "version": _version(), "traces": {}}
    for path in map(Path, paths):
        with tempfile.TemporaryDirectory() as folder:
            removed = _prepare(path, Path(folder) / path.name)
            results["traces"][path.name] = {
                mode: {**_analyze(folder, flag), "removed": removed}
                for mode, flag in MODES.items()}
    Path(out).write_text(json.dumps(results))


def _analyze(folder: str, rounding_off: str) -> dict[str, Any]:
    os.environ["HTA_DISABLE_NS_ROUNDING"] = rounding_off
    from hta.trace_analysis import TraceAnalysis

    started = time.perf_counter()
    try:
        analysis = TraceAnalysis(trace_dir=folder)
        ranks = analysis.t.get_ranks()
        idle, _ = analysis.get_idle_time_breakdown(ranks=ranks, visualize=False,
                                                   consecutive_kernel_delay=30)
        temporal = analysis.get_temporal_breakdown(visualize=False)
    except Exception as exc:  # HTA's own failure is a result: the test reports it
        return {"error": f"{type(exc).__name__}: {exc}".strip(": ")}
    return {"ranks": [int(r) for r in ranks], "seconds": time.perf_counter() - started,
            "temporal": temporal.to_dict("records"), "idle": idle.to_dict("records")}


def _prepare(src: Path, dst: Path) -> dict[str, int]:
    """The trace as HTA finds it, in a folder of its own, minus what HTA would wrongly take
    for GPU work: `cuda_sync` events, and the `stream` arg of host events (torch.compile's
    triton launch ops carry one, and HTA counts every event with a stream as GPU time)."""
    opener: Any = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    kept = [e for e in events if not (isinstance(e, dict) and e.get("cat") == "cuda_sync")]
    host_streams = 0
    for event in kept:
        args = event.get("args") if isinstance(event, dict) else None
        if (isinstance(args, dict) and event.get("cat") not in GPU_CATS
                and _is_stream(args.get("stream"))):
            del args["stream"]
            host_streams += 1
    removed = {"cuda_sync": len(events) - len(kept), "host_stream_args": host_streams}
    if not any(removed.values()):
        shutil.copy(src, dst)
        return removed
    if isinstance(doc, dict):
        doc["traceEvents"] = kept
    with opener(dst, "wt") as fh:
        json.dump(doc if isinstance(doc, dict) else kept, fh)
    return removed


def _is_stream(value: Any) -> bool:
    """Whether HTA reads the value as a stream (`normalize_gpu_stream_numbers`: int(value),
    -1 when that fails; ROCm writes '0x0', which HTA ignores)."""
    try:
        return value is not None and int(value) != -1
    except (TypeError, ValueError):
        return False


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("HolisticTraceAnalysis")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
