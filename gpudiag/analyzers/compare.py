"""Two or more runs side by side: the data behind `gpudiag compare A B [C...]`.

    cmp = compare([gpudiag.load("fp32/"), gpudiag.load("bf16/")], ["fp32", "bf16"])
    cmp.summary                       # wall/step time, samples/s, peak memory, per run
    regressions(cmp, parse_fail_on("step_time>+5%,sync_stall>+2pp"))

The first run is the baseline. Every table has one column per run (named by its label)
followed, for each other run, by its change against the baseline: `delta:<label>` (same
unit as the values), `rel:<label>` (fraction of the baseline: 0.1 = +10%; inf when the
baseline is 0 and the run is not) and, for shares, `pp:<label>` (percentage points).
NaN means "not available in that run" (no step markers, no memory events, no timeline).

Definitions, per run:
- wall time: the GPU window, first kernel/copy start to last end (`Trace.gpu_window_ns`);
- process time: the wall time of the longest-lived profiled process (a `gpudiag profile`
  run records each process's start and end), else the span of the trace's host events:
  what a run without GPU activity is measured by;
- step time: the median step of `analyzers.steps.training_steps` (step markers or, without
  them, the detected steps: optimizer steps, jitted-step executions, a repeating op
  sequence; a step runs to the next step's start), over every rank, warm-up steps left
  out; NaN when no steps are found. `steps` counts them all, `warmup_steps` the warm-up;
- samples/s: `step_size` / step time, when the caller gives the samples per step;
- peak memory (reserved) and peak allocated: the highest value any one device reached in
  `analyzers.memory.allocator`, i.e. the profiler's running totals (Kineto `[memory]`
  events) or the snapshot and its replayed history. Running sums of bare tensor deltas are
  left out: they start at 0 when recording starts, so they are not the device's memory.
  The highest single device, not the sum, because that is the one that runs out;
- peak CPU tensor memory: the highest running total of host allocations the profiler saw
  (Kineto `[memory]` events on device -1, `analyzers.host_steps.host_memory`) of any one
  process: the framework's CPU tensors only, not the process's memory;
- peak resident memory: the program's peak resident set as `gpudiag profile` measured it
  (`getrusage` of the command and its waited-for children; meta.json `peak_rss_bytes`),
  the memory the machine had to give the run; NaN for a trace that is not such a run;
- losses: the waterfall summed over devices; a share is a cause's time over the summed
  windows, the same numbers `gpudiag analyze` and its `--fail-on` use;
- kernels: GPU time and launches per kernel (NCCL kernels by op, algorithm, protocol and
  type, so a renamed NCCL kernel keeps one row); a kernel absent from a run took 0 ns there
  (a PyTorch and a JAX run share few names: compare `kernel_time_ns` and the waterfall);
- collectives: calls and time per op (`collective_stats`); syncs: count and host wait per
  kind (`sync_points`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analyzers import run_facts
from gpudiag.analyzers.diagnosis import Diagnosis, diagnose
from gpudiag.analyzers.findings import LOSS_CAUSES, format_ns
from gpudiag.analyzers.memory.allocator import fragmentation
from gpudiag.analyzers.run_facts import RunFacts
from gpudiag.analyzers.steps.training import summary as step_summary
from gpudiag.analyzers.steps.training import training_steps
from gpudiag.errors import InputError
from gpudiag.names import short_names
from gpudiag.trace import Trace

#: rows of `Comparison.summary`, in display order (units in the names)
SUMMARY_ROWS = ("wall_time_ns", "process_time_ns", "step_time_ns", "steps", "warmup_steps",
                "samples_per_s", "peak_reserved_bytes", "peak_allocated_bytes",
                "peak_cpu_bytes", "peak_rss_bytes", "kernel_time_ns", "kernels")

#: `--fail-on` metric -> summary row (loss causes are metrics too: `pp` or `%`)
BUDGET_METRICS = {"step_time": "step_time_ns", "wall_time": "wall_time_ns",
                  "samples_per_s": "samples_per_s", "peak_memory": "peak_reserved_bytes",
                  "peak_allocated": "peak_allocated_bytes", "process_time": "process_time_ns",
                  "cpu_memory": "peak_cpu_bytes", "rss": "peak_rss_bytes"}

#: why a metric can be missing from a run, said when a budget cannot be checked
_MISSING = {"step_time": "no steps were found in it (no step markers, optimizer steps, jitted "
                         "step or repeating ops)",
            "wall_time": "it has no kernels or copies on a timeline (compare process_time)",
            "process_time": "it has no process times and no host events",
            "cpu_memory": "it has no CPU memory events (torch.profiler profile_memory=True)",
            "rss": "it is not a gpudiag profile run (the session measures the program's "
                   "peak resident set)",
            "samples_per_s": "it needs steps and --step-size N (samples per step)",
            "peak_memory": "it has no memory totals or snapshot "
                           "(profile with profile_memory=True or dump a snapshot)",
            "peak_allocated": "it has no memory totals or snapshot "
                              "(profile with profile_memory=True or dump a snapshot)"}


@dataclass
class Comparison:
    """The runs' numbers side by side; see the module docstring for every definition."""

    labels: list[str]
    summary: pd.DataFrame      # index `metric`: SUMMARY_ROWS
    losses: pd.DataFrame       # index: cause; lost ns summed over devices
    shares: pd.DataFrame       # index: cause; share of the summed windows (0-1), pp deltas
    kernels: pd.DataFrame      # index: kernel name; short_name, ns per run, count:<label>
    collectives: pd.DataFrame  # index: (op, quantity) with quantity count | total_ns
    syncs: pd.DataFrame        # index: (kind, quantity) with quantity count | host_wait_ns
    step_size: int | None = None
    notes: list[str] = field(default_factory=list)
    predicted: pd.DataFrame = field(default_factory=lambda: _predicted_frame([]))

    @property
    def baseline(self) -> str:
        return self.labels[0]

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name, in display order."""
        return {"summary": self.summary, "losses": self.losses, "shares": self.shares,
                "kernels": self.kernels, "collectives": self.collectives,
                "syncs": self.syncs}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (what `gpudiag compare --json` prints): tables as lists of
        records with their index as columns; NaN and inf become None (JSON has neither)."""
        return {"labels": list(self.labels), "baseline": self.baseline,
                "step_size": self.step_size, "notes": list(self.notes),
                **{name: _records(frame) for name, frame in self.tables().items()},
                "predicted": _records(self.predicted.set_index(["run", "cause"]))}


