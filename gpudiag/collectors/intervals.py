"""Vectorized helpers on time intervals shared by the readers."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def nesting_depth(group: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike) -> IntArray:
    """Depth of each interval in the stack of its group (0 = outermost).

    The depth of interval i is the number of other intervals of its group that contain it
    (open no later, close no earlier; of two identical intervals the first listed contains
    the second). For one thread's properly nested call stack this is the stack depth; where
    ranges overlap without nesting (clock rounding in real traces) an interval that is open
    when i starts but closes before i ends does not count, so a child is always deeper than
    the range that contains it.

    No Python loop per interval: times are rank-encoded into one int64 key per (group, time),
    the intervals open at each start are counted with one sort and one searchsorted, and
    only intervals that are partially overlapped are corrected one at a time.
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
    start_key = gs * span + ss
    first_in_group = np.searchsorted(gs, gs, side="left")
    position = np.arange(n, dtype=np.int64) - first_in_group

    end_keys = np.sort(gs * span + es)
    ended = np.searchsorted(end_keys, start_key, side="right") - first_in_group
    # Zero-length intervals starting where i starts sort after i yet count as ended: undo that.
    zero = es == ss
    same_start_last = np.searchsorted(start_key, start_key, side="right") - 1
    zero_count = _count_by_key(start_key, zero)
    zero_block_first = same_start_last - zero_count + 1
    own = np.arange(n, dtype=np.int64)
    overcount = np.where(zero, zero_count - (own - zero_block_first), zero_count)
    depth_sorted = position - (ended - overcount)
    depth_sorted -= _partial_overlaps(start_key, gs * span + es, es)
    depth = np.empty(n, dtype=np.int64)
    depth[order] = np.maximum(depth_sorted, 0)
    return depth


def _partial_overlaps(start_key: IntArray, end_key: IntArray, end_rank: IntArray) -> IntArray:
    """For each interval (in sorted order), how many intervals that opened before it are
    still open at its start but close before its end (they overlap it without containing it)."""
    n = len(start_key)
    # Intervals starting inside interval j occupy positions (j, last_j): those among them
    # that end after j are j's partial overlappers.
    last = np.searchsorted(start_key, end_key, side="left")
    lo = np.arange(n, dtype=np.int64) + 1
    has_inner = last > lo
    inner_max = np.full(n, -1, dtype=np.int64)
    inner_max[has_inner] = range_max(end_rank, lo[has_inner], last[has_inner])
    correction = np.zeros(n, dtype=np.int64)
    for j in np.flatnonzero(inner_max > end_rank):  # rare: only improperly nested data
        inner = np.arange(lo[j], last[j])
        correction[inner[end_rank[inner] > end_rank[j]]] += 1
    return correction


def range_max(values: IntArray, lo: IntArray, hi: IntArray) -> IntArray:
    """max(values[lo[q]:hi[q]]) for every query q (each range non-empty), in O(n log n) time
    and O(n) memory: a sparse table built one level at a time, answering the queries whose
    length needs that level before the next is built."""
    length = hi - lo
    level_of = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    out = np.empty(len(lo), dtype=values.dtype)
    table = values.copy()
    for level in range(int(level_of.max()) + 1 if len(lo) else 0):
        if level:
            half = 1 << (level - 1)
            table = np.maximum(table[:-half], table[half:])
        queries = np.flatnonzero(level_of == level)
        width = 1 << level
        out[queries] = np.maximum(table[lo[queries]], table[hi[queries] - width])
    return out


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
