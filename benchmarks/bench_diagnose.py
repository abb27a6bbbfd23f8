"""Diagnose benchmark: `gpudiag.diagnose` on a synthetic 10-million-kernel trace, and on the
fixture traces next to HTA's own analyses in the same run.

    python benchmarks/bench_diagnose.py                      # 10M kernels, 8 streams
    python benchmarks/bench_diagnose.py --kernels 1000000    # smaller
    python benchmarks/bench_diagnose.py --fixtures           # our analyses vs HTA's
    python benchmarks/bench_diagnose.py --critical           # critical paths, ours vs HTA's

The synthetic trace has every table diagnose uses: kernels with launch configurations on 8
streams of one H100, one launch call per kernel, a stream sync every 1000 kernels, an NCCL
all_reduce every 500 kernels on a ninth stream, and copies. Each measurement runs in a
fresh process; it reports the time of `diagnose` alone and the peak RSS of the process
(`ru_maxrss`) before and after it. Goal (issue 3): under 60 s on 2 cores, under 6 GB.

HTA comparison: HTA (benchmarks/.venv-hta) loads each Kineto fixture, then
`get_temporal_breakdown` and `get_idle_time_breakdown` are timed; gpudiag loads the same
file, then its equivalents (`timeline.temporal_breakdown`, `timeline.idle_breakdown`) and
the whole `diagnose` (every analyzer) are timed. Loads are excluded on both sides (HTA
does much of its work while loading, which bench_load.py measures).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = REPO.parent / "shared" / "fixtures" / "kineto"
HTA_PYTHON = HERE / ".venv-hta" / "bin" / "python"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic(n: int, seed: int = 0) -> Any:
    """A Trace of n kernels (numpy-built, no Python loop per kernel)."""
    import numpy as np
    import pandas as pd

    import gpudiag

    rng = np.random.default_rng(seed)
    streams = 8
    dur = rng.integers(2_000, 40_000, n)
    gap = rng.integers(500, 8_000, n)
    gap[rng.random(n) < 0.001] = 2_000_000  # occasional host stalls
    stream = np.arange(n) % streams
    start = np.cumsum(gap // streams + dur // streams)  # 8 streams overlap
    end = start + dur
    corr = np.arange(1, n + 1)
    grid = rng.choice([1, 16, 132, 264, 1000, 5000], n)
    kernels = pd.DataFrame({
        "pid": 1, "device": 0, "stream": stream + 7, "start_ns": start, "end_ns": end,
        "name": pd.Categorical.from_codes(rng.integers(0, 50, n),
                                          [f"kernel_{i}" for i in range(49)]
                                          + ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]),
        "correlation": corr, "kernel_id": np.arange(n), "grid_x": grid, "grid_y": 1,
        "grid_z": 1, "block_x": 256, "block_y": 1, "block_z": 1, "regs_per_thread": 64,
        "smem_bytes": 0})
    api_start = start - rng.integers(5_000, 30_000, n)
    api = pd.DataFrame({"pid": 1, "tid": 1, "start_ns": api_start, "end_ns": api_start + 4_000,
                        "name": "cudaLaunchKernel",
                        "kind": "runtime", "correlation": corr})
    every = np.arange(0, n, 1000)
    syncs = pd.DataFrame({"pid": 1, "tid": 1, "device": 0, "stream": 7,
                          "start_ns": end[every] - 50_000, "end_ns": end[every] + 1_000,
                          "kind": "stream", "correlation": n + 1 + np.arange(len(every))})
    coll = np.arange(0, n, 500)
    collectives = pd.DataFrame({
        "pid": 1, "rank": 0, "device": 0, "stream": 99, "start_ns": start[coll],
        "end_ns": start[coll] + 30_000, "op": "all_reduce", "bytes": 1 << 22,
        "group_size": 8, "comm": "0", "seq": np.arange(len(coll)), "kernel_id": pd.NA})
    copies = pd.DataFrame({"pid": 1, "device": 0, "stream": 8, "start_ns": end[coll] + 100,
                           "end_ns": end[coll] + 2_100, "kind": "HtoD", "bytes": 1 << 20,
                           "host_mem": "pinned"})
    devices = pd.DataFrame([{"device": 0, "name": "NVIDIA H100 80GB HBM3", "vendor": "nvidia",
                             "sm_count": 132, "cc_major": 9, "cc_minor": 0}])
    return gpudiag.Trace(kernels=kernels, api=api, syncs=syncs, collectives=collectives,
                         copies=copies, devices=devices)


def run_synthetic(n: int, savings: bool = True) -> dict[str, Any]:
    import gpudiag

    trace = synthetic(n)
    before = _rss_mb()
    t0 = time.perf_counter()
    dx = gpudiag.diagnose(trace, savings=savings)
    seconds = time.perf_counter() - t0
    return {"kernels": n, "savings": savings, "seconds": seconds, "rss_before_mb": before,
            "rss_peak_mb": _rss_mb(), "findings": len(dx.findings),
            "replayed": int(dx.findings["saving_ns"].notna().sum()),
            "notes": [note for note in dx.notes if "savings" in note],
            "losses": dx.losses.set_index("cause")["share"].round(4).to_dict()}


def run_ours(path: str) -> dict[str, Any]:
    import gpudiag
    from gpudiag.analyzers import timeline

    trace = gpudiag.load(path)
    t0 = time.perf_counter()
    timeline.temporal_breakdown(trace)
    t1 = time.perf_counter()
    timeline.idle_breakdown(trace)
    t2 = time.perf_counter()
    gpudiag.diagnose(trace)
    return {"temporal_s": t1 - t0, "idle_s": t2 - t1, "seconds": time.perf_counter() - t2}


HTA_SCRIPT = """
import json, shutil, sys, tempfile, time, pathlib
from hta.trace_analysis import TraceAnalysis
src = pathlib.Path(sys.argv[1]); d = tempfile.mkdtemp()
shutil.copy(src, pathlib.Path(d) / ("rank-0." + src.name.split(".", 1)[1]))
ta = TraceAnalysis(trace_dir=d)
t0 = time.perf_counter(); ta.get_temporal_breakdown(visualize=False)
ranks = sorted(ta.t.traces)  # HTA reads the rank from the file; rank-1 files exist
t1 = time.perf_counter(); ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
t2 = time.perf_counter()
print(json.dumps({"temporal_s": t1 - t0, "idle_s": t2 - t1}))
"""


HTA_CRITICAL = """
import json, os, shutil, sys, tempfile, time, pathlib
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
from hta.trace_analysis import TraceAnalysis
src = pathlib.Path(sys.argv[1]); d = tempfile.mkdtemp()
shutil.copy(src, pathlib.Path(d) / ("rank-0." + src.name.split(".", 1)[1]))
ta = TraceAnalysis(trace_dir=d)
rank = sorted(ta.t.traces)[0]
t0 = time.perf_counter()
graph, ok = ta.critical_path_analysis(rank=rank, annotation="", instance_id=None)
print(json.dumps({"critical_s": time.perf_counter() - t0, "ok": bool(ok)}))
"""


def run_critical(path: str) -> dict[str, Any]:
    """Ours on one fixture, its load excluded: the critical path, the replay graph, and
    diagnose with and without expected savings."""
    import gpudiag
    from gpudiag.analyzers.critical.path import critical_path
    from gpudiag.analyzers.critical.replay import Replay

    trace = gpudiag.load(path)
    t0 = time.perf_counter()
    critical_path(trace)
    t1 = time.perf_counter()
    Replay.of(trace)
    t2 = time.perf_counter()
    gpudiag.diagnose(gpudiag.load(path), savings=False)
    t3 = time.perf_counter()
    dx = gpudiag.diagnose(gpudiag.load(path))
    t4 = time.perf_counter()
    return {"critical_s": t1 - t0, "replay_graph_s": t2 - t1, "diagnose_s": t3 - t2,
            "diagnose_savings_s": t4 - t3, "replayed": int(dx.findings["saving_ns"].notna().sum()),
            "findings": len(dx.findings)}


def critical() -> dict[str, Any]:
    """The largest Kineto fixture: our critical path (and savings) beside HTA's."""
    path = max(FIXTURES.glob("*.json*"), key=lambda p: p.stat().st_size)
    row: dict[str, Any] = {"trace": path.name,
                           **_child([__file__, "--worker-critical", str(path)])}
    if HTA_PYTHON.exists():
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(HTA_CRITICAL)
        row["hta_critical_s"] = _child([f.name, str(path)], python=str(HTA_PYTHON))[
            "critical_s"]
    return row


