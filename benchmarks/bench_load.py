"""Load benchmark: gpudiag.load vs Holistic Trace Analysis (HTA) on the same Kineto traces.

Every load runs in its own fresh Python process (a worker started by this script), so each
measurement pays the same cold start a user pays, and peak memory is that of one load alone.
The worker times only the load call; the imports before it are timed and reported apart.

    python benchmarks/bench_load.py                      # fixture traces of 20 MB+ uncompressed
    python benchmarks/bench_load.py --all --repeat 5     # every fixture trace
    python benchmarks/bench_load.py trace.json.gz --json out.json
    python benchmarks/bench_load.py --split              # add where gpudiag's load time goes

HTA runs with its own interpreter (`--hta-python`, default benchmarks/.venv-hta/bin/python
when it exists): it pulls jupyterlab and is never a dependency of gpudiag. See README.md.

Memory: each worker reads `ru_maxrss` of itself once after its imports (the baseline) and
once after the load (the peak); "extra" is peak minus baseline, the memory the load itself
took. The worker also reports `ru_maxrss` of its child processes, in case a loader forks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
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
HTA_VENV_PYTHON = HERE / ".venv-hta" / "bin" / "python"
MIN_MB = 20.0  # default traces: fixtures at least this large uncompressed
GOAL_SPEEDUP = 5.0  # the goal: at least 5x faster than HTA ...
GOAL_MEMORY = 0.5  # ... with at most half of its extra memory
TOOLS = ("gpudiag", "hta")
LOAD_START, LOAD_END = "##gpudiag-bench-load-start##", "##gpudiag-bench-load-end##"


# ----------------------------------------------------------------------------- worker side


def _maxrss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size so far, in MB (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(who).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _versions(*dists: str) -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    found.update({d: _version(d) for d in dists})
    return found


def _worker_gpudiag(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    import gpudiag

    import_s = time.perf_counter() - t0
    baseline = _maxrss_mb()
    c0, t0 = time.process_time(), time.perf_counter()
    trace = gpudiag.load(path)
    load_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    peak = _maxrss_mb()
    rows = {name: len(frame) for name, frame in trace.tables().items() if len(frame)}
    return {
        "import_s": import_s, "load_s": load_s, "cpu_s": cpu_s,
        "baseline_mb": baseline, "peak_mb": peak,
        "children_peak_mb": _maxrss_mb(resource.RUSAGE_CHILDREN), "rows": rows,
        "versions": _versions("gpudiag", "pandas", "numpy", "msgspec", "pyarrow"),
    }


def _worker_hta(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    import_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="bench-hta-") as tmp:
        # HTA reads every trace in a directory: give it one holding only this trace.
        (Path(tmp) / path.name).symlink_to(path.resolve())
        baseline = _maxrss_mb()
        c0, t0 = time.process_time(), time.perf_counter()
        analysis = TraceAnalysis(trace_dir=tmp)
        load_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        peak = _maxrss_mb()
    rows = {f"rank{rank}": len(frame) for rank, frame in analysis.t.traces.items()}
    return {
        "import_s": import_s, "load_s": load_s, "cpu_s": cpu_s,
        "baseline_mb": baseline, "peak_mb": peak,
        "children_peak_mb": _maxrss_mb(resource.RUSAGE_CHILDREN), "rows": rows,
        "versions": _versions("HolisticTraceAnalysis", "pandas", "numpy"),
    }


def _worker_split(path: Path, repeat: int) -> dict[str, Any]:
    """Where gpudiag's load time goes: a cold first load, then warm gunzip / decode / load."""
    import cProfile
    import pstats

    import gpudiag
    from gpudiag.readers.chrome import structs as chrome_json
    from gpudiag.readers.files import read_bytes

    before = set(sys.modules)
    print(LOAD_START, file=sys.stderr, flush=True)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    gpudiag.load(path)
    cold_s = time.perf_counter() - t0
    cold_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(LOAD_END, file=sys.stderr, flush=True)
    lazy = sorted({name.split(".")[0] for name in set(sys.modules) - before})
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gpudiag.load(path)
    warm_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
            del result
        return min(times)

    content = read_bytes(path)
    phases = {
        "gunzip_s": best(lambda: read_bytes(path)),
        "decode_s": best(lambda: chrome_json._DECODER.decode(content)),
        "load_s": best(lambda: gpudiag.load(path)),
    }
    content = b""
    profile = cProfile.Profile()
    profile.enable()
    gpudiag.load(path)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:10]
    hot = [
        {"function": f"{Path(file).name}:{line}({func})" if line else func,
         "calls": calls, "tottime_s": tottime, "cumtime_s": cumtime}
        for (file, line, func), (_, calls, tottime, cumtime, _) in top
    ]
    return {"cold_load_s": cold_s, "lazy_packages": lazy, "cold_page_faults": cold_faults,
            "warm_page_faults": warm_faults, **phases, "profile_tottime": hot}


