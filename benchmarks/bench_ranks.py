"""Many-rank benchmark: a job of N rank traces, gpudiag vs HTA, end to end, side by side.

    python benchmarks/bench_ranks.py                          # issue 14's table, best of 3
    python benchmarks/bench_ranks.py --jobs dlrm:8 dlrm:64 --repeat 1 --json out.json
    python benchmarks/bench_ranks.py --tools workers1 workers2 hta   # some of the columns

Jobs are built from real Kineto rank traces, copied once per rank with that rank's
`distributedInfo` and its clock shifted by `rank x 37 µs`, so the ranks are distinct and
their collectives do not line up exactly:
- `dlrm:N`: N ranks from the two sampled ranks of a 128-rank DLRM job (120 KB gzipped,
  1.7 MB of JSON, ~1,100 kernels each; rank r copies rank r mod 2): many small files, where
  a tool's fixed cost per file decides;
- `a100:N`: N ranks from rank 0 of a 16-rank A100 job (1.4 MB gzipped, 25.8 MB of JSON,
  6,080 kernels): fewer, larger files.
Each measurement runs in a fresh process (the user's cold start, imports included), with
every tool's bytecode compiled as an installed package has it (this checkout's gpudiag is
compiled first: where PYTHONDONTWRITEBYTECODE is set, as on our VMs, an editable checkout
would compile its 150 modules in every process, ~0.1 s each time, and HTA's
site-packages were compiled when pip installed them):
- gpudiag `merged`: `gpudiag.diagnose(gpudiag.load(folder))` (one process reads every rank
  and merges them);
- gpudiag `workers1` / `workers2`: `gpudiag.diagnose_job(folder, workers=N, rows=False)`
  (files read and analyzed in batches, in this process or on N local worker processes, then
  reduced; without the gap rows, as `gpudiag analyze --workers N` runs it);
- gpudiag `dask2`: the same on a `distributed.LocalCluster` of 2 worker processes, started
  inside the measured process (its start-up is counted);
- HTA: `TraceAnalysis(trace_dir=folder)` then `get_temporal_breakdown()` (HTA parses the
  ranks with a process pool), in HTA's own environment (benchmarks/.venv-hta).
Reported: wall time, CPU time of the process and its children (CPU utilization = CPU /
wall), the measured process's peak RSS ("coordinator") and the peak of the RSS summed over
it and all its descendants, sampled every 20 ms by this script ("total": from outside, so
the sampling takes no time from the measured process's threads).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import gzip
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "shared" / "fixtures" / "kineto"
SOURCES = {
    "dlrm": [FIXTURES / "world128_sampled_rank0.json.gz",
             FIXTURES / "world128_sampled_rank1.json.gz"],
    "a100": [FIXTURES / "a100_80gb_rank0of16_nccl_streamsync.json.gz"],
}
HTA_PYTHON = HERE / ".venv-hta" / "bin" / "python"
SHIFT_US = 37.0
TS = re.compile(rb'"ts": ?(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)')
DISTRIBUTED = re.compile(rb'"distributedInfo": ?\{[^}]*\}')
#: issue 14's table: DLRM ranks at 8 to 64, and 16 ranks of ~25 MB
JOBS = ("dlrm:8", "dlrm:16", "dlrm:32", "dlrm:64", "a100:16")

MEASURE = r"""
import json, resource, sys, time
folder, tool = sys.argv[1], sys.argv[2]
job = {} if len(sys.argv) < 4 else json.loads(sys.argv[3])  # diagnose_job's options
started = time.perf_counter()
if tool == "merged":
    import gpudiag
    dx = gpudiag.diagnose(gpudiag.load(folder))
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
elif tool.startswith("workers"):
    import gpudiag
    dx = gpudiag.diagnose_job(folder, workers=int(tool.removeprefix("workers")), rows=False,
                              **job)
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
elif tool == "dask2":
    import distributed
    import gpudiag
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        dx = gpudiag.diagnose_job(folder, client=client, rows=False, **job)
    detail = {"findings": len(dx.findings), "devices": int(dx.losses["device"].nunique())}
else:
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_dir=folder)
    detail = {"temporal_rows": len(analysis.get_temporal_breakdown(visualize=False))}
wall = time.perf_counter() - started
import multiprocessing  # the CPU of child processes counts once they are reaped
while multiprocessing.active_children():
    time.sleep(0.005)
from multiprocessing import forkserver  # a local pool's workers are the fork server's children:
server = forkserver._forkserver._forkserver_pid  # wait until it has reaped them, then stop it
if server is not None:
    children = f"/proc/{server}/task/{server}/children"
    while open(children).read().strip():
        time.sleep(0.005)
    forkserver._forkserver._stop()
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": own.ru_utime + own.ru_stime + kids.ru_utime
                  + kids.ru_stime, "peak_mb": own.ru_maxrss / 1024, **detail}))