def _child(args: list[str], python: str = sys.executable) -> dict[str, Any]:
    out = subprocess.run([python, *args], capture_output=True, text=True, check=True,
                         cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fixtures() -> list[dict[str, Any]]:
    rows = []
    for path in sorted(FIXTURES.glob("*.json*")):
        ours = _child([__file__, "--worker-ours", str(path)])
        row = {"trace": path.name, "gpudiag_temporal_s": round(ours["temporal_s"], 3),
               "gpudiag_idle_s": round(ours["idle_s"], 3),
               "gpudiag_diagnose_s": round(ours["seconds"], 3)}
        if HTA_PYTHON.exists():
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(HTA_SCRIPT)
            try:
                hta = _child([f.name, str(path)], python=str(HTA_PYTHON))
                row["hta_temporal_s"] = round(hta["temporal_s"], 3)
                row["hta_idle_s"] = round(hta["idle_s"], 3)
            except subprocess.CalledProcessError as exc:
                row["hta_error"] = exc.stderr.strip().splitlines()[-1][:120]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=10_000_000)
    parser.add_argument("--fixtures", action="store_true")
    parser.add_argument("--no-savings", action="store_true",
                        help="diagnose without the expected savings' replays (the baseline)")
    parser.add_argument("--worker-synthetic", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-no-savings", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--critical", action="store_true",
                        help="the critical path and savings on the largest fixture, and HTA's")
    parser.add_argument("--worker-ours", help=argparse.SUPPRESS)
    parser.add_argument("--worker-critical", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_synthetic:
        print(json.dumps(run_synthetic(args.worker_synthetic, not args.worker_no_savings)))
    elif args.worker_ours:
        print(json.dumps(run_ours(args.worker_ours)))
    elif args.worker_critical:
        print(json.dumps(run_critical(args.worker_critical)))
    elif args.critical:
        print(json.dumps(critical(), indent=1))
    elif args.fixtures:
        for row in fixtures():
            print(json.dumps(row))
    else:
        flags = ["--worker-no-savings"] if args.no_savings else []
        print(json.dumps(_child([__file__, "--worker-synthetic", str(args.kernels), *flags]),
                         indent=1))


if __name__ == "__main__":
    main()