def compare(traces: Sequence[Trace | RunFacts], labels: Sequence[str], *,
            step_size: int | None = None, top: int = 20,
            diagnoses: Sequence[Diagnosis] | None = None) -> Comparison:
    """Compare runs against the first (the baseline).

        cmp = compare([before, after], ["before", "after"], step_size=32)
        cmp.summary.loc["step_time_ns", "rel:after"]      # +0.1 = 10% slower steps
        cmp.shares["pp:after"]                             # waterfall change, in points

    `top`: kernels kept, by the largest time change against the baseline. `diagnoses`:
    the runs' `diagnose()` results when the caller already has them (else computed). A run
    may be its `run_facts.RunFacts` instead of its trace (a job diagnosed rank by rank,
    `run_facts.of_parts`); its diagnosis must then be given.
    """
    labels = _check(traces, labels, step_size)
    if diagnoses is None and not all(isinstance(run, Trace) for run in traces):
        raise ValueError("compare: runs given as RunFacts need their diagnoses")
    dxs = list(diagnoses) if diagnoses is not None else [
        diagnose(trace) for trace in traces if isinstance(trace, Trace)]
    if len(dxs) != len(labels):
        raise ValueError("compare: one diagnosis per trace, in the same order")
    dxs = [_completed(run, dx) for run, dx in zip(traces, dxs, strict=True)]
    runs = [run_facts.of_trace(run) if isinstance(run, Trace) else run for run in traces]
    notes: list[str] = []
    summary = pd.DataFrame({label: _summary(run, diagnosis, step_size, label, notes)
                            for label, run, diagnosis in zip(labels, runs, dxs, strict=True)})
    summary.index.name = "metric"
    lost = pd.DataFrame({label: _lost(diagnosis)
                         for label, diagnosis in zip(labels, dxs, strict=True)})
    shares = lost / lost.sum(min_count=1)
    table = versus(summary.loc[list(SUMMARY_ROWS)], labels)
    return Comparison(
        labels=labels, summary=table, predicted=predicted(dxs, labels, table),
        losses=versus(lost, labels), shares=versus(shares, labels, points=True),
        kernels=_kernels(runs, labels, top, notes),
        collectives=_per_key(labels, [_collectives(diagnosis) for diagnosis in dxs], "op"),
        syncs=_per_key(labels, [_syncs(diagnosis) for diagnosis in dxs], "kind"),
        step_size=step_size, notes=notes)


