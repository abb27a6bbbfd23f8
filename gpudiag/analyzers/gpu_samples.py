"""NVML samples: how busy, how full, how hot and how throttled each GPU was.

`gpudiag profile` reads every visible GPU through NVML every `--nvml-interval` into the
`samples` table (collectors/nvml/sampler.py). Two questions, one function each:

- `sample_summary`: per (rank, device) the utilization NVML saw, the memory peak, power,
  temperature and how often each clocks-event ("throttle") reason was active, beside the
  kernel-busy share the trace's own kernels give over the same span;
- `findings`: GPUs whose clocks were held down by power or heat in more than a fifth of
  the samples, with what to check.

Only NVML's own metrics in their documented units are read (`NVML_UNITS`): the `samples`
table also holds other series (`memory.*` of a PyTorch memory timeline) that mean
something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals
from gpudiag.analyzers import findings as found
from gpudiag.analyzers import keys
from gpudiag.analyzers.findings import Contract, Result
from gpudiag.trace import Trace

#: the metrics the NVML sampler writes, with the unit each is written in
NVML_UNITS: Mapping[str, str] = {
    "gpu_util": "%", "mem_util": "%", "mem_used": "bytes", "mem_total": "bytes",
    "sm_clock": "MHz", "mem_clock": "MHz", "power": "W", "temperature": "C",
    "pcie_tx": "bytes/s", "pcie_rx": "bytes/s", "nvlink_tx": "bytes/s", "nvlink_rx": "bytes/s",
    "throttle_reasons": "bitmask",
}

#: nvmlClocksEventReasons bits (nvml.h; drivers before 535 call them
#: nvmlClocksThrottleReason*) that say why clocks are below the maximum. Left out: 0x10 sync
#: boost (another GPU of the group decides) and 0x100 display clock (not on data-centre GPUs).
THROTTLE_BITS: Mapping[str, int] = {
    "gpu_idle": 0x1,  # nothing runs: clocks drop to idle (harmless)
    "app_clocks": 0x2,  # clocks pinned by `nvidia-smi -ac` (applications clocks)
    "sw_power_cap": 0x4,  # the power limit (`nvidia-smi -pl`) holds clocks down
    "hw_slowdown": 0x8,  # clocks halved or worse: heat, power brake or power draw too high
    "sw_thermal": 0x20,  # above the GPU's or memory's max operating temperature
    "hw_thermal": 0x40,  # hardware slowdown for temperature
    "hw_power_brake": 0x80,  # the system's power supply asserted the power brake
}
THERMAL_BITS = 0x20 | 0x40
#: power: the power cap and the power brake; a hw_slowdown with no thermal bit set is
#: counted here too (what is left of nvml.h's list of its causes is the power draw)
POWER_BITS = 0x4 | 0x80
HW_SLOWDOWN = 0x8

#: utilization below this (%) counts as a poorly used GPU in `low_util_share`
LOW_UTIL_PCT = 30.0
#: a GPU throttled by power or heat in more than this share of samples gets a finding
THROTTLE_SHARE = 0.2

CAUSE = "throttle"

SUMMARY_COLUMNS: Mapping[str, str] = {
    "rank": "Int64", "device": "Int64", "samples": "int64", "start_ns": "int64",
    "end_ns": "int64", "span_ns": "int64", "gpu_util_mean_pct": "float64",
    "gpu_util_median_pct": "float64", "low_util_share": "float64",
    "kernel_busy_share": "float64", "mem_used_peak_bytes": "Int64", "mem_total_bytes": "Int64",
    "power_mean_w": "float64", "temperature_max_c": "float64", "sm_clock_mean_mhz": "float64",
    "throttle_samples": "int64",
    **{f"throttle_{name}": "float64" for name in THROTTLE_BITS},
    "power_throttled_share": "float64", "thermal_throttled_share": "float64",
    "sm_clock_throttled_mhz": "float64", "sm_clock_unthrottled_mhz": "float64",
}
KEYS = ["rank", "device"]


def nvml_rows(trace: Trace) -> pd.DataFrame:
    """The `samples` rows of NVML metrics in NVML_UNITS' units, with a value, sorted.

        rows = nvml_rows(trace)
        rows[rows.metric == "power"].groupby("device")["value"].max()
        rows[["rank", "device", "ts_ns", "metric", "value"]]

    Columns rank, device (Int64, NA where not recorded: the session's sampler records no
    rank), ts_ns, metric (category), value; sorted by rank (NA first), device, metric,
    time. Rows of another metric, or of an NVML metric in another unit, are left out (one
    check per distinct metric and unit, not per row). Computed once per trace (the summary,
    the findings and the figure share it); each call returns a copy.
    """
    rows = _shared_rows(trace)
    return rows.assign(rank=keys.key_column(rows["rank"]), device=keys.key_column(rows["device"]))


def _shared_rows(trace: Trace) -> pd.DataFrame:
    """`nvml_rows` computed once per trace, rank and device as `keys.key_array` gives them
    (the numpy code here groups on them); callers here only read it."""
    return trace.derived("nvml_rows", lambda: _select(trace))


def _select(trace: Trace) -> pd.DataFrame:
    samples = trace.samples
    metric, unit = samples["metric"].astype("category"), samples["unit"].astype("category")
    units = [str(category) for category in unit.cat.categories]
    # [metric code, unit code]; the last row and column stand for NA (category code -1)
    valid = np.zeros((len(metric.cat.categories) + 1, len(units) + 1), dtype=bool)
    for code, name in enumerate(metric.cat.categories):  # once per distinct metric
        expected = NVML_UNITS.get(str(name))
        if expected in units:
            valid[code, units.index(expected)] = True
    keep = valid[metric.cat.codes.to_numpy(), unit.cat.codes.to_numpy()] \
        & samples["value"].notna().to_numpy(bool)
    out = pd.DataFrame({
        "rank": keys.key_array(samples["rank"])[keep],
        "device": keys.key_array(samples["device"])[keep],
        "ts_ns": samples["ts_ns"].to_numpy(np.int64)[keep],
        "metric": metric[keep].cat.remove_unused_categories().to_numpy(),
        "value": samples["value"].to_numpy(np.float64)[keep],
    })
    out["metric"] = out["metric"].astype("category")
    return out.sort_values(["rank", "device", "metric", "ts_ns"], kind="stable",
                           ignore_index=True)


def sample_summary(trace: Trace, *, low_util_pct: float = LOW_UTIL_PCT) -> pd.DataFrame:
    """Per (rank, device): what NVML saw over the sampled span, beside the kernels' view.

        s = sample_summary(trace)
        s[["device", "gpu_util_mean_pct", "kernel_busy_share", "low_util_share"]]
        s[["device", "power_throttled_share", "thermal_throttled_share"]]

    - `samples`: sampling moments; `start_ns`/`end_ns`/`span_ns`: first and last of them.
    - `gpu_util_mean_pct` (time-weighted: each sample counts for the time since the previous
      one, which is the period NVML's value describes, so skipped ticks do not bias it),
      `gpu_util_median_pct` (of the samples), `low_util_share` (share of the time with
      gpu_util < `low_util_pct`, default 30 %).
    - `kernel_busy_share`: the share of [start_ns, end_ns] covered by the union of the
      trace's kernels on that device (any rank when the samples carry none, as the session's
      sampler writes them); NaN when the device has no kernels or the trace's times are not
      a timeline. NVML's gpu_util is "the percent of time over the past sample period during
      which one or more kernels was executing", so the two measure the same thing and should
      agree within the sampling error. A large gap means kernels the trace missed (another
      process on the GPU, a collection window shorter than the run) or device numbers that
      differ (each rank started with its own CUDA_VISIBLE_DEVICES calls its GPU 0).
    - `mem_used_peak_bytes`, `mem_total_bytes`: NVML's view, all processes and contexts
      included (more than the PyTorch allocator reserves); `power_mean_w`,
      `temperature_max_c`, `sm_clock_mean_mhz`.
    - `throttle_samples` and, per THROTTLE_BITS reason, `throttle_<reason>`: the share of
      the throttle samples with that bit set; `power_throttled_share` and
      `thermal_throttled_share` group them (POWER_BITS, THERMAL_BITS); the SM clock's mean
      in samples with either (`sm_clock_throttled_mhz`) and in the others.
    Metrics a GPU does not report are NaN (NA for the byte columns). Empty without samples.
    """
    return trace.derived(f"sample_summary:{low_util_pct!r}",
                         lambda: _summary(trace, low_util_pct)).copy()


def _summary(trace: Trace, low_util_pct: float) -> pd.DataFrame:
    rows = _shared_rows(trace)
    if rows.empty:
        return _typed(pd.DataFrame(columns=list(SUMMARY_COLUMNS)))
    times = rows.groupby(KEYS, sort=True)["ts_ns"]
    out = pd.DataFrame({"samples": times.nunique(), "start_ns": times.min(),
                        "end_ns": times.max()})
    out["span_ns"] = out["end_ns"] - out["start_ns"]
    out = out.join(_utilization(rows, low_util_pct)).join(_levels(rows)).join(_throttle(rows))
    out = out.reset_index()
    out["kernel_busy_share"] = _kernel_busy(trace, out)
    out["throttle_samples"] = out["throttle_samples"].fillna(0)
    for col in ("rank", "device"):
        out[col] = keys.key_column(out[col])
    return _typed(out.reindex(columns=list(SUMMARY_COLUMNS)))


def _of(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    return rows[(rows["metric"] == metric).to_numpy(bool)]


def _utilization(rows: pd.DataFrame, low_util_pct: float) -> pd.DataFrame:
    """Time-weighted mean and low share of gpu_util, and its plain median, per device."""
    util = _of(rows, "gpu_util")
    period = util.groupby(KEYS)["ts_ns"].diff()
    period = period.fillna(period.groupby([util["rank"], util["device"]]).transform("median"))
    period = period.fillna(1.0)
    value = util["value"]
    weighted = pd.DataFrame({"rank": util["rank"], "device": util["device"], "w": period,
                             "wv": period * value, "wlow": period * (value < low_util_pct)})
    sums = weighted.groupby(KEYS).sum()
    return pd.DataFrame({"gpu_util_mean_pct": sums["wv"] / sums["w"],
                         "gpu_util_median_pct": util.groupby(KEYS)["value"].median(),
                         "low_util_share": sums["wlow"] / sums["w"]})


def _levels(rows: pd.DataFrame) -> pd.DataFrame:
    """Peaks and means of the level metrics, one groupby for all of them."""
    levels = rows[rows["metric"].isin(["mem_used", "mem_total", "power", "temperature",
                                       "sm_clock"]).to_numpy(bool)]
    wide = levels.pivot_table(index=KEYS, columns="metric", values="value",
                              aggfunc=["mean", "max"], observed=True)
    pick = {"mem_used_peak_bytes": ("max", "mem_used"), "mem_total_bytes": ("max", "mem_total"),
            "power_mean_w": ("mean", "power"), "temperature_max_c": ("max", "temperature"),
            "sm_clock_mean_mhz": ("mean", "sm_clock")}
    return pd.DataFrame({name: wide.get(col, np.nan) for name, col in pick.items()},
                        index=wide.index)


def _throttle(rows: pd.DataFrame) -> pd.DataFrame:
    """Per device the share of throttle samples with each reason, the power and thermal
    groups, and the mean SM clock with and without them (matched on the sample time)."""
    throttles = _of(rows, "throttle_reasons")
    bits = throttles["value"].to_numpy(np.float64).astype(np.uint64)
    flags = {f"throttle_{name}": (bits & np.uint64(bit)) != 0
             for name, bit in THROTTLE_BITS.items()}
    thermal = (bits & np.uint64(THERMAL_BITS)) != 0
    power = ((bits & np.uint64(POWER_BITS)) != 0) | (((bits & np.uint64(HW_SLOWDOWN)) != 0)
                                                      & ~thermal)
    table = pd.DataFrame({"rank": throttles["rank"].to_numpy(),
                          "device": throttles["device"].to_numpy(),
                          "ts_ns": throttles["ts_ns"].to_numpy(), **flags,
                          "power_throttled_share": power, "thermal_throttled_share": thermal})
    shares = table.drop(columns="ts_ns").groupby(KEYS).mean()
    shares["throttle_samples"] = table.groupby(KEYS).size()
    clock = _of(rows, "sm_clock")[[*KEYS, "ts_ns", "value"]].merge(
        table[[*KEYS, "ts_ns"]].assign(throttled=power | thermal), on=[*KEYS, "ts_ns"])
    means = clock.pivot_table(index=KEYS, columns="throttled", values="value", aggfunc="mean")
    shares["sm_clock_throttled_mhz"] = means.get(True, np.nan)
    shares["sm_clock_unthrottled_mhz"] = means.get(False, np.nan)
    return shares


def _kernel_busy(trace: Trace, out: pd.DataFrame) -> npt.NDArray[np.float64]:
    """Per summary row, the share of its sampled span covered by the device's kernels
    (`out` still holds `_shared_rows`' int64 keys: `keys.MISSING` for NA)."""
    busy = np.full(len(out), np.nan)
    kernels = trace.kernels
    if kernels.empty or not trace.meta.get("timeline", True):
        return busy
    rank, device = keys.key_array(kernels["rank"]), keys.key_array(kernels["device"])
    kernel_start = kernels["start_ns"].to_numpy(np.int64)
    kernel_end = kernels["end_ns"].to_numpy(np.int64)
    rows = out[[*KEYS, "start_ns", "end_ns"]].to_numpy(np.int64)
    # one pass per GPU, never one per kernel
    for row, (gpu_rank, gpu_device, start, end) in enumerate(rows):
        mine = (device == gpu_device) & ((rank == gpu_rank) | (gpu_rank == keys.MISSING))
        if mine.any() and end > start:
            spans = intervals.union(kernel_start[mine], kernel_end[mine])
            inside = intervals.clip(spans, int(start), int(end))
            busy[row] = intervals.total(inside) / (end - start)
    return busy


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Exactly SUMMARY_COLUMNS, in order, at their dtypes (byte counts rounded)."""
    frame = frame.copy()
    for col in ("mem_used_peak_bytes", "mem_total_bytes"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").round()
    return frame.loc[:, list(SUMMARY_COLUMNS)].astype(dict(SUMMARY_COLUMNS))


# -- findings ---------------------------------------------------------------------------------

#: (kind, summary column, advice key, the reasons it groups)
KINDS = (("thermal", "thermal_throttled_share", "throttle_thermal",
          ("sw_thermal", "hw_thermal", "hw_slowdown")),
         ("power", "power_throttled_share", "throttle_power",
          ("sw_power_cap", "hw_power_brake", "hw_slowdown")))


def analyze(trace: Trace) -> Result:
    """The GPU-samples analyzer's one result: throttle findings and `sample_summary`.

        result = gpu_samples.analyze(trace)
        result.findings[["where", "evidence"]]
        result.tables["sample_summary"]
    """
    return combine([part(trace)])


def part(trace: Trace) -> pd.DataFrame:
    """One rank's share of a job's analysis: its GPUs' summary rows."""
    return sample_summary(trace)


def combine(parts: list[pd.DataFrame]) -> Result:
    """The job's result from its ranks' parts: the summaries in (rank, device) order and
    the findings read from them."""
    summary = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True).sort_values(
        KEYS, kind="stable", ignore_index=True)  # as the summary's groupby sorts them
    return Result(summary_findings(summary), {"sample_summary": summary})


