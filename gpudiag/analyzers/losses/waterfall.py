"""The loss waterfall: every nanosecond of each device's window attributed to one cause.

Per device (a `(rank, device)` pair) the window runs from its first to its last GPU event.
Idle time is cut into gaps and attributed by `gaps.py`. Busy time (the union of kernels,
copies and memsets on all streams) is cut at every event boundary into segments, and each
segment is attributed by what ran in it:

- only copies or memsets ran: **copy** (exposed transfer time);
- only collective kernels ran: **comm_wait** for the part inside a rank's wait for its
  peers (cross-rank arrival skew, from `collectives.wait_intervals`), **useful** for the
  rest (the transfer itself; exposed communication is reported as a finding, not a loss);
- compute kernels ran: **small_grid** for the fraction `max(0, 1 - sum(e))` of the
  segment, where `e` is each running compute kernel's SM efficiency (`tail_efficiency`
  from `launch.occupancy`: waves / ceil(waves), the share of block slots its grid fills)
  — concurrent kernels fill each other's empty SMs, so a small grid beside a big one loses
  nothing; kernels whose efficiency is unknown count as 1 (no claim without evidence);
  **useful** for the rest.

`useful` is the window minus every other cause, so the rows of a device sum to its window
exactly. The same layers answer the question for any sub-window (a step, a heatmap bin)
through cumulative sums, without re-running the analysis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals
from gpudiag.analyzers import keys
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses.gaps import device_events, idle_gaps
from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS
from gpudiag.trace import Trace

#: collective kernels by name, as HTA classifies COMMUNICATION (plus RCCL)
COMM_KERNEL = re.compile(r"^nccl|ncclKernel|ncclDev|^hccl|^rccl", re.IGNORECASE)

Layer = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]
#: (rank, device) as plain ints, `keys.MISSING` for NA (dict keys must compare equal)
DeviceKey = tuple[int, int]


def device_key(rank: Any, device: Any) -> DeviceKey:
    """The `LossTimeline` key of a device: NA (pd.NA, None, NaN) as `keys.MISSING`."""
    return (keys.MISSING if pd.isna(rank) else int(rank),
            keys.MISSING if pd.isna(device) else int(device))


@dataclass
class LossTimeline:
    """Per device, the window and one layer of weighted disjoint intervals per cause.

    Both dicts are keyed by `DeviceKey`; `amounts` also takes the (rank, device) of a
    table row as it is, NA included (`(pd.NA, 0)`: device 0 of a trace without ranks)."""

    windows: dict[DeviceKey, tuple[int, int]] = field(default_factory=dict)
    layers: dict[DeviceKey, dict[str, Layer]] = field(default_factory=dict)
    #: per device, the union of the segments where only collective kernels ran: what
    #: comm_wait is carved from once the ranks' waits are known (a job's ranks are read
    #: apart, and their waits need every rank's collectives: `jobs` intersects them later)
    comm_only: dict[DeviceKey, intervals.Spans] = field(default_factory=dict)

    def amounts(self, key: tuple[Any, Any],
                edges: npt.ArrayLike) -> dict[str, npt.NDArray[np.float64]]:
        """Time of each cause between consecutive `edges` (clipped to the window); `useful`
        is the residual, so each bin's causes sum to its in-window length. `key` is the
        device's (rank, device), NA where unknown (a `DeviceKey` of `windows` works too)."""
        key = device_key(*key)
        first, last = self.windows[key]
        bounds = np.clip(np.asarray(edges, dtype=np.int64), first, last)
        out = {cause: np.diff(_weighted_before(layer, bounds))
               for cause, layer in self.layers[key].items()}
        out["useful"] = (np.diff(bounds).astype(np.float64)
                         - sum(out.values(), np.zeros(len(bounds) - 1)))
        return out

    def totals(self, window: tuple[int, int] | None = None) -> pd.DataFrame:
        """`rank, device, cause, lost_ns, share` over each device's window (or `window`)."""
        rows = []
        for key, (first, last) in self.windows.items():
            start, end = clip_window((first, last), window)
            if window is not None and end - start <= 0:
                continue  # the device ran nothing in the window
            amounts = self.amounts(key, [start, max(start, end)])
            lost = {cause: round(float(amounts.get(cause, [0.0])[0])) for cause in LOSS_CAUSES
                    if cause != "useful"}
            rows += loss_rows(key, max(end - start, 0), lost)
        return losses_frame(rows)


def clip_window(device_window: tuple[int, int], window: tuple[int, int] | None
                ) -> tuple[int, int]:
    """A device's window cut to the analyzed window (itself when there is none)."""
    first, last = device_window
    return (first, last) if window is None else (max(first, window[0]), min(last, window[1]))