def _worker_memory(path: Path) -> dict[str, Any]:
    """Peak RSS of gpudiag's first two steps alone, in a fresh process: gunzip, then decode."""
    import gpudiag  # noqa: F401  (the same baseline as the gpudiag worker)
    from gpudiag.readers.chrome import structs as chrome_json
    from gpudiag.readers.files import read_bytes

    baseline = _maxrss_mb()
    content = read_bytes(path)
    gunzip_peak = _maxrss_mb()
    doc = chrome_json._DECODER.decode(content)
    decode_peak = _maxrss_mb()
    return {"content_mb": len(content) / 1e6, "events": len(doc.traceEvents or []),
            "gunzip_extra_mb": gunzip_peak - baseline, "decode_extra_mb": decode_peak - baseline}


def worker(tool: str, path: Path, repeat: int) -> int:
    """Run one load and print its measurements as one JSON line (an `error` key on failure)."""
    try:
        if tool == "split":
            result = _worker_split(path, repeat)
        else:
            result = {"gpudiag": _worker_gpudiag, "hta": _worker_hta,
                      "memory": _worker_memory}[tool](path)
    except Exception as exc:  # report what failed, the runner prints it in the table
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- runner side


def uncompressed_mb(path: Path) -> float:
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    if not gzipped:
        return path.stat().st_size / 1e6
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            size += len(chunk)
    return size / 1e6


def default_traces(include_small: bool) -> list[Path]:
    if not FIXTURES.is_dir():
        sys.exit(f"no fixture directory at {FIXTURES}; pass trace paths explicitly")
    found = sorted(p for p in FIXTURES.iterdir() if p.is_file())
    if include_small:
        return found
    return [p for p in found if uncompressed_mb(p) >= MIN_MB]


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "memory_gb": mem_gb,
            "os": platform.platform(), "load_average_1min_at_start": load and round(load[0], 2)}


def run_worker(python: str, tool: str, path: Path, *, repeat: int = 1, timeout: float = 900,
               importtime: bool = False) -> tuple[dict[str, Any], str]:
    """One fresh worker process; its JSON result (or {'error': ...}) and its stderr."""
    cmd = [python, *(["-X", "importtime"] if importtime else []), str(Path(__file__).resolve()),
           "--worker", tool, "--repeat", str(repeat), str(path)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=REPO, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}, ""
    except OSError as exc:
        return {"error": f"cannot start {python}: {exc}"}, ""
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"error": f"worker exited {proc.returncode}: {tail}"}
    return result, proc.stderr


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Best of the runs: the least load time, and the run with the least extra memory."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[0]["error"], "runs": runs}
    mem = min(good, key=lambda r: r["peak_mb"] - r["baseline_mb"])
    return {
        "load_s": min(r["load_s"] for r in good),
        "cpu_s": min(r["cpu_s"] for r in good),
        "import_s": min(r["import_s"] for r in good),
        "baseline_mb": mem["baseline_mb"], "peak_mb": mem["peak_mb"],
        "extra_mb": mem["peak_mb"] - mem["baseline_mb"],
        "children_peak_mb": max(r["children_peak_mb"] for r in good),
        "rows": good[0]["rows"], "versions": good[0]["versions"],
        "failed_runs": len(runs) - len(good), "runs": runs,
    }