#: a baseline finding counts as fixed in a later run when what is left of its lost time
#: there (same cause, place and advice) is at most this share of it
FIXED_SHARE = 0.2
PREDICTED_COLUMNS = ("run", "cause", "where", "fix", "lost_ns", "lost_after_ns",
                     "predicted_ns", "predicted_step_ns", "measured_step_ns",
                     "measured_wall_ns")


def predicted(dxs: Sequence[Diagnosis], labels: Sequence[str], summary: pd.DataFrame
              ) -> pd.DataFrame:
    """Predicted vs measured: for each later run, the baseline's findings it fixed (their
    lost time gone, `FIXED_SHARE`) with the saving the baseline predicted for them (window
    and, with steps, per step: `saving_step_share` x the baseline's median step), beside
    the step-time and wall-time change measured (baseline minus run: positive is faster).
    Several findings fixed at once predict their savings' sum at most."""
    base = dxs[0].findings
    base = base[base["saving_ns"].notna().to_numpy(bool) & (base["lost_ns"] > 0).to_numpy(bool)]
    step = summary.loc["step_time_ns", labels[0]]
    rows = []
    for label, dx in zip(labels[1:], dxs[1:], strict=True):
        left = dx.findings.groupby(["cause", "where", "advice"], dropna=False)["lost_ns"].sum()
        measured = {f"measured_{name}_ns": -summary.loc[f"{name}_time_ns", f"delta:{label}"]
                    for name in ("step", "wall")}
        for found in base.itertuples():
            after = int(left.get((found.cause, found.where, found.advice), 0))
            if after > FIXED_SHARE * found.lost_ns:
                continue
            rows.append({"run": label, "cause": found.cause, "where": found.where,
                         "fix": found.fix, "lost_ns": found.lost_ns, "lost_after_ns": after,
                         "predicted_ns": found.saving_ns,
                         "predicted_step_ns": found.saving_step_share * step, **measured})
    return _predicted_frame(rows)


def _predicted_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=list(PREDICTED_COLUMNS))
    return out.astype({"run": "string", "cause": "string", "where": "string",
                       "fix": "string", "lost_ns": "float64", "lost_after_ns": "float64",
                       "predicted_ns": "float64", "predicted_step_ns": "float64",
                       "measured_step_ns": "float64", "measured_wall_ns": "float64"})


def _completed(run: Trace | RunFacts, dx: Diagnosis) -> Diagnosis:
    """`dx` with what compare reads of it that a caller's diagnosis may lack (its steps,
    host memory, fragmentation) computed from the trace; a diagnosis from `diagnose` (or
    `diagnose_job`) already holds them where they apply."""
    if not isinstance(run, Trace):
        return dx
    tables = dict(dx.tables)
    if "host_memory" not in tables:
        from gpudiag.analyzers.host.steps import host_memory

        tables["host_memory"] = host_memory(run)
    if "fragmentation" not in tables and not (run.memory.empty and run.memory_blocks.empty):
        tables["fragmentation"] = fragmentation(run)
    steps = dx.steps if dx.steps is not None else training_steps(run)
    return replace(dx, tables=tables, steps=steps)