def loss_rows(key: DeviceKey, length: int, lost: dict[str, int]) -> list[dict[str, object]]:
    """The waterfall rows of one device: each cause's lost time, `useful` the rest."""
    lost = {**lost, "useful": length - sum(v for c, v in lost.items() if c != "useful")}
    return [{"rank": key[0], "device": key[1], "cause": cause, "lost_ns": lost[cause],
             "share": lost[cause] / length if length else np.nan} for cause in LOSS_CAUSES]


def losses_frame(rows: list[dict[str, object]] | None = None) -> pd.DataFrame:
    """The waterfall table of `rows` whose rank and device are `DeviceKey` ints: NA again
    where they are `keys.MISSING`."""
    out = pd.DataFrame(rows or [], columns=["rank", "device", "cause", "lost_ns", "share"])
    out["rank"] = keys.key_column(out["rank"])
    out["device"] = keys.key_column(out["device"])
    return out.astype({"cause": "string", "lost_ns": "int64", "share": "float64"})


def loss_timeline(trace: Trace, *, efficiency: pd.Series | None = None,
                  comm_waits: pd.DataFrame | None = None,
                  launch_gap_ns: int = LAUNCH_GAP_NS, sync_tolerance_ns: int = SYNC_TOLERANCE_NS,
                  window: tuple[int, int] | None = None) -> LossTimeline:
    """The attribution of every device's window, as layers (see the module docstring).

        tl = loss_timeline(trace)
        tl.totals()                              # the waterfall
        tl.amounts((pd.NA, 0), range(t0, t1, 10**6))  # per-ms causes, device 0, no rank

    `efficiency` (aligned with `trace.kernels`) and `comm_waits` come from the launch and
    collectives analyzers; without them small_grid and comm_wait are 0.
    """
    timeline = LossTimeline()
    if not trace.meta.get("timeline", True):  # e.g. Nsight Compute's serialized replays
        return timeline
    events = device_events(trace)
    weight, comm = _kernel_weights(trace, efficiency)
    gaps = idle_gaps(trace, launch_gap_ns=launch_gap_ns, sync_tolerance_ns=sync_tolerance_ns,
                     window=window)
    waits = comm_waits if comm_waits is not None else pd.DataFrame(
        columns=["rank", "device", "start_ns", "end_ns"])
    wait_rows, idle = by_device(waits), _idle_layers(gaps)
    no_waits = waits.iloc[0:0]
    for key, idx in events.by_device.items():
        first, last = int(events.start[idx].min()), int(events.end[idx].max())
        if window is not None:
            first, last = max(first, window[0]), min(last, window[1])
        if last <= first:
            continue
        timeline.windows[key] = (first, last)
        is_kernel = events.table[idx] == 0
        rows = events.row[idx]
        weights = np.full(len(idx), np.nan)  # NaN marks copies
        weights[is_kernel] = weight.reindex(rows[is_kernel]).to_numpy(np.float64)
        is_comm = np.zeros(len(idx), dtype=bool)
        is_comm[is_kernel] = comm.reindex(rows[is_kernel]).to_numpy(bool)
        layers, timeline.comm_only[key] = _busy_layers(
            events.start[idx], events.end[idx], weights=weights, is_comm=is_comm,
            waits=wait_rows.get(key, no_waits), first=first, last=last)
        for cause, layer in idle.get(key, _NO_IDLE).items():
            old = layers.get(cause)
            layers[cause] = layer if old is None else (  # disjoint: busy vs idle copy time
                np.concatenate([old[0], layer[0]]), np.concatenate([old[1], layer[1]]),
                np.concatenate([old[2], layer[2]]))
        timeline.layers[key] = layers
    return timeline


def losses(trace: Trace, **options: object) -> pd.DataFrame:
    """The waterfall: `rank, device, cause, lost_ns, share`, one row per cause per device.

        dx = losses(trace)
        dx.pivot_table(index="cause", columns="device", values="share")
        dx.groupby("device").lost_ns.sum()   # == each device's window

    Options are those of `loss_timeline`.
    """
    return loss_timeline(trace, **options).totals()  # type: ignore[arg-type]


def _kernel_weights(trace: Trace, efficiency: pd.Series | None
                    ) -> tuple[pd.Series, pd.Series]:
    """Per kernel (index of `trace.kernels`): the SM efficiency used by the small-grid
    rule (1 when unknown, 0 for collective kernels) and whether it is a collective."""
    kernels = trace.kernels
    eff = pd.Series(1.0, index=kernels.index)
    if efficiency is not None and len(kernels):
        eff = efficiency.reindex(kernels.index).fillna(1.0).clip(0.0, 1.0).astype("float64")
    comm = (keys.matches(kernels["name"], COMM_KERNEL)
            | kernels["kernel_id"].isin(trace.collectives["kernel_id"].dropna()).to_numpy(bool))
    return eff.where(~comm, 0.0), pd.Series(comm, index=kernels.index)


