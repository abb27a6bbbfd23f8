"""The array helpers that replace per-group pandas work give what pandas gives: groups in
a sorted groupby's order, a categorical's texts, a cumcount per group, and a conformed
table passed through unchanged."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.analyzers import keys
from gpudiag.analyzers.host.columns import Columns
from gpudiag.readers.kineto.collectives import group_counts
from gpudiag.schema import TABLES

SMALL = st.lists(st.tuples(st.integers(-2, 3), st.integers(0, 2)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(SMALL)
def test_positions_are_the_groups_of_a_sorted_groupby(pairs: list[tuple[int, int]]) -> None:
    first = np.array([a for a, _ in pairs], dtype=np.int64)
    second = np.array([b for _, b in pairs], dtype=np.int64)
    frame = pd.DataFrame({"a": first, "b": second})
    expected = [(key, rows.tolist())
                for key, rows in frame.groupby(["a", "b"], sort=True).indices.items()]
    got = [(tuple(int(v) for v in key), rows.tolist())
           for key, rows in keys.positions(first, second)]
    assert got == [(tuple(int(v) for v in key), rows) for key, rows in expected]


def test_positions_of_nothing_is_empty() -> None:
    assert list(keys.positions(np.zeros(0, dtype=np.int64))) == []


def test_texts_of_a_categorical_equal_astype_str() -> None:
    names = pd.Series(pd.Categorical(["b", None, "a", "b", "10"]))
    got = keys.texts(names)
    expected = names.astype(str).to_numpy()
    assert got.dtype == object
    assert [None if pd.isna(v) else v for v in got] == \
        [None if pd.isna(v) else v for v in expected]
    plain = pd.Series([1, 2])
    assert keys.texts(plain).tolist() == ["1", "2"]


def test_columns_take_and_groups_select_every_column() -> None:
    frame = pd.DataFrame({"x": pd.array([1, None, 3], dtype="Int64"), "y": [5, 6, 7],
                          "name": pd.Categorical(["p", "q", "p"])})
    rows = Columns.of(frame, ["x", "y", "name"], extra=np.array([True, False, True]))
    assert rows["x"].dtype == np.float64 and np.isnan(rows["x"][1])
    assert rows["y"].dtype == np.int64 and rows["name"].tolist() == ["p", "q", "p"]
    picked = rows.take(rows["extra"])
    assert len(picked) == 2 and picked["y"].tolist() == [5, 7]
    groups = [(key, part["y"].tolist()) for key, part in rows.groups(np.array([1, 0, 1]))]
    assert groups == [((0,), [6]), ((1,), [5, 7])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2)),
                          st.one_of(st.none(), st.sampled_from(["pg0", "pg1"]))),
                max_size=30))
def test_group_counts_equal_a_groupby_cumcount(rows: list[tuple[int | None, str | None]]
                                               ) -> None:
    pid = pd.array([p for p, _ in rows], dtype="Int64")
    comm = np.array([c for _, c in rows], dtype=object)
    frame = pd.DataFrame({"pid": pid, "comm": comm})
    expected = frame.groupby(["pid", "comm"], dropna=False, sort=False).cumcount()
    assert group_counts(pid, comm).tolist() == expected.tolist()


def test_a_conformed_table_is_passed_through_as_a_new_frame() -> None:
    table = TABLES["kernels"]
    kernels = table.conform({"start_ns": [1, 2], "end_ns": [3, 4], "kernel_id": [0, 1],
                             "name": ["a", "b"]})
    again = table.conform(kernels)
    assert again is not kernels
    pd.testing.assert_frame_equal(again, kernels)
    again.loc[0, "start_ns"] = 99  # copy-on-write: the first frame keeps its value
    assert kernels.loc[0, "start_ns"] == 1
    shuffled = kernels.iloc[::-1]  # not a RangeIndex from 0: rebuilt, renumbered
    assert table.conform(shuffled).index.tolist() == [0, 1]
