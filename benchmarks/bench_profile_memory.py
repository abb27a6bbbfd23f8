"""Memory and time that profiling adds to a training program, per number of iterations:
bare, under `gpudiag profile --backend torch` (the default window and `--steps all`), and
under torch.profiler written by hand with the same options.

    python benchmarks/bench_profile_memory.py                      # 100 and 300 iterations
    python benchmarks/bench_profile_memory.py --iters 100 300 1000 --json memory.json
    python benchmarks/bench_profile_memory.py --iters 60 --startup-s 20   # a long start-up

The workload is `benchmarks/programs/gpt_char.py`, nanoGPT's character model shape on CPU
(no gpudiag markers: steps come from the optimizer hook); `--startup-s S` gives it S seconds
of start-up before the model is built, as HuggingFace's `run_clm` or a Lightning Trainer has
(text tokenized in Python, one small tensor per example: the profiler records millions of
Python calls before any step). Peak memory is the program's own
peak resident set (getrusage of the waited-for child: for the gpudiag variants the session
records it in the run's meta.json, so the session's own merge is not counted). Step time
is the program's median step after 5 warm-up steps, measured inside its loop. Run on a
quiet machine; ratios between variants of one run are what this measures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "benchmarks" / "programs" / "gpt_char.py"
VARIANTS = ("bare", "gpudiag", "gpudiag --steps all", "torch.profiler by hand")


def run_variant(variant: str, iters: int, startup_s: float, scratch: Path) -> dict[str, Any]:
    """One run: its peak RSS (bytes), median step (s) and wall time."""
    program = [sys.executable, str(WORKLOAD), "--iters", str(iters), "--startup-s",
               str(startup_s)]
    if variant.startswith("gpudiag"):
        run_dir = scratch / f"{variant.replace(' ', '_')}-{iters}-{startup_s}"
        extra = ["--steps", "all"] if variant.endswith("all") else []
        cmd = [sys.executable, "-m", "gpudiag", "profile", "--backend", "torch", "--no-report",
               "-o", str(run_dir), *extra, "--", *program]
    else:
        run_dir = None
        cmd = program + (["--manual-profiler"] if variant.startswith("torch") else [])
    probe = ("import resource, subprocess, sys, json, time\n"
             "t = time.perf_counter(); done = subprocess.run(sys.argv[1:], capture_output=True,"
             " text=True)\n"
             "print(json.dumps({'rc': done.returncode, 'out': done.stdout, 'err': done.stderr,"
             " 'wall_s': time.perf_counter() - t,"
             " 'maxrss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))")
    raw = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                         check=True, cwd=scratch)
    result = json.loads(raw.stdout)
    if result["rc"] != 0:
        raise SystemExit(f"{variant} failed: {result['err'][-2000:]}")
    line = [x for x in result["out"].splitlines() if x.startswith("{")][-1]
    program_out = json.loads(line)
    peak = result["maxrss"]
    if run_dir is not None:
        peak = json.loads((run_dir / "meta.json").read_text())["peak_rss_bytes"]
    return {"variant": variant, "iters": iters, "startup_s": startup_s, "peak_rss_bytes": peak,
            "step_s": program_out["step_s"], "wall_s": result["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--startup-s", type=float, nargs="+", default=[0.0],
                        help="Seconds of start-up work before the model is built (each value "
                             "is a case, with every --iters).")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON here.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for startup_s in args.startup_s:
            for iters in args.iters:
                for variant in VARIANTS:
                    rows.append(run_variant(variant, iters, startup_s, Path(tmp)))
                    print(f"done: {variant} x {iters}, start-up {startup_s} s", file=sys.stderr)
    bare = {(r["iters"], r["startup_s"]): r for r in rows if r["variant"] == "bare"}
    print(f"{'variant':<24}{'iters':>6}{'start-up':>9}{'peak RSS':>11}{'added':>10}{'step':>10}"
          f"{'slower':>8}{'wall':>8}")
    for row in rows:
        base = bare[row["iters"], row["startup_s"]]
        added = (row["peak_rss_bytes"] - base["peak_rss_bytes"]) / 2**20
        slower = row["step_s"] / base["step_s"] - 1
        print(f"{row['variant']:<24}{row['iters']:>6}{row['startup_s']:>8.0f}s"
              f"{row['peak_rss_bytes'] / 2**20:>9.0f}MB{added:>8.0f}MB"
              f"{row['step_s'] * 1e3:>8.1f}ms{slower:>+8.0%}{row['wall_s']:>7.1f}s")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
