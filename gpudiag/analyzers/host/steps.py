"""Where the host's step time goes, on any trace with host events (CPU-only runs too).

    host_breakdown(trace)       # per process and category: time in the steady steps, share
    host_by_step(trace)         # one row per step: ns per category, CPU memory peak
    host_top_ops(trace)         # ops by self time in the steady steps
    findings(trace)             # host_data_loading, host_python_overhead, ... with advice

The steps are `steps.training_steps` (markers or detected); each step's host time is cut
into the categories of `host_categories` (data loading, optimizer, backward, compile,
forward, other ops, framework ops, Python between ops), which sum to the step's time.
Only *profiled* steps count: a `gpudiag profile` run keeps its step markers for the whole
run but framework events for a bounded window, so a step counts when at least half of it
lies inside the span of its process's recorded ops. Without steps, each process's
profiled span is one step named `(whole trace)`. Totals and shares are over the profiled
steps that are not warm-up; the warm-up steps' time is reported apart (`warmup_ns`).

CPU memory: the profiler's running total of host allocations (Kineto `[memory]` events on
device -1, `total_allocated_bytes`), its peak per step and per process.

Findings, each `lost_ns` = the category's time in the steady steps and `share` = of their
summed time: `host_data_loading`, `host_python_overhead`, `host_optimizer`,
`host_compile` (at least `min_share`, 10%) and `host_op` (one op's self time, at least
`min_op_share`, 20%). They are host time, not GPU time: on a trace with a GPU timeline
`diagnose` ranks them after the GPU findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals as iv
from gpudiag.analyzers import callsites, keys
from gpudiag.analyzers.findings import Contract, Result, format_ns, frame
from gpudiag.analyzers.frameworks import formats_of, framework, framework_of
from gpudiag.analyzers.host.advice import advice, evidence
from gpudiag.analyzers.host.categories import (
    CATEGORIES,
    DATA,
    OP_SOURCES,
    OPTIMIZER,
    amounts,
    category_spans,
    host_columns,
    self_times,
)
from gpudiag.analyzers.host.columns import Columns
from gpudiag.analyzers.host.loader_workers import loader_workers
from gpudiag.analyzers.host.loader_workers import summary as loader_summary
from gpudiag.analyzers.steps.training import training_steps
from gpudiag.intervals import nesting_depth
from gpudiag.markers import DOMAIN as MARKER_DOMAIN
from gpudiag.trace import Trace
from gpudiag.trace_meta import helper_pids

WHOLE = "(whole trace)"
BY_STEP = ("rank", "pid", "tid", "step", "index", "start_ns", "end_ns", "dur_ns", "warmup",
           "profiled", *(f"{c}_ns" for c in CATEGORIES), "cpu_time", "python_off_cpu_ns",
           "cpu_peak_bytes")

#: cause -> category it measures
CAUSES = {"host_data_loading": "data_loading", "host_python_overhead": "python",
          "host_off_cpu": "off_cpu",
          "host_optimizer": "optimizer", "host_compile": "compile"}


def has_host_events(trace: Trace) -> bool:
    """Whether the trace has framework ops or annotations on a host thread (what the host
    step breakdown reads)."""
    ranges = trace.ranges
    return bool((ranges["source"].isin((*OP_SOURCES, "annotation"))
                 & ranges["tid"].notna()).any())


def host_by_step(trace: Trace) -> pd.DataFrame:
    """One row per step of every process: `rank` (NA: none), `pid`, `tid`, `step`, `index`,
    `start_ns`, `end_ns`, `dur_ns` (the step's time less gpudiag's own pauses in it, the
    profiler writing a segment on the program's thread, and less its part outside the
    recorded span), `warmup`, `profiled`,
    `<category>_ns` for each category
    (they sum to `dur_ns`; 0 in steps that were not profiled) and `cpu_peak_bytes` (NA
    without CPU memory events).

        host_by_step(trace).set_index("step")[["data_loading_ns", "python_ns"]]
    """
    return _analysis(trace)["by_step"]


def host_breakdown(trace: Trace) -> pd.DataFrame:
    """Per process and category: `rank, pid, category, time_ns` (in the profiled steps
    that are not warm-up), `share` (of those steps' time), `per_step_ns` (mean per step),
    `warmup_ns` (in the warm-up steps), `steps`.

        host_breakdown(trace).sort_values("share", ascending=False).head()
    """
    return _breakdown(host_by_step(trace))


def _breakdown(by_step: pd.DataFrame) -> pd.DataFrame:
    """`host_breakdown` of a `host_by_step` table: per process (in (rank, pid) order, NA
    last) and category, from arrays (a job has a process per rank)."""
    profiled = by_step[by_step["profiled"].to_numpy(bool)]
    if profiled.empty:  # no steps, or none of them profiled (a window between two steps' work)
        return pd.DataFrame({col: pd.Series(dtype=dtype) for col, dtype in BREAKDOWN_DTYPES})
    rank, pid = profiled["rank"].astype("Int64"), profiled["pid"].astype("Int64")
    last = np.iinfo(np.int64).max  # NA sorts after every rank and pid, as in a groupby
    steady = ~profiled["warmup"].to_numpy(bool)
    duration = profiled["dur_ns"].to_numpy(np.int64)
    times = {category: profiled[f"{category}_ns"].to_numpy(np.int64)
             for category in CATEGORIES}
    columns: dict[str, list[Any]] = {name: [] for name, _ in BREAKDOWN_DTYPES}
    for _, rows in keys.positions(rank.to_numpy(np.int64, na_value=last),
                                  pid.to_numpy(np.int64, na_value=last)):
        mine, warm = rows[steady[rows]], rows[~steady[rows]]
        total, count = int(duration[mine].sum()), len(mine)
        for category in CATEGORIES:
            time = int(times[category][mine].sum())
            columns["rank"].append(rank.array[rows[0]])
            columns["pid"].append(pid.array[rows[0]])
            columns["category"].append(category)
            columns["time_ns"].append(time)
            columns["share"].append(time / total if total else np.nan)
            columns["per_step_ns"].append(time / count if count else np.nan)
            columns["warmup_ns"].append(int(times[category][warm].sum()))
            columns["steps"].append(count)
    return pd.DataFrame(columns).astype({"rank": "Int64", "pid": "Int64"})


#: `host_breakdown` columns and dtypes
BREAKDOWN_DTYPES = (("rank", "Int64"), ("pid", "Int64"), ("category", "object"),
                    ("time_ns", "int64"), ("share", "float64"), ("per_step_ns", "float64"),
                    ("warmup_ns", "int64"), ("steps", "int64"))


def host_top_ops(trace: Trace, top: int = 15) -> pd.DataFrame:
    """Ops (torch ops, framework events) by self time in the steady profiled steps, all
    threads: `name, calls, self_ns, share` (of the steady steps' summed time), `top` rows.

        host_top_ops(trace).head()
    """
    return _analysis(trace)["top_ops"].head(top).reset_index(drop=True)


def host_memory(trace: Trace) -> pd.DataFrame:
    """CPU memory per process: `rank, pid, peak_bytes` (the highest running total),
    `peak_step` (the step it happened in, NA outside steps), `steady_peak_bytes` (highest
    in a step that is not warm-up)."""
    return _analysis(trace)["memory"]


def _analysis(trace: Trace) -> dict[str, Any]:
    return trace.derived("host_steps", lambda: _compute(trace))


def _compute(trace: Trace) -> dict[str, Any]:
    ranges = trace.ranges
    host = ranges.loc[(ranges["tid"].notna() & (ranges["source"] != "step")).to_numpy(bool),
                      ["rank", "pid", "tid", "start_ns", "end_ns", "name", "source"]]
    # a process is (rank, pid), NA a value of its own: int64 keys (NA as keys.MISSING) to
    # group and match by, NA again in host_by_step (host_memory keeps them, see below);
    # its rows are arrays (`Columns`): a process costs numpy selections, not pandas ones
    rows = host_columns(host, _rank=keys.key_array(host["rank"]),
                        _pid=keys.key_array(host["pid"]),
                        rank=host["rank"].to_numpy(np.float64, na_value=np.nan),
                        pid=host["pid"].to_numpy(np.float64, na_value=np.nan))
    steps = training_steps(trace)
    recorded = _recorded(ranges)
    cpu_times = _step_cpu_times(ranges)
    step_rows = _by_process(steps)
    memory = _cpu_memory(trace)
    memory_rows = _by_process(memory)
    by_step, top_ops, mem_rows, gaps, lanes = [], [], [], [], []
    helpers = helper_pids(trace.meta)  # DataLoader workers: their time is not a step's
    for (rank, pid), mine in rows.groups(rows["_rank"], rows["_pid"]):
        ops = mine.take(mine["_op"] | mine["_annotation"])
        if not len(ops) or pid in helpers or _waits_on_trainers((rank, pid), step_rows):
            continue
        first, last = recorded.get((rank, pid)) or _span(ops.take(~_own_pauses(ops)), ops)
        windows = _windows(step_rows.get((rank, pid), steps.iloc[0:0]), first, last,
                           int(rank), int(pid))
        known = windows["tid"][~pd.isna(windows["tid"])]
        tid = int(known[0]) if len(known) else None
        unrecorded = iv.subtract(iv.union(windows["start_ns"], windows["end_ns"]),
                                 (np.array([first], dtype=np.int64),
                                  np.array([last], dtype=np.int64)))
        spans = _without_own_pauses(
            category_spans(mine, tid, windows["start_ns"], windows["end_ns"]), mine,
            unrecorded)
        mem = memory_rows.get((rank, pid), memory.iloc[0:0])
        table = _per_step(windows, spans, mem, cpu_times)
        by_step.append(table)
        steady = table[table["profiled"] & ~table["warmup"]]
        top_ops.append(_self_time(mine, steady))
        mem_rows.append(_memory_row(int(rank), int(pid), mem, table))
        gaps.append(_python_gaps(trace, mine, tid, spans, steady))
        lanes.append(Lane(int(rank), int(pid), tid, spans, steady))
    return {**_tables(by_step, top_ops, mem_rows, gaps), "lanes": lanes}


#: what gpudiag's profiler names the time it held the program's thread (writing a segment)
OWN_PAUSE = "gpudiag: "


def _own_pauses(ranges: Columns) -> npt.NDArray[np.bool_]:
    """Which of a process's ranges are gpudiag's own pauses (`OWN_PAUSE` annotations)."""
    names = ranges["name"]
    own = np.fromiter((str(name).startswith(OWN_PAUSE) for name in names), dtype=bool,
                      count=len(names))
    return own & ranges["_annotation"]


def _waits_on_trainers(process: tuple[int, int],
                       step_rows: dict[tuple[int, int], pd.DataFrame]) -> bool:
    """Whether a process is not a training loop while others are: it has no step and
    another process has (a parent waiting in `p.join()` on the processes that train, as
    mnist_hogwild's; a launcher). Its whole span would read as one step of Python between
    ops: 99.9% of 12.7 s for a parent that only waited."""
    return bool(step_rows) and process not in step_rows


def _recorded(ranges: pd.DataFrame) -> dict[tuple[int, int], tuple[int, int]]:
    """Per process ((rank, pid) keys), the span the profiler recorded: its host ranges but
    gpudiag's own (`markers.DOMAIN`: a `gpudiag profile` run's steps, `gpudiag.region()`
    markers and pauses cover the whole run, not only the window the profiler recorded). A
    process with only those has none here (its markers, less the pauses, are its span)."""
    own = ranges["domain"] == MARKER_DOMAIN
    mine = ranges[~own.fillna(False).to_numpy(bool) & ranges["tid"].notna().to_numpy(bool)]
    rank, pid = keys.key_array(mine["rank"]), keys.key_array(mine["pid"])
    start, end = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
    return {(int(r), int(p)): (int(start[rows].min()), int(end[rows].max()))
            for (r, p), rows in keys.positions(rank, pid)}


def _span(rows: Columns, fallback: Columns) -> tuple[int, int]:
    """The first start and last end of `rows`, else of `fallback`."""
    rows = rows if len(rows) else fallback
    return int(rows["start_ns"].min()), int(rows["end_ns"].max())


def _without_own_pauses(spans: dict[str, iv.Spans], ranges: Columns,
                        unrecorded: iv.Spans) -> dict[str, iv.Spans]:
    """The categories less the time gpudiag's profiler held the program's thread (its
    `gpudiag: ...` ranges: stopping torch.profiler and writing a segment took up to seconds
    under load, and counted as the program's Python or optimizer), which is kept apart as
    `OWN` with the `unrecorded` time of the steps (a step the window cut: its part outside
    the profiler's recording is not the program's Python), so that no category, nor the
    Python remainder, nor a step's time holds either; `PAUSES` keeps the pauses alone."""
    own = ranges.take(_own_pauses(ranges))
    pauses = iv.union(np.concatenate([own["start_ns"], unrecorded[0]]),
                      np.concatenate([own["end_ns"], unrecorded[1]]))
    spans = {category: iv.subtract(time, pauses) for category, time in spans.items()}
    return {**spans, OWN: pauses, PAUSES: iv.union(own["start_ns"], own["end_ns"])}


#: the key of gpudiag's own pauses and the steps' unrecorded time among a process's category
#: spans, and of the pauses alone
OWN, PAUSES = "gpudiag", "gpudiag pauses"


def _by_process(frame: pd.DataFrame) -> dict[tuple[int, int], pd.DataFrame]:
    """The rows of each process ((rank, pid) keys, `keys.MISSING` for NA), in their order."""
    return {(int(rank), int(pid)): frame.iloc[rows] for (rank, pid), rows in
            keys.positions(keys.key_array(frame["rank"]), keys.key_array(frame["pid"]))}


@dataclass(frozen=True)
class Lane:
    """One process's training thread as host_steps measured it: `rank` and `pid` (int64
    keys, `keys.MISSING` for NA), `tid` (None: unknown), its category spans and its steady
    steps (profiled, not warm-up) that the findings sum over."""

    rank: int
    pid: int
    tid: int | None
    spans: dict[str, iv.Spans]
    steady: pd.DataFrame

    def time_of(self, category: str) -> iv.Spans:
        """The spans of one category in steady steps: `python` what no category covers and
        the thread ran on a CPU, `off_cpu` the rest of it (`python_off_cpu_ns`)."""
        windows = iv.union(self.steady["start_ns"], self.steady["end_ns"])
        if category not in ("python", "off_cpu"):
            return iv.intersect(self.spans[category], windows)
        covered = iv.union(np.concatenate([span[0] for span in self.spans.values()]),
                           np.concatenate([span[1] for span in self.spans.values()]))
        on_cpu, off_cpu = self._split(iv.subtract(windows, covered))
        return on_cpu if category == "python" else off_cpu

    def _split(self, python: iv.Spans) -> tuple[iv.Spans, iv.Spans]:
        """Python's spans cut into the part on a CPU and the part off it: when in a step the
        thread was off a CPU is not recorded, only how long, so each span of a step keeps
        the step's share of Python on a CPU at its start and gives the rest to `off_cpu`."""
        start, end = python
        steps = self.steady.sort_values("start_ns")
        at = np.clip(np.searchsorted(steps["start_ns"].to_numpy(np.int64), start,
                                     side="right") - 1, 0, max(len(steps) - 1, 0))
        total = steps["python_ns"].to_numpy(np.int64)
        off = steps["python_off_cpu_ns"].to_numpy(np.int64)
        keep = (1 - off / np.maximum(total, 1))[at] if len(steps) else np.ones(len(start))
        cut = start + np.floor((end - start) * keep).astype(np.int64)
        return (start, cut), (cut, end)


def lanes(trace: Trace) -> list[Lane]:
    """Each process's training thread with its category spans (what `findings` summed):
    where a host finding's time is, for the replay of its fix."""
    return list(_analysis(trace)["lanes"])


def _tables(by_step: list[pd.DataFrame], top_ops: list[pd.DataFrame],
            mem_rows: list[dict[str, Any]], gaps: list[pd.DataFrame]) -> dict[str, Any]:
    """The host tables from the per-process pieces (in process order)."""
    out = pd.concat(by_step, ignore_index=True) if by_step else _empty_by_step()
    out = out.astype({"tid": "Int64"}).assign(rank=keys.key_column(out["rank"]),
                                             pid=keys.key_column(out["pid"]))
    mem_table = pd.DataFrame(mem_rows, columns=["rank", "pid", "peak_bytes", "peak_step",
                                                "steady_peak_bytes"])
    mem_table = mem_table.assign(rank=keys.key_column(mem_table["rank"]),
                                 pid=keys.key_column(mem_table["pid"]))
    return {"by_step": out,
            "top_ops": _top(top_ops, out), "memory": mem_table,
            "python_where": pd.concat(gaps, ignore_index=True) if gaps
            else pd.DataFrame({"where": [], "ns": []}),
            "pieces": (by_step, top_ops, mem_rows, gaps)}


def _windows(steps: pd.DataFrame, first: int, last: int, rank: int, pid: int
             ) -> dict[str, Any]:
    """The process's steps as columns, with `profiled`; its recorded span `[first, last]`
    as one step without any. `rank` and `pid` are the process's int64 keys
    (`keys.MISSING` for NA)."""
    if steps.empty:
        return {"rank": np.array([rank]), "pid": np.array([pid]),
                "tid": pd.Series([pd.NA]).array, "step": np.array([WHOLE], dtype=object),
                "index": np.array([0]), "start_ns": np.array([first]),
                "end_ns": np.array([last]), "dur_ns": np.array([last - first]),
                "warmup": np.array([False]), "profiled": np.array([True])}
    start = steps["start_ns"].to_numpy(np.int64)
    end = steps["end_ns"].to_numpy(np.int64)
    inside = np.minimum(end, last) - np.maximum(start, first)
    count = len(steps)
    return {"rank": np.full(count, rank, dtype=np.int64),
            "pid": np.full(count, pid, dtype=np.int64), "tid": steps["tid"].array,
            "step": steps["step"].array, "index": steps["index"].to_numpy(),
            "start_ns": start, "end_ns": end, "dur_ns": steps["dur_ns"].to_numpy(),
            "warmup": steps["warmup"].to_numpy(),
            "profiled": 2 * inside >= steps["dur_ns"].to_numpy()}


def _step_cpu_times(ranges: pd.DataFrame) -> dict[tuple[int, int, int], int]:
    """The training thread's CPU time in each step gpudiag measured it for (its step
    ranges' `cpu_time`), by (pid, start_ns, end_ns): what `training_steps` made of them."""
    if "cpu_time" not in ranges:
        return {}
    measured = ranges[(ranges["source"] == "step").to_numpy(bool)
                      & ranges["cpu_time"].notna().to_numpy(bool)]
    return {(int(pid), int(start), int(end)): int(cpu) for pid, start, end, cpu in zip(
        measured["pid"], measured["start_ns"], measured["end_ns"], measured["cpu_time"],
        strict=True) if not pd.isna(pid)}


def _per_step(windows: dict[str, Any], spans: dict[str, iv.Spans], memory: pd.DataFrame,
              cpu_times: dict[tuple[int, int, int], int]) -> pd.DataFrame:
    """The process's `host_by_step` rows: its windows, each category's time in them, the
    thread's time on a CPU and the CPU memory peak, one frame built once."""
    out = dict(windows)
    start, end = windows["start_ns"], windows["end_ns"]
    dur = np.asarray(windows["dur_ns"], dtype=np.int64)
    paused, excluded = amounts(spans[PAUSES], start, end), amounts(spans[OWN], start, end)
    # profiled: the profiler recorded at least half of the step's time that was the program's
    profiled = out["profiled"] = 2 * (dur - excluded) >= dur - paused
    own = np.where(profiled, excluded, paused)
    out["dur_ns"] = dur - own
    covered = own.copy()
    for category in CATEGORIES[:-1]:
        time = np.where(profiled, amounts(spans[category], start, end), 0)
        out[f"{category}_ns"] = time
        covered += time
    out["python_ns"] = np.where(profiled, np.maximum(end - start - covered, 0), 0)
    cpu = pd.array([cpu_times.get((int(pid), int(a), int(b))) for pid, a, b in
                    zip(windows["pid"], start, end, strict=True)], dtype="Int64")
    out["cpu_time"] = cpu
    out["python_off_cpu_ns"] = _python_off_cpu(out, cpu, start, end)
    out["cpu_peak_bytes"] = _peaks(memory, start, end)
    return pd.DataFrame(out)


def _python_off_cpu(out: dict[str, Any], cpu: Any, start: npt.ArrayLike, end: npt.ArrayLike
                    ) -> npt.NDArray[np.int64]:
    """How much of each step's Python between ops the training thread spent off a CPU
    (descheduled by a busy machine, or blocked outside any op: I/O, a sleep), 0 where its
    CPU time was not measured. The thread's time off a CPU in the step is its wall time
    less its CPU time; waits on the data loader are off a CPU and are data loading
    already, the ops are taken as on a CPU; what remains is Python's, at most all of it."""
    wall = np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)
    known = ~pd.isna(cpu)
    on_cpu = np.where(known, np.asarray(cpu.fillna(0), dtype=np.int64), wall)
    off = np.maximum(wall - on_cpu - np.asarray(out["data_loading_ns"], dtype=np.int64), 0)
    return np.minimum(off, np.asarray(out["python_ns"], dtype=np.int64)).astype(np.int64)


def _cpu_memory(trace: Trace) -> pd.DataFrame:
    mem = trace.memory
    mem = mem[(mem["device"] == -1).fillna(False).to_numpy(bool)  # -1: host memory (schema)
              & mem["total_allocated_bytes"].notna().to_numpy(bool)]
    return mem.sort_values("ts_ns")


def _peaks(mem: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> pd.arrays.IntegerArray:
    """The highest running total of CPU allocations inside each step (NA without any)."""
    out = pd.array([pd.NA] * len(start), dtype="Int64")
    if mem.empty:
        return out
    times = mem["ts_ns"].to_numpy(np.int64)
    total = mem["total_allocated_bytes"].to_numpy(np.int64)
    step = np.searchsorted(start, times, side="right") - 1
    inside = (step >= 0) & (times < end[np.maximum(step, 0)])
    peak = pd.Series(total[inside]).groupby(step[inside]).max()
    out[peak.index.to_numpy()] = peak.to_numpy()
    return out


def _memory_row(rank: int, pid: int, mem: pd.DataFrame, table: pd.DataFrame
                ) -> dict[str, Any]:
    if mem.empty:
        return {"rank": rank, "pid": pid, "peak_bytes": pd.NA, "peak_step": pd.NA,
                "steady_peak_bytes": pd.NA}
    best = mem["total_allocated_bytes"].astype("int64").idxmax()
    peak_at = int(mem.at[best, "ts_ns"])
    hit = table[(table["start_ns"] <= peak_at) & (table["end_ns"] > peak_at)]
    steady = table.loc[~table["warmup"], "cpu_peak_bytes"].dropna()
    return {"rank": rank, "pid": pid, "peak_bytes": int(mem.at[best, "total_allocated_bytes"]),
            "peak_step": str(hit["step"].iloc[0]) if len(hit) else pd.NA,
            "steady_peak_bytes": int(steady.max()) if len(steady) else pd.NA}


def _self_time(ranges: Columns, steady: pd.DataFrame) -> pd.DataFrame:
    """Self ns per op name, counting ops that start inside the steady steps."""
    ops = ranges.take(ranges["_op"] & ~ranges["_is_step"])
    if not len(ops) or steady.empty:
        return pd.DataFrame({"name": [], "calls": [], "self_ns": []})
    own = self_times(ops)
    start = ops["start_ns"]
    step = np.searchsorted(steady["start_ns"].to_numpy(np.int64), start, side="right") - 1
    inside = (step >= 0) & (start < steady["end_ns"].to_numpy(np.int64)[np.maximum(step, 0)])
    # a call recorded twice (jax's nested PjitFunction) is one call
    same = keys.codes(ops["tid"], ops["name_code"])
    call = nesting_depth(same, start, ops["end_ns"]) == 0
    codes = ops["name_code"][inside]
    named = codes >= 0  # pandas' groupby leaves missing names out
    if not named.any():
        return pd.DataFrame({"name": ops["name"][inside][named], "self_ns": own[inside][named],
                             "call": call[inside][named].astype(np.int64)}).groupby(
            "name").agg(calls=("call", "sum"), self_ns=("self_ns", "sum")).reset_index()
    distinct, first, which = np.unique(codes[named], return_index=True, return_inverse=True)
    calls = np.zeros(len(distinct), dtype=np.int64)
    self_ns = np.zeros(len(distinct), dtype=np.int64)
    np.add.at(calls, which.reshape(-1), call[inside][named])
    np.add.at(self_ns, which.reshape(-1), own[inside][named])
    names = ops["name"][inside][named][first]
    order = np.argsort(names)  # by name, as a groupby sorts (names are distinct)
    return pd.DataFrame({"name": names[order], "calls": calls[order],
                         "self_ns": self_ns[order]})


def _top(parts: list[pd.DataFrame], by_step: pd.DataFrame) -> pd.DataFrame:
    steady = by_step[by_step["profiled"] & ~by_step["warmup"]] if len(by_step) else by_step
    total = int(steady["dur_ns"].sum()) if len(steady) else 0
    parts = [part for part in parts if len(part)]
    if not parts:
        return pd.DataFrame({"name": pd.Series(dtype=str), "calls": pd.Series(dtype="int64"),
                             "self_ns": pd.Series(dtype="int64"),
                             "share": pd.Series(dtype="float64")})
    ops = pd.concat(parts).groupby("name").sum().reset_index()
    ops = ops.sort_values(["self_ns", "name"], ascending=[False, True], ignore_index=True)
    ops["share"] = ops["self_ns"] / total if total else np.nan
    return ops.astype({"calls": "int64", "self_ns": "int64"})


def _python_gaps(trace: Trace, ranges: Columns, tid: int | None,
                 spans: dict[str, iv.Spans], steady: pd.DataFrame, *,
                 limit: int = 2000) -> pd.DataFrame:
    """Python time by the innermost user frame open mid-gap (the `limit` longest gaps), when
    the trace has Python frames."""
    if not ranges["_python"].any() or steady.empty or tid is None:
        return pd.DataFrame({"where": [], "ns": []})
    taken = iv.union(np.concatenate([span[0] for span in spans.values()]),
                     np.concatenate([span[1] for span in spans.values()]))
    free = iv.subtract(iv.union(steady["start_ns"], steady["end_ns"]), taken)
    length = free[1] - free[0]
    keep = np.argsort(length, kind="stable")[::-1][:limit]
    mid = (free[0][keep] + free[1][keep]) // 2
    pid, rank = (pd.NA if np.isnan(value) else int(value)
                 for value in (ranges["pid"][0], ranges["rank"][0]))
    where = callsites.where_at(trace, [pid] * len(mid), [tid] * len(mid), mid,
                               [rank] * len(mid))
    found = pd.DataFrame({"where": where, "ns": length[keep]}).dropna()
    return found[found["where"].astype(str).str.contains(r"\.py:\d")]


def _empty_by_step() -> pd.DataFrame:
    return pd.DataFrame({col: pd.Series(dtype="int64" if col.endswith("_ns") or col == "index"
                                        else "bool" if col in ("warmup", "profiled")
                                        else "Int64" if col in ("rank", "pid", "tid",
                                                                "cpu_time", "cpu_peak_bytes")
                                        else "object") for col in BY_STEP})


# -- findings -------------------------------------------------------------------------------


def analyze(trace: Trace) -> Result:
    """The host-steps analyzer's one result: host findings and the four host tables.

        result = steps.analyze(trace)
        result.findings[["cause", "share", "where"]]
        result.tables["host_by_step"].set_index("step")

    `host_breakdown`, `host_by_step`, `host_top_ops` and `host_memory` are all read from
    one pass over the host ops.
    """
    return combine([part(trace)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's host analysis: its processes' pieces (steps by
    category, op self times, memory, Python time by frame), which framework recorded it,
    and the time of the ranges a data-loading or optimizer finding is named after."""

    pieces: tuple[list[pd.DataFrame], list[pd.DataFrame], list[dict[str, Any]],
                  list[pd.DataFrame]]
    formats: frozenset[str]
    torch_ops: bool
    named: dict[tuple[str, bool], pd.Series]
    loader: pd.DataFrame  # its DataLoader workers' batches (`loader_workers`)


def part(trace: Trace) -> Part:
    """This rank's host pieces (see `Part`)."""
    return Part(_analysis(trace)["pieces"], formats_of(trace.meta),
                bool((trace.ranges["source"] == "torch_op").any()), _named_time(trace),
                loader_workers(trace))


def combine(parts: list[Part]) -> Result:
    """The job's result: every process's pieces in process order (rank, pid), then the
    tables and findings read from them."""
    if len(parts) == 1:
        pieces = parts[0].pieces
    else:
        every = [tuple(piece.pieces[n][i] for n in range(4))
                 for piece in parts for i in range(len(piece.pieces[2]))]
        every.sort(key=_process_order)  # stable: a process of two parts keeps their order
        pieces = tuple([process[n] for process in every] for n in range(4))  # type: ignore
    tables = _tables(*pieces)
    formats = frozenset().union(*(piece.formats for piece in parts))
    kind = framework_of(formats, any(piece.torch_ops for piece in parts))
    named: dict[tuple[str, bool], pd.Series] = {}
    for piece in parts:
        for key, sums in piece.named.items():
            named[key] = sums if key not in named else named[key].add(sums, fill_value=0)
    by_step = tables["by_step"]
    loader = pd.concat([piece.loader for piece in parts], ignore_index=True)
    return Result(_findings(tables, kind, named, loader), {
        "host_breakdown": _breakdown(by_step), "host_by_step": by_step,
        "host_top_ops": tables["top_ops"].head(15).reset_index(drop=True),
        "host_memory": tables["memory"]})


def _process_order(process: tuple[Any, ...]) -> tuple[int, int]:
    """A process's key (its memory row names its rank and pid as int64 keys)."""
    row = process[2]
    return int(row["rank"]), int(row["pid"])


def findings(trace: Trace, *, min_share: float = 0.1, min_op_share: float = 0.2,
             top_ops: int = 3) -> pd.DataFrame:
    """Host-side findings over the steady profiled steps (see the module docstring).

        findings(trace)[["cause", "share", "where", "advice"]]

    `min_share`: least share of step time a category needs to be reported (10%);
    `min_op_share`: the same for one op's self time (20%), of which the `top_ops` largest.
    """
    return _findings(_analysis(trace), framework(trace), _named_time(trace),
                     loader_workers(trace), min_share=min_share, min_op_share=min_op_share,
                     top_ops=top_ops)


def _findings(tables: dict[str, Any], kind: str | None,
              named_time: dict[tuple[str, bool], pd.Series], loader: pd.DataFrame, *,
              min_share: float = 0.1, min_op_share: float = 0.2, top_ops: int = 3
              ) -> pd.DataFrame:
    """`findings` from the host tables, the framework, the named ranges' time and the
    DataLoader workers' batches (the data-loading finding says what they take)."""
    by_step = tables["by_step"]
    steady = by_step[by_step["profiled"] & ~by_step["warmup"]] if len(by_step) else by_step
    total = int(steady["dur_ns"].sum()) if len(steady) else 0
    if total <= 0:
        return frame()
    warm = int(by_step["warmup"].sum())
    context = {"steps": len(steady), "warmup": warm, "total": total,
               "whole": bool((steady["step"] == WHOLE).all())}
    rows = []
    off_cpu = int(steady["python_off_cpu_ns"].sum()) if len(steady) else 0
    for cause, category in CAUSES.items():
        time = off_cpu if category == "off_cpu" else int(steady[f"{category}_ns"].sum())
        if cause == "host_python_overhead":  # Python is what ran on a CPU
            time -= off_cpu
        if time < min_share * total:
            continue
        said = evidence(cause, time, context)
        if cause == "host_data_loading":
            work = steady["dur_ns"].to_numpy(np.int64) - steady["data_loading_ns"].to_numpy(
                np.int64)
            workers = loader_summary(loader, float(np.median(work)))
            said += f"; {workers}" if workers else ""
        if cause == "host_python_overhead" and off_cpu >= 0.05 * total:
            per_step = format_ns(off_cpu / max(len(steady), 1))
            said += (f"; {per_step} more per step the thread was off a CPU between ops "
                     "(host_off_cpu), not counted here")
        rows.append({"cause": cause, "lost_ns": time, "share": time / total,
                     "where": _where(tables, named_time, cause), "count": len(steady),
                     "evidence": said, "advice": advice(cause, kind)})
    ops = tables["top_ops"]
    named = pd.Series(ops["name"], dtype="category")  # loader / optimizer ranges: said above
    ops = ops[~(keys.matches(named, DATA) | keys.matches(named, OPTIMIZER))]
    for row in ops[ops["self_ns"] >= min_op_share * total].head(top_ops).itertuples():
        rows.append({"cause": "host_op", "lost_ns": int(row.self_ns),
                     "share": row.self_ns / total, "where": row.name, "count": int(row.calls),
                     "evidence": evidence("host_op", int(row.self_ns), {**context,
                                                                         "calls": row.calls}),
                     "advice": advice("host_op", kind)})
    return frame(rows)


def _named_time(trace: Trace) -> dict[tuple[str, bool], pd.Series]:
    """Per finding that is named after a range (data loading, optimizer): the time of the
    matching ranges by name, outside Python frames (`True`) and in all (`False`)."""
    out = {}
    for cause, pattern in (("host_data_loading", DATA), ("host_optimizer", OPTIMIZER)):
        named = keys.matches(trace.ranges["name"], pattern)
        for framed in (True, False):
            hit = trace.ranges[named & (trace.ranges["source"] != "python").to_numpy(bool)
                               if framed else named]
            out[cause, framed] = (hit["end_ns"] - hit["start_ns"]).groupby(
                hit["name"].astype(str)).sum()
    return out


def _where(tables: dict[str, Any], named_time: dict[tuple[str, bool], pd.Series],
           cause: str) -> str:
    """Where a host finding happens: the DataLoader or optimizer range name, the user frame
    that most of the Python time ran under."""
    if cause in ("host_python_overhead", "host_off_cpu"):  # the same gaps between ops
        found = tables["python_where"]
        if len(found):
            return str(found.groupby("where")["ns"].sum().idxmax())
        return "(between framework ops)"
    if (cause, True) not in named_time:
        return "(compiler)"
    time = named_time[cause, True]
    if time.empty:
        time = named_time[cause, False]
    if time.empty:
        return "-"
    return str(time.sort_index().idxmax())


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
