"""Collective communication: bandwidth per message size, comm/compute overlap, late ranks.

Three questions about the `collectives` table, each with the definition the incumbent tools
use, so a number can be checked against theirs:
- how fast is each collective? nccl-tests' algbw = S / t and busbw = algbw x factor (B8);
- how much communication hides behind compute? HTA's, Nsight Systems' and tb-profiler's
  overlap ratios, which differ in their denominators; all three are reported, named by it;
- who arrives late? see `collectives_skew` (matching across ranks, clock assumptions).
`findings` turns them into `comm_wait`, `comm` (exposed) and slow-bandwidth findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag import intervals as iv
from gpudiag.analyzers import callsites
from gpudiag.analyzers.collectives.skew import arrival_skew, typed, wait_intervals, wait_note
from gpudiag.analyzers.findings import ADVICE, Contract, Result, format_ns, frame
from gpudiag.analyzers.keys import key_array, key_column
from gpudiag.analyzers.steps.training import step_windows
from gpudiag.trace import Trace

__all__ = ["arrival_skew", "bus_factor", "collective_calls", "collective_stats", "findings",
           "overlap", "wait_intervals", "wait_note"]

STATS_BY = ("op", "bytes", "group_size", "dtype")
KEY_DTYPES = {"op": "string", "bytes": "Int64", "group_size": "Int64", "dtype": "string",
              "comm": "string", "name": "string", "rank": "Int64", "device": "Int64"}
STATS_COLUMNS = {"count": "int64", "total_ns": "int64", "mean_ns": "float64", "min_ns": "int64",
                 "max_ns": "int64", "algbw_gbps": "float64", "busbw_gbps": "float64",
                 "busbw_peak_gbps": "float64", "group_size_assumed": "bool"}
OVERLAP_COLUMNS = {
    "rank": "Int64", "device": "Int64", "comm_ns": "int64", "compute_ns": "int64",
    "overlap_ns": "int64", "exposed_comm_ns": "int64", "comm_kernel_ns": "int64",
    "comm_kernel_overlap_ns": "int64", "step_ns": "int64", "step_overlap_ns": "int64",
    "step_source": "string", "overlap_of_comm": "float64",
    "overlap_of_comm_kernel_ns": "float64", "overlap_of_step": "float64",
}
#: advice for collectives far slower than their peers, until findings.ADVICE has a key for it
#: torch ops every collective runs inside, which say nothing about where it was called
BARE_SITES = ("record_param_comms",)
_NONE: iv.Spans = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def bus_factor(op: pd.Series, group_size: pd.Series) -> np.ndarray:
    """busbw / algbw per call (nccl-tests): all_reduce 2(n-1)/n; reduce_scatter, all_gather,
    all_to_all (n-1)/n; broadcast, reduce, send/recv 1; NaN for barrier/other or unknown n."""
    size = pd.to_numeric(group_size, errors="coerce").to_numpy(dtype=np.float64,
                                                               na_value=np.nan)
    ops = op.astype(str).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.select(
            [ops == "all_reduce", np.isin(ops, ["reduce_scatter", "all_gather", "all_to_all"]),
             np.isin(ops, ["broadcast", "reduce", "send", "recv", "send_recv"])],
            [2 * (size - 1) / size, (size - 1) / size, np.ones(len(size))], np.nan)


def collective_calls(trace: Trace, *, assume_world: bool = True) -> pd.DataFrame:
    """The `collectives` table with per-call `dur_ns`, `factor`, `algbw_gbps`, `busbw_gbps`.

        calls = collective_calls(trace)
        calls.plot.scatter("bytes", "busbw_gbps", logx=True)
        calls.groupby("op")["busbw_gbps"].median()

    GB/s are 1e9 bytes/s (bytes per ns). Kineto traces often lack the group size; with
    `assume_world` it is taken from `meta["world_size"]` and `group_size_assumed` says so:
    right for the default process group, wrong by the factor's change for sub-groups.
    """
    calls = trace.collectives.copy()
    world = int(trace.meta.get("world_size") or 0)
    assumed = calls["group_size"].isna() & (assume_world and world > 0)
    if assumed.any():
        calls["group_size"] = calls["group_size"].fillna(world)
    dur = (calls["end_ns"] - calls["start_ns"]).to_numpy(np.int64)
    factor = bus_factor(calls["op"], calls["group_size"])
    size = calls["bytes"].to_numpy(dtype=np.float64, na_value=np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, size / dur, np.nan)
    return calls.assign(dur_ns=dur, factor=factor, algbw_gbps=algbw, busbw_gbps=algbw * factor,
                    group_size_assumed=assumed.to_numpy())


def collective_stats(trace: Trace, *, by: Sequence[str] = STATS_BY,
                     assume_world: bool = True) -> pd.DataFrame:
    """Per (op, bytes, group_size, dtype): count, duration statistics and bandwidth.

        stats = collective_stats(trace)
        stats.sort_values("total_ns", ascending=False).head(10)
        stats[stats.op == "all_reduce"].plot("bytes", "busbw_gbps", logx=True)

    `algbw_gbps` = Σ bytes / Σ duration, which is S / mean time when the group has one size
    (as nccl-tests averages its iterations); `busbw_gbps` applies the op's factor;
    `busbw_peak_gbps` is the fastest single call. `by` picks other keys, e.g. add 'name' to
    keep nccl-tests' out-of-place and in-place rows apart, or 'rank' to compare ranks.
    """
    keys = list(by)
    columns = {**{key: KEY_DTYPES.get(key, "string") for key in keys}, **STATS_COLUMNS}
    calls = collective_calls(trace, assume_world=assume_world)
    if calls.empty:
        return typed(None, columns)
    calls = calls.assign(bus_bytes=calls["bytes"].astype("float64") * calls["factor"])
    out = calls.groupby(keys, observed=True, dropna=False, sort=True).agg(
        count=("dur_ns", "size"), total_ns=("dur_ns", "sum"), mean_ns=("dur_ns", "mean"),
        min_ns=("dur_ns", "min"), max_ns=("dur_ns", "max"), sized=("bytes", "count"),
        sum_bytes=("bytes", "sum"), bus_bytes=("bus_bytes", "sum"),
        bus_sized=("bus_bytes", "count"),
        busbw_peak_gbps=("busbw_gbps", "max"),
        group_size_assumed=("group_size_assumed", "any"),
    ).reset_index()
    timed = (out["total_ns"] > 0) & (out["sized"] == out["count"])
    total = out["total_ns"].where(timed).astype("float64")
    out["algbw_gbps"] = out["sum_bytes"].astype("float64") / total
    bus = out["bus_bytes"].where(out["bus_sized"] == out["count"])  # NaN: factor unknown
    out["busbw_gbps"] = bus.astype("float64") / total
    return typed(out, columns)


def overlap(trace: Trace, *, steps: bool = True) -> pd.DataFrame:
    """Communication hidden behind compute, per (rank, device), by all three definitions.

        ov = overlap(trace)
        ov[["rank", "overlap_of_comm", "overlap_of_comm_kernel_ns", "overlap_of_step"]]
        ov.exposed_comm_ns.sum() / 1e6   # ms of communication nothing hides

    comm = union of the collective kernels' intervals; compute = union of every other kernel
    (copies are neither, as in HTA); overlap = their intersection; exposed = comm - overlap.
    - `overlap_of_comm` = overlap_ns / comm_ns: HTA's comp_comm_overlap_pctg / 100;
    - `overlap_of_comm_kernel_ns` = Σ per NCCL kernel |kernel ∩ compute| / Σ kernel durations:
      Nsight Systems' nccl_gpu_overlap_trace ('Compute Overlap' of the NCCL kernels, summed
      per name as its grouped table does, here over all of them). Differs from HTA's only
      when NCCL kernels run concurrently on several streams (they count once per kernel);
    - `overlap_of_step` = step_overlap_ns / step_ns: tb-profiler's overlap share of the step.
      Steps are the rank's ProfilerStep ranges, each extended to the end of the last kernel
      launched inside it (as tb-profiler maps steps onto the GPU); without steps, the
      device's GPU window (first to last kernel or copy). `step_source` says which.
    Ratios are NaN where their denominator is 0. Traces without a timeline (nccl-tests logs)
    give an empty frame, and collectives on no device (gloo's, timed on the host) are left
    out: compute here is GPU kernels, and what host work hides a gloo call is not measured.
    """
    comm = _on_device(trace)
    if comm.empty:
        return typed(None, OVERLAP_COLUMNS)
    compute = spans_by_device(compute_kernels(trace))
    cols = ["rank", "device", "start_ns", "end_ns"]
    busy = _keyed(pd.concat([table[cols] for table in (trace.kernels, trace.copies, comm)
                             if len(table)]))
    windows = _step_windows(trace) if steps else {}
    rows = []
    for (rank, device), group in _keyed(comm).groupby(["_r", "_d"], sort=True):
        window, source = windows.get(rank), "steps"
        if window is None:
            mine = busy[(busy["_r"] == rank) & (busy["_d"] == device)]
            window, source = _window(mine), "gpu_window"
        rows.append({"rank": rank, "device": device, "step_source": source,
                     **_overlap_numbers(group, compute.get((rank, device), _NONE), window)})
    out = pd.DataFrame(rows)
    return typed(out.assign(rank=key_column(out["rank"]), device=key_column(out["device"])),
                 OVERLAP_COLUMNS)


def analyze(trace: Trace) -> Result:
    """The collectives analyzer's one result: comm_wait / comm findings and three tables.

        result = calls.analyze(trace)
        result.tables["collective_stats"]; result.tables["overlap"]
        result.tables["arrival_skew"].drop_duplicates("match_id")

    The arrival skew is the one the findings and the loss model's comm_wait use: matched
    once per trace.
    """
    return combine([part(trace)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's collectives analysis: its collective rows, the call
    site of each collective kernel (by kernel id), its compute kernels' busy time inside
    its calls (all a call's hidden time needs), its overlap rows, and the meta the
    bandwidth and skew read (world size, real times)."""

    calls: pd.DataFrame
    sites: pd.Series
    compute: dict[tuple[int, int], iv.Spans]
    overlap: pd.DataFrame
    world_size: int | None
    timeline: bool


def part(trace: Trace) -> Part:
    """This rank's collectives and what its findings need of its kernels (see `Part`)."""
    calls = trace.collectives
    compute = spans_by_device(compute_kernels(trace))
    inside = {key: iv.intersect(compute[key], iv.union(rows["start_ns"], rows["end_ns"]))
              for key, rows in _by_device(calls) if key in compute}
    world = trace.meta.get("world_size")
    return Part(calls, _site_map(trace), inside, overlap(trace),
                None if world is None else int(world), bool(trace.meta.get("timeline", True)))


def shift_kernels(piece: Part, offset: int) -> Part:
    """The part with its kernel ids after `offset` (the merge's numbering of a job)."""
    calls = piece.calls.assign(kernel_id=piece.calls["kernel_id"] + offset)
    return Part(calls, piece.sites.set_axis(piece.sites.index + offset), piece.compute,
                piece.overlap, piece.world_size, piece.timeline)


def combine(parts: list[Part]) -> Result:
    """The job's result from its ranks' parts: their calls in file order (as merged),
    matched across ranks, with each rank's compute and sites."""
    calls = pd.concat([piece.calls for piece in parts], ignore_index=True) \
        if len(parts) > 1 else parts[0].calls
    sizes = {piece.world_size for piece in parts if piece.world_size is not None}
    meta = {"timeline": all(piece.timeline for piece in parts),
            **({"world_size": sizes.pop()} if len(sizes) == 1 else {})}
    trace = Trace(meta=meta, collectives=calls)
    compute = {key: spans for piece in parts for key, spans in piece.compute.items()}
    sites = pd.concat([piece.sites for piece in parts]) if len(parts) > 1 else parts[0].sites
    ov = parts[0].overlap if len(parts) == 1 else _in_device_order(
        pd.concat([piece.overlap for piece in parts], ignore_index=True))
    return Result(_findings(trace, compute, sites), {
        "collective_stats": collective_stats(trace), "overlap": ov,
        "arrival_skew": arrival_skew(trace)})


def _by_device(rows: pd.DataFrame) -> list[tuple[tuple[int, int], pd.DataFrame]]:
    return [((int(rank), int(device)), group)
            for (rank, device), group in _keyed(rows).groupby(["_r", "_d"], sort=False)]


def _in_device_order(rows: pd.DataFrame) -> pd.DataFrame:
    """Overlap rows in (rank, device) order, none first (as `overlap` groups them)."""
    keyed = _keyed(rows).sort_values(["_r", "_d"], kind="stable")
    return keyed.drop(columns=["_r", "_d"]).reset_index(drop=True)


def findings(trace: Trace, *, min_lost_ns: int = 100_000, large_bytes: int = 32 << 20,
             slow_ratio: float = 0.25, min_large_calls: int = 4) -> pd.DataFrame:
    """`comm_wait`, `comm` (exposed) and slow-bandwidth findings, in findings.frame's shape.

        f = findings(trace)
        f[f.cause == "comm_wait"][["where", "lost_ns", "evidence"]]
        f.sort_values("lost_ns", ascending=False).head()

    - comm_wait, per (comm, op): the early ranks' waiting (arrival_skew) that compute does not
      hide; `where` names the op, the rank that arrived last most often and the call site;
    - comm, per (comm, op): collective time not overlapped by compute on its device (summed
      per call; it includes the waiting reported under comm_wait, which the evidence says);
    - comm (slow), per (comm, op): calls of at least `large_bytes` whose busbw is below
      `slow_ratio` x the median busbw of the same op and group size at that size or above
      (at least `min_large_calls` such calls to compare). Waiting is taken out of the
      duration first, so a late rank is not mistaken for a slow link; lost_ns is the time
      above what the median bandwidth would take. Findings under `min_lost_ns` are dropped.
    """
    return _findings(trace, spans_by_device(compute_kernels(trace)), _site_map(trace),
                     min_lost_ns=min_lost_ns, large_bytes=large_bytes, slow_ratio=slow_ratio,
                     min_large_calls=min_large_calls)


def _findings(trace: Trace, compute: dict[tuple[int, int], iv.Spans], sites: pd.Series, *,
              min_lost_ns: int = 100_000, large_bytes: int = 32 << 20,
              slow_ratio: float = 0.25, min_large_calls: int = 4) -> pd.DataFrame:
    """`findings` from the collectives, each device's compute spans and the call site of
    each collective kernel (`sites`, by kernel id)."""
    skew = arrival_skew(trace)
    parts = [_wait_findings(skew, compute, sites),
             _exposed_findings(trace, compute, skew, sites),
             _slow_findings(trace, skew, sites, large_bytes=large_bytes, slow_ratio=slow_ratio,
                            min_large_calls=min_large_calls)]
    rows = [row for part in parts for row in part]
    out = frame(rows)
    return out[out["lost_ns"] >= min_lost_ns].reset_index(drop=True)


def _site_map(trace: Trace) -> pd.Series:
    """The call site of each collective kernel, by kernel id (`_sites`)."""
    calls = trace.collectives
    known = calls[calls["kernel_id"].notna().to_numpy(bool)].drop_duplicates("kernel_id")
    return pd.Series(_sites(trace, known).to_numpy(dtype=object),
                     index=pd.Index(known["kernel_id"].astype("int64")), dtype=object)


def _site_of(rows: pd.DataFrame, sites: pd.Series) -> pd.Series:
    """Each row's call site from `sites` (None without a kernel or a site)."""
    ids = pd.to_numeric(rows["kernel_id"]).astype("Int64")
    found = ids.map(sites).to_numpy(dtype=object) if len(sites) else \
        np.full(len(rows), None, dtype=object)
    return pd.Series([None if pd.isna(site) else site for site in found], index=rows.index,
                     dtype=object)


# -- intervals per device ---------------------------------------------------------------------


def compute_kernels(trace: Trace) -> pd.DataFrame:
    """Kernels that are not collectives: the 'compute' side of every overlap."""
    kernels = trace.kernels
    comm_ids = trace.collectives["kernel_id"].dropna().astype("int64")
    return kernels[~kernels["kernel_id"].isin(comm_ids)]


def spans_by_device(rows: pd.DataFrame) -> dict[tuple[int, int], iv.Spans]:
    """Union of the rows' intervals per (rank, device); NA rank or device keyed as
    `keys.MISSING` (plain ints, so the dict's keys compare equal)."""
    return {(int(rank), int(device)): iv.union(group["start_ns"], group["end_ns"])
            for (rank, device), group in _keyed(rows).groupby(["_r", "_d"], sort=False)}


def covered(rows: pd.DataFrame, spans: dict[tuple[int, int], iv.Spans]) -> np.ndarray:
    """How much of each row's [start_ns, end_ns) lies inside its own device's spans."""
    out = np.zeros(len(rows), dtype=np.int64)
    keyed = _keyed(rows)
    start, end = keyed["start_ns"].to_numpy(np.int64), keyed["end_ns"].to_numpy(np.int64)
    for key, idx in keyed.groupby(["_r", "_d"], sort=False).indices.items():
        if key in spans:
            out[idx] = iv.overlap(start[idx], end[idx], spans[key])
    return out


def _keyed(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with int64 keys `_r`, `_d` (rank, device; NA as `keys.MISSING`) to group by."""
    return rows.assign(_r=key_array(rows["rank"]), _d=key_array(rows["device"]))


def _on_timeline(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    return rows if trace.meta.get("timeline", True) else rows.iloc[0:0]


def _on_device(trace: Trace) -> pd.DataFrame:
    """Collectives on a timeline that ran on a device (what GPU compute can hide)."""
    calls = _on_timeline(trace, trace.collectives)
    return calls[calls["device"].notna().to_numpy(bool)]


def _window(rows: pd.DataFrame) -> iv.Spans:
    if rows.empty:
        return _NONE
    return iv.as_ns([rows["start_ns"].min()]), iv.as_ns([rows["end_ns"].max()])


def _overlap_numbers(comm: pd.DataFrame, compute: iv.Spans, window: iv.Spans) -> dict[str, object]:
    comm_set = iv.union(comm["start_ns"], comm["end_ns"])
    both = iv.intersect(comm_set, compute)
    comm_ns, overlap_ns = iv.total(comm_set), iv.total(both)
    kernel_ns = int((comm["end_ns"] - comm["start_ns"]).sum())
    kernel_overlap = int(iv.overlap(comm["start_ns"], comm["end_ns"], compute).sum())
    step_ns, step_overlap = iv.total(window), iv.total(iv.intersect(both, window))
    return {"comm_ns": comm_ns, "compute_ns": iv.total(compute), "overlap_ns": overlap_ns,
            "exposed_comm_ns": comm_ns - overlap_ns, "comm_kernel_ns": kernel_ns,
            "comm_kernel_overlap_ns": kernel_overlap, "step_ns": step_ns,
            "step_overlap_ns": step_overlap, "overlap_of_comm": _ratio(overlap_ns, comm_ns),
            "overlap_of_comm_kernel_ns": _ratio(kernel_overlap, kernel_ns),
            "overlap_of_step": _ratio(step_overlap, step_ns)}


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole > 0 else float("nan")


def _step_windows(trace: Trace) -> dict[int, iv.Spans]:
    """Per rank (`keys.MISSING`: none), the union of its steps (markers or detected, warm-up
    left out), each extended to the end of the last kernel launched inside it (the GPU
    finishes a step's work after the host moved on)."""
    if trace.kernels.empty:
        return {}
    found = step_windows(trace)
    steps = found[~found["warmup"].astype(bool)].reset_index(drop=True)
    if steps.empty:
        return {}
    kernels = trace.kernels
    launch = callsites.kernel_launches(trace)["api_start_ns"]
    known = (launch.notna() & kernels["pid"].notna()).to_numpy()
    # by (rank, pid): ranks on other hosts reuse pids
    left = pd.DataFrame({"rank": key_array(kernels["rank"][known]),
                         "pid": kernels["pid"][known].astype("int64"),
                         "t": launch[known].astype("int64"), "gpu_end": kernels["end_ns"][known]})
    # a step of no known pid (MISSING) matches no kernel: every left pid is known
    right = pd.DataFrame({"rank": key_array(pd.to_numeric(steps["rank"])),
                          "pid": key_array(pd.to_numeric(steps["pid"])),
                          "t": steps["start_ns"], "step_end": steps["end_ns"],
                          "step": np.arange(len(steps))})
    hit = pd.merge_asof(left.sort_values("t"), right.sort_values("t"), on="t",
                        by=["rank", "pid"])
    hit = hit[hit["t"] < hit["step_end"]]
    own_end = steps["end_ns"].to_numpy(np.int64)
    gpu_end = (hit.groupby("step")["gpu_end"].max().astype("Int64").reindex(right["step"])
               .to_numpy(np.int64, na_value=np.iinfo(np.int64).min))  # never via float: ns
    end = np.maximum(own_end, gpu_end)
    keyed = steps.assign(end_ns=end, _r=key_array(pd.to_numeric(steps["rank"])))
    return {int(rank): iv.union(group["start_ns"], group["end_ns"])
            for rank, group in keyed.groupby("_r")}


# -- findings ---------------------------------------------------------------------------------


def _wait_findings(skew: pd.DataFrame, compute: dict[tuple[int, int], iv.Spans],
                   sites: pd.Series) -> list[dict[str, object]]:
    rows = skew[~skew["clock_suspect"] & (skew["wait_ns"] > 0)]
    if rows.empty:
        return []
    hidden = covered(rows.assign(end_ns=rows["start_ns"] + rows["wait_ns"]), compute)
    rows = rows.assign(exposed=rows["wait_ns"] - hidden, site=_site_of(rows, sites))
    keys = ["comm", "op"]
    agg = rows.groupby(keys, sort=False).agg(
        lost_ns=("exposed", "sum"), wait_ns=("wait_ns", "sum"), max_skew=("skew_ns", "max"),
        how=("matched_by", "first"))
    calls = skew[~skew["clock_suspect"]].drop_duplicates("match_id")
    agg = agg.join(calls.groupby(keys).size().rename("calls"))
    agg = agg.join(_top(calls, keys, "last_rank")).join(_top(rows, keys, "site").drop(
        columns="n"))
    out = []
    for (comm, operation), sums in agg.iterrows():  # one row per (comm, op): a handful
        where = (f"{finding_name(comm, operation)}: rank {sums['last_rank']} arrives last "
                 f"({sums['n']} of {_calls(sums['calls'])}){_at(sums['site'])}")
        evidence = (f"{_calls(sums['calls'])} matched by {sums['how']}; early ranks wait "
                    f"{_ms(sums['wait_ns'])}, {_ms(sums['lost_ns'])} of it not hidden by "
                    f"compute; max skew {_ms(sums['max_skew'])}")
        out.append({"cause": "comm_wait", "lost_ns": sums["lost_ns"], "where": where,
                    "count": sums["calls"], "evidence": evidence,
                    "advice": ADVICE["comm_wait"], "kind": "comm_wait",
                    "subject": finding_name(comm, operation)})
    return out


def _exposed_findings(trace: Trace, compute: dict[tuple[int, int], iv.Spans],
                      skew: pd.DataFrame, sites: pd.Series) -> list[dict[str, object]]:
    calls = _on_device(trace)  # a gloo call's overlap with host compute is not measured
    if calls.empty:
        return []
    dur = calls["end_ns"] - calls["start_ns"]
    wait = _wait_of(calls, skew)
    calls = calls.assign(comm=calls["comm"].astype("string").fillna(""),
                         op=calls["op"].astype("string"), dur_ns=dur,
                         exposed=dur - covered(calls, compute), wait_ns=wait,
                         site=_site_of(calls, sites))
    keys = ["comm", "op"]
    agg = calls.groupby(keys, sort=False).agg(
        lost_ns=("exposed", "sum"), dur_ns=("dur_ns", "sum"), wait_ns=("wait_ns", "sum"),
        count=("dur_ns", "size"))
    agg = agg.join(_top(calls, keys, "site"))
    return [{"cause": "comm", "lost_ns": sums["lost_ns"], "count": sums["count"],
             "where": f"{finding_name(comm, operation)}{_at(sums['site'])}",
             "advice": ADVICE["comm_exposed"], "kind": "comm_exposed",
             "subject": finding_name(comm, operation),
             "evidence": (f"{_calls(sums['count'])}, {_ms(sums['dur_ns'])} of communication, "
                          f"{_ms(sums['lost_ns'])} not overlapped with compute"
                          + (f" ({_ms(sums['wait_ns'])} of the calls' time is waiting for late "
                             "ranks: see comm_wait)" if sums["wait_ns"] > 0 else ""))}
            for (comm, operation), sums in agg.iterrows()]


def _slow_findings(trace: Trace, skew: pd.DataFrame, sites: pd.Series, *, large_bytes: int,
                   slow_ratio: float, min_large_calls: int) -> list[dict[str, object]]:
    calls = collective_calls(trace)
    wait = _wait_of(calls, skew).to_numpy()
    moving = calls["dur_ns"].to_numpy() - wait  # the call's time once every rank has arrived
    with np.errstate(divide="ignore", invalid="ignore"):
        busbw = np.where(moving > 0, calls["bytes"].to_numpy(np.float64, na_value=np.nan)
                         * calls["factor"].to_numpy() / moving, np.nan)
    calls = calls.assign(moving=moving, busbw=busbw,
                         comm=calls["comm"].astype("string").fillna(""),
                         op=calls["op"].astype("string"))
    calls = calls[(calls["bytes"] >= large_bytes).fillna(False).to_numpy() & np.isfinite(busbw)]
    peers = calls.groupby(["op", "group_size"], dropna=False)["busbw"]
    calls = calls.assign(ref=peers.transform("median"), peers=peers.transform("count"))
    slow = calls[(calls["peers"] >= min_large_calls) & (calls["busbw"] < slow_ratio * calls["ref"])]
    if slow.empty:
        return []
    slow = slow.assign(lost=slow["moving"] * (1 - slow["busbw"] / slow["ref"]),
                       site=_site_of(slow, sites))
    keys = ["comm", "op"]
    agg = slow.groupby(keys, sort=False).agg(
        lost_ns=("lost", "sum"), count=("lost", "size"), low=("busbw", "min"),
        high=("busbw", "max"), ref=("ref", "median"), peers=("peers", "max"))
    agg = agg.join(_top(slow, keys, "site"))
    return [{"cause": "comm", "lost_ns": int(sums["lost_ns"]), "count": sums["count"],
             "where": f"slow {finding_name(comm, operation)}{_at(sums['site'])}",
             "advice": ADVICE["comm_slow"], "kind": "comm_slow",
             "subject": finding_name(comm, operation),
             "evidence": (f"{sums['count']} of {sums['peers']} {operation} calls "
                          f"≥ {large_bytes >> 20} MiB reach {sums['low']:.1f}–"
                          f"{sums['high']:.1f} GB/s bus bandwidth, median of the others "
                          f"{sums['ref']:.1f} GB/s (waiting for late ranks excluded)")}
            for (comm, operation), sums in agg.iterrows()]


def _wait_of(rows: pd.DataFrame, skew: pd.DataFrame) -> pd.Series:
    """Each collective's wait_ns from `skew` (0 where not matched): by kernel_id, and rows
    without a kernel (gloo's, host-timed) by (rank, comm, seq, start_ns). A match flagged
    `clock_suspect` waits nothing: its starts are apart by the ranks' clocks, not by waiting
    (as in `wait_intervals`)."""
    skew = skew[~skew["clock_suspect"]]
    known = skew[skew["kernel_id"].notna()].drop_duplicates("kernel_id")
    wait = rows["kernel_id"].map(known.set_index("kernel_id")["wait_ns"])
    bare = rows["kernel_id"].isna().to_numpy(bool)
    if bare.any():
        keys = ["rank", "comm", "seq", "start_ns"]
        host = skew[skew["kernel_id"].isna()].drop_duplicates(keys)
        mine = rows.loc[bare, keys].assign(comm=rows.loc[bare, "comm"].astype("string")
                                           .fillna(""))
        found = mine.merge(host[[*keys, "wait_ns"]], on=keys, how="left")["wait_ns"]
        wait[bare] = found.to_numpy()
    return wait.fillna(0).astype("int64")


def _sites(trace: Trace, rows: pd.DataFrame) -> pd.Series:
    """Call site of each collective's launch: user Python frame, else torch op or annotation
    (callsites.where_at); None where the trace has no launch call for it."""
    out = pd.Series(None, index=rows.index, dtype=object)
    kernels = trace.kernels
    if kernels.empty or trace.api.empty:
        return out
    pos = pd.Index(kernels["kernel_id"]).get_indexer(rows["kernel_id"])  # NA: -1, not found
    found = pos >= 0
    launched = kernels.iloc[pos[found]].set_axis(rows.index[found])
    api = callsites.launch_calls(trace, launched)
    known = api["tid"].notna() & api["api_start_ns"].notna()
    if known.any():
        out[known[known].index] = callsites.where_at(
            trace, launched["pid"][known], api["tid"][known],
            api["api_start_ns"][known].astype("int64"), launched["rank"][known])
    return out.where(~out.isin(BARE_SITES), None)


def _top(rows: pd.DataFrame, keys: list[str], col: str) -> pd.DataFrame:
    """Per key, the most frequent value of `col` and its count `n`."""
    counts = rows.groupby([*keys, col], sort=False, dropna=True).size().rename("n").reset_index()
    counts = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates(keys)
    return counts.set_index(keys)


def finding_name(comm: object, operation: object) -> str:
    """A finding's `subject`: the (communicator, op) whose calls are behind it (its
    `where` begins with it too)."""
    return f"{operation} on {_comm(comm)}"


def _at(site: object) -> str:
    return f" at {site}" if isinstance(site, str) and site else ""


def _comm(name: object) -> str:
    """Process-group names are numbers ('0'); say what they are."""
    return f"process group {name}" if str(name).isdigit() else str(name)


def _calls(count: object) -> str:
    return f"{count} call" if count == 1 else f"{count} calls"


def _ms(duration: float) -> str:
    return format_ns(duration)  # the one duration formatter: 4.6 µs, not 0.00 ms


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine, shift_kernels=shift_kernels)