def versus(values: pd.DataFrame, labels: Sequence[str], *, points: bool = False) -> pd.DataFrame:
    """`values` (one float column per label) with each later run's change vs the first.

        versus(pd.DataFrame({"a": [100.0], "b": [110.0]}), ["a", "b"])
        # -> a, b, delta:b = 10.0, rel:b = 0.1
        versus(shares, ["a", "b"], points=True)   # -> a, b, pp:b

    `points`: the values are shares (0-1), so the change is in percentage points.
    """
    out = values.loc[:, list(labels)].astype("float64")
    base = out[labels[0]]
    for label in labels[1:]:
        diff = out[label] - base
        if points:
            out[f"pp:{label}"] = 100 * diff
            continue
        out[f"delta:{label}"] = diff
        rel = diff / base.where(base != 0)
        zero = base == 0
        out[f"rel:{label}"] = rel.mask(zero, np.sign(diff) * np.inf).mask(zero & (diff == 0),
                                                                          0.0)
    return out


# -- per run --------------------------------------------------------------------------------


def _check(traces: Sequence[Trace | RunFacts], labels: Sequence[str],
           step_size: int | None) -> list[str]:
    """Caller mistakes are ValueErrors (the CLI derives labels and checks --step-size)."""
    if len(traces) < 2 or len(traces) != len(labels):
        raise ValueError("compare: two or more traces, one label each")
    if len(set(labels)) != len(labels):
        raise ValueError(f"compare: labels must be distinct, got {list(labels)}")
    if step_size is not None and step_size <= 0:
        raise ValueError("compare: step_size is samples per step, a positive integer")
    return [str(label) for label in labels]


def _summary(run: RunFacts, diagnosis: Diagnosis, step_size: int | None, label: str,
             notes: list[str]) -> pd.Series:
    """One run's SUMMARY_ROWS (NaN where not available, with a note saying why)."""
    window = run.window_ns
    if window is None:
        notes.append(f"{label}: no kernels or copies on a timeline, so no wall time or "
                     "waterfall (process time, steps and CPU memory still compare)")
    info = step_summary(diagnosis.steps)
    step = math.nan if info["median_ns"] is None else float(info["median_ns"])
    if not info["count"]:
        notes.append(f"{label}: no steps found (no step markers, optimizer steps, jitted "
                     "step or repeating ops), so no step time or samples/s")
    elif info["method"] != "markers":
        notes.append(f"{label}: steps are {info['method_text']} ({info['detail']})")
    reserved, allocated = _peaks(run, diagnosis)
    cpu = _cpu_peak(diagnosis)
    if math.isnan(reserved) and math.isnan(allocated) and math.isnan(cpu):
        notes.append(f"{label}: no memory totals or snapshot, so no peak memory")
    return pd.Series({
        "wall_time_ns": math.nan if window is None else float(window[1] - window[0]),
        "process_time_ns": run.process_time_ns,
        "step_time_ns": step,
        "steps": float(info["count"]) if info["count"] else math.nan,
        "warmup_steps": float(info["warmup"]) if info["count"] else math.nan,
        "samples_per_s": step_size / step * 1e9 if step_size and step > 0 else math.nan,
        "peak_reserved_bytes": reserved, "peak_allocated_bytes": allocated,
        "peak_cpu_bytes": cpu, "peak_rss_bytes": run.peak_rss_bytes,
        "kernel_time_ns": float(run.kernels["sum"].sum()),
        "kernels": float(run.kernels["size"].sum()),
    }, dtype="float64")


def _cpu_peak(diagnosis: Diagnosis) -> float:
    """The highest CPU allocation total of any one process; NaN when unknown."""
    memory = diagnosis.tables.get("host_memory")
    if memory is None or not len(memory):
        return math.nan
    peak = memory["peak_bytes"].dropna()
    return float(peak.max()) if len(peak) else math.nan


def _peaks(run: RunFacts, diagnosis: Diagnosis) -> tuple[float, float]:
    """(reserved, allocated) peaks of the busiest device; NaN when unknown."""
    frag = diagnosis.tables.get("fragmentation")
    if not run.memory or frag is None:
        return math.nan, math.nan
    frag = frag[frag["source"] != "deltas"]
    peak = [frag[col].max() if len(frag) else pd.NA
            for col in ("reserved_bytes", "allocated_bytes")]
    return tuple(math.nan if pd.isna(value) else float(value)  # type: ignore[return-value]
                 for value in peak)