"""


def rank_copy(text: bytes, rank: int, world: int) -> bytes:
    """The trace as rank `rank` of `world` would have written it, `rank x SHIFT_US` later."""
    shift = rank * SHIFT_US
    shifted = TS.sub(lambda m: b'"ts": ' + repr(float(m[1]) + shift).encode(), text)
    info = json.dumps({"backend": "nccl", "rank": rank, "world_size": world}).encode()
    return DISTRIBUTED.sub(b'"distributedInfo": ' + info, shifted, count=1)


def build_job(kind: str, ranks: int, folder: Path) -> Path:
    """`ranks` rank files of `kind` under `folder/<kind><N>` (built once per job)."""
    job = folder / f"{kind}{ranks}"
    if job.is_dir():
        return job
    job.mkdir(parents=True)
    texts = [gzip.decompress(path.read_bytes()) for path in SOURCES[kind]]
    for rank in range(ranks):
        (job / f"rank{rank}.json.gz").write_bytes(
            gzip.compress(rank_copy(texts[rank % len(texts)], rank, ranks), compresslevel=1))
    return job


def measure(python: str, job: Path, tool: str, options: str = "{}") -> dict[str, Any]:
    """One fresh run of `tool` on `job`: its own numbers, and the peak of the RSS summed
    over it and its descendants, sampled from here (a sampling thread inside the measured
    process took ~1 s of 7 from it: every /proc read it made handed the GIL back and forth)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([python, "-c", MEASURE, str(job), tool, options], stdout=out,
                                stderr=err, text=True, cwd=HERE.parent)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(SAMPLE_S)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            return {"error": (err.read().strip().splitlines() or ["failed"])[-1][:200]}
        result: dict[str, Any] = json.loads(out.read().strip().splitlines()[-1])
    result["total_peak_mb"] = max(peak / 2**20, result["peak_mb"])
    return result


#: how often the total RSS is sampled
SAMPLE_S = 0.02


def tree_rss(pid: int) -> int:
    """The RSS of a process and all its descendants, in bytes (0 once it is gone)."""
    total = 0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
    except psutil.Error:
        return 0
    return total


def best(python: str, job: Path, tool: str, repeat: int, options: str = "{}"
         ) -> dict[str, Any]:
    runs = [measure(python, job, tool, options) for _ in range(repeat)]
    good = [r for r in runs if "error" not in r]
    return min(good, key=lambda r: r["wall_s"]) if good else runs[0]


def row(job: str, tool: str, result: dict[str, Any], hta: dict[str, Any] | None) -> str:
    """One table row: wall, CPU utilization, coordinator and total peak RSS, HTA / this."""
    if "error" in result:
        return f"| {job} | {tool} | failed: {result['error']} | | | | |"
    utilization = result["cpu_s"] / result["wall_s"] if result["wall_s"] else 0.0
    ratio = (f"{hta['wall_s'] / result['wall_s']:.2f}×"
             if hta is not None and "error" not in hta and tool != "hta" else "")
    return (f"| {job} | {tool} | {result['wall_s']:.2f} | {utilization:.2f} | "
            f"{result['peak_mb']:,.0f} | {result['total_peak_mb']:,.0f} | {ratio} |")


TOOLS = ("merged", "workers1", "workers2", "dask2", "hta")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), metavar="KIND:RANKS",
                        help=f"kinds: {', '.join(SOURCES)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-python", default=str(HTA_PYTHON))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--no-savings", action="store_true",
                        help="the jobs without expected savings (diagnose_job(savings=False):"
                             " the work a job did before it replayed them)")
    args = parser.parse_args()
    compileall.compile_dir(HERE.parent / "gpudiag", quiet=1)  # as pip leaves an install
    results = []
    lines = ["| job | run | wall s | CPU / wall | coordinator peak MB | total peak MB "
             "| HTA / this |", "|--|--|--:|--:|--:|--:|--:|"]
    with tempfile.TemporaryDirectory(prefix="gpudiag-ranks-") as tmp:
        for spec in args.jobs:
            kind, ranks = spec.split(":")
            job = build_job(kind, int(ranks), Path(tmp))
            print(f"# {spec} in {job}", file=sys.stderr)
            options = json.dumps({"savings": False} if args.no_savings else {})
            measured = {tool: best(args.hta_python if tool == "hta" else sys.executable, job,
                                   tool, args.repeat, options) for tool in args.tools}
            results.append({"job": spec, **measured})
            lines += [row(spec, tool, result, measured.get("hta"))
                      for tool, result in measured.items()]
            print(lines[-len(measured)], file=sys.stderr)
    print(f"Best of {args.repeat}, fresh processes; coordinator: the measured process; "
          "total: it and every process it started, summed.")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
