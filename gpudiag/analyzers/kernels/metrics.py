"""Per-kernel hardware metrics from Nsight Compute: what limits each profiled kernel.

`kernel_metrics` pivots the long `metrics` table into one row per profiled kernel with the
numbers ncu's Details page leads with (Speed of Light, occupancy, cache hit rates) and decides
the SOL bottleneck exactly as ncu's `SOLBottleneck` rule does, so a report can explain a
kernel without ncu installed. `rules` flattens ncu's own rule results and `rule_findings`
keeps those that name a problem (the one table of them every page shows); `findings` turns
the metrics and the rules into gpudiag findings, and `analyze` returns both, with the tables,
from one `kernel_metrics` computation.

Metric names depend on the ncu version and, much more, on the sections collected
(`--set basic` has no Memory Workload Analysis, custom section files have what they list).
`METRIC_ALIASES` names, per column, every metric name that carries it, first present wins;
a column whose metrics a kernel lacks is NA and named in that row's `missing`, and
`result.attrs["missing"]` lists the columns no kernel has (what a report should call
"not collected"). Thresholds are keyword arguments; their defaults and where they come from
are documented on `kernel_metrics`.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analyzers import findings as fnd
from gpudiag.analyzers.findings import Contract
from gpudiag.names import short_names
from gpudiag.schema import NS_PER_UNIT
from gpudiag.trace import Trace

#: column <- ncu metric names carrying it, first present wins. Where each name was seen:
#: "fixtures" = the shared ncu reports (ncu 2022.4 to 2025.1, V100..GH200, sets basic..full).
METRIC_ALIASES: Mapping[str, tuple[str, ...]] = {
    # every fixture (in "ns" from ncu 2022.4, "nsecond" elsewhere: scaled by its unit)
    "duration_ns": ("gpu__time_duration.sum",),
    # SpeedOfLight section (all sets, basic included); absent from custom-section reports
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    # SpeedOfLight "Memory Throughput": the busiest of DRAM, L1 and L2, % of its peak
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    # gpu__dram_*: SpeedOfLight in every fixture with that section (V100 basic included);
    # dram__throughput.*: the MemoryWorkloadAnalysis name in ncu's rule sources (REFERENCE
    # B3), in no fixture
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    # MemoryWorkloadAnalysis (full set, or sections listing it); not in basic/default sets
    "l1_hit_rate_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_rate_pct": ("lts__t_sector_hit_rate.pct",),
    # Occupancy section: both in every fixture with it (the AchievedOccupancy rule's inputs)
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    # LaunchStats: every fixture except one a10g kernel whose launch metrics ncu lost
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
}

#: output columns and dtypes (percentages are % of the unit's sustained peak)
COLUMNS: Mapping[str, str] = {
    "kernel_id": "int64", "device": "Int64", "name": "string", "short_name": "string",
    "duration_ns": "Int64", "grid_size": "Int64", "block_size": "Int64", "sm_count": "Int64",
    "sm_throughput_pct": "Float64", "memory_throughput_pct": "Float64",
    "dram_throughput_pct": "Float64", "l1_hit_rate_pct": "Float64", "l2_hit_rate_pct": "Float64",
    "achieved_occupancy_pct": "Float64", "theoretical_occupancy_pct": "Float64",
    "waves_per_sm": "Float64", "regs_per_thread": "Int64", "smem_bytes": "Int64",
    "bottleneck": "string", "small_grid": "boolean", "low_l2_hit": "boolean",
    "low_memory_throughput": "boolean", "achieved_occupancy_gap": "boolean",
    "low_theoretical_occupancy": "boolean", "missing": "string",
}

RULE_COLUMNS: Mapping[str, str] = {
    "kernel_id": "int64", "name": "string", "rule": "string", "rule_name": "string",
    "section": "string", "title": "string", "type": "string", "speedup_type": "string",
    "speedup_pct": "Float64", "focus_metrics": "string", "message": "string",
}

#: `rule_findings` columns and dtypes: the rule results a user should act on
RULE_FINDING_COLUMNS: Mapping[str, str] = {
    "kernel_id": "int64", "name": "string", "short_name": "string", "rule": "string",
    "rule_name": "string", "title": "string", "type": "string", "speedup_type": "string",
    "speedup_pct": "Float64", "message": "string",
}

#: ncu rule result types (ncu_report's MsgType, lower-cased) that name a problem; the
#: others are `ok` (ncu: "the message is informative") and `none` (no type); see
#: `rule_findings`
ACTIONABLE_RULE_TYPES = ("warning", "optimization", "error")

#: ncu SOLBottleneck titles (SpeedOfLight.py), in the rule's decision order
SMALL_GRID, LATENCY = "Small Grid", "Latency Issue"
HIGH_COMPUTE, HIGH_MEMORY = "High Compute Throughput", "High Memory Throughput"
BALANCED, HIGH = "Balanced Throughput", "High Throughput"

ADVICE_LATENCY = ("give each thread more independent work (unroll loops, several loads in "
                  "flight per thread) or launch a larger grid so warps can hide each other's "
                  "memory and instruction latency")
ADVICE_L2 = ("improve data locality for L2: tile the loops so a block reuses what it loaded "
             "while it is still in L2, or order blocks so neighbours share tiles")
ADVICE_ACHIEVED = ("balance work across warps and blocks (no per-thread loop counts that vary "
                   "widely, no long-running tail blocks) so the warps the SM can hold stay busy")


def kernel_metrics(trace: Trace, *, l2_hit_rate_min: float = 62.0,
                   memory_throughput_min: float = 50.0, occupancy_gap_max: float = 10.0,
                   theoretical_occupancy_min: float = 80.0, waves_min: float = 1.0,
                   balanced_threshold: float = 10.0, latency_bound_threshold: float = 60.0,
                   no_bound_threshold: float = 80.0) -> pd.DataFrame:
    """One row per profiled kernel (kernel_id with metrics): its SOL bottleneck and flags.

        km = kernel_metrics(trace)
        km[["short_name", "duration_ns", "bottleneck", "small_grid"]]
        km.attrs["missing"]   # columns this report did not collect (e.g. --set basic)

    Flags are nullable booleans, NA where an input is missing:
    - `low_l2_hit`: L2 hit rate < `l2_hit_rate_min` (62 %, our heuristic: ncu has no
      hit-rate rule);
    - `low_memory_throughput`: `memory_throughput_pct` (gpu__compute_memory_throughput, the
      busiest of DRAM, L1 and L2 as % of its peak) < `memory_throughput_min` (50 %): no
      memory unit is even half busy;
    - `small_grid`: waves per SM < `waves_min` (1, ncu's SOLBottleneck waves threshold);
    - `achieved_occupancy_gap`: theoretical - achieved occupancy > `occupancy_gap_max` points
      (10, ncu's AchievedOccupancy rule);
    - `low_theoretical_occupancy`: theoretical occupancy < `theoretical_occupancy_min`
      (80 %, ncu's TheoreticalOccupancy rule).
    `balanced_threshold`, `latency_bound_threshold` and `no_bound_threshold` (10, 60, 80)
    and `waves_min` are ncu's SOLBottleneck defaults (see `sol_bottleneck`).
    """
    values = _pivot(trace)
    out = _launch_columns(trace, values.index).join(values)
    out["bottleneck"] = sol_bottleneck(
        out["sm_throughput_pct"], out["memory_throughput_pct"], out["waves_per_sm"],
        balanced_threshold=balanced_threshold, latency_bound_threshold=latency_bound_threshold,
        no_bound_threshold=no_bound_threshold, waves_threshold=waves_min)
    out["small_grid"] = out["waves_per_sm"] < waves_min
    out["low_l2_hit"] = out["l2_hit_rate_pct"] < l2_hit_rate_min
    out["low_memory_throughput"] = out["memory_throughput_pct"] < memory_throughput_min
    gap = out["theoretical_occupancy_pct"] - out["achieved_occupancy_pct"]
    out["achieved_occupancy_gap"] = gap > occupancy_gap_max
    out["low_theoretical_occupancy"] = out["theoretical_occupancy_pct"] < theoretical_occupancy_min
    out["missing"] = _missing(out)
    out = out.reset_index().loc[:, list(COLUMNS)].astype(dict(COLUMNS))
    out.attrs["missing"] = [c for c in METRIC_ALIASES if out[c].isna().all() and len(out)]
    return out


def sol_bottleneck(sm_pct: pd.Series, memory_pct: pd.Series, waves: pd.Series, *,
                   balanced_threshold: float = 10.0, latency_bound_threshold: float = 60.0,
                   no_bound_threshold: float = 80.0, waves_threshold: float = 1.0) -> pd.Series:
    """ncu's SOLBottleneck decision per kernel, in its order (SpeedOfLight.py, REFERENCE B3).

        km = kernel_metrics(trace)
        sol_bottleneck(km.sm_throughput_pct, km.memory_throughput_pct, km.waves_per_sm)
        sol_bottleneck(pd.Series([59.9]), pd.Series([10.0]), pd.Series([2.0]))  # Latency Issue

    Both throughputs below `no_bound_threshold` and below `latency_bound_threshold`: "Small
    Grid" when waves < `waves_threshold`, else "Latency Issue"; else (both below 80) "High
    Compute/Memory Throughput" when they differ by >= `balanced_threshold` points, else
    "Balanced Throughput"; either >= 80: "High Throughput". NA without both throughputs
    (the report has no SpeedOfLight section, so ncu would not decide either); missing waves
    never make a Small Grid.
    """
    sm = pd.to_numeric(sm_pct, errors="coerce").astype("float64").to_numpy()
    mem = pd.to_numeric(memory_pct, errors="coerce").astype("float64").to_numpy()
    wv = pd.to_numeric(waves, errors="coerce").astype("float64").to_numpy()
    known = ~(np.isnan(sm) | np.isnan(mem))
    unbound = (sm < no_bound_threshold) & (mem < no_bound_threshold)
    low = unbound & (sm < latency_bound_threshold) & (mem < latency_bound_threshold)
    apart = unbound & ~low & (np.abs(sm - mem) >= balanced_threshold)
    labels = np.array([None, SMALL_GRID, LATENCY, HIGH_COMPUTE, HIGH_MEMORY, BALANCED, HIGH],
                      dtype=object)
    code = np.select(
        [~known, low & (wv < waves_threshold), low, apart & (sm > mem), apart, unbound],
        [0, 1, 2, 3, 4, 5], default=6)
    return pd.Series(labels[code], index=sm_pct.index, dtype="string")


def _pivot(trace: Trace) -> pd.DataFrame:
    """The alias metrics as one float column per quantity, indexed by kernel_id.

    One pivot over the rows whose metric is an alias (vectorized); durations are scaled to
    ns by their unit first. Every kernel with any metric row gets a row.
    """
    m = trace.metrics
    names = [n for aliases in METRIC_ALIASES.values() for n in aliases]
    rows = m[m["metric"].isin(names)]
    value = rows["value"].to_numpy(dtype="float64", copy=True)
    is_time = (rows["metric"] == "gpu__time_duration.sum").to_numpy()
    units = rows["unit"].astype("string").str.strip().str.lower()
    scale = units.map(NS_PER_UNIT).astype("float64").to_numpy()
    value[is_time] *= scale[is_time]  # an unknown unit gives NaN, not a guess
    wide = pd.DataFrame({"kernel_id": rows["kernel_id"].to_numpy(),
                         "metric": rows["metric"].astype(str).to_numpy(), "value": value})
    wide = wide.pivot_table(index="kernel_id", columns="metric", values="value",
                            aggfunc="first", dropna=False)
    wide = wide.reindex(pd.Index(np.unique(m["kernel_id"]), name="kernel_id"))
    out = pd.DataFrame(index=wide.index)
    for column, aliases in METRIC_ALIASES.items():
        present = [a for a in aliases if a in wide.columns]
        out[column] = (wide[present].bfill(axis=1).iloc[:, 0] if present
                       else pd.Series(np.nan, index=wide.index))
    out["duration_ns"] = out["duration_ns"].round()
    return out.astype("Float64")  # NaN -> NA, so a flag of a missing metric is NA, not False


def _launch_columns(trace: Trace, kernel_ids: pd.Index) -> pd.DataFrame:
    """Name, device and launch shape from the kernels table (the reader already read the
    launch__* metrics into it), plus the SM count of the kernel's device."""
    k = trace.kernels.set_index("kernel_id").reindex(kernel_ids)
    out = pd.DataFrame(index=kernel_ids)
    out["device"] = k["device"]
    out["name"] = k["name"].astype("string")
    out["short_name"] = short_names(k["name"]).astype("string")
    out["grid_size"] = k["grid_x"] * k["grid_y"] * k["grid_z"]
    out["block_size"] = k["block_x"] * k["block_y"] * k["block_z"]
    sms = trace.devices.drop_duplicates("device").set_index("device")["sm_count"]
    out["sm_count"] = k["device"].map(sms)
    out["regs_per_thread"] = k["regs_per_thread"]
    out["smem_bytes"] = k["smem_bytes"]
    return out


def _missing(out: pd.DataFrame) -> pd.Series:
    """Per row, the metric columns that are NA, comma-separated ("" when none)."""
    text = np.full(len(out), "", dtype=object)
    for column in METRIC_ALIASES:
        text = text + np.where(out[column].isna().to_numpy(), column + ",", "")
    return pd.Series(text, index=out.index, dtype="string").str.rstrip(",")


#: ncu's inline link markup in rule messages: `@url:LABEL:ADDRESS@`, `@section:ID:LABEL@`
_URL = re.compile(r"@url:([^:@]*):([^@]+)@")
_SECTION = re.compile(r"@[a-z]+:[^:@]*:([^@]*)@")


def plain_message(text: str) -> str:
    """An ncu rule message as plain text: links as 'label (address)', section references by
    their label (ncu's GUI renders these; a table or hover text must not show the markup)."""
    text = _URL.sub(lambda m: f"{m[1]} ({m[2]})" if m[1] else m[2], str(text))
    return _SECTION.sub(r"\1", text)


def rules(trace: Trace) -> pd.DataFrame:
    """ncu's own guided-analysis results, one row per (kernel_id, rule result).

        r = rules(trace)
        r[r.speedup_type == "global"].sort_values("speedup_pct", ascending=False)
        r[r.rule == "SOLBottleneck"][["kernel_id", "title", "type"]]

    Several rows of one rule per kernel are normal (CPIStall, MemoryCacheAccessPattern
    report several findings). `speedup_pct` is ncu's estimate; only `global` ones are a
    share of the kernel's whole duration (`local` ones are of one unit's work).
    `focus_metrics` ("metric=value [ncu's check]; ...") is NA where the reader did not keep
    them. Messages keep ncu's link markup (`@section:Id:text@`).
    """
    raw = pd.DataFrame(trace.meta.get("ncu_rules") or [])
    if raw.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in RULE_COLUMNS.items()})

    def col(key: str) -> pd.Series:
        return raw[key] if key in raw else pd.Series(None, index=raw.index, dtype=object)

    names = trace.kernels.set_index("kernel_id")["name"].astype("string")
    out = pd.DataFrame({
        "kernel_id": raw["kernel_id"], "name": raw["kernel_id"].map(names),
        "rule": col("rule_identifier"), "rule_name": col("name"),
        "section": col("section_identifier"), "title": col("title"), "type": col("type"),
        "speedup_type": col("speedup_type"),
        "speedup_pct": pd.to_numeric(col("speedup"), errors="coerce"),
        "focus_metrics": col("focus_metrics").map(_focus),
        "message": col("message").map(plain_message, na_action="ignore"),
    })
    return out.astype(dict(RULE_COLUMNS)).reset_index(drop=True)


def rule_findings(trace: Trace) -> pd.DataFrame:
    """ncu's rule results a user should act on, most estimated speedup first: THE table of
    them (`gpudiag report` and `gpudiag heatmap` both list this one, from the Diagnosis).

        found = rule_findings(trace)
        found[["short_name", "rule", "title", "type", "speedup_pct"]].head()
        found[found["type"] == "warning"]

    One row per (kernel_id, rule result) of `rules` whose type names a problem
    (ACTIONABLE_RULE_TYPES). ncu_report's MsgType says what each type means: `optimization`
    "represents a suggestion for performance optimization" (in the fixtures, every result
    with an estimated speedup), `warning` "a warning or fixable issue", `error` "an error,
    potentially in executing the rule" (kept: a rule that failed on a kernel, e.g. for a
    metric not collected, left that kernel unchecked, and the message names the metric).
    Dropped: `ok`, "informative" (the bottleneck of a kernel near peak, a roofline ratio:
    nothing to change), and `none` (no type; in the fixtures, results without a message).
    A rule that failed reports its error twice, its own line ("Rule Occupancy returned an
    error: Metric ... not found") and then the Python exception inside ncu's rule script,
    with paths on the recording machine: one error row per (kernel, rule) is kept, the first.
    Sorted by ncu's estimated speedup (`speedup_pct`): `global` ones (a share of the kernel's
    whole time) first, largest first, then `local` ones (a share of one unit's work: not
    comparable with global ones), then rows without one; ties in ncu's order.
    `short_name` is `gpudiag.names.short_names` of the full `name`; `message` is plain text
    (`plain_message`).
    """
    found = rules(trace)
    kind = found["type"].str.lower().fillna("")
    found = found[kind.isin(ACTIONABLE_RULE_TYPES).to_numpy(dtype=bool)]
    errors = (kind[found.index] == "error").to_numpy(dtype=bool)
    repeated = np.zeros(len(found), dtype=bool)  # a second error of one rule on one kernel
    repeated[errors] = found[errors].duplicated(["kernel_id", "rule"]).to_numpy(dtype=bool)
    found = found[~repeated]
    scope = found["speedup_type"].str.lower().map({"global": 0, "local": 1})
    order = scope.where(found["speedup_pct"].notna()).fillna(2).astype("int64")
    found = found.assign(_order=order.to_numpy(), _speedup=-found["speedup_pct"].fillna(0))
    found = found.sort_values(["_order", "_speedup"], kind="stable", ignore_index=True)
    found["short_name"] = short_names(found["name"]).astype("string")
    return found.loc[:, list(RULE_FINDING_COLUMNS)].astype(dict(RULE_FINDING_COLUMNS))


def _focus(metrics: Any) -> str | None:
    """ncu's focus metrics ({name, value, severity, info} dicts) as one line."""
    if not isinstance(metrics, list) or not metrics:
        return None
    parts = []
    for m in metrics:
        value = m.get("value")
        text = f"{m.get('name')}={value:.4g}" if isinstance(value, int | float) else str(
            m.get("name"))
        parts.append(text + (f" [{m['info']}]" if m.get("info") else ""))
    return "; ".join(parts)


# -- findings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One kind of per-kernel finding: its cause, the ncu rules whose GLOBAL speedup prices
    it ((rule identifier, title), title None = any), the advice and an evidence template
    (str.format over the mean values of the kernel's launches and the thresholds)."""

    cause: str
    rules: tuple[tuple[str, str | None], ...]
    advice: str
    evidence: str


PROBLEMS: Mapping[str, Problem] = {
    "small_grid": Problem(
        "small_grid", (("LaunchConfiguration", "Small Grid"), ("SOLBottleneck", SMALL_GRID)),
        fnd.ADVICE["small_grid"],
        "Small Grid: {waves_per_sm:.3g} waves per SM (< {waves_min:g}), a grid of "
        "{grid_size:.0f} block(s) for {sm_count:.0f} SMs"),
    "latency": Problem(
        "kernel", (("SOLBottleneck", LATENCY),), ADVICE_LATENCY,
        "Latency Issue: SM throughput {sm_throughput_pct:.1f}% and memory throughput "
        "{memory_throughput_pct:.1f}% of peak (both < {latency_bound_threshold:g}%), "
        "{waves_per_sm:.3g} waves per SM"),
    "low_l2_hit": Problem(
        "kernel", (), ADVICE_L2,
        "low L2 hit rate: {l2_hit_rate_pct:.1f}% (< {l2_hit_rate_min:g}%) at memory "
        "throughput {memory_throughput_pct:.1f}% of peak, DRAM {dram_throughput_pct:.1f}%"),
    "achieved_occupancy_gap": Problem(
        "kernel", (("AchievedOccupancy", None),), ADVICE_ACHIEVED,
        "achieved occupancy {achieved_occupancy_pct:.1f}% vs theoretical "
        "{theoretical_occupancy_pct:.1f}% (gap > {occupancy_gap_max:g} points)"),
    "low_theoretical_occupancy": Problem(
        "kernel", (("TheoreticalOccupancy", None),), fnd.ADVICE["occupancy"],
        "theoretical occupancy {theoretical_occupancy_pct:.1f}% (< "
        "{theoretical_occupancy_min:g}%): {regs_per_thread:.0f} registers/thread, "
        "{smem_bytes:.0f} B shared memory/block, {block_size:.0f} threads/block"),
}


def analyze(trace: Trace, **thresholds: float) -> fnd.Result:
    """The Nsight Compute analyzer's one result: its findings and the tables they come
    from, `kernel_metrics` computed once (what `diagnose` keeps and the reports read).

        result = analyze(trace)
        result.findings                    # == findings(trace)
        result.tables["kernel_metrics"]    # == kernel_metrics(trace)
        result.tables["ncu_rules"]         # == rule_findings(trace): what the pages list

    `thresholds` go to kernel_metrics, so the findings and the table agree on them.
    """
    metrics = kernel_metrics(trace, **thresholds)
    return fnd.Result(findings=findings(trace, metrics=metrics, **thresholds),
                      tables={"kernel_metrics": metrics, "ncu_rules": rule_findings(trace)})


def findings(trace: Trace, *, metrics: pd.DataFrame | None = None,
             **thresholds: float) -> pd.DataFrame:
    """Findings (findings.frame) per kernel name x problem; `thresholds` go to kernel_metrics.

        f = findings(trace)
        f[["cause", "lost_ns", "where", "count", "evidence"]]
        findings(trace, l2_hit_rate_min=50.0)

    `metrics`: `kernel_metrics(trace, **thresholds)` when the caller has it already (so
    `analyze` computes it once); pass the same `thresholds`, as the evidence names them.
    It is read, never changed.

    Problems (PROBLEMS): small grid (cause `small_grid`), latency issue, low L2 hit rate,
    achieved-occupancy gap, low theoretical occupancy (cause `kernel`). `lost_ns` sums, over
    the launches, duration x ncu's largest GLOBAL estimated speedup among the problem's
    rules; 0 where ncu gives none (a guess of ours would look as certain as ncu's). Noise
    kept out: occupancy problems of a small grid (fewer blocks than SMs: raising occupancy
    cannot help before the grid grows), and a low L2 hit rate while memory throughput is
    low (misses then do not limit the kernel; a latency finding covers slow memory).
    """
    km = kernel_metrics(trace, **thresholds) if metrics is None else metrics
    masks = _problem_masks(km)
    rows = [km.loc[mask.fillna(False).to_numpy()].assign(problem=name)
            for name, mask in masks.items()]
    hits = pd.concat(rows, ignore_index=True)
    if hits.empty:
        return fnd.frame()
    speedup = _speedups(rules(trace))
    key = pd.MultiIndex.from_frame(hits[["kernel_id", "problem"]])
    pct = speedup.reindex(key).to_numpy(dtype="float64", na_value=np.nan)
    duration = hits["duration_ns"].astype("float64").fillna(0).to_numpy()
    hits["lost_ns"] = np.rint(duration * np.nan_to_num(pct) / 100).astype(np.int64)
    return _grouped(hits, thresholds)


def _problem_masks(km: pd.DataFrame) -> dict[str, pd.Series]:
    small = km["small_grid"].fillna(False)
    busy_memory = ~km["low_memory_throughput"].fillna(False)
    return {
        "small_grid": km["small_grid"],
        "latency": km["bottleneck"] == LATENCY,
        "low_l2_hit": km["low_l2_hit"] & busy_memory,
        "achieved_occupancy_gap": km["achieved_occupancy_gap"] & ~small,
        "low_theoretical_occupancy": km["low_theoretical_occupancy"] & ~small,
    }


def _speedups(r: pd.DataFrame) -> pd.Series:
    """ncu's largest GLOBAL speedup (%) per (kernel_id, problem), from the matching rules."""
    wanted = pd.DataFrame([(p, rule, title) for p, prob in PROBLEMS.items()
                           for rule, title in prob.rules],
                          columns=["problem", "rule", "want_title"])
    r = r[(r["speedup_type"] == "global") & r["speedup_pct"].notna()]
    hit = r.astype({"rule": object}).merge(wanted, on="rule")
    hit = hit[hit["want_title"].isna() | (hit["title"] == hit["want_title"]).fillna(False)]
    return hit.groupby(["kernel_id", "problem"])["speedup_pct"].max().astype("float64")


def _grouped(hits: pd.DataFrame, thresholds: Mapping[str, float]) -> pd.DataFrame:
    """One finding per (kernel name, problem): launches counted, lost time summed, evidence
    from the mean of each number over the launches."""
    numbers = [c for c, t in COLUMNS.items() if t in ("Float64", "Int64") and c != "kernel_id"]
    hits[numbers] = hits[numbers].astype("float64")
    groups = hits.groupby(["name", "problem"], sort=False, dropna=False)
    agg = groups[numbers].mean()
    agg["count"] = groups.size()
    agg["lost_ns"] = groups["lost_ns"].sum()
    agg["where"] = groups["short_name"].first()
    limits = {**_THRESHOLD_DEFAULTS, **thresholds}
    rows = []
    for (_, problem), row in agg.iterrows():  # one per finding, not per event
        spec = PROBLEMS[str(problem)]
        values = {k: _Num(v) for k, v in row[numbers].items()}
        text = spec.evidence.format_map({**values, **limits})
        if row["count"] > 1:
            text += f" (mean of {row['count']} launches)"
        rows.append({"cause": spec.cause, "lost_ns": row["lost_ns"], "where": row["where"],
                     "count": row["count"], "evidence": text, "advice": spec.advice})
    out = fnd.frame(rows)
    return out.sort_values(["lost_ns", "count"], ascending=False, kind="stable",
                           ignore_index=True)


class _Num(float):
    """A number for evidence templates: NaN (a metric not collected) prints as "n/a"."""

    def __format__(self, spec: str) -> str:
        return "n/a" if math.isnan(self) else super().__format__(spec)


_THRESHOLD_DEFAULTS: dict[str, float] = {
    name: p.default for name, p in inspect.signature(kernel_metrics).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
}


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze)
