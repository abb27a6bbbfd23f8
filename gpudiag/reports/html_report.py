"""`gpudiag report`: the Trace and its Diagnosis laid out as one HTML page (issue 4).

This module only picks, renames and formats columns that the analyzers and `summarize`
already computed; the one aggregation here (the memory rows: peaks of the fragmentation
table per device) is a display summary, not a diagnosis. Long tables are cut to their top
rows by lost time, with a note saying how many rows the page leaves out.

Figures come from the caller (`figures`: slot name -> plotly Figure or a list of them), so
this page does not depend on the figure builders; the slots are listed in `FIGURE_SLOTS`.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import HOST_CAUSES
from gpudiag.analyzers.summary import summarize
from gpudiag.commands import program_name
from gpudiag.inputs.text import valid_tree
from gpudiag.reports.formats import format_bytes, format_ns, format_window, untimed_window
from gpudiag.reports.html import Section, page
from gpudiag.reports.html_ranks import stragglers
from gpudiag.reports.html_tables import Table
from gpudiag.reports.ncu.rules import rule_table
from gpudiag.trace import Trace

FIGURE_SLOTS = ("waterfall", "utilization", "gpu_samples", "collective_waits", "memory",
                "ncu_heatmap", "rank_causes")
"""Where `report(figures=...)` places each figure; other names get a section of their own."""

TOP_ROWS = 50
"""Rows shown per long table (findings, sync points, kernels...); the rest is counted."""

MAX_DEVICES = 32
"""Devices listed one by one in the waterfall; a job of more shows its total there (and
its ranks, worst first, under Stragglers)."""


def report(trace: Trace, dx: Diagnosis, *, figures: Mapping[str, Any] | None = None,
           cdn: bool = False, title: str | None = None, generated_for: str | None = None,
           info: dict[str, Any] | None = None) -> str:
    """The report page for one trace: run summary, waterfall, findings, tables, figures.

        dx = gpudiag.diagnose(trace)
        html = report(trace, dx, figures={"waterfall": figures.waterfall(dx)})
        Path("report.html").write_text(html, encoding="utf-8")

    Sections without data are left out. `cdn`: link plotly.js instead of inlining it.
    `info`: the run summary when the caller has it (a job diagnosed rank by rank passes
    `JobDiagnosis.summary()` with a `trace` that holds only the job's meta).
    """
    trace, title, generated_for = _displayable(trace, title, generated_for)
    if info is None:
        info = summarize(trace, top=TOP_ROWS, window_ns=dx.window_ns)
    figs = {name: _as_list(fig) for name, fig in (figures or {}).items()}
    built: list[Section | list[Section] | None] = [
        _run_summary(trace, info),
        _waterfall(dx, figs.pop("waterfall", [])),
        _findings(dx),
        stragglers(dx, figs.pop("rank_causes", [])),
        _figures_only("GPU utilization over time", figs.pop("utilization", [])),
        _gpu_samples(dx, figs.pop("gpu_samples", [])),
        _top_kernels(info),
        _sync_points(dx),
        _copies(dx),
        _collectives(dx, figs.pop("collective_waits", [])),
        _small_grid(dx),
        _memory(dx, figs.pop("memory", [])),
        _host(dx),
        _kernel_metrics(trace, dx, figs.pop("ncu_heatmap", [])),
        _streams(dx),
        _notes(dx),
    ]
    sections = [part for s in built if s is not None
                for part in (s if isinstance(s, list) else [s])]
    sections += [Section(name, figures=fig) for name, fig in figs.items() if fig]
    return page(title or page_title(trace), sections, cdn=cdn, generated_for=generated_for)


def _as_list(fig: Any) -> list[Any]:
    if fig is None:
        return []
    return list(fig) if isinstance(fig, list | tuple) else [fig]


def page_title(trace: Trace, kind: str = "report") -> str:
    """'gpudiag report: rank0.json.gz (NVIDIA A100-SXM4-80GB)': the page kind, the trace's
    name (its own, a profile run's program, or its files) and the GPUs it names."""
    name = trace.meta.get("trace_name")
    sources = [s for s in trace.meta.get("sources") or [] if s.get("path")]
    command = trace.meta.get("command")
    if not name and isinstance(command, list) and command:  # a `gpudiag profile` run
        name = program_name([str(c) for c in command])
    if not name and sources:
        name = ", ".join(Path(str(s.get("path", "?"))).name for s in sources[:3])
        name += f" (+{len(sources) - 3})" if len(sources) > 3 else ""
    gpus = _gpu_names(trace.devices)
    title = f"gpudiag {kind}: {name}" if name else f"gpudiag {kind}"
    return f"{title} ({gpus})" if gpus else title


def _gpu_names(devices: pd.DataFrame) -> str:
    """'NVIDIA H100 80GB HBM3' or '8x NVIDIA A100-SXM4-80GB, 1x ...': the named devices."""
    names = devices["name"].dropna().astype(str)
    counts = names[names != ""].value_counts(sort=False)
    if len(counts) == 1 and counts.iloc[0] == 1:
        return str(counts.index[0])
    return ", ".join(f"{count}x {name}" for name, count in counts.items())


def _device(rank: Any, device: Any) -> str:
    """'r3:0' for rank 3 device 0, '0' without a rank (as the terminal report writes it)."""
    if isinstance(device, str):  # a label already ('all 64': a job's total)
        return device
    dev = "-" if pd.isna(device) else str(int(device))
    return dev if pd.isna(rank) else f"r{int(rank)}:{dev}"


def _with_device(frame: pd.DataFrame) -> pd.DataFrame:
    """`rank` and `device` columns folded into one 'device' label column, first."""
    labels = [_device(r, d) for r, d in zip(frame["rank"], frame["device"], strict=True)]
    rest = frame.drop(columns=["rank", "device"])
    return pd.concat([pd.DataFrame({"device": labels}, index=frame.index), rest], axis=1)


def _cut(frame: pd.DataFrame, notes: list[str], what: str, n: int = TOP_ROWS) -> pd.DataFrame:
    if len(frame) > n:
        notes.append(f"showing the top {n} of {len(frame):,} {what}; "
                     "`gpudiag analyze --json` lists all")
    return frame.head(n).reset_index(drop=True)


def _displayable(trace: Trace, title: str | None, generated_for: str | None
                 ) -> tuple[Trace, str | None, str | None]:
    """The trace (a shallow copy when its meta needed it), title and command line with every
    name that is not UTF-8 escaped (`inputs.text.valid_tree`)."""
    meta = valid_tree(trace.meta)
    if meta is not trace.meta:
        trace = copy.copy(trace)
        trace.meta = meta
    return trace, valid_tree(title), valid_tree(generated_for)


def _run_summary(trace: Trace, info: dict[str, Any]) -> Section:
    rows: list[tuple[str, str]] = []
    for src in info["sources"]:
        if not src.get("path"):  # gpudiag profile's host markers: counted as processes below
            continue
        size = format_bytes(src["bytes"]) if src.get("bytes") is not None else "?"
        rows.append(("source", f"{src.get('path')} ({src.get('format')}, {size})"))
    meta = trace.meta
    command = meta.get("command")
    if command:
        rows.append(("command", command if isinstance(command, str)
                     else shlex.join(map(str, command))))
    processes = meta.get("processes") or []
    if processes:
        rows.append(("processes", f"{len(processes)} (pids "
                     + ", ".join(str(p.get("pid")) for p in processes[:8])
                     + (", ..." if len(processes) > 8 else "") + ")"))
    for key in ("started_at", "trace_name", "vendor", "backend", "world_size"):
        if meta.get(key) is not None:
            rows.append((key.replace("_", " "), str(meta[key])))
    if info["ranks"]:
        rows.append(("ranks", ", ".join(map(str, info["ranks"]))))
    versions = meta.get("tool_versions") or {}
    if versions:
        rows.append(("tool versions", ", ".join(f"{k} {v}" for k, v in versions.items())))
    rows.append(("GPU window", _window(info)))
    counts = ", ".join(f"{name} {n:,}" for name, n in info["rows"].items() if n)
    rows.append(("rows", counts or "none"))
    notes = [f"{kind}: {count}" for kind, count in info["warnings"].items()]
    if info.get("outcome"):  # how the run failed comes first
        notes.insert(0, info["outcome"]["headline"])
        rows.insert(0, ("outcome", info["outcome"]["headline"]))
    facts = Table(pd.DataFrame(rows, columns=["", "value"]).astype(str), sortable=False)
    return Section("Run summary", notes=notes, tables=[facts, *_devices(info["devices"])])


def _window(info: dict[str, Any]) -> str:
    window = info["window"]
    if window:  # as the terminal writes it: a length, offsets from the first GPU event
        return format_window(window)
    return untimed_window(info) or "none"


def _devices(devices: list[dict[str, Any]]) -> list[Table]:
    if not devices:
        return []
    frame = pd.DataFrame(devices)
    frame = _with_device(frame)[["device", "name", "sm_count", "compute_capability",
                                 "mem_bytes", "used"]]
    frame.columns = ["device", "name", "SMs", "CC", "memory", "used"]
    frame["SMs"] = frame["SMs"].astype("Int64")
    frame["memory"] = frame["memory"].astype("Int64")
    return [Table(frame, {"memory": "bytes"}, caption="Devices")]


def _waterfall(dx: Diagnosis, figs: list[Any]) -> Section | None:
    loss = dx.losses
    if loss.empty and not figs:
        return None
    keep = loss[(loss["lost_ns"] > 0) | (loss["cause"] == "useful")]
    devices = len(loss[["rank", "device"]].drop_duplicates())
    if devices > MAX_DEVICES:  # a job of many ranks: its total here, its ranks under Stragglers
        keep = _job_total(keep, devices)
    frame = _with_device(keep.reset_index(drop=True))[["device", "cause", "lost_ns", "share"]]
    frame.columns = ["device", "cause", "time", "share"]
    return Section("Where the GPU time went", figures=figs, table=frame,
                   formats={"time": "ns", "share": "share"},
                   text="The loss waterfall per device: each GPU nanosecond of the window "
                        "is either useful or lost to one cause (docs/analysis.md).")


def _job_total(loss: pd.DataFrame, devices: int) -> pd.DataFrame:
    """The waterfall of all `devices` together: one row per cause."""
    time = loss.groupby("cause", sort=False)["lost_ns"].sum()
    window = int(loss["lost_ns"].sum())
    return pd.DataFrame({"rank": pd.NA, "device": f"all {devices:,}", "cause": time.index,
                         "lost_ns": time.to_numpy(),
                         "share": time.to_numpy() / window if window else float("nan")})


def _findings(dx: Diagnosis) -> Section | None:
    found = dx.findings
    if found.empty:
        return None
    notes: list[str] = []
    top = _cut(found, notes, "findings")
    columns = ["cause", "lost_ns", "share", "saving_ns", "saving_share", "fix", "where",
               "count", "evidence", "advice"]
    names = ["cause", "lost", "share", "saves", "of window", "fix replayed", "where", "count",
             "evidence", "what to do"]
    saved = bool(found["saving_ns"].notna().any())
    if not saved:  # nothing replayed (a job, no timeline): no empty columns
        columns, names = columns[:3] + columns[6:], names[:3] + names[6:]
    timed = bool((found["lost_ns"] > 0).any())
    if not timed:  # no finding costs measured time (Nsight Compute): '-' says nothing
        kept = [i for i, column in enumerate(columns) if column not in ("lost_ns", "share")]
        columns, names = [columns[i] for i in kept], [names[i] for i in kept]
    frame = pd.DataFrame({"#": range(1, len(top) + 1)}).join(top[columns].reset_index(
        drop=True))
    frame.columns = ["#", *names]
    host_only = bool(found["cause"].isin(HOST_CAUSES).all())
    title = ("Findings, by expected saving" if saved else
             "Findings, by host time lost" if host_only else
             "Findings, by GPU time lost" if timed else "Findings")
    if not timed:
        notes.append("none costs measured time: a file without a timeline (an Nsight "
                     "Compute report) shows where each kernel falls short, not how long it "
                     "kept the GPU from other work")
    if saved:
        notes.append("saves: how much shorter the window gets in a replay of the recorded "
                     "schedule with that cause fixed (the fix replayed: docs/analysis.md, "
                     "Expected savings); lost: the time the cause cost")
    return Section(title, notes=notes, table=frame,
                   formats={"lost": _lost, "share": "share", "saves": "ns",
                            "of window": "share"})


def _lost(ns: Any) -> str:
    """'-' for findings that cost no GPU time (memory, ncu rules), as the terminal writes."""
    return format_ns(float(ns)) if ns else "-"


def _figures_only(title: str, figs: list[Any]) -> Section | None:
    return Section(title, figures=figs) if figs else None


def _top_kernels(info: dict[str, Any]) -> Section | None:
    kernels = info["top_kernels"]
    if not kernels:
        return None
    frame = pd.DataFrame(kernels)[["short_name", "count", "total_ns", "mean_ns", "share"]]
    frame.columns = ["kernel", "launches", "total", "mean", "share"]
    notes = [f"the top {TOP_ROWS} kernel names by total GPU time"] \
        if len(kernels) == TOP_ROWS else []
    return Section("Top kernels", notes=notes, table=frame,
                   formats={"total": "ns", "mean": "ns", "share": "share"})


def _detail(dx: Diagnosis, name: str) -> pd.DataFrame | None:
    frame = dx.tables.get(name)
    return None if frame is None or frame.empty else frame


def _sync_points(dx: Diagnosis) -> Section | None:
    sync = _detail(dx, "sync_points")
    if sync is None:
        return None
    notes: list[str] = []
    sync = _cut(sync.sort_values("gpu_idle_ns", ascending=False, kind="stable"), notes,
                "sync points")
    frame = sync[["kind", "where", "api", "count", "host_wait_ns", "gpu_idle_ns", "per_step"]]
    frame.columns = ["kind", "where", "API", "count", "host wait", "GPU idle", "per step"]
    return Section("Sync points", notes=notes, table=frame,
                   formats={"host wait": "ns", "GPU idle": "ns"},
                   text="Where the host blocked on the GPU, by call site.")


def _host(dx: Diagnosis) -> list[Section] | None:
    """The host side of the steps: where each step's host time went, the ops that took it,
    the CPU memory peak (what a CPU-only run has to act on; on GPU runs, the host's share)."""
    breakdown = _detail(dx, "host_breakdown")
    if breakdown is None:
        return None
    frame = breakdown.assign(category=breakdown["category"].str.replace("_", " "))
    frame = frame[["category", "time_ns", "share", "per_step_ns", "warmup_ns", "steps"]]
    frame.columns = ["part of the step", "time", "share", "per step", "in warm-up", "steps"]
    sections = [Section("Host time per step", table=frame,
                        formats={"time": "ns", "share": "share", "per step": "ns",
                                 "in warm-up": "ns"},
                        text="Where the host's step time went, in the steps after warm-up "
                             "(warm-up steps apart).")]
    ops = _detail(dx, "host_top_ops")
    if ops is not None:
        top = ops[["name", "calls", "self_ns", "share"]].head(TOP_ROWS)
        top.columns = ["op", "calls", "self time", "share"]
        sections.append(Section("Host ops by self time", table=top,
                                formats={"self time": "ns", "share": "share"}))
    memory = _detail(dx, "host_memory")
    if memory is not None:
        peak = memory[["pid", "peak_bytes", "peak_step", "steady_peak_bytes"]]
        peak.columns = ["process", "CPU tensor memory peak", "in step", "peak after warm-up"]
        sections.append(Section("CPU memory", table=peak,
                                formats={"CPU tensor memory peak": "bytes",
                                         "peak after warm-up": "bytes"},
                                text="The profiler's running total of CPU tensor "
                                     "allocations per process: the framework's tensors, "
                                     "not the process's resident memory."))
    return sections


def _copies(dx: Diagnosis) -> Section | None:
    stats = _detail(dx, "copy_stats")
    if stats is None:
        return None
    frame = _with_device(stats)[["device", "kind", "host_mem", "count", "bytes", "dur_ns",
                                 "bytes_per_s", "peak_share"]]
    frame.columns = ["device", "kind", "host memory", "count", "bytes", "time", "bandwidth",
                     "of peak"]
    return Section("Memory copies", table=frame,
                   formats={"bytes": "bytes", "time": "ns", "bandwidth": "bytes_per_s",
                            "of peak": "share"})


def _collectives(dx: Diagnosis, figs: list[Any]) -> Section | None:
    stats = _detail(dx, "collective_stats")
    if stats is None and not figs:
        return None
    tables: list[Table] = []
    notes: list[str] = []
    if stats is not None:
        frame = stats[["op", "bytes", "group_size", "dtype", "count", "total_ns", "mean_ns",
                       "min_ns", "max_ns", "algbw_gbps", "busbw_gbps", "busbw_peak_gbps"]]
        frame.columns = ["op", "bytes", "ranks", "dtype", "calls", "total", "mean", "min",
                         "max", "algbw", "busbw", "busbw of best call"]
        fmt = dict.fromkeys(["total", "mean", "min", "max"], "ns")
        fmt |= dict.fromkeys(["algbw", "busbw", "busbw of best call"], "gbps")
        tables.append(Table(frame, {**fmt, "bytes": "bytes"}, caption="Collectives"))
        if bool(stats["group_size_assumed"].any()):
            notes.append("some group sizes were not recorded and are assumed: their busbw "
                         "is an estimate")
    overlap = _detail(dx, "overlap")
    if overlap is not None:
        frame = _with_device(overlap)[["device", "comm_ns", "exposed_comm_ns",
                                       "overlap_of_comm", "overlap_of_step"]]
        frame.columns = ["device", "communication", "not overlapped", "overlapped share",
                         "overlap share of step"]
        tables.append(Table(frame, {"communication": "ns", "not overlapped": "ns",
                                    "overlapped share": "share",
                                    "overlap share of step": "share"},
                            caption="Communication overlapped with compute"))
    return Section("Collectives", notes=notes, figures=figs, tables=tables,
                   text="busbw uses nccl-tests' bus-bandwidth factors, so it compares with "
                        "the link's peak.")


def _small_grid(dx: Diagnosis) -> Section | None:
    grid = _detail(dx, "small_grid")
    if grid is None:
        return None
    notes: list[str] = []
    grid = _cut(grid.sort_values("lost_ns", ascending=False, kind="stable"), notes, "kernels")
    frame = grid[["name", "count", "dur_ns", "lost_ns", "grid_blocks", "block_threads",
                  "blocks_per_sm", "waves", "theoretical_occupancy", "limiter"]]
    frame.columns = ["kernel", "launches", "time", "SM slots idle", "grid", "block",
                     "blocks/SM", "waves", "theoretical occupancy", "limited by"]
    return Section("Grid size and occupancy", notes=notes, table=frame,
                   formats={"time": "ns", "SM slots idle": "ns",
                            "theoretical occupancy": "share"})


def _gpu_samples(dx: Diagnosis, figs: list[Any]) -> Section | None:
    summary = _detail(dx, "sample_summary")
    if summary is None and not figs:
        return None
    tables: list[Table] = []
    if summary is not None:
        frame = _with_device(summary)[[
            "device", "samples", "span_ns", "gpu_util_mean_pct", "gpu_util_median_pct",
            "low_util_share", "kernel_busy_share", "mem_used_peak_bytes", "mem_total_bytes",
            "power_mean_w", "temperature_max_c", "sm_clock_mean_mhz", "power_throttled_share",
            "thermal_throttled_share"]]
        frame.columns = ["device", "samples", "span", "GPU util (mean)", "GPU util (median)",
                         "time under 30% util", "kernels busy", "peak memory used",
                         "memory total", "mean power", "max temperature", "mean SM clock",
                         "power throttled", "thermally throttled"]
        tables.append(Table(frame, {
            "span": "ns", "GPU util (mean)": "pct", "GPU util (median)": "pct",
            "time under 30% util": "share", "kernels busy": "share",
            "peak memory used": "bytes", "memory total": "bytes",
            "mean power": lambda v: f"{float(v):.0f} W",
            "max temperature": lambda v: f"{float(v):.0f} °C",
            "mean SM clock": lambda v: f"{float(v):.0f} MHz",
            "power throttled": "share", "thermally throttled": "share"},
            caption="NVML samples per GPU"))
    return Section("GPU samples (NVML)", figures=figs, tables=tables,
                   text="What the driver measured while the job ran. NVML's GPU utilization "
                        "is the share of time at least one kernel ran, so it should match "
                        "'kernels busy' (the trace's kernels over the same span); a large "
                        "gap means work the trace did not record.")


def _memory(dx: Diagnosis, figs: list[Any]) -> Section | None:
    frag = _detail(dx, "fragmentation")
    if frag is None and not figs:
        return None
    tables: list[Table] = []
    if frag is not None:
        from gpudiag.analyzers.memory.allocator import peaks

        frame = _with_device(peaks(frag))
        frame.columns = ["device", "events", "peak reserved", "peak allocated",
                         "worst fragmentation", "final fragmentation"]
        tables.append(Table(frame, {"peak reserved": "bytes", "peak allocated": "bytes",
                                    "worst fragmentation": "share",
                                    "final fragmentation": "share"},
                            caption="Allocator memory per device"))
    return Section("Memory", figures=figs, tables=tables,
                   text="Fragmentation: the share of reserved-but-free memory that is not "
                        "in the largest free block (what a large allocation cannot use).")


_FLAGS = {"small_grid": "small grid", "low_l2_hit": "low L2 hit rate",
          "low_memory_throughput": "low memory throughput",
          "achieved_occupancy_gap": "achieved << theoretical occupancy",
          "low_theoretical_occupancy": "low theoretical occupancy"}


def _kernel_metrics(trace: Trace, dx: Diagnosis, figs: list[Any]) -> Section | None:
    metrics = _detail(dx, "kernel_metrics")
    if metrics is None and not figs:
        return None
    tables: list[Table] = []
    notes: list[str] = []
    if metrics is not None:
        top = _cut(metrics.sort_values("duration_ns", ascending=False, kind="stable"),
                   notes, "profiled kernels", n=2 * TOP_ROWS)
        tables.append(_metrics_table(top, notes))
    rules = rule_table(dx, notes)
    if rules is not None:
        tables.append(rules)
    return Section("Kernel metrics (Nsight Compute)", notes=notes, figures=figs,
                   tables=tables)


_METRIC_HEADERS = {
    "kernel_id": "id", "short_name": "kernel", "duration_ns": "time", "grid_size": "grid",
    "block_size": "block", "sm_throughput_pct": "SM %", "memory_throughput_pct": "memory %",
    "dram_throughput_pct": "DRAM %", "l1_hit_rate_pct": "L1 hit %",
    "l2_hit_rate_pct": "L2 hit %", "achieved_occupancy_pct": "achieved occ. %",
    "theoretical_occupancy_pct": "theoretical occ. %", "waves_per_sm": "waves per SM",
    "regs_per_thread": "registers", "smem_bytes": "shared memory", "bottleneck": "bottleneck"}
_MEASURED = list(_METRIC_HEADERS)[2:-1]  # what ncu measures (not the id, name, verdict)
NO_METRICS = "all: ncu recorded no metrics for this kernel"
"""The 'metrics missing' cell of a kernel ncu could not profile (every metric empty)."""


def _metrics_table(top: pd.DataFrame, notes: list[str]) -> Table:
    """kernel_metrics' rows as shown: the short name (full one on hover), metrics that no
    kernel has left out and named in a note, and per kernel what it lacks."""
    absent = [c for c in _MEASURED if top[c].isna().all()]
    if absent and len(absent) < len(_MEASURED):
        notes.append("not in this report (not collected, columns left out): "
                     + ", ".join(_METRIC_HEADERS[c] for c in absent))
    else:
        absent = []
    flags = [", ".join(label for col, label in _FLAGS.items() if row[col] is True)
             for row in top[list(_FLAGS)].astype(object).to_dict("records")]
    shown = [c for c in _METRIC_HEADERS if c not in absent]
    lacking = _missing_text(top, absent)
    frame = top[shown].rename(columns=_METRIC_HEADERS).assign(flags=flags)
    if any(lacking):  # a column of empty cells only takes width
        frame["metrics missing"] = lacking
    pct = dict.fromkeys(["SM %", "memory %", "DRAM %", "L1 hit %", "L2 hit %",
                         "achieved occ. %", "theoretical occ. %"], "pct")
    return Table(frame.reset_index(drop=True), {**pct, "time": "ns", "shared memory": "bytes"},
                 caption="Nsight Compute metrics per kernel",
                 titles={"kernel": top["name"].astype(str).tolist()})


def _missing_text(metrics: pd.DataFrame, absent: list[str]) -> list[str]:
    """Per kernel, the shown metrics it lacks, by their headers; one sentence when ncu
    recorded nothing for the kernel (a row of empty cells would not say why)."""
    lacking = metrics[[c for c in _MEASURED if c not in absent]].isna()
    measured = (~metrics[_MEASURED].isna()).any(axis=1).tolist()
    return [", ".join(_METRIC_HEADERS[c] for c, gone in row.items() if gone) if any_value
            else NO_METRICS
            for row, any_value in zip(lacking.to_dict("records"), measured, strict=True)]


def _streams(dx: Diagnosis) -> Section | None:
    streams = _detail(dx, "stream_summary")
    if streams is None:
        return None
    frame = _with_device(streams)
    busy = frame["busy_ns"] / frame["span_ns"].where(frame["span_ns"] > 0)
    frame = frame[["device", "stream", "span_ns", "busy_ns", "idle_ns", "events"]] \
        .assign(busy_share=busy)
    frame.columns = ["device", "stream", "span", "busy", "idle", "events", "busy share"]
    notes: list[str] = []
    frame = _cut(frame, notes, "streams")
    return Section("Streams", notes=notes, table=frame,
                   formats={"span": "ns", "busy": "ns", "idle": "ns", "busy share": "share"})


def _notes(dx: Diagnosis) -> Section | None:
    return Section("Notes", notes=list(dx.notes)) if dx.notes else None
