"""The allocator's layout as an address x time grid, for a heatmap (drawn by reports/).

    g = occupancy_grid(trace, max_addresses=128, max_times=100)
    g.pivot(index="address_bin", columns="time_bin", values="allocated_share")
    g[g.time_bin == g.time_bin.max()].state.value_counts()

Addresses are *stacked*: every range of addresses reserved at some sampled moment, in
address order, laid end to end, so the gaps between segments (gigabytes of unrelated
virtual address space) take no room. The stacked axis is cut into at most `max_addresses`
equal bins, the history into at most `max_times` evenly spaced states (by event count, the
first and the last included); each cell says what share of its bytes were allocated,
inactive (free inside a segment) or unreserved at that moment. Cost: one layout copy per
sampled state during the replay, then `searchsorted` and cumulative sums per state, so
O(max_times x (blocks + max_addresses)), whatever the history's length.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers.memory.layout import MIN_BLOCK, Frozen
from gpudiag.analyzers.memory.replay import Key, replay_devices
from gpudiag.intervals import union
from gpudiag.trace import Trace

STATES = ("allocated", "inactive", "unreserved")
COLUMNS = {"rank": "Int64", "device": "Int64", "time_bin": "int64", "ts_ns": "int64",
           "address_bin": "int64", "offset_bytes": "int64", "bin_bytes": "int64",
           "allocated_share": "float64", "inactive_share": "float64",
           "unreserved_share": "float64", "state": "category"}
IntArray = npt.NDArray[np.int64]


def occupancy_grid(trace: Trace, *, max_addresses: int = 256,
                   max_times: int = 200) -> pd.DataFrame:
    """One row per (device, sampled moment, address bin): what the bytes there were doing.

        g = occupancy_grid(trace)
        g.pivot(index="address_bin", columns="time_bin", values="inactive_share")
        g.groupby("time_bin").inactive_share.mean()

    Columns `rank, device, time_bin, ts_ns, address_bin, offset_bytes, bin_bytes,
    allocated_share, inactive_share, unreserved_share, state` (`offset_bytes`: where the bin
    starts on the stacked axis; `state`: the largest share). At most `max_addresses` x
    `max_times` rows per device. Needs a snapshot: without the block layout there is
    nothing to draw, and the frame is empty.
    """
    frames = []
    for key, steps in replay_devices(trace, samples=max(max_times, 1)).items():
        layouts = [steps.kept[state] for state in sorted(steps.kept)]
        if not layouts:
            continue
        axis = _axis(layouts)
        total = int((axis[1] - axis[0]).sum())
        bins = int(max(1, min(max_addresses, total // MIN_BLOCK)))
        edges = np.linspace(0, total, bins + 1).round().astype(np.int64)
        used = np.vstack([_covered(layout.blocks, axis, edges) for layout in layouts])
        free = np.vstack([_covered(layout.free, axis, edges) for layout in layouts])
        times = _state_times(trace, steps.row)[sorted(steps.kept)]
        frames.append(_cells(key, times, edges, used, free))
    if not frames:
        return pd.DataFrame({col: pd.Series(dtype=dtype) for col, dtype in COLUMNS.items()})
    out = pd.concat(frames, ignore_index=True)
    return out.astype({col: dtype for col, dtype in COLUMNS.items() if dtype != "category"})


def _state_times(trace: Trace, rows: IntArray) -> IntArray:
    """ts_ns of each state: the event that led to it; the first event's for the start."""
    times = trace.memory["ts_ns"].to_numpy(np.int64)[rows[1:]]
    # -1: a snapshot without history, time unknown
    return np.concatenate([times[:1], times]) if len(times) else np.array([-1], dtype=np.int64)


def _axis(layouts: list[Frozen]) -> tuple[IntArray, IntArray, IntArray]:
    """(starts, ends, stacked offset of each start) of every range reserved in `layouts`."""
    segs = np.concatenate([layout.segments for layout in layouts]).reshape(-1, 2)
    starts, ends = union(segs[:, 0], segs[:, 1])
    offsets = np.concatenate([[0], np.cumsum(ends - starts)[:-1]]).astype(np.int64)
    return starts, ends, offsets


def _covered(spans: IntArray, axis: tuple[IntArray, IntArray, IntArray],
             edges: IntArray) -> IntArray:
    """Bytes of the disjoint address ranges `spans` inside each stacked bin."""
    if not len(spans):
        return np.zeros(len(edges) - 1, dtype=np.int64)
    starts, _, offsets = axis
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    reserved = np.searchsorted(starts, spans[:, 0], side="right") - 1  # its reserved range
    stacked = offsets[reserved] + spans[:, 0] - starts[reserved]  # where it starts, stacked
    length = spans[:, 1] - spans[:, 0]
    before = np.concatenate([[0], np.cumsum(length)])
    # bytes below each edge: whole spans before it plus the part of the one it cuts
    cut = np.searchsorted(stacked, edges, side="right") - 1
    safe = np.maximum(cut, 0)
    below = np.where(cut >= 0,
                     before[safe] + np.clip(edges - stacked[safe], 0, length[safe]), 0)
    return np.diff(below).astype(np.int64)


def _cells(key: Key, state_times: IntArray, edges: IntArray, used: IntArray,
           free: IntArray) -> pd.DataFrame:
    """The grid of one device from bytes per (state, bin) allocated (`used`) and free."""
    times, bins = used.shape
    size = np.diff(edges)
    unreserved = size - used - free  # integers, so the three shares sum to exactly 1
    shares = np.stack([used, free, unreserved]) / np.maximum(size, 1)
    return pd.DataFrame({
        "rank": key[0], "device": key[1], "time_bin": np.repeat(np.arange(times), bins),
        "ts_ns": np.repeat(state_times, bins), "address_bin": np.tile(np.arange(bins), times),
        "offset_bytes": np.tile(edges[:-1], times), "bin_bytes": np.tile(size, times),
        "allocated_share": shares[0].ravel(), "inactive_share": shares[1].ravel(),
        "unreserved_share": shares[2].ravel(),
        "state": pd.Categorical.from_codes(shares.argmax(axis=0).ravel(),
                                           categories=list(STATES)),
    })