def _lost(diagnosis: Diagnosis) -> pd.Series:
    """Lost ns per cause summed over devices; NaN for every cause without a timeline."""
    if diagnosis.losses.empty:
        return pd.Series(math.nan, index=list(LOSS_CAUSES), dtype="float64")
    by_cause = diagnosis.losses.groupby("cause")["lost_ns"].sum()
    return by_cause.reindex(list(LOSS_CAUSES), fill_value=0).astype("float64")


def _collectives(diagnosis: Diagnosis) -> pd.DataFrame:
    stats = diagnosis.tables.get("collective_stats")
    if stats is None or stats.empty:
        return pd.DataFrame({"count": [], "total_ns": []})
    return stats.groupby("op", observed=True)[["count", "total_ns"]].sum()


def _syncs(diagnosis: Diagnosis) -> pd.DataFrame:
    points = diagnosis.tables.get("sync_points")
    if points is None or points.empty:
        return pd.DataFrame({"count": [], "host_wait_ns": []})
    return points.groupby("kind", observed=True)[["count", "host_wait_ns"]].sum()


# -- across runs ----------------------------------------------------------------------------


def _per_key(labels: list[str], frames: list[pd.DataFrame], key: str) -> pd.DataFrame:
    """Per-run `key x quantity` tables as one `(key, quantity)` x run table with deltas; a
    key a run lacks counts 0 there (it made no such call)."""
    long = {label: frame.rename_axis(key).reset_index().melt(id_vars=key, var_name="quantity")
            .set_index([key, "quantity"])["value"]
            for label, frame in zip(labels, frames, strict=True)}
    return versus(pd.DataFrame(long).astype("float64").fillna(0.0).sort_index(), labels)


def _kernels(runs: Sequence[RunFacts], labels: list[str], top: int,
             notes: list[str]) -> pd.DataFrame:
    """GPU ns per kernel per run (0 where a run lacks it), the `top` largest changes first;
    `count:<label>` launches per run; `short_name` for display. Kernels are matched by name,
    NCCL's by what they do (`kernel_key`), which stays when their signature changes."""
    time, count = {}, {}
    for label, run in zip(labels, runs, strict=True):
        time[label], count[label] = run.kernels["sum"], run.kernels["size"]
    times = pd.DataFrame(time).astype("float64").fillna(0.0)
    names = [set(series.index) for series in time.values()]
    if all(names) and not set.intersection(*names):
        notes.append("the runs share no kernel names (another framework or compiler?): "
                     "compare kernel_time_ns and the waterfall instead")
    table = versus(times, labels)
    change = table[[f"delta:{label}" for label in labels[1:]]].abs().max(axis=1)
    order = pd.DataFrame({"change": change, "base": times[labels[0]]})
    table = table.loc[order.sort_values(["change", "base"], ascending=False).index[:top]]
    table.index.name = "name"
    table.insert(0, "short_name", short_names(pd.Series(table.index, index=table.index))
                 .astype(str))
    counts = pd.DataFrame(count).reindex(table.index).fillna(0).astype("int64")
    return table.join(counts.add_prefix("count:"))


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    flat = frame.reset_index()
    return [{str(column): _plain(value) for column, value in row.items()}
            for row in flat.to_dict(orient="records")]