def bench(paths: list[Path], pythons: dict[str, str], repeat: int) -> list[dict[str, Any]]:
    results = []
    for path in paths:
        size = uncompressed_mb(path)
        print(f"# {path.name} ({size:.1f} MB)", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in TOOLS}
        for i in range(repeat):  # interleave the tools so drift hits both alike
            for tool in TOOLS:
                result, _ = run_worker(pythons[tool], tool, path)
                runs[tool].append(result)
                shown = result.get("error") or f"{result['load_s']:.3f} s"
                print(f"#   run {i + 1}/{repeat} {tool}: {shown}", file=sys.stderr, flush=True)
        entry: dict[str, Any] = {"trace": path.name, "path": str(path), "uncompressed_mb": size}
        entry.update({tool: summarize(runs[tool]) for tool in TOOLS})
        g, h = entry["gpudiag"], entry["hta"]
        if "error" not in g and "error" not in h:
            entry["speedup"] = h["load_s"] / g["load_s"]
            entry["cpu_speedup"] = h["cpu_s"] / g["cpu_s"]
            entry["extra_memory_ratio"] = (
                g["extra_mb"] / h["extra_mb"] if h["extra_mb"] > 0 else None)
            entry["goal_met"] = (entry["speedup"] >= GOAL_SPEEDUP
                                 and entry["extra_memory_ratio"] is not None
                                 and entry["extra_memory_ratio"] <= GOAL_MEMORY)
        results.append(entry)
    return results


def split(paths: list[Path], python: str, repeat: int) -> list[dict[str, Any]]:
    """gpudiag's load broken into gunzip, JSON decode and table building, one process per trace."""
    out = []
    for path in paths:
        print(f"# split {path.name}", file=sys.stderr, flush=True)
        result, stderr = run_worker(python, "split", path, repeat=repeat, importtime=True)
        if "error" not in result:
            result["lazy_import_s"] = _import_seconds_between_markers(stderr)
        memory, _ = run_worker(python, "memory", path)
        out.append({"trace": path.name, **result, "memory": memory})
    return out


def _import_seconds_between_markers(stderr: str) -> float:
    """Sum of top-level `-X importtime` cumulative times printed during the first load."""
    total_us, inside = 0, False
    for line in stderr.splitlines():
        if line == LOAD_START:
            inside = True
        elif line == LOAD_END:
            break
        elif inside and line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|", 2)
            if name.startswith(" ") and not name.startswith("  ") and cumulative.strip().isdigit():
                total_us += int(cumulative)  # a top-level import, its children included
    return total_us / 1e6


# ----------------------------------------------------------------------------- report


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _table_row(r: dict[str, Any]) -> str:
    g, h = r["gpudiag"], r["hta"]
    cells = [f"`{r['trace']}`", f"{r['uncompressed_mb']:.1f}"]
    cells += ["error" if "error" in side else f"{side['load_s']:.3f}" for side in (g, h)]
    cells.append(_f(r.get("speedup"), ".1f") + ("×" if "speedup" in r else ""))
    cells += ["–" if "error" in side else f"{side['cpu_s']:.3f}" for side in (g, h)]
    cells.append(_f(r.get("cpu_speedup"), ".1f") + ("×" if "cpu_speedup" in r else ""))
    cells += ["–" if "error" in side else f"{side['peak_mb']:.0f} / {side['baseline_mb']:.0f}"
              for side in (g, h)]
    cells += ["–" if "error" in side else f"{side['extra_mb']:.0f}" for side in (g, h)]
    cells.append(_f(r.get("extra_memory_ratio"), ".2f"))
    goal = r.get("goal_met")
    if r["uncompressed_mb"] < MIN_MB:
        cells.append(f"n/a (< {MIN_MB:g} MB)")
    else:
        cells.append("–" if goal is None else ("met" if goal else "not met"))
    return "| " + " | ".join(cells) + " |"


