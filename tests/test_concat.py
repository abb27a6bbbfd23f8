"""Column-by-column concatenation of a table's frames equals `pd.concat`'s (with
`concat_tables`' category repair), on real traces' tables and on generated frames."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag import concat
from gpudiag.readers.sources import read_file
from gpudiag.trace import TABLE_NAMES, concat_tables, pandas_concat
from tests.conftest import fixture

RANKS = ["world128_sampled_rank0.json.gz", "world128_sampled_rank1.json.gz",
         "a100_alexnet_sync_critical_path.json.gz", "h100_cuda_sync_category_small.json"]


def _reference(frames: list[pd.DataFrame]) -> pd.DataFrame:
    nonempty = [frame for frame in frames if len(frame)] or frames[:1]
    return pandas_concat(nonempty)


def test_real_tables_concatenate_as_pandas_does() -> None:
    traces = [read_file(fixture(f"kineto/{name}")) for name in RANKS]
    for trace in traces:
        trace.fill_rank()
    groups = [traces, *map(list, itertools.combinations(traces, 2)), [traces[0], traces[0]]]
    for group in groups:
        for name in TABLE_NAMES:
            frames = [getattr(trace, name) for trace in group]
            pd.testing.assert_frame_equal(concat_tables(frames), _reference(frames),
                                          check_exact=True)


NAMES = st.sampled_from(["a", "b", "c", "é", "a b", ""])


@st.composite
def frames(draw: st.DrawFn) -> list[pd.DataFrame]:
    """Frames of one table: the same columns and dtypes, categories that may differ in
    their set, their order or unused entries, missing values everywhere."""
    count = draw(st.integers(1, 4))
    out = []
    for _ in range(count):
        rows = draw(st.integers(0, 6))
        values = draw(st.lists(st.one_of(st.none(), NAMES), min_size=rows, max_size=rows))
        extra = draw(st.lists(NAMES, max_size=3, unique=True))
        used = [value for value in dict.fromkeys(values) if value is not None]
        categories = list(dict.fromkeys(used + extra))
        if draw(st.booleans()):
            categories = sorted(categories)
        ints = draw(st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=rows,
                             max_size=rows))
        out.append(pd.DataFrame({
            "name": pd.Categorical(values, categories=categories),
            "count": pd.array(ints, dtype="Int64"),
            "ns": np.arange(rows, dtype=np.int64),
            "share": np.linspace(0, 1, rows),
            "flag": pd.array([None if v is None else v > 0 for v in ints], dtype="boolean"),
        }))
    return out


@settings(max_examples=300, deadline=None)
@given(frames())
def test_generated_frames_concatenate_as_pandas_does(parts: list[pd.DataFrame]) -> None:
    pd.testing.assert_frame_equal(concat_tables(parts), _reference(parts), check_exact=True)


def test_frames_that_differ_go_to_pandas() -> None:
    first = pd.DataFrame({"x": np.array([1], np.int64)})
    other_dtype = pd.DataFrame({"x": [1.5]})
    assert concat.same_columns([first, other_dtype]) is None
    assert concat.same_columns([first, pd.DataFrame({"y": np.array([1], np.int64)})]) is None
    pd.testing.assert_frame_equal(concat_tables([first, other_dtype]),
                                  pd.concat([first, other_dtype], ignore_index=True))
