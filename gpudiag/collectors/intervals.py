"""Vectorized helpers on time intervals shared by the readers."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def nesting_depth(group: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike) -> IntArray:
    """Depth of each interval in the stack of its group (0 = outermost).

    The depth of interval i is the number of intervals of its group that opened before it
    (ties: the longer one first) and had not closed when i opened; an interval that ends
    exactly where i starts has closed. For properly nested ranges (one thread's call stack)
    this is the stack depth; for ranges that overlap without nesting it is the number open.
    No Python loop per interval: times are rank-encoded into one int64 key per (group, time)
    and counted with one sort and one searchsorted.
    """
    g = np.asarray(group)
    s = np.asarray(start, dtype=np.int64)
    e = np.maximum(np.asarray(end, dtype=np.int64), s)
    n = len(s)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    _, gcode = np.unique(g, return_inverse=True)
    gcode = gcode.astype(np.int64)
    times, inverse = np.unique(np.concatenate([s, e]), return_inverse=True)
    span = np.int64(len(times) + 1)
    srank, erank = inverse[:n].astype(np.int64), inverse[n:].astype(np.int64)

    order = np.lexsort((-erank, srank, gcode))  # group, start asc, end desc
    gs, ss, es = gcode[order], srank[order], erank[order]
    first_in_group = np.searchsorted(gs, gs, side="left")
    position = np.arange(n, dtype=np.int64) - first_in_group

    end_keys = np.sort(gs * span + es)
    ended = np.searchsorted(end_keys, gs * span + ss, side="right") - first_in_group
    # Zero-length intervals starting where i starts sort after i yet count as ended: undo that.
    zero = es == ss
    key = gs * span + ss
    same_start_last = np.searchsorted(key, key, side="right") - 1
    zero_count = _count_by_key(key, zero)
    zero_block_first = same_start_last - zero_count + 1
    own = np.arange(n, dtype=np.int64)
    overcount = np.where(zero, zero_count - (own - zero_block_first), zero_count)
    depth_sorted = position - (ended - overcount)
    depth = np.empty(n, dtype=np.int64)
    depth[order] = np.maximum(depth_sorted, 0)
    return depth


def _count_by_key(key: IntArray, flag: npt.NDArray[np.bool_]) -> IntArray:
    """For each position of sorted `key`, how many positions with the same key have `flag`."""
    _, idx, counts_inv = np.unique(key, return_index=True, return_inverse=True)
    sums = np.add.reduceat(flag.astype(np.int64), idx)
    return sums[counts_inv]


def us_to_ns(values: npt.ArrayLike) -> IntArray:
    """Microseconds (float, as Chrome traces write them) to exact integer nanoseconds.

    Splitting off the integer part keeps nanosecond precision for epoch-scale timestamps,
    where `ts * 1000` in float64 would round to 256 ns.
    """
    us = np.asarray(values, dtype=np.float64)
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
