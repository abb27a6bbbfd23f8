"""A/B benchmark of two gpudiag trees on one interpreter: load, diagnose and the pages.

    git worktree add ../before <commit>
    python benchmarks/bench_ab.py ../before      # then, in the same environment:
    PYTHONPATH=. python benchmarks/bench_ab.py .

Run both with the same interpreter and libraries (a venv with gpudiag installed non-editable,
the tree under test first on PYTHONPATH): an editable install's import hook would win over
PYTHONPATH, and two venvs differ by more than the code. Prints one JSON line of CPU seconds,
the best of `--repeat` runs per step: loading two Kineto fixtures and diagnosing them, the
diagnosis and report page of `bench_diagnose.synthetic(--kernels)`, and the Nsight Compute
heatmap page of `bench_report.ncu_synthetic(10_000)` with and without its Diagnosis.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "kineto"
TRACES = ("a100_80gb_rank0of16_nccl_streamsync.json.gz",
          "v100_rank1of2_nccl_profile_memory.json.gz")


def best(step: Callable[[], object], repeat: int) -> float:
    """The least CPU time of `repeat` runs of `step` (CPU time: less disturbed by others)."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        step()
        times.append(time.process_time() - started)
    return round(min(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="the gpudiag checkout whose benchmarks to use")
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree / "benchmarks")]
    from bench_diagnose import synthetic
    from bench_report import ncu_synthetic

    import gpudiag
    from gpudiag.reports.build import heatmap_page, report_page

    out: dict[str, object] = {"gpudiag": gpudiag.__file__}
    for name in TRACES:
        path = FIXTURES / name
        out[f"load {name}"] = best(lambda path=path: gpudiag.load(path), args.repeat + 2)
        trace = gpudiag.load(path)
        out[f"diagnose {name}"] = best(lambda trace=trace: gpudiag.diagnose(trace),
                                       args.repeat)
    big = synthetic(args.kernels)
    diagnosis = gpudiag.diagnose(big)
    out[f"diagnose {args.kernels} kernels"] = best(lambda: gpudiag.diagnose(big), args.repeat)
    out[f"report page {args.kernels} kernels"] = best(lambda: report_page(big, diagnosis),
                                                      args.repeat)
    ncu = ncu_synthetic(10_000)
    ncu_diagnosis = gpudiag.diagnose(ncu)
    out["ncu heatmap page, no Diagnosis"] = best(lambda: heatmap_page(ncu, None), args.repeat)
    out["ncu heatmap page, its Diagnosis"] = best(lambda: heatmap_page(ncu, ncu_diagnosis),
                                                  args.repeat)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