def _plain(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return None if value is pd.NA else value


# -- relative budgets -----------------------------------------------------------------------

_SPEC = re.compile(r"^(?P<metric>[a-z_]+)(?P<op>[<>])(?P<sign>[+-]?)"
                   r"(?P<value>\d+(?:\.\d+)?)(?P<unit>%|pp)$")
_GRAMMAR = ("write METRIC>+N% (an increase) or METRIC<-N% (a drop), comma-separated; "
            "METRIC is one of " + ", ".join(BUDGET_METRICS) + " or a loss cause ("
            + ", ".join(LOSS_CAUSES) + ") with Npp for its share or N% for its time")


@dataclass(frozen=True)
class RelativeBudget:
    """How far a run may move from the baseline: `metric op limit unit`."""

    metric: str
    op: str         # '>': fails on an increase beyond limit; '<': on a drop beyond it
    limit: float    # percent or percentage points, not negative
    unit: str       # '%' (relative change) or 'pp' (share change, loss causes only)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{'+' if self.op == '>' else '-'}{self.limit:g}{self.unit}"


def parse_fail_on(spec: str) -> list[RelativeBudget]:
    """Relative budgets from `--fail-on`; an InputError names the first bad part.

        parse_fail_on("step_time>+5%,peak_memory>+10%,sync_stall>+2pp")
        parse_fail_on("samples_per_s<-5%")     # fails when throughput drops 5%
        parse_fail_on("host_bound>+20%")       # host_bound time (not share) up 20%
    """
    budgets = []
    for part in filter(None, (piece.replace(" ", "") for piece in spec.split(","))):
        match = _SPEC.match(part)
        problem = _spec_problem(match)
        if problem:
            raise InputError("--fail-on", f"cannot read budget '{part}': {problem}", _GRAMMAR)
        assert match is not None  # _spec_problem said so
        budgets.append(RelativeBudget(match["metric"], match["op"], float(match["value"]),
                                      match["unit"]))
    return budgets


def _spec_problem(match: re.Match[str] | None) -> str:
    if match is None:
        return "not of the form METRIC>+N% or METRIC<-N%"
    if match["metric"] not in BUDGET_METRICS and match["metric"] not in LOSS_CAUSES:
        return f"unknown metric '{match['metric']}'"
    if match["unit"] == "pp" and match["metric"] not in LOSS_CAUSES:
        return "pp (percentage points) applies to loss-cause shares only"
    if (match["op"], match["sign"]) in ((">", "-"), ("<", "+")):
        return (f"'{match['op']}{match['sign']}' cannot happen: use >+N for a rise, <-N "
                "for a drop")
    return ""


def regressions(comparison: Comparison, budgets: Sequence[RelativeBudget]) -> list[str]:
    """One line per (budget, run) where a run moved past the budget vs the baseline.

        cmp = compare([base, new], ["base", "new"])
        for line in regressions(cmp, parse_fail_on("step_time>+5%")):
            print(line)                         # and exit 1 in CI

    A budget whose metric a run lacks raises InputError: a check that cannot run must
    not pass silently.
    """
    lines = []
    for budget in budgets:
        table, row, change, unit = _budget_source(comparison, budget)
        values = table.loc[row]
        for label in comparison.labels:
            if pd.isna(values[label]):
                raise InputError("--fail-on", f"cannot check {budget} for run '{label}'",
                                 _MISSING.get(budget.metric, "it has no GPU timeline"))
        for label in comparison.labels[1:]:
            moved = _moved(values, comparison.baseline, label, change)
            if (moved > budget.limit) if budget.op == ">" else (moved < -budget.limit):
                lines.append(
                    f"{label}: {budget} broken, {budget.metric} "
                    f"{_show(unit, values[comparison.baseline])} -> {_show(unit, values[label])}"
                    f" ({moved:+.2f}{budget.unit}) vs baseline '{comparison.baseline}'")
    return lines


def _moved(values: pd.Series, base: str, label: str, change: str) -> float:
    """The change in the budget's unit: % from the exact delta (10% stays 10.0, not
    10.000000000000002 as 100 * 0.1 gives), pp as stored."""
    if change == "pp" or values[base] == 0:
        return float(values[f"{change}:{label}"]) * (100 if change == "rel" else 1)
    return 100 * float(values[f"delta:{label}"]) / float(values[base])


def _budget_source(comparison: Comparison,
                   budget: RelativeBudget) -> tuple[pd.DataFrame, str, str, str]:
    """(table, row, change column prefix, unit of the values) a budget reads."""
    if budget.metric in BUDGET_METRICS:
        row = BUDGET_METRICS[budget.metric]
        return comparison.summary, row, "rel", row.rsplit("_", 1)[-1]
    if budget.unit == "pp":
        return comparison.shares, budget.metric, "pp", "share"
    return comparison.losses, budget.metric, "rel", "ns"


def _show(unit: str, value: float) -> str:
    """A value for a one-line message."""
    if unit == "ns":
        return format_ns(value)
    if unit == "bytes":
        return f"{value / 2**20:.1f} MiB"
    if unit == "share":
        return f"{100 * value:.2f}%"
    return f"{value:.1f}/s"
