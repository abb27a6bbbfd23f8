"""Blocking sync points: where the host waits for the GPU, and what the GPU loses by it.

A sync point is one (kind, call site): every explicit synchronize, synchronous copy and the
implicit syncs PyTorch makes (`.item()`, `.cpu()`, `.tolist()`, `bool(tensor)`, `nonzero`
and other ops whose output size depends on GPU data), recognized by the torch op open on
the thread when the wait began. For each: how often, how long the host waited
(`host_wait_ns`), how much GPU idle the loss model attributed to it (`gpu_idle_ns`: the
sync_stall gaps it ended, see `gaps.py`), and how it recurs per training step.

Works on host-only data: an Nsight Systems export without GPU activity still has its
synchronize calls; they are counted and their host wait reported, with no GPU idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analyzers import callsites, keys
from gpudiag.analyzers.findings import ADVICE, Contract, Result, format_ns, frame
from gpudiag.analyzers.losses.gaps import idle_gaps
from gpudiag.analyzers.losses.waits import blocking_waits
from gpudiag.trace import Trace

#: innermost torch op at the wait -> the implicit sync it stands for
TORCH_SYNC_OPS = {
    "aten::item": "item", "aten::_local_scalar_dense": "item", "aten::is_nonzero": "item",
    "aten::tolist": "item", "aten::cpu": "to_cpu", "aten::to": "blocking_copy",
    "aten::_to_copy": "blocking_copy", "aten::copy_": "blocking_copy",
    "aten::nonzero": "data_dependent",
    "aten::masked_select": "data_dependent", "aten::unique": "data_dependent",
    "aten::_unique2": "data_dependent", "aten::repeat_interleave": "data_dependent",
    "aten::index": "data_dependent",
}

_ADVICE_BY_KIND = {"item": "sync_item", "to_cpu": "sync_copy", "copy": "sync_copy",
                   "blocking_copy": "sync_copy",
                   "event": "sync_event", "data_dependent": "sync_item"}

COLUMNS = ("kind", "where", "count", "host_wait_ns", "gpu_idle_ns", "steps_with",
           "per_step", "api")


def sync_points(trace: Trace, **gap_options: Any) -> pd.DataFrame:
    """One row per (kind, call site), most GPU idle first: `kind, where, count,
    host_wait_ns, gpu_idle_ns, steps_with, per_step, api`.

        points = sync_points(trace)
        points.head()                       # the syncs that cost the GPU the most
        points[points.kind == "item"]       # the .item() calls

    `steps_with` counts the training steps (step ranges) holding such a sync and
    `per_step` = count / steps; both NA without step markers. `gap_options` go to
    `gaps.idle_gaps`.
    """
    return _points(classified_waits(trace, **gap_options), len(_steps(trace)))


def _points(waits: pd.DataFrame, steps: int) -> pd.DataFrame:
    """`sync_points` of classified waits, `steps` step ranges in all."""
    if waits.empty:
        return _empty()
    waits = waits.assign(host_wait_ns=waits["end_ns"] - waits["start_ns"])
    grouped = waits.groupby(["kind", "where"], sort=False, dropna=False)
    out = grouped.agg(count=("start_ns", "size"), host_wait_ns=("host_wait_ns", "sum"),
                      gpu_idle_ns=("gpu_idle_ns", "sum"), steps_with=("step", "nunique"),
                      api=("api", _most_common)).reset_index()
    if not steps:
        out["steps_with"] = pd.NA
        out["per_step"] = np.nan
    else:
        out["per_step"] = out["count"] / steps
    out = out.sort_values(["gpu_idle_ns", "host_wait_ns"], ascending=False, ignore_index=True)
    return out.loc[:, list(COLUMNS)].astype({"kind": "string", "where": "string",
                                             "steps_with": "Int64", "api": "string"})


def classified_waits(trace: Trace, **gap_options: Any) -> pd.DataFrame:
    """`waits.blocking_waits` with `kind` refined by the torch op open at each wait,
    `where` (the call site), `gpu_idle_ns` (sync_stall time it ended) and `step`.

    Computed once per trace and `gap_options` (`sync_points` and the Perfetto export's sync
    sites both read it); do not modify the frame you get back."""
    key = "classified_waits:" + repr(sorted(gap_options.items()))
    return trace.derived(key, lambda: _classified_waits(trace, gap_options))


def _classified_waits(trace: Trace, gap_options: dict[str, Any]) -> pd.DataFrame:
    waits = blocking_waits(trace).copy()
    if waits.empty:
        return waits.assign(where=pd.Series(dtype="string"), gpu_idle_ns=pd.Series(dtype="int64"),
                            step=pd.Series(dtype="Int64"))
    ops = trace.ranges[trace.ranges["source"] == "torch_op"]
    if len(ops):
        hit = callsites.innermost(ops, waits, waits["start_ns"].to_numpy(np.int64))
        op_names = np.where(hit >= 0, ops["name"].astype(str).to_numpy()[np.maximum(hit, 0)], "")
        implicit = pd.Series(op_names).map(TORCH_SYNC_OPS)
        waits["kind"] = implicit.fillna(waits["kind"]).astype("string")
    where = callsites.where_at(trace, waits["pid"], waits["tid"], waits["start_ns"],
                               waits["rank"])
    fallback = waits["api"].fillna(waits["kind"]).astype(str).to_numpy()
    waits["where"] = pd.array(np.where(pd.isna(where), fallback, where), dtype="string")
    waits["gpu_idle_ns"] = _idle_ended(trace, waits, gap_options)
    waits["step"] = _step_of(trace, waits)
    return waits


def _idle_ended(trace: Trace, waits: pd.DataFrame, gap_options: dict[str, Any]) -> np.ndarray:
    gaps = idle_gaps(trace, **gap_options)
    stalls = gaps[gaps["cause"] == "sync_stall"]
    if stalls.empty:
        return np.zeros(len(waits), dtype=np.int64)
    # by (rank, pid, start): ranks on other hosts reuse pids
    lost = (stalls["end_ns"] - stalls["start_ns"]).groupby(
        [keys.key_array(stalls["rank"]), stalls["pid"], stalls["wait_start_ns"]]).sum()
    found = pd.MultiIndex.from_arrays([keys.key_array(waits["rank"]), waits["pid"],
                                       waits["start_ns"]])
    pos = lost.index.get_indexer(found)
    values = lost.to_numpy(np.int64)
    # several waits may start together (a stream sync under .item()): credit the first
    first = ~found.duplicated()
    return np.where((pos >= 0) & first, values[np.maximum(pos, 0)], 0)


def _steps(trace: Trace) -> pd.DataFrame:
    return trace.ranges[trace.ranges["source"] == "step"]


def _step_of(trace: Trace, waits: pd.DataFrame) -> pd.Series:
    steps = _steps(trace)
    if steps.empty:
        return pd.Series(pd.NA, index=waits.index, dtype="Int64")
    t = waits["start_ns"].to_numpy(np.int64)
    hit = callsites.innermost(steps, waits, t)
    # steps marked on another thread of the process: match by time within (rank, pid)
    other = callsites.innermost(steps, waits, t, ("rank", "pid"))
    hit = np.where(hit >= 0, hit, other)
    return keys.key_column(pd.Series(hit, index=waits.index))  # -1 (keys.MISSING): no step


def _most_common(values: pd.Series) -> object:
    counts = values.dropna().value_counts()
    return counts.index[0] if len(counts) else pd.NA


def analyze(trace: Trace, **gap_options: Any) -> Result:
    """The sync analyzer's one result: its findings, `sync_points`, and `sync_waits` (the
    classified blocking waits they sum, one row per wait: what the Perfetto export names
    its sync_stall slices after), each computed once.

        result = sync.analyze(trace)
        result.tables["sync_points"].head()
        result.tables["sync_waits"][["kind", "where", "gpu_idle_ns"]]
    """
    return combine([part(trace, **gap_options)])


@dataclass(frozen=True)
class Part:
    """What one rank (or any slice of a job by whole processes) contributes: its
    classified waits, its step ranges and whether it has GPU activity. `combine` of the
    parts of a job's ranks is the analysis of the merged job."""

    waits: pd.DataFrame
    steps: int
    host_only: bool


