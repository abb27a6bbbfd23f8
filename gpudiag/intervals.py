"""Time intervals on numpy arrays: the algebra the analyzers share, and the readers' nesting.

Every analyzer asks the same few questions of time intervals: what is their union (busy
time), what is left of a window outside it (idle gaps), how much of each interval lies
inside a set of disjoint intervals (overlap). Doing these with sorts, cumulative sums and
`searchsorted` keeps a 10-million-kernel trace free of Python loops per event.

Intervals are half-open `[start, end)` in int64 ns. A "set" is sorted, disjoint and
non-touching (what `union` returns). The readers use `nesting_depth` (the stack depth of
each range in its thread) and `us_to_ns` (exact microseconds to nanoseconds).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Spans = tuple[IntArray, IntArray]


def as_ns(values: npt.ArrayLike) -> IntArray:
    return np.asarray(values, dtype=np.int64)


def union(start: npt.ArrayLike, end: npt.ArrayLike) -> Spans:
    """The union of intervals as a set; intervals that touch are merged (as HTA merges).

    Empty intervals (end <= start) add nothing.
    """
    starts, ends = as_ns(start), as_ns(end)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.empty(len(starts), dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(starts) - 1)
    return starts[first], reach[last]


def total(spans: Spans) -> int:
    starts, ends = spans
    return int((ends - starts).sum())


def complement(spans: Spans, lo: int, hi: int) -> Spans:
    """The parts of `[lo, hi)` outside a set: the gaps."""
    inner_starts, inner_ends = clip(spans, lo, hi)
    starts = np.concatenate([[lo], inner_ends]).astype(np.int64)
    ends = np.concatenate([inner_starts, [hi]]).astype(np.int64)
    keep = ends > starts
    return starts[keep], ends[keep]


def clip(spans: Spans, lo: int, hi: int) -> Spans:
    """A set restricted to `[lo, hi)`."""
    starts, ends = np.maximum(spans[0], lo), np.minimum(spans[1], hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def covered_before(spans: Spans, t: npt.ArrayLike) -> IntArray:
    """For each time t, how much of the set lies before t."""
    starts, ends = spans
    t = as_ns(t)
    if len(starts) == 0:
        return np.zeros(t.shape, dtype=np.int64)
    lengths = ends - starts
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    inside = idx >= 0
    safe = np.maximum(idx, 0)
    partial = np.clip(t - starts[safe], 0, lengths[safe])
    return np.where(inside, before[safe] + partial, 0)


def overlap(start: npt.ArrayLike, end: npt.ArrayLike, spans: Spans) -> IntArray:
    """For each interval `[start, end)`, the length of it that lies inside the set."""
    starts, ends = as_ns(start), as_ns(end)
    return np.maximum(
        covered_before(spans, np.maximum(ends, starts)) - covered_before(spans, starts), 0)


def intersect(a: Spans, b: Spans) -> Spans:
    """The intersection of two sets, as a set."""
    return _where_count(a, b, 2)


def subtract(a: Spans, b: Spans) -> Spans:
    """The parts of set `a` outside set `b`."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return a
    both = intersect(a, b)
    low, high = int(a[0][0]), int(a[1][-1])
    return intersect(a, complement(both, low, high))


def _where_count(first: Spans, second: Spans, level: int) -> Spans:
    """Where the number of sets covering a time equals `level` (a sweep line)."""
    times = np.concatenate([first[0], first[1], second[0], second[1]])
    steps = np.concatenate([np.ones(len(first[0])), -np.ones(len(first[1])),
                            np.ones(len(second[0])), -np.ones(len(second[1]))]).astype(np.int64)
    if len(times) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((steps, times))  # at one time, ends before starts
    times, depth = times[order], np.cumsum(steps[order])
    covering = depth[:-1] == level
    starts, ends = times[:-1][covering], times[1:][covering]
    return union(starts, ends)


