"""Report benchmark: size and browser render time of the pages gpudiag writes, at scale.

    python benchmarks/bench_report.py                    # 10M-kernel trace + 10,000-kernel ncu
    python benchmarks/bench_report.py --kernels 1000000  # smaller trace

Issue 4's goal: whatever the input size, a page holds under 5 MB of data (plotly.js itself,
4.8 MB inlined once, is not data) and renders in a browser in under 3 s. Measured here:
- the full report of the synthetic trace of bench_diagnose.py (10 million kernels);
- the kernel x metric heatmap of a synthetic Nsight Compute report of 10,000 kernels.
Render time is headless Chromium's from navigation to every plot drawn (tests/browser.py;
browser launch and screenshot excluded), when chromium and playwright are installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def ncu_synthetic(n: int) -> Any:
    """A Trace shaped like an Nsight Compute report of n kernels (kernels + metrics)."""
    import numpy as np
    import pandas as pd

    import gpudiag

    rng = np.random.default_rng(0)
    names = [f"void kernel_{i % 300}<float, {i % 7}>(float*, int)" for i in range(n)]
    kernels = pd.DataFrame({"kernel_id": np.arange(n), "device": 0, "start_ns": 0,
                            "end_ns": rng.integers(1_000, 100_000, n), "name": names,
                            "grid_x": rng.choice([1, 64, 1024], n), "grid_y": 1, "grid_z": 1,
                            "block_x": 256, "block_y": 1, "block_z": 1,
                            "regs_per_thread": 32, "smem_bytes": 0})
    metric_names = {"gpu__time_duration.sum": "nsecond",
                    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "%",
                    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "%",
                    "lts__t_sector_hit_rate.pct": "%",
                    "sm__warps_active.avg.pct_of_peak_sustained_active": "%",
                    "sm__maximum_warps_per_active_cycle_pct": "%",
                    "launch__waves_per_multiprocessor": ""}
    rows = [pd.DataFrame({"kernel_id": np.arange(n), "device": 0, "name": names,
                          "metric": m, "unit": u, "value": rng.random(n) * 100})
            for m, u in metric_names.items()]
    devices = pd.DataFrame([{"device": 0, "name": "NVIDIA H100 80GB HBM3", "vendor": "nvidia",
                             "sm_count": 132, "cc_major": 9, "cc_minor": 0}])
    return gpudiag.Trace(kernels=kernels, metrics=pd.concat(rows), devices=devices,
                         meta={"timeline": False})


def measure(html: str, label: str, out: Path) -> dict[str, Any]:
    from gpudiag.reports.html import _plotly_script

    path = out / f"{label}.html"
    path.write_text(html, encoding="utf-8")
    size = len(html.encode("utf-8"))
    data = size - len(_plotly_script(False).encode("utf-8"))
    row: dict[str, Any] = {"page": label, "bytes": size, "data_bytes": data}
    try:
        from tests.browser import open_report, unavailable_reason
    except ImportError:
        return row
    if unavailable_reason() is None:
        result = open_report(path, out / f"{label}.png")
        row.update(render_s=round(result.render_seconds, 2), plots=result.plots, ok=result.ok)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=10_000_000)
    parser.add_argument("--ncu-kernels", type=int, default=10_000)
    args = parser.parse_args()
    from bench_diagnose import synthetic

    import gpudiag
    from gpudiag.reports.build import heatmap_page, report_page

    out = Path(tempfile.mkdtemp(prefix="gpudiag-bench-report-"))
    trace = synthetic(args.kernels)
    dx = gpudiag.diagnose(trace)
    t0 = time.perf_counter()
    html = report_page(trace, dx)
    row = measure(html, f"report_{args.kernels}_kernels", out)
    row["build_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(row))
    ncu = ncu_synthetic(args.ncu_kernels)
    t0 = time.perf_counter()
    html = heatmap_page(ncu, None)
    row = measure(html, f"ncu_heatmap_{args.ncu_kernels}_kernels", out)
    row["build_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(row))
    print(f"pages and screenshots in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