def part(trace: Trace, **gap_options: Any) -> Part:
    """This rank's share of the sync analysis (see `combine`)."""
    return Part(classified_waits(trace, **gap_options), len(_steps(trace)),
                trace.kernels.empty and trace.copies.empty)


def combine(parts: list[Part]) -> Result:
    """The analysis of the ranks whose parts these are, in their merge order: the waits
    concatenated in time order (step positions numbered across the job, as in a merged
    trace), then grouped by call site."""
    frames, offset = [], 0
    for piece in parts:
        frames.append(piece.waits.assign(step=piece.waits["step"] + offset) if offset
                      else piece.waits)
        offset += piece.steps
    waits = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True).sort_values(
        "start_ns", kind="stable", ignore_index=True)  # as `blocking_waits` sorts them
    points = _points(waits, offset)
    host_only = all(piece.host_only for piece in parts)
    return Result(_findings(points, host_only), {"sync_points": points, "sync_waits": waits})


def findings(trace: Trace, *, min_lost_ns: int = 0, points: pd.DataFrame | None = None,
             **gap_options: Any) -> pd.DataFrame:
    """Sync points that cost GPU time (or, on host-only data, host time), as findings.

        findings(trace).head()

    `points`: a `sync_points` result to reuse (else computed with `gap_options`).
    """
    points = sync_points(trace, **gap_options) if points is None else points
    return _findings(points, trace.kernels.empty and trace.copies.empty, min_lost_ns)