def findings(trace: Trace, *, throttle_share: float = THROTTLE_SHARE) -> pd.DataFrame:
    """GPUs throttled by heat or power in more than `throttle_share` of their samples.

        f = gpu_samples.findings(trace)
        f[["where", "count", "evidence"]]
        f.advice.iloc[0]          # findings.ADVICE["throttle_thermal"] or ["throttle_power"]

    One finding per GPU and kind (thermal: THERMAL_BITS; power: POWER_BITS and a
    hw_slowdown without a thermal bit), of cause `throttle`. `count` is the throttled
    samples; `lost_ns` is 0: slower clocks stretch kernels rather than leave the GPU idle,
    and samples cannot say by how much. The evidence gives the shares of each reason, the
    SM clock with and without throttling, the peak temperature and mean power. Default
    threshold 0.2 (THROTTLE_SHARE): a GPU held down a fifth of the time is a steady
    condition (a power limit, a hot chassis), not a transient boost-clock dip.
    """
    return summary_findings(sample_summary(trace), throttle_share=throttle_share)


def summary_findings(summary: pd.DataFrame, *, throttle_share: float = THROTTLE_SHARE
                     ) -> pd.DataFrame:
    """The throttle findings of a `sample_summary` (see `findings`)."""
    rows = []
    for kind, column, advice, reasons in KINDS:
        hit = summary[summary[column].fillna(0) > throttle_share]
        for row in hit.to_dict("records"):  # one per throttled GPU, a handful at most
            rows.append({"cause": CAUSE, "lost_ns": 0, "where": _where(row),
                         "count": round(row[column] * row["throttle_samples"]),
                         "evidence": _evidence(row, kind, column, reasons),
                         "advice": found.ADVICE[advice]})
    return found.frame(rows)