def _busy_layers(start: npt.NDArray[np.int64], end: npt.NDArray[np.int64], *,
                 weights: npt.NDArray[np.float64], is_comm: npt.NDArray[np.bool_],
                 waits: pd.DataFrame, first: int, last: int
                 ) -> tuple[dict[str, Layer], intervals.Spans]:
    start, end = np.clip(start, first, last), np.clip(end, first, last)
    is_copy = np.isnan(weights)
    compute = ~is_copy & ~is_comm
    sweep = intervals.Sweep(start, end)  # each column reduced before the next is summed
    seg_start, seg_end = sweep.start, sweep.end
    has_compute = sweep.sum(compute) > 0.5
    small = np.where(has_compute,
                     np.clip(1.0 - sweep.sum(np.where(compute, weights, 0.0)), 0.0, 1.0), 0.0)
    small[small < 1e-9] = 0.0
    has_comm = sweep.sum(is_comm) > 0.5
    copy_only = ~has_compute & ~has_comm & (sweep.sum(is_copy) > 0.5)
    comm_only = ~has_compute & has_comm
    keep = small > 0
    only_comm = intervals.union(seg_start[comm_only], seg_end[comm_only])
    return {"small_grid": (seg_start[keep], seg_end[keep], small[keep]),
            "copy": (seg_start[copy_only], seg_end[copy_only], np.ones(int(copy_only.sum()))),
            "comm_wait": comm_wait_layer(only_comm, waits)}, only_comm


def comm_wait_layer(comm_only: intervals.Spans, waits: pd.DataFrame) -> Layer:
    """The comm_wait layer of a device: where only collectives ran and the rank waited for
    its peers (`waits`: that device's rows of `collectives.wait_intervals`)."""
    spans = intervals.intersect(comm_only, intervals.union(waits["start_ns"], waits["end_ns"]))
    return (*spans, np.ones(len(spans[0])))


IDLE_CAUSES = ("sync_stall", "launch_bound", "host_bound", "copy")
_NO_IDLE: dict[str, Layer] = {cause: (np.zeros(0, np.int64), np.zeros(0, np.int64),
                                      np.ones(0)) for cause in IDLE_CAUSES}


def _idle_layers(gaps: pd.DataFrame) -> dict[DeviceKey, dict[str, Layer]]:
    """Each device's idle pieces as one layer per cause (weight 1)."""
    rank, device = keys.key_array(gaps["rank"]), keys.key_array(gaps["device"])
    cause = gaps["cause"].to_numpy(dtype=object, na_value=None)
    start, end = gaps["start_ns"].to_numpy(np.int64), gaps["end_ns"].to_numpy(np.int64)
    out: dict[DeviceKey, dict[str, Layer]] = {}
    for (rank_key, device_key), rows in keys.positions(rank, device):
        layers: dict[str, Layer] = {}
        for name in IDLE_CAUSES:
            hit = rows[cause[rows] == name]
            layers[name] = (start[hit], end[hit], np.ones(len(hit)))
        out[(int(rank_key), int(device_key))] = layers
    return out


def by_device(frame: pd.DataFrame) -> dict[DeviceKey, pd.DataFrame]:
    """The rows of `frame` (rank and device NA where unknown) on each of its devices, keyed
    by `DeviceKey`: one pass, where a selection per device costs devices x rows."""
    rank, device = keys.key_array(frame["rank"]), keys.key_array(frame["device"])
    return {(int(rank_key), int(device_key)): frame.iloc[rows]
            for (rank_key, device_key), rows in keys.positions(rank, device)}


def _weighted_before(layer: Layer, times: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """For each time, the weighted length of the layer before it (layers are disjoint)."""
    starts, ends, weights = layer
    if len(starts) == 0:
        return np.zeros(len(times))
    order = np.argsort(starts, kind="stable")
    starts, ends, weights = starts[order], ends[order], weights[order]
    weighted = (ends - starts) * weights
    before = np.concatenate([[0.0], np.cumsum(weighted)[:-1]])
    idx = np.searchsorted(starts, times, side="right") - 1
    safe = np.maximum(idx, 0)
    partial = np.clip(times - starts[safe], 0, ends[safe] - starts[safe]) * weights[safe]
    return np.where(idx >= 0, before[safe] + partial, 0.0)