class Sweep:
    """The timeline cut at every boundary of a set of intervals, into elementary segments
    `[start, end)`; `sum(weights)` gives, per segment, the sum of a weight over the
    intervals covering it (weights of 1: how many cover it).

    One column at a time, so a caller can reduce each to what it needs (a flag, a lost
    fraction) before the next: with ten million kernels a segments x columns matrix was
    the largest allocation of the whole diagnosis. Segments covered by nothing are
    included (sums 0)."""

    def __init__(self, start: npt.ArrayLike, end: npt.ArrayLike) -> None:
        starts, ends = as_ns(start), as_ns(end)
        self._keep = ends > starts
        times = np.concatenate([starts[self._keep], ends[self._keep]])
        self._order = np.argsort(times, kind="stable")
        times = times[self._order]
        self._nonempty = np.flatnonzero(times[1:] > times[:-1])
        self.start = times[self._nonempty]
        self.end = times[self._nonempty + 1]

    def sum(self, weight: npt.ArrayLike) -> npt.NDArray[np.float64]:
        weights = np.asarray(weight, dtype=np.float64)[self._keep]
        steps = np.concatenate([weights, -weights])[self._order]
        return np.cumsum(steps)[self._nonempty]


def segments(start: npt.ArrayLike, end: npt.ArrayLike,
             weights: npt.ArrayLike | None = None
             ) -> tuple[IntArray, IntArray, npt.NDArray[np.float64]]:
    """`Sweep` in one call: segments `[s, e)` and a (segments x k) matrix of the sums of
    each weight column (`weights` (n,) or (n, k); without it, the covering count)."""
    sweep = Sweep(start, end)
    s_arr = as_ns(start)
    matrix = np.ones((len(s_arr), 1)) if weights is None else np.asarray(weights, dtype=np.float64)
    matrix = matrix.reshape(len(s_arr), -1)
    sums = np.column_stack([sweep.sum(matrix[:, column]) for column in range(matrix.shape[1])]) \
        if matrix.shape[1] else np.zeros((len(sweep.start), 0))
    return sweep.start, sweep.end, sums

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
    groups = np.asarray(group)
    starts = np.asarray(start, dtype=np.int64)
    ends = np.maximum(np.asarray(end, dtype=np.int64), starts)
    count = len(starts)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    _, gcode = np.unique(groups, return_inverse=True)
    gcode = gcode.astype(np.int64)
    times, inverse = np.unique(np.concatenate([starts, ends]), return_inverse=True)
    span = np.int64(len(times) + 1)
    srank, erank = inverse[:count].astype(np.int64), inverse[count:].astype(np.int64)

    order = np.lexsort((-erank, srank, gcode))  # group, start asc, end desc
    sorted_group, sorted_start, sorted_end = gcode[order], srank[order], erank[order]
    start_key = sorted_group * span + sorted_start
    first_in_group = np.searchsorted(sorted_group, sorted_group, side="left")
    position = np.arange(count, dtype=np.int64) - first_in_group

    end_keys = np.sort(sorted_group * span + sorted_end)
    ended = np.searchsorted(end_keys, start_key, side="right") - first_in_group
    # Zero-length intervals starting where i starts sort after i yet count as ended: undo that.
    zero = sorted_end == sorted_start
    same_start_last = np.searchsorted(start_key, start_key, side="right") - 1
    zero_count = _count_by_key(start_key, zero)
    zero_block_first = same_start_last - zero_count + 1
    own = np.arange(count, dtype=np.int64)
    overcount = np.where(zero, zero_count - (own - zero_block_first), zero_count)
    depth_sorted = position - (ended - overcount)
    depth_sorted -= _partial_overlaps(start_key, sorted_group * span + sorted_end, sorted_end)
    depth = np.empty(count, dtype=np.int64)
    depth[order] = np.maximum(depth_sorted, 0)
    return depth


def _partial_overlaps(start_key: IntArray, end_key: IntArray, end_rank: IntArray) -> IntArray:
    """For each interval (in sorted order), how many intervals that opened before it are
    still open at its start but close before its end (they overlap it without containing it)."""
    count = len(start_key)
    # Intervals starting inside interval j occupy positions (j, last_j): those among them
    # that end after j are j's partial overlappers.
    last = np.searchsorted(start_key, end_key, side="left")
    first_inner = np.arange(count, dtype=np.int64) + 1
    has_inner = last > first_inner
    inner_max = np.full(count, -1, dtype=np.int64)
    inner_max[has_inner] = range_max(end_rank, first_inner[has_inner], last[has_inner])
    correction = np.zeros(count, dtype=np.int64)
    for outer in np.flatnonzero(inner_max > end_rank):  # rare: only improperly nested data
        inner = np.arange(first_inner[outer], last[outer])
        correction[inner[end_rank[inner] > end_rank[outer]]] += 1
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
    micros = np.asarray(values, dtype=np.float64)
    whole = np.floor(micros)
    return whole.astype(np.int64) * 1000 + np.rint((micros - whole) * 1000).astype(np.int64)