def _findings(points: pd.DataFrame, host_only: bool, min_lost_ns: int = 0) -> pd.DataFrame:
    """Findings of sync points: by GPU idle, or by host wait when there is no GPU."""
    if host_only:  # no GPU timeline: rank by the host time blocked instead
        points = points[points["host_wait_ns"] > 0].assign(gpu_idle_ns=points["host_wait_ns"])
    else:
        points = points[points["gpu_idle_ns"] > min_lost_ns]
    note = " (host time: the trace has no GPU activity)" if host_only else ""
    rows = [{
        "cause": "sync_stall", "lost_ns": p.gpu_idle_ns, "where": p.where, "count": p.count,
        "evidence": _evidence(p) + note,
        "advice": advice_of(str(p.kind)), "kind": kind_of(str(p.kind)),
    } for p in points.itertuples()]  # one per sync site: a few dozen at most
    return frame(rows)


def advice_of(kind: str) -> str:
    """The advice of a sync site's finding, by the kind of its waits."""
    return ADVICE[kind_of(kind)]


def kind_of(kind: str) -> str:
    """The finding kind (`ADVICE` key) of a sync site, by the kind of its waits."""
    return _ADVICE_BY_KIND.get(kind, "sync_device")


def _evidence(p: Any) -> str:
    per_step = p.per_step
    recur = f", {per_step:.1f} per step" if pd.notna(per_step) else ""
    api = p.api
    via = f" via {api}" if isinstance(api, str) else ""
    return (f"{p.count} {p.kind} syncs{via}{recur}; host waited "
            f"{format_ns(p.host_wait_ns)}, GPU idle after them {format_ns(p.gpu_idle_ns)}")


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="string") for c in ("kind", "where", "api")}
                        | {c: pd.Series(dtype="int64") for c in ("count", "host_wait_ns",
                                                                 "gpu_idle_ns")}
                        | {"steps_with": pd.Series(dtype="Int64"),
                           "per_step": pd.Series(dtype="float64")}).loc[:, list(COLUMNS)]


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
