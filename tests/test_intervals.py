"""Interval helpers: nesting depth against a brute-force oracle, exact µs -> ns."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.intervals import nesting_depth, range_max, us_to_ns


def contains(j: tuple[int, int, int, int], i: tuple[int, int, int, int]) -> bool:
    """Oracle: j (group, start, end, index) contains i."""
    gj, sj, ej, kj = j
    gi, si, ei, ki = i
    if gj != gi or kj == ki or not (sj <= si and ei <= ej and si < ej):
        return False
    if (sj, ej) == (si, ei):
        return kj < ki  # of two identical intervals the first listed contains the second
    return True


intervals = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(0, 30), st.integers(1, 12)),
    min_size=1, max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_depth_counts_the_intervals_that_contain_each_one(rows: list[tuple[str, int, int]]) -> None:
    group = [g for g, _, _ in rows]
    start = [s for _, s, _ in rows]
    end = [s + d for _, s, d in rows]
    depth = nesting_depth(group, start, end)
    items = [(g, s, e, k) for k, (g, s, e) in enumerate(zip(group, start, end, strict=True))]
    expected = [sum(contains(j, i) for j in items) for i in items]
    assert depth.tolist() == expected


def test_depth_of_a_properly_nested_stack() -> None:
    depth = nesting_depth(["t"] * 4, [0, 10, 20, 50], [100, 50, 30, 60])
    assert depth.tolist() == [0, 1, 2, 1]


def test_partially_overlapping_sibling_does_not_deepen_the_child() -> None:
    # X [0,10] overlaps P [5,20] without containing it; C [12,15] sits inside P only.
    assert nesting_depth(["t"] * 3, [0, 5, 12], [10, 20, 15]).tolist() == [0, 0, 1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60), st.data())
def test_range_max_matches_python_max(values: list[int], data: st.DataObject) -> None:
    arr = np.array(values, dtype=np.int64)
    lo = np.array(data.draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=20)))
    hi = np.array([data.draw(st.integers(int(a) + 1, len(values))) for a in lo])
    expected = [max(values[a:b]) for a, b in zip(lo, hi, strict=True)]
    assert range_max(arr, lo, hi).tolist() == expected


def test_microsecond_floats_convert_to_exact_nanoseconds() -> None:
    assert us_to_ns([1683564901548726, 1365627862757.064, 0.5, 2.08]).tolist() == [
        1683564901548726000, 1365627862757064, 500, 2080]
