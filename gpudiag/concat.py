"""Concatenating frames of one table, column by column, as `pd.concat` would.

A job's batch merges a dozen tables of every rank file it read, and `pd.concat` of frames
that share their columns and dtypes still pays its general alignment machinery per frame
and per column (about 0.4 ms per file and table for 120 KB DLRM ranks: a tenth of a
batch's reading). The frames of a Trace table always have the same columns at the same
declared dtypes, so each column is one `np.concatenate` (or its extension array's own
concatenation) instead. The result is what `pd.concat(frames, ignore_index=True)` gives,
with one rule of pandas spelled out for category columns:

- frames whose categories are the same set keep the first frame's categories, in its order;
- otherwise pandas falls back to text, which `trace.concat_tables` turns back into a
  category column: the categories are then the values present, sorted.

Frames that differ in columns or dtypes go to `pd.concat` itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def same_columns(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    """`frames` concatenated (a RangeIndex from 0), or None when they differ in columns or
    non-category dtypes (the caller then uses `pd.concat`)."""
    first = frames[0]
    columns = list(first.columns)
    dtypes = list(first.dtypes)
    for frame in frames[1:]:
        if list(frame.columns) != columns:
            return None
        for dtype, other in zip(dtypes, frame.dtypes, strict=True):
            if isinstance(dtype, pd.CategoricalDtype):
                if not isinstance(other, pd.CategoricalDtype) or other.ordered or dtype.ordered:
                    return None
            elif other != dtype:
                return None
    out = {col: _column([frame[col].array for frame in frames], dtype)
           for col, dtype in zip(columns, dtypes, strict=True)}
    return pd.DataFrame(out, index=pd.RangeIndex(sum(len(frame) for frame in frames)),
                        copy=False)


def _column(arrays: list[Any], dtype: Any) -> Any:
    if isinstance(dtype, pd.CategoricalDtype):
        return categories_joined(arrays)
    if isinstance(dtype, np.dtype):
        return np.concatenate([np.asarray(array) for array in arrays])
    return type(arrays[0])._concat_same_type(arrays)


def categories_joined(arrays: list[pd.Categorical]) -> pd.Categorical:
    """Categoricals concatenated: the first one's categories when all have the same set,
    else the values present, sorted (see the module docstring)."""
    first = arrays[0].categories
    same = all(array.categories.equals(first) for array in arrays[1:])
    if not same and all(len(array.categories) == len(first) for array in arrays[1:]):
        known = set(first)
        same = all(set(array.categories) == known for array in arrays[1:])
    if same:
        categories = first
    else:
        present: set[Any] = set()
        for array in arrays:
            codes = np.asarray(array.codes)
            present.update(array.categories[np.unique(codes[codes >= 0])])
        categories = pd.Index(sorted(present)) if present else _no_categories(arrays)
    codes = np.concatenate([_recoded(array, categories) for array in arrays])
    return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(categories))


def _no_categories(arrays: list[pd.Categorical]) -> pd.Index:
    """No value present: pandas' text fallback keeps the categories' common dtype (the
    default string dtype when all are text, else object)."""
    kinds = {array.categories.dtype for array in arrays}
    return pd.Index([], dtype=kinds.pop() if len(kinds) == 1 else object)


def _recoded(array: pd.Categorical, categories: pd.Index) -> np.ndarray:
    """The array's codes into `categories` (which hold every value it uses)."""
    codes = np.asarray(array.codes, dtype=np.int64)
    if array.categories.equals(categories):
        return codes
    position = np.append(categories.get_indexer(array.categories), -1)
    return position[codes]