def _where(row: Mapping[str, Any]) -> str:
    gpu = "GPU ?" if pd.isna(row["device"]) else f"GPU {row['device']}"
    return gpu if pd.isna(row["rank"]) else f"rank {row['rank']} · {gpu}"


def _evidence(row: Mapping[str, Any], kind: str, column: str, reasons: tuple[str, ...]) -> str:
    """One finding's numbers in words (one call per finding)."""
    each = ", ".join(f"{name.replace('_', ' ')} {row[f'throttle_{name}']:.0%}"
                     for name in reasons if row[f"throttle_{name}"] > 0)
    parts = [f"{kind} throttling in {row[column]:.0%} of {row['throttle_samples']} "
             f"NVML samples ({each})"]
    hot, cold = row["sm_clock_throttled_mhz"], row["sm_clock_unthrottled_mhz"]
    if pd.notna(hot):
        parts.append(f"SM clock {hot:.0f} MHz while throttled"
                     + (f" vs {cold:.0f} MHz otherwise" if pd.notna(cold) else ""))
    if pd.notna(row["temperature_max_c"]):
        parts.append(f"up to {row['temperature_max_c']:.0f} °C")
    if pd.notna(row["power_mean_w"]):
        parts.append(f"{row['power_mean_w']:.0f} W on average")
    return "; ".join(parts)


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
