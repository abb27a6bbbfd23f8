"""Many-rank benchmark: a job of N rank traces, gpudiag load + diagnose vs HTA, end to end.

    python benchmarks/bench_ranks.py                     # 8, 16 and 32 ranks, best of 1
    python benchmarks/bench_ranks.py --ranks 8 64 --repeat 3 --json out.json
    python benchmarks/bench_ranks.py --tools merged workers2 hta   # some of the columns

The job is built from one real Kineto rank trace (default: the 16-rank A100 fixture, 25.8 MB
uncompressed), copied once per rank with that rank's `distributedInfo` and its clock shifted
by `rank x 37 µs`, so the ranks are distinct and their collectives do not line up exactly.
Each measurement runs in a fresh process (the user's cold start, its own peak memory):
- gpudiag `merged`: `gpudiag.diagnose(gpudiag.load(folder))` (one process reads every rank
  and merges them);
- gpudiag `workers1` / `workers2`: `jobs.diagnose_job(folder, workers=N, rows=False)` (each
  rank read and analyzed apart, in this process or on N spawned processes, then reduced;
  without the gap rows, as `gpudiag analyze --workers N` runs it);
- gpudiag `dask2`: the same on a `distributed.LocalCluster` of 2 worker processes, started
  inside the measured process (its start-up is counted);
- HTA: `TraceAnalysis(trace_dir=folder)` then `get_temporal_breakdown()` (HTA parses the
  ranks with a process pool), in HTA's own environment (benchmarks/.venv-hta).
Wall time, CPU time of the process and its children (CPU utilization = CPU / wall), and peak
RSS of the process and of its children. This is the baseline issue 14 is measured against.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "shared" / "fixtures" / "kineto" / \
    "a100_80gb_rank0of16_nccl_streamsync.json.gz"
HTA_PYTHON = HERE / ".venv-hta" / "bin" / "python"
SHIFT_US = 37.0
TS = re.compile(rb'"ts": ?(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)')
DISTRIBUTED = re.compile(rb'"distributedInfo": ?\{[^}]*\}')

MEASURE = r"""
import json, resource, sys, time
folder, tool = sys.argv[1], sys.argv[2]
started, cpu = time.perf_counter(), time.process_time()
if tool == "merged":
    import gpudiag
    dx = gpudiag.diagnose(gpudiag.load(folder))
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
elif tool.startswith("workers"):
    from gpudiag.jobs.job import diagnose_job
    dx = diagnose_job(folder, workers=int(tool.removeprefix("workers")), rows=False)
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
elif tool == "dask2":
    import distributed
    from gpudiag.jobs.job import diagnose_job
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        dx = diagnose_job(folder, client=client, rows=False)
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
else:
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_dir=folder)
    detail = {"temporal_rows": len(analysis.get_temporal_breakdown(visualize=False))}
wall = time.perf_counter() - started
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime
                  + kids.ru_stime, "peak_mb": own.ru_maxrss / 1024,
                  "children_peak_mb": kids.ru_maxrss / 1024, **detail}))
"""


def rank_copy(text: bytes, rank: int, world: int) -> bytes:
    """The trace as rank `rank` of `world` would have written it, `rank x SHIFT_US` later."""
    shift = rank * SHIFT_US
    shifted = TS.sub(lambda m: b'"ts": ' + repr(float(m[1]) + shift).encode(), text)
    info = json.dumps({"backend": "nccl", "rank": rank, "world_size": world}).encode()
    return DISTRIBUTED.sub(b'"distributedInfo": ' + info, shifted, count=1)


def build_job(source: Path, ranks: int, folder: Path) -> Path:
    """`ranks` rank files under `folder/ranks<N>` (built once per size)."""
    job = folder / f"ranks{ranks}"
    if job.is_dir():
        return job
    job.mkdir(parents=True)
    text = gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes()
    for rank in range(ranks):
        (job / f"rank{rank}.json.gz").write_bytes(
            gzip.compress(rank_copy(text, rank, ranks), compresslevel=1))
    return job


def measure(python: str, job: Path, tool: str) -> dict[str, Any]:
    run = subprocess.run([python, "-c", MEASURE, str(job), tool], check=False,
                         capture_output=True, text=True, cwd=HERE.parent)
    if run.returncode != 0:
        return {"error": (run.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def best(python: str, job: Path, tool: str, repeat: int) -> dict[str, Any]:
    runs = [measure(python, job, tool) for _ in range(repeat)]
    good = [r for r in runs if "error" not in r]
    return min(good, key=lambda r: r["wall_s"]) if good else runs[0]


def row(ranks: int, tool: str, result: dict[str, Any], hta: dict[str, Any] | None) -> str:
    """One table row: wall, CPU utilization, coordinator and largest child peak RSS."""
    if "error" in result:
        return f"| {ranks} | {tool} | failed: {result['error']} | | | | |"
    utilization = result["cpu_s"] / result["wall_s"] if result["wall_s"] else 0.0
    ratio = (f"{hta['wall_s'] / result['wall_s']:.2f}×"
             if hta is not None and "error" not in hta and tool != "hta" else "")
    return (f"| {ranks} | {tool} | {result['wall_s']:.2f} | {utilization:.2f} | "
            f"{result['peak_mb']:,.0f} | {result['children_peak_mb']:,.0f} | {ratio} |")


TOOLS = ("merged", "workers1", "workers2", "dask2", "hta")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--hta-python", default=str(HTA_PYTHON))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    args = parser.parse_args()
    results = []
    lines = ["| ranks | run | wall s | CPU/wall | coordinator peak MB | largest child peak MB "
             "| HTA / this |", "|--:|--|--:|--:|--:|--:|--:|"]
    with tempfile.TemporaryDirectory(prefix="gpudiag-ranks-") as tmp:
        for ranks in args.ranks:
            job = build_job(args.source, ranks, Path(tmp))
            print(f"# {ranks} ranks in {job}", file=sys.stderr)
            measured = {tool: best(args.hta_python if tool == "hta" else sys.executable, job,
                                   tool, args.repeat) for tool in args.tools}
            results.append({"ranks": ranks, **measured})
            lines += [row(ranks, tool, result, measured.get("hta"))
                      for tool, result in measured.items()]
    print(f"Source: {args.source.name}, best of {args.repeat}, fresh processes; the "
          "coordinator is the measured process, a child a pool or Dask worker (HTA: its "
          "parser pool).")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
