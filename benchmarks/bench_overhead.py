"""Profiling overhead: steps/s of a training loop bare, under `gpudiag profile --backend torch`
and under `--backend cupti`.

    python benchmarks/bench_overhead.py                          # 3 repeats, 300 steps
    python benchmarks/bench_overhead.py --repeats 5 --json overhead.json
    python benchmarks/bench_overhead.py --device cpu --backends torch --steps 100

The workload is `examples/sync_in_loop.py --fixed` (no host syncs, so the GPU queue stays
full and the profiler's per-launch cost shows). It prints its own steps/s, measured inside
the loop after its warm-up steps, so interpreter start-up, CUDA initialization and
gpudiag's merge at exit stay out of every number. Variants run interleaved (bare, torch,
cupti, bare, ...) so drift of the machine spreads over all of them; the table gives the
median of each and its overhead = bare median / variant median - 1 (the extra time per
step, in %). `cupti` runs only where a GPU and cupti-python are present, and says why not
otherwise. No absolute numbers are asserted: ratios between runs of one machine are what
this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "examples" / "sync_in_loop.py"


def available(backend: str) -> str | None:
    """None when `backend` can run here, else the reason it cannot."""
    sys.path.insert(0, str(REPO))
    try:
        from gpudiag.errors import GpudiagError
        from gpudiag.profiler.backends import resolve
    except ImportError as exc:
        return f"gpudiag is not importable: {exc}"
    try:
        resolve(backend)
    except GpudiagError as exc:
        return str(exc)
    return None


def measure(variant: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """One run of the workload; its JSON line's steps/s, or the error."""
    workload = [sys.executable, str(WORKLOAD), "--fixed", "--steps", str(args.steps),
                "--device", args.device]
    cmd = workload if variant == "bare" else [
        sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir), "--backend", variant,
        "--no-report", "--", *workload]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"example"')]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return {"steps_per_s": json.loads(lines[-1])["steps_per_s"]}


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median steps/s per variant and its overhead against the bare median."""
    out: dict[str, Any] = {}
    for variant, runs in results.items():
        rates = [r["steps_per_s"] for r in runs if r.get("steps_per_s")]
        out[variant] = {"steps_per_s": rates, "median": statistics.median(rates) if rates
                        else None, "errors": [r["error"] for r in runs if "error" in r]}
    bare = out.get("bare", {}).get("median")
    for entry in out.values():
        entry["overhead_pct"] = (round((bare / entry["median"] - 1) * 100, 2)
                                 if bare and entry["median"] else None)
    return out


def table(summary: dict[str, Any], skipped: dict[str, str]) -> str:
    lines = [f"{'variant':<8} {'median steps/s':>15} {'overhead':>9}  runs",
             f"{'-' * 8} {'-' * 15} {'-' * 9}  ----"]
    for variant, e in summary.items():
        median = f"{e['median']:.2f}" if e["median"] else "-"
        over = f"{e['overhead_pct']:+.1f}%" if e["overhead_pct"] is not None else "-"
        runs = ", ".join(f"{r:.1f}" for r in e["steps_per_s"])
        errors = f"  errors: {e['errors'][0]}" if e["errors"] else ""
        lines.append(f"{variant:<8} {median:>15} {over:>9}  {runs}{errors}")
    lines += [f"{variant:<8} skipped: {why}" for variant, why in skipped.items()]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--backends", default="torch,cupti", help="profiled variants to run")
    p.add_argument("--timeout", type=float, default=180, help="seconds per run")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    skipped = {b: why for b in args.backends.split(",") if b and (why := available(b))}
    variants = ["bare"] + [b for b in args.backends.split(",") if b and b not in skipped]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="gpudiag-overhead-") as tmp:
        for i in range(args.repeats):
            for variant in variants:
                results[variant].append(measure(variant, args, Path(tmp) / f"{variant}-{i}"))
    summary = summarize(results)
    print(table(summary, skipped))
    if args.json:
        args.json.write_text(json.dumps({
            "workload": f"examples/sync_in_loop.py --fixed --steps {args.steps}",
            "device": args.device, "repeats": args.repeats, "variants": summary,
            "skipped": skipped}, indent=1))
    return 0 if summary["bare"]["median"] else 1


if __name__ == "__main__":
    sys.exit(main())