def _row_notes(r: dict[str, Any], repeat: int) -> list[str]:
    notes = []
    for tool, side in (("gpudiag", r["gpudiag"]), ("HTA", r["hta"])):
        if "error" in side:
            notes.append(f"- {tool} failed on `{r['trace']}`: {side['error']}")
            continue
        if side["failed_runs"]:
            notes.append(f"- {tool} failed {side['failed_runs']} of {repeat} runs on "
                         f"`{r['trace']}`")
        if side["children_peak_mb"] > 0:
            notes.append(f"- {tool} forked on `{r['trace']}`: child peak RSS "
                         f"{side['children_peak_mb']:.0f} MB (not in its extra memory)")
    return notes


def markdown(results: list[dict[str, Any]], info: dict[str, Any], repeat: int) -> str:
    m = info["machine"]
    lines = [
        "## Load: gpudiag vs HTA",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"{m['memory_gb']} GB RAM, {m['os']}; 1-min load average at start "
        f"{m['load_average_1min_at_start']}.",
    ]
    for tool, label in (("gpudiag", "gpudiag side"), ("hta", "HTA side")):
        v = info["versions"].get(tool)
        if v:
            lines.append(f"{label} ({info['pythons'][tool]}): "
                         + ", ".join(f"{k} {val}" for k, val in v.items()) + ".")
    lines += [
        f"Best of {repeat} runs, each load in a fresh process; time of the load call only "
        "(imports excluded): wall clock (s) and the worker's CPU time (CPU s, all threads, "
        "less disturbed by other work on the machine). Speedup = HTA / gpudiag. "
        "Extra memory = peak RSS − RSS after imports; extra ratio = gpudiag / HTA.",
        "",
        "| trace | MB | gpudiag s | HTA s | speedup | gpudiag CPU s | HTA CPU s | CPU speedup "
        "| gpudiag peak / base MB | HTA peak / base MB | gpudiag extra MB | HTA extra MB "
        "| extra ratio | goal |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    notes = []
    for r in results:
        lines.append(_table_row(r))
        notes += _row_notes(r, repeat)
    lines.append("")
    lines.append(f"Goal: speedup ≥ {GOAL_SPEEDUP:g}× and extra ratio (gpudiag/HTA) ≤ "
                 f"{GOAL_MEMORY:g} on traces of {MIN_MB:g} MB+ uncompressed.")
    imports = [(r["gpudiag"].get("import_s"), r["hta"].get("import_s")) for r in results]
    gi = [g for g, _ in imports if g is not None]
    hi = [h for _, h in imports if h is not None]
    if gi or hi:
        lines.append(f"Import time (best): gpudiag {_f(min(gi) if gi else None, '.2f')} s, "
                     f"HTA {_f(min(hi) if hi else None, '.2f')} s.")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def markdown_split(rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> str:
    lines = [
        "## Where gpudiag's load time goes",
        "",
        "Cold = the first load in a fresh process (run under `-X importtime`, which slows it a "
        "little); warm = best later load in the same process. Gunzip includes reading the "
        "file. Build = warm load − gunzip − decode: events into columns, args, tables, "
        "schema. Lazy imports = top-level imports first made by the cold load. Page faults = "
        "minor faults during the cold load and during the second load.",
        "",
        "| trace | cold load s | lazy imports s | warm load s | gunzip s | JSON decode s "
        "| build tables s | page faults cold / warm |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| `{r['trace']}` | error: {r['error']} ||||||| ")
            continue
        build = r["load_s"] - r["gunzip_s"] - r["decode_s"]
        lines.append(
            f"| `{r['trace']}` | {r['cold_load_s']:.3f} | {r['lazy_import_s']:.3f} "
            f"| {r['load_s']:.3f} | {r['gunzip_s']:.3f} | {r['decode_s']:.3f} | {build:.3f} "
            f"| {r['cold_page_faults']} / {r['warm_page_faults']} |")
    extra = {r["trace"]: r["gpudiag"].get("extra_mb") for r in results}
    lines += [
        "", "### gpudiag's extra memory by step", "",
        "Peak RSS above the post-import baseline, each step alone in a fresh process: the "
        "gunzip (`read_bytes`) and then the typed decode, with the whole load from the table "
        "above.", "",
        "| trace | content MB | events | gunzip peak extra MB | + decode peak extra MB "
        "| whole load extra MB |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        m = r.get("memory", {})
        if "error" in m:
            lines.append(f"| `{r['trace']}` | error: {m['error']} ||||| ")
            continue
        lines.append(
            f"| `{r['trace']}` | {m['content_mb']:.1f} | {m['events']} "
            f"| {m['gunzip_extra_mb']:.0f} | {m['decode_extra_mb']:.0f} "
            f"| {_f(extra.get(r['trace']), '.0f')} |")
    for r in rows:
        if "error" in r:
            continue
        lines += ["", f"Packages first imported by the cold load of `{r['trace']}`: "
                  + (", ".join(r["lazy_packages"]) or "none") + ".", "",
                  f"cProfile of one warm load of `{r['trace']}`, by own time:", "",
                  "| function | calls | own s | cumulative s |", "|---|--:|--:|--:|"]
        lines += [f"| `{p['function']}` | {p['calls']} | {p['tottime_s']:.3f} "
                  f"| {p['cumtime_s']:.3f} |" for p in r["profile_tottime"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path,
                        help=f"trace files (default: fixtures of {MIN_MB:g} MB+ in {FIXTURES})")
    parser.add_argument("--all", action="store_true", help="every fixture trace, small included")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool, best kept")
    parser.add_argument("--hta-python", default=None,
                        help=f"interpreter with HTA installed (default: {HTA_VENV_PYTHON} "
                             "if it exists, else this one)")
    parser.add_argument("--gpudiag-python", default=sys.executable,
                        help="interpreter with gpudiag installed (default: this one)")
    parser.add_argument("--split", action="store_true",
                        help="also break gpudiag's load into gunzip / decode / build")
    parser.add_argument("--json", type=Path, help="also write all results to this JSON file")
    parser.add_argument("--worker", choices=[*TOOLS, "split", "memory"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        if len(args.traces) != 1:
            parser.error("--worker takes exactly one trace path")
        return worker(args.worker, args.traces[0], max(args.repeat, 1))

    paths = args.traces or default_traces(args.all)
    if not paths:
        sys.exit("no traces to load")
    hta_python = args.hta_python or (
        str(HTA_VENV_PYTHON) if HTA_VENV_PYTHON.exists() else sys.executable)
    pythons = {"gpudiag": args.gpudiag_python, "hta": hta_python}
    repeat = max(args.repeat, 1)

    start_machine = machine()  # before the runs, so the load average is other work's
    results = bench(paths, pythons, repeat)
    versions = {}
    for tool in TOOLS:
        for r in results:
            if "versions" in r[tool]:
                versions[tool] = r[tool]["versions"]
                break
    info = {"machine": start_machine, "pythons": pythons, "versions": versions, "repeat": repeat}
    report = markdown(results, info, repeat)
    split_rows = split(paths, args.gpudiag_python, repeat) if args.split else None
    if split_rows is not None:
        report += "\n\n" + markdown_split(split_rows, results)
    print(report)
    if args.json:
        args.json.write_text(json.dumps(
            {**info, "results": results, "split": split_rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
