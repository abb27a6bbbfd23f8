"""The analyzers' interval algebra against a brute-force model: every integer time point."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=12)


def _points(pairs: list[tuple[int, int]]) -> set[int]:
    return {t for s, d in pairs for t in range(s, s + d)}


def _as_set(spans_: iv.Spans) -> set[int]:
    return {t for s, e in zip(*spans_, strict=True) for t in range(int(s), int(e))}


def _arrays(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([p[0] for p in pairs], dtype=np.int64)
    return s, s + np.array([p[1] for p in pairs], dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_set_operations_equal_the_point_model(a: list[tuple[int, int]],
                                              b: list[tuple[int, int]]) -> None:
    ua, ub = iv.union(*_arrays(a)), iv.union(*_arrays(b))
    assert _as_set(ua) == _points(a) and iv.total(ua) == len(_points(a))
    assert (np.diff(ua[0]) > 0).all() and (ua[0][1:] > ua[1][:-1]).all()  # sorted, apart
    assert _as_set(iv.intersect(ua, ub)) == _points(a) & _points(b)
    assert _as_set(iv.subtract(ua, ub)) == _points(a) - _points(b)
    assert _as_set(iv.complement(ua, 5, 50)) == set(range(5, 50)) - _points(a)
    qs, qe = _arrays(b)
    assert iv.overlap(qs, qe, ua).tolist() == [
        len(set(range(s, e)) & _points(a)) for s, e in zip(qs.tolist(), qe.tolist(),
                                                           strict=True)]


@settings(max_examples=200, deadline=None)
@given(spans, st.lists(st.floats(0, 1), min_size=12, max_size=12))
def test_sweep_sums_weights_of_the_covering_intervals(a: list[tuple[int, int]],
                                                      weights: list[float]) -> None:
    s, e = _arrays(a)
    w = np.array(weights[:len(a)])
    sweep = iv.Sweep(s, e)
    count, total = sweep.sum(np.ones(len(a))), sweep.sum(w)
    for seg_s, seg_e, n, x in zip(sweep.start, sweep.end, count, total, strict=True):
        covering = [i for i in range(len(a)) if s[i] <= seg_s and seg_e <= e[i] and e[i] > s[i]]
        assert round(n) == len(covering)
        assert abs(x - sum(w[i] for i in covering)) < 1e-9
    if len(sweep.start):
        assert (sweep.end[:-1] == sweep.start[1:]).all()  # segments tile the swept span


keys_ = st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 4)),
                 max_size=15)


@settings(max_examples=200, deadline=None)
@given(keys_, keys_)
def test_join_finds_the_first_equal_key_with_na_equal_na(left: list[tuple[object, int]],
                                                         right: list[tuple[object, int]]
                                                         ) -> None:
    import pandas as pd

    from gpudiag.analyzers import keys

    def cols(rows: list[tuple[object, int]]) -> list[pd.Series]:
        return [pd.Series([r[0] for r in rows], dtype="Int64"),
                pd.Series([r[1] for r in rows], dtype="int64")]

    got = keys.join(cols(left), cols(right))
    want = [next((j for j, r in enumerate(right) if r == q), -1) for q in left]
    assert got.tolist() == want
