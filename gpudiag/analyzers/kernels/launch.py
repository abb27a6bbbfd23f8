"""Launch analyzer: grids too small for the GPU, partial last waves, and launch overhead.

Nsight Compute's Small Grid, Tail Effect and Block Size rules (REFERENCE B3) judge one
profiled kernel each; here they are evaluated on *every* launch of a trace from its launch
configuration and the device's limits (`occupancy.py`), and weighted by the launches' real
durations, which ncu leaves as a TODO. The time a grid leaves SMs idle is
`duration x (1 - tail_efficiency)`: the device's block slots stand empty for that share of
the kernel's time, assuming its blocks take equal time. It is split into `small_grid_ns`
(the whole grid is under one wave) and `tail_ns` (the last of several waves is partial).

`launch_overhead` and `launch_rate` measure the host side of launching, as HTA's
`get_cuda_kernel_launch_stats` does: the launch call, the delay until the kernel starts,
and how much of a thread's time goes into launch calls.

For Nsight Compute reports (`meta["timeline"]` False) durations are ncu's serialized
replays of each kernel: real kernel times, but not a timeline; findings say so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import callsites, keys
from gpudiag.analyzers.findings import ADVICE, Contract, Result, format_ns, frame
from gpudiag.analyzers.kernels import occupancy as occ
from gpudiag.analyzers.losses.waterfall import COMM_KERNEL
from gpudiag.names import job_short_names, short_names
from gpudiag.trace import Trace

#: ncu's warp size for the Block Size rule (every NVIDIA GPU)
WARP = 32
NO_TIMELINE_NOTE = "durations are Nsight Compute replay times, not a timeline"

SMALL_GRID_COLUMNS = {
    "name": "string", "full_name": "string", "count": "int64", "dur_ns": "int64",
    "small_grid_ns": "int64", "tail_ns": "int64", "lost_ns": "int64",
    "ncu_small_grid_speedup": "float64", "ncu_tail_speedup": "float64",
    "odd_block_launches": "int64", "ncu_block_size_speedup": "float64",
    "unknown_launches": "int64", "grid_blocks": "Int64", "block_threads": "Int64",
    "blocks_per_sm": "Int64", "sm_count": "Int64", "waves": "float64",
    "theoretical_occupancy": "float64", "limiter": "string",
}
OVERHEAD_COLUMNS = {
    "kernel_id": "int64", "name": "string", "full_name": "string", "pid": "Int64",
    "tid": "Int64", "api_name": "string", "api_start_ns": "int64", "api_dur_ns": "int64",
    "gpu_dur_ns": "int64", "launch_delay_ns": "int64", "short": "bool", "long_delay": "bool",
}
RATE_COLUMNS = {
    "rank": "Int64", "pid": "Int64", "tid": "Int64", "launches": "int64", "kernels": "int64",
    "window_ns": "int64", "launches_per_s": "float64", "launch_ns": "int64",
    "launch_share": "float64",
}


def occupancy(trace: Trace) -> pd.DataFrame:
    """Theoretical occupancy, waves and tail efficiency of every kernel launch.

        occ = launch.occupancy(trace)
        trace.kernels.join(occ)[["name", "theoretical_occupancy", "limiter", "waves"]]
        occ["unavailable"].value_counts()     # why some launches have no numbers

    One row per `trace.kernels` row (same index and order): `theoretical_occupancy` (0-1,
    resident warps / the SM's warp slots), `blocks_per_sm` (resident blocks per SM),
    `limiter` (`warps`, `blocks`, `registers` or `shared_memory`; ties go to the hardware
    limits `warps` then `blocks`, since such a launch is as occupied as its block size
    allows), `waves` (grid blocks / (blocks_per_sm x SMs)), `tail_efficiency`
    (waves / ceil(waves): the time-averaged share of the device's block slots the grid
    fills, assuming equal block durations; it covers grids under one wave and the last
    partial wave alike) and `unavailable` (NA when everything is computed, else the first
    reason something is not: no device properties, no registers recorded, no SM count...).
    Computed as the CUDA occupancy calculator does (see `occupancy.py`), never read from
    ncu's own occupancy metrics.
    """
    return _occupancy(trace).loc[:, list(occ.COLUMNS)]


def _occupancy(trace: Trace) -> pd.DataFrame:
    """The calculation once per trace (the waterfall, `small_grid` and `findings` share it)."""
    return trace.derived("occupancy", lambda: occ.for_kernels(trace.kernels, trace.devices))


def per_launch(trace: Trace, *, tail_min_speedup: float = 0.2) -> pd.DataFrame:
    """Every kernel launch with its occupancy and what its grid costs, index aligned with
    `trace.kernels`.

        pl = launch.per_launch(trace)
        pl[pl.small_grid_ns > 0][["name", "grid_blocks", "waves", "small_grid_ns"]]
        pl.groupby("limiter")["dur_ns"].sum()

    Adds to `occupancy`'s columns: `name` (short) and `full_name`, `dur_ns`,
    `small_grid_ns` and `tail_ns` (SM-time left idle, ns), the per-launch ncu rule
    speedups `ncu_small_grid_speedup` ((SMs - grid) / SMs when grid < SMs),
    `ncu_tail_speedup` (1 / (1 + whole waves) when the last wave is partial and that is at
    least `tail_min_speedup`, ncu's 20 % reporting bar) and `ncu_block_size_speedup`
    (the idle share of a block's last warp when its size is not a multiple of 32), and
    `collective` (an NCCL/RCCL kernel, which `small_grid` and `findings` leave out: its few
    blocks are by design and its time is communication, the collectives analyzer's part).
    """
    return _per_launch(trace, tail_min_speedup, None)


def _per_launch(trace: Trace, tail_min_speedup: float,
                keep: Callable[[pd.DataFrame], npt.NDArray[np.bool_]] | None,
                timed_only: bool = False) -> pd.DataFrame:
    """`per_launch`, built only for the non-collective launches `keep(occupancy)` selects
    (and only those with a duration when `timed_only`): findings and `small_grid` need a
    part of a 10-million-launch trace, whose full table is over a GB."""
    kernels, occupancy_ = trace.kernels, _occupancy(trace)
    dur = (kernels["end_ns"] - kernels["start_ns"]).clip(lower=0).to_numpy(np.int64)
    collective = (keys.matches(kernels["name"], COMM_KERNEL)
                  | kernels["kernel_id"].isin(trace.collectives["kernel_id"].dropna())
                  .to_numpy(bool))
    if keep is not None:
        chosen = keep(occupancy_) & ~collective & ((dur > 0) | (not timed_only))
        kernels, occupancy_ = kernels[chosen], occupancy_[chosen]
        dur, collective = dur[chosen], collective[chosen]
    out = occupancy_.copy()
    out.insert(0, "full_name", kernels["name"])
    out.insert(0, "name", short_names(kernels["name"]))
    idle = np.nan_to_num(dur * (1 - out["tail_efficiency"].to_numpy(np.float64)))
    waves = out["waves"].to_numpy(np.float64)
    out["dur_ns"] = dur
    out["collective"] = collective
    out["small_grid_ns"] = np.where(waves < 1, idle, 0.0)
    out["tail_ns"] = np.where(waves >= 1, idle, 0.0)
    return _ncu_rules(out, tail_min_speedup)


def _ncu_rules(out: pd.DataFrame, tail_min_speedup: float) -> pd.DataFrame:
    """ncu's LaunchStatistics speedups (REFERENCE B3) per launch, 0 where a rule does not
    fire and NaN where its inputs are unknown."""
    grid, sms = out["grid_blocks"].to_numpy(), out["sm_count"].to_numpy()
    waves = out["waves"].to_numpy(np.float64)
    threads = out["block_threads"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        small = np.where(grid < sms, (sms - grid) / sms, 0.0)
        whole, partial = np.floor(waves), waves - np.floor(waves)
        tail = np.where((partial > 0) & (whole >= 1), 1 / (1 + whole), 0.0)
        odd = threads % WARP
        block = np.where(odd > 0, (1 - odd / WARP) / np.ceil(threads / WARP), 0.0)
    out["ncu_small_grid_speedup"] = np.where(np.isnan(grid * sms), np.nan, small)
    out["ncu_tail_speedup"] = np.where(np.isnan(waves), np.nan,
                                       np.where(tail >= tail_min_speedup, tail, 0.0))
    out["ncu_block_size_speedup"] = np.where(np.isnan(threads), np.nan, block)
    return out


def small_grid(trace: Trace, *, tail_min_speedup: float = 0.2) -> pd.DataFrame:
    """Per kernel name: how much SM-time its grids leave idle, and ncu's rules on every launch.

        sg = launch.small_grid(trace)
        sg[["name", "count", "dur_ns", "small_grid_ns", "tail_ns", "waves", "limiter"]].head()
        sg["lost_ns"].sum() / sg["dur_ns"].sum()    # share of kernel time with idle SMs

    One row per compute-kernel name (collectives left out, see `per_launch`), most SM-time
    lost first: `name` (short) and `full_name`,
    `count`, `dur_ns`, `small_grid_ns` (launches under one wave), `tail_ns` (the partial
    last wave of longer grids), `lost_ns` (their sum); ncu's rule speedups evaluated on
    every launch and weighted by duration (`ncu_small_grid_speedup`, `ncu_tail_speedup`,
    reported only where a launch reaches `tail_min_speedup`, and
    `ncu_block_size_speedup`), `odd_block_launches` (block size not a multiple of 32),
    `unknown_launches` (no waves: see `occupancy(trace)["unavailable"]`), and the launch
    configuration of the launch that lost the most (`grid_blocks`, `block_threads`,
    `blocks_per_sm`, `sm_count`) with duration-weighted `waves` and
    `theoretical_occupancy` and that launch's `limiter`.
    """
    return _small_grid_table(_launch_groups(trace, tail_min_speedup, timed_only=False))


def _small_grid_table(groups: pd.DataFrame) -> pd.DataFrame:
    """`small_grid` of launch groups (`_launch_groups`)."""
    if groups.empty:
        return _typed(pd.DataFrame(), SMALL_GRID_COLUMNS)
    groups = groups.copy()
    groups["odd_block_launches"] = np.where(groups["ncu_block_size_speedup"] > 0,
                                            groups["count"], 0)
    groups["unknown_launches"] = np.where(groups["waves"].isna(), groups["count"], 0)
    per_name = ["full_name"]
    out = groups.groupby(per_name, observed=True, dropna=False, sort=False).agg(
        name=("name", "first"), count=("count", "sum"), dur_ns=("dur_ns", "sum"),
        small_grid_ns=("small_grid_ns", "sum"), tail_ns=("tail_ns", "sum"),
        lost_ns=("lost_ns", "sum"), odd_block_launches=("odd_block_launches", "sum"),
        unknown_launches=("unknown_launches", "sum"))
    for col in ("ncu_small_grid_speedup", "ncu_tail_speedup", "ncu_block_size_speedup",
                "waves", "theoretical_occupancy"):
        out[col] = _weighted(groups, col, per_name)
    worst = _worst(groups, per_name).set_index("full_name")
    for col in ("grid_blocks", "block_threads", "blocks_per_sm", "sm_count", "limiter"):
        out[col] = worst[col].reindex(out.index)
    out = out.reset_index().sort_values(["lost_ns", "dur_ns"], ascending=False,
                                        kind="stable", ignore_index=True)
    return _typed(out, SMALL_GRID_COLUMNS)


def _launch_groups(trace: Trace, tail_min_speedup: float, *, timed_only: bool,
                   idle_only: bool = False, sites: bool = False) -> pd.DataFrame:
    """Non-collective launches aggregated by (launch configuration, kernel name[, call
    site]): `count`, `dur_ns` (sum), `max_dur_ns`, the configuration's occupancy columns and
    ncu rule speedups, and the SM time its grids leave idle (`small_grid_ns`, `tail_ns`,
    `lost_ns`).

    Every quantity of `small_grid` and `findings` is either fixed by the configuration or
    a sum of durations, so millions of launches reduce to a few thousand groups before any
    column is computed (a per-launch table of a 10-million-kernel trace is over a GB). The
    worst launch of a group is its longest: its idle share is the configuration's."""
    kernels, occupancy_ = trace.kernels, _occupancy(trace)
    dur = (kernels["end_ns"] - kernels["start_ns"]).clip(lower=0).to_numpy(np.int64)
    keep = _grouped_launches(trace, kernels)
    if timed_only:
        keep &= dur > 0
    if idle_only:
        keep &= (occupancy_["tail_efficiency"] < 1).to_numpy(bool)
    chosen = np.flatnonzero(keep)
    columns = [occupancy_["config"].to_numpy()[chosen],
               kernels["name"].cat.codes.to_numpy()[chosen]]
    where, named = _sites_of(trace, chosen) if sites else (None, None)
    if where is not None:
        columns.append(where)
    code = keys.codes(*columns)
    frame_ = pd.DataFrame({"code": code, "dur": dur[chosen], "pos": chosen})
    agg = frame_.groupby("code", sort=False).agg(count=("dur", "size"), dur_ns=("dur", "sum"),
                                                 max_dur_ns=("dur", "max"), pos=("pos", "first"))
    rep = agg["pos"].to_numpy()
    out = occupancy_.iloc[rep].reset_index(drop=True)
    out.insert(0, "full_name", kernels["name"].iloc[rep].to_numpy())
    out.insert(0, "name", short_names(kernels["name"].iloc[rep]).to_numpy())
    if where is not None and named is not None:
        first = pd.Series(np.arange(len(chosen))).groupby(code, sort=False).first()
        out["where"] = where[first.reindex(agg.index).to_numpy()]
        out["_named"] = named[first.reindex(agg.index).to_numpy()]  # where = the short name
    for col in ("count", "dur_ns", "max_dur_ns"):
        out[col] = agg[col].to_numpy()
    return _ncu_rules(_by_value(out), tail_min_speedup)


#: what a launch group is, besides its kernel (and call site): the values its occupancy and
#: idle share follow from. A configuration code is one (rank, device)'s; groups of equal
#: values are one group, so the ranks of one program share theirs and a job's parts stop
#: growing with its ranks
GROUP_VALUES = ("grid_blocks", "block_threads", "sm_count", *occ.COLUMNS)


def _by_value(groups: pd.DataFrame) -> pd.DataFrame:
    """Launch groups of equal kernel, call site and `GROUP_VALUES` as one, in order of
    first appearance: counts and durations summed (integers: any order of parts gives the
    same sums), the longest launch kept, the idle time computed from the sums (ncu's rules
    follow from the values: the first group's hold for all)."""
    if groups.empty:
        return _with_idle(groups)
    by = [groups["full_name"], *(groups[col] for col in GROUP_VALUES)]
    if "where" in groups:
        by += [groups["where"], groups["_named"]]
    code = keys.codes(*by)
    if len(np.unique(code)) == len(code):
        return _with_idle(groups.reset_index(drop=True))
    summed = pd.DataFrame({"code": code, "count": groups["count"].to_numpy(),
                           "dur_ns": groups["dur_ns"].to_numpy(),
                           "max_dur_ns": groups["max_dur_ns"].to_numpy(),
                           "pos": np.arange(len(code))}).groupby("code", sort=False).agg(
        count=("count", "sum"), dur_ns=("dur_ns", "sum"), max_dur_ns=("max_dur_ns", "max"),
        pos=("pos", "first"))
    out = groups.iloc[summed["pos"].to_numpy()].reset_index(drop=True)
    for col in ("count", "dur_ns", "max_dur_ns"):
        out[col] = summed[col].to_numpy()
    return _with_idle(out)


def _with_idle(out: pd.DataFrame) -> pd.DataFrame:
    """The SM-time groups leave idle: `small_grid_ns`, `tail_ns` (and their longest
    launch's, `max_`), `lost_ns`, from the durations and the idle share."""
    idle_share = np.nan_to_num(1 - out["tail_efficiency"].to_numpy(np.float64))
    waves = out["waves"].to_numpy(np.float64)
    for col, dur_col in (("", "dur_ns"), ("max_", "max_dur_ns")):
        idle = out[dur_col].to_numpy(np.float64) * idle_share
        out[f"{col}small_grid_ns"] = np.where(waves < 1, idle, 0.0)
        out[f"{col}tail_ns"] = np.where(waves >= 1, idle, 0.0)
    out["lost_ns"] = out["small_grid_ns"] + out["tail_ns"]
    return out


def _grouped_launches(trace: Trace, kernels: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """The launches small grids are measured on: not collective kernels."""
    return ~(keys.matches(kernels["name"], COMM_KERNEL)
             | kernels["kernel_id"].isin(trace.collectives["kernel_id"].dropna())
             .to_numpy(bool))


def _worst(groups: pd.DataFrame, group_by: list[str], part: str = "lost_ns") -> pd.DataFrame:
    """Per group of `group_by`, the row holding the launch that lost the most `part` (its
    longest launch times the configuration's idle share; ties: the longer launch)."""
    lost = groups[f"max_{part}"] if f"max_{part}" in groups else (
        groups["max_small_grid_ns"] + groups["max_tail_ns"])
    ordered = groups.assign(_lost=lost).sort_values(["_lost", "max_dur_ns"], kind="stable")
    return ordered.groupby(group_by, observed=True, dropna=False, sort=False).tail(1)


def _weighted(launches: pd.DataFrame, col: str, group_by: list[str]) -> pd.Series:
    """Duration-weighted mean of `col` per group, over launches where it is known (NaN when
    those launches have no duration)."""
    value = launches[col].astype("float64")
    weight = launches["dur_ns"].where(value.notna(), 0).astype("float64")
    parts = launches[group_by].assign(num=value.fillna(0) * weight, den=weight)
    sums = parts.groupby(group_by, observed=True, dropna=False, sort=False)[["num", "den"]].sum()
    return sums["num"] / sums["den"].where(sums["den"] > 0)


def _typed(data: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """`data` with exactly `columns`, in order and typed (ns columns rounded to int64)."""
    out = pd.DataFrame(index=data.index)
    for col, dtype in columns.items():
        values = data[col] if col in data else pd.Series(pd.NA, index=data.index, dtype=object)
        if dtype == "int64":
            values = pd.to_numeric(values, errors="coerce").fillna(0).round()
        elif dtype == "Int64":
            values = pd.to_numeric(values, errors="coerce").round()
        elif dtype == "bool":
            values = values.fillna(False)
        out[col] = values.astype(dtype)
    return out.reset_index(drop=True)


def launch_overhead(trace: Trace, *, runtime_cutoff_ns: int = 50_000,
                    delay_cutoff_ns: int = 100_000) -> pd.DataFrame:
    """Per kernel launch: the launch call, the kernel, and the delay between them (HTA).

        lo = launch.launch_overhead(trace)
        lo[lo["short"]].groupby("name")["gpu_dur_ns"].agg(["count", "sum"])
        lo["launch_delay_ns"].describe()

    One row per kernel whose launching API call the trace has (same pid and correlation
    id), in kernel order: `kernel_id`, `name` (short), `full_name`, `pid`, `tid`,
    `api_name`, `api_start_ns`, `api_dur_ns`, `gpu_dur_ns`, `launch_delay_ns`
    (HTA: `max(0, gpu start - api start - api duration)`, the time from the call's return
    to the kernel's start), `short` (HTA's short kernel: the call took at most
    `runtime_cutoff_ns` and the kernel ran shorter than its own launch call, so launching
    costs more than the work) and `long_delay` (delay over `delay_cutoff_ns`, HTA's
    default outlier bar).
    """
    kernels = trace.kernels
    calls = callsites.kernel_launches(trace)
    known = calls["api_start_ns"].notna().to_numpy(bool)
    kernels, calls = kernels[known], calls[known]
    api_dur = (calls["api_end_ns"] - calls["api_start_ns"]).astype("int64")
    gpu_dur = (kernels["end_ns"] - kernels["start_ns"]).astype("int64")
    delay = (kernels["start_ns"] - calls["api_end_ns"]).astype("int64").clip(lower=0)
    out = pd.DataFrame({
        "kernel_id": kernels["kernel_id"], "name": short_names(kernels["name"]),
        "full_name": kernels["name"].astype("string"), "pid": kernels["pid"],
        "tid": calls["tid"],
        "api_name": calls["api_name"], "api_start_ns": calls["api_start_ns"],
        "api_dur_ns": api_dur, "gpu_dur_ns": gpu_dur, "launch_delay_ns": delay,
        "short": (api_dur <= runtime_cutoff_ns) & (gpu_dur < api_dur),
        "long_delay": delay > delay_cutoff_ns,
    })
    return _typed(out, OVERHEAD_COLUMNS)


def launch_rate(trace: Trace) -> pd.DataFrame:
    """Per host thread: how many launches it made, how fast, and its time spent launching.

        lr = launch.launch_rate(trace)
        lr[["pid", "tid", "launches", "launches_per_s", "launch_share"]]
        lr["launch_share"].max()       # near 1: the thread does little but launch

    One row per (rank, pid, tid) that issued a kernel launch, most launches first: `launches`
    (API calls that launched at least one kernel, matched by correlation id), `kernels`
    (kernels they launched; a graph launch starts many), `window_ns` (the thread's span:
    its first to last API call or range), `launches_per_s`, `launch_ns` (time inside
    launch calls, overlaps counted once) and `launch_share` (= launch_ns / window_ns).
    """
    api, kernels = trace.api, trace.kernels
    launched = [kernels["rank"], kernels["pid"], kernels["correlation"]]
    is_launch = (keys.isin([api["rank"], api["pid"], api["correlation"]], launched)
                 & api["correlation"].notna().to_numpy(bool))
    calls = api.loc[is_launch, ["rank", "pid", "tid", "start_ns", "end_ns", "correlation"]]
    calls = calls.drop_duplicates(["rank", "pid", "correlation"]).dropna(subset=["pid", "tid"])
    if calls.empty:
        return _typed(pd.DataFrame(), RATE_COLUMNS)
    thread = ["_rank", "pid", "tid"]  # a thread is one rank's: pids repeat across hosts
    calls["_rank"] = keys.key_array(calls["rank"])
    # kernels per launch call (a graph launch starts many): count kernels by their call
    pos = keys.join(launched, [calls["rank"], calls["pid"], calls["correlation"]])
    calls["kernels"] = np.bincount(pos[pos >= 0], minlength=len(calls)).astype(np.int64)
    calls = calls.sort_values([*thread, "start_ns"], kind="stable")
    reach = calls.groupby(thread)["end_ns"].cummax()
    before = reach.groupby([calls[key] for key in thread]).shift(1)
    begin = np.maximum(calls["start_ns"], before.fillna(calls["start_ns"]))
    calls["busy"] = (calls["end_ns"] - begin).clip(lower=0)
    out = calls.groupby(thread).agg(launches=("start_ns", "size"),
                                    kernels=("kernels", "sum"), launch_ns=("busy", "sum"))
    window = _thread_windows(trace).reindex(out.index)
    out["window_ns"] = window
    out["launches_per_s"] = out["launches"] / (window / 1e9).where(window > 0)
    out["launch_share"] = out["launch_ns"] / window.where(window > 0)
    out = out.reset_index()
    out["rank"] = keys.key_column(out["_rank"])
    return _rate_order(_typed(out, RATE_COLUMNS))


def _rate_order(rates: pd.DataFrame) -> pd.DataFrame:
    """Most launches first; then by rank (none first), pid and tid."""
    order = rates.assign(_rank=keys.key_array(rates["rank"])).sort_values(
        ["launches", "_rank", "pid", "tid"], ascending=[False, True, True, True], kind="stable")
    return order.drop(columns="_rank").reset_index(drop=True)


def _thread_windows(trace: Trace) -> pd.Series:
    """Per (rank, pid, tid), rank as `keys.MISSING` when none: last end - first start over
    its API calls and host ranges."""
    cols = ["rank", "pid", "tid", "start_ns", "end_ns"]
    spans = pd.concat([trace.api[cols], trace.ranges[cols]], ignore_index=True)
    spans = spans.dropna(subset=["pid", "tid"])
    spans["_rank"] = keys.key_array(spans["rank"])
    threads = spans.groupby(["_rank", "pid", "tid"])
    return (threads["end_ns"].max() - threads["start_ns"].min()).astype("int64")


def analyze(trace: Trace) -> Result:
    """The launch analyzer's one result: small-grid and tail findings and its two tables.

        result = launch.analyze(trace)
        result.tables["small_grid"].head()      # per kernel name
        result.tables["launch_rate"]            # per host thread

    Occupancy is computed once per trace and shared by the three.
    """
    return combine([part(trace)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's launch analysis: its launch groups (a group is one
    rank's: the configuration holds the rank), its idle groups with their call sites, its
    threads' launch rates, its kernel names (short names are unique over the job's) and
    whether it holds ncu data and real times."""

    groups: pd.DataFrame
    idle: pd.DataFrame
    rates: pd.DataFrame
    kernel_names: tuple[str, ...]
    ncu: bool
    timeline: bool


def part(trace: Trace, *, tail_min_speedup: float = 0.2) -> Part:
    """This rank's launch groups and rates (see `Part`)."""
    categories = trace.kernels["name"].astype("category").cat.categories
    return Part(_launch_groups(trace, tail_min_speedup, timed_only=False),
                _launch_groups(trace, tail_min_speedup, timed_only=True, idle_only=True,
                               sites=True),
                launch_rate(trace), tuple(str(name) for name in categories),
                len(trace.metrics) > 0, bool(trace.meta.get("timeline", True)))


def combine(parts: list[Part]) -> Result:
    """The job's result: the ranks' groups in file order, short names made unique over
    the job's kernel names (as a merged trace's are), then the tables and findings."""
    groups = [piece.groups for piece in parts]
    idle = [piece.idle for piece in parts]
    if len(parts) > 1:
        shorts = job_short_names([piece.kernel_names for piece in parts])
        groups = [_renamed(frame_, shorts) for frame_ in groups]
        idle = [_renamed(frame_, shorts) for frame_ in idle]
    found = _idle_findings(_by_value(_stack(idle)), ncu=any(piece.ncu for piece in parts),
                           timeline=all(piece.timeline for piece in parts))
    rates = parts[0].rates if len(parts) == 1 else _rate_order(
        pd.concat([piece.rates for piece in parts], ignore_index=True))
    return Result(found, {"small_grid": _small_grid_table(_by_value(_stack(groups))),
                          "launch_rate": rates})


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    nonempty = [frame_ for frame_ in frames if len(frame_)]
    if len(nonempty) <= 1:
        return nonempty[0] if nonempty else frames[0]
    return pd.concat(nonempty, ignore_index=True)


def _renamed(groups: pd.DataFrame, shorts: dict[str, str]) -> pd.DataFrame:
    """Groups with the job's short names (and the `where` that is a short name)."""
    if groups.empty:
        return groups
    name = groups["full_name"].astype(str).map(shorts).to_numpy(dtype=object)
    out = groups.assign(name=name)
    if "_named" in groups:
        out["where"] = np.where(groups["_named"].to_numpy(bool), name,
                                groups["where"].to_numpy(dtype=object))
    return out


def findings(trace: Trace, *, tail_min_speedup: float = 0.2,
             min_share: float = 0.01) -> pd.DataFrame:
    """Grids that leave SMs idle, as findings: one per (kernel, call site) and kind.

        f = launch.findings(trace)
        f[["cause", "lost_ns", "where", "count", "evidence"]]
        f[f["advice"] == ADVICE["tail"]]       # the partial-last-wave part

    Cause `small_grid` with `ADVICE["small_grid"]` for launches under one wave (lost_ns =
    their `small_grid_ns`) and with `ADVICE["tail"]` for the partial last wave of longer
    grids (`tail_ns`). `where` is the call site of the launches (the user's Python line,
    torch op or NVTX range open at the launch call) when the trace has one, else the
    kernel's short name. `evidence` gives the launch count and time, and the grid,
    blocks/SM, SMs, waves, occupancy and limiter of the launch that lost the most, and the
    estimated speedup of ncu's rule (named after ncu only when the trace holds Nsight
    Compute data: elsewhere the rule is gpudiag's evaluation of the launch). A
    finding is kept when its lost time is at least `min_share` of its launches' duration
    (a tail of 1 % of a kernel is noise). Only launches with a duration count; collective
    kernels are left out (see `per_launch`).
    """
    groups = _launch_groups(trace, tail_min_speedup, timed_only=True, idle_only=True,
                            sites=True)
    return _idle_findings(groups, ncu=len(trace.metrics) > 0,
                          timeline=bool(trace.meta.get("timeline", True)), min_share=min_share)


def _idle_findings(groups: pd.DataFrame, *, ncu: bool, timeline: bool,
                   min_share: float = 0.01) -> pd.DataFrame:
    """The findings of idle launch groups (`_launch_groups(..., idle_only=True, sites=True)`)."""
    if groups.empty:
        return frame()
    note = "" if timeline else "; " + NO_TIMELINE_NOTE
    rows = []
    for part, advice in (("small_grid_ns", "small_grid"), ("tail_ns", "tail")):
        for group in _groups(groups, part, min_share).to_dict("records"):  # per kernel x site
            rows.append({"cause": "small_grid", "lost_ns": round(group["lost"]),
                         "where": group["where"], "count": group["count"],
                         "evidence": _evidence(group, part, ncu) + note,
                         "advice": ADVICE[advice], "kind": advice,
                         "subject": group["name"]})
    return frame(rows)


def _sites_of(trace: Trace, chosen: npt.NDArray[np.int64]
              ) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.bool_]]:
    """`launch_sites` of the kernels at these positions, computed once per trace and
    positions (the findings and the expected savings group the same launches)."""
    def compact() -> tuple[pd.Categorical, npt.NDArray[np.bool_]]:
        where, named = launch_sites(trace, trace.kernels.index[chosen])
        return pd.Categorical(where), named  # a few sites for millions of launches

    key = f"launch_sites:{len(chosen)}:{hash(chosen.tobytes())}"
    sites, named = trace.derived(key, compact)
    names = np.empty(len(sites.categories) + 1, dtype=object)  # the last, code -1: None
    names[:-1] = np.asarray(sites.categories, dtype=object)
    return names[sites.codes], named


def idle_launches(trace: Trace, shorts: Mapping[str, str] | None = None
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.object_]]:
    """The launches the small-grid findings group (timed, under a full wave, not
    collective: positions in `trace.kernels`) and the call site each is grouped by (the
    kernel's short name where it has none: of `shorts`, a job's short names of its
    kernels' full names, when the trace is one batch of the job)."""
    kernels, occupancy_ = trace.kernels, _occupancy(trace)
    dur = (kernels["end_ns"] - kernels["start_ns"]).to_numpy(np.int64)
    chosen = np.flatnonzero(_grouped_launches(trace, kernels) & (dur > 0)
                            & (occupancy_["tail_efficiency"] < 1).to_numpy(bool))
    where, named = _sites_of(trace, chosen)
    if shorts is not None and named.any():
        where = where.copy()
        where[named] = kernels["name"].iloc[chosen[named]].astype(str).map(shorts) \
            .to_numpy(dtype=object)
    return chosen, where


def launch_sites(trace: Trace, index: pd.Index
           ) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.bool_]]:
    """Per launch (kernels index labels): the call site at its launch call, else the
    kernel's short name; and whether it is the name (no call site)."""
    kernels = trace.kernels
    # not the whole rows: 20 columns
    pid, rank = kernels["pid"].loc[index], kernels["rank"].loc[index]
    calls = callsites.kernel_launches(trace).loc[index]
    known = calls["api_start_ns"].notna().to_numpy(bool)
    where = np.array(short_names(kernels["name"].loc[index]).astype(object).to_numpy(),
                     dtype=object)
    if known.any():
        mine = calls[known]
        site = callsites.where_at(trace, pid[known], mine["tid"], mine["api_start_ns"],
                                  rank[known])
        where[known] = np.where(pd.isna(site), where[known], site)
        named = np.ones(len(where), dtype=bool)
        named[known] = pd.isna(site)
        return where, named
    return where, np.ones(len(where), dtype=bool)


def _groups(groups: pd.DataFrame, part: str, min_share: float) -> pd.DataFrame:
    """Launch groups with `part` > 0 per (kernel, site): totals and the worst launch."""
    hit = groups[groups[part] > 0]
    per_site = ["full_name", "where"]
    rule = RULE_OF[part]
    weight = np.where(hit[rule].notna(), hit["dur_ns"], 0.0)
    sums = hit.assign(lost=hit[part], dur=hit["dur_ns"], num=np.nan_to_num(hit[rule]) * weight,
                      den=weight).groupby(per_site, observed=True, dropna=False, sort=False)[
        ["lost", "count", "dur", "num", "den"]].sum()
    sums["speedup"] = sums["num"] / sums["den"].where(sums["den"] > 0)
    worst = _worst(hit, per_site, part).drop(columns=["count"]).set_index(per_site)
    out = worst.join(sums[["lost", "count", "dur", "speedup"]]).reset_index()
    out = out[out["lost"] >= min_share * out["dur"]]
    return out.sort_values("lost", ascending=False, kind="stable")


RULE_OF = {"small_grid_ns": "ncu_small_grid_speedup", "tail_ns": "ncu_tail_speedup"}


#: the estimated speedup of each part's rule, in words: after ncu's rule name when the trace
#: holds Nsight Compute data, else what the estimate assumes (no tool named that did not run)
_ESTIMATE = {("small_grid_ns", True): "ncu Small Grid estimate {:.0%}",
             ("tail_ns", True): "ncu Tail Effect estimate {:.0%}",
             ("small_grid_ns", False): "estimated speedup {:.0%} with a grid filling the GPU",
             ("tail_ns", False): "estimated speedup {:.0%} without the partial last wave"}


def _evidence(group: dict[str, Any], part: str, ncu: bool) -> str:
    """The numbers behind a finding: the totals, and the launch that lost the most."""
    slots = int(group["blocks_per_sm"]) * int(group["sm_count"])
    waves, tail = float(group["waves"]), float(group["tail_efficiency"])
    count = int(group["count"])
    head = f"{group['name']}: " if group["where"] != group["name"] else ""
    shape = (f"{count} launch{'es' if count != 1 else ''}, {format_ns(group['dur'])}; grid "
             f"of {int(group['grid_blocks'])} blocks for {slots} block slots "
             f"({group['blocks_per_sm']} blocks/SM x {int(group['sm_count'])} SMs) = "
             f"{waves:.3g} waves")
    if part == "tail_ns":
        shape += f", last wave {waves - np.floor(waves):.0%} full"
    speedup = float(group["speedup"])
    estimate = "; " + _ESTIMATE[part, ncu].format(speedup) if speedup > 0 else ""
    return (f"{head}{shape}; SM slots idle {1 - tail:.0%} of the kernel time; theoretical "
            f"occupancy {float(group['theoretical_occupancy']):.0%} (limited by "
            f"{group['limiter']}){estimate}")


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
