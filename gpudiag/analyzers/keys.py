"""Joins and matches on multi-column keys without building Python tuples.

A pandas MultiIndex over millions of rows materializes a tuple per row for most
operations; joining kernels to their launch calls that way cost more than the whole loss
model. Here each key column is factorized once (NA is a value of its own), the codes are
combined into one int64 per row, and joins are a sort plus `searchsorted`. Regexes run
once per distinct name (pandas categories), never once per row.

Missing keys: a table's rank, device or pid is pandas NA when unknown (schema.py), never -1.
Numeric code that needs plain int64 arrays takes them from `key_array`, where `MISSING`
stands for NA, and hands results back through `key_column`, which turns it into NA again:
the sentinel lives only inside those arrays and never reaches a result. (The memory table's
`device == -1` is a value, host memory, not a missing key: it never goes through
`key_column`.)
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd

IntArray = npt.NDArray[np.int64]

#: what stands for a missing rank, device or pid inside `key_array`'s int64 arrays (only
#: there: tables hold pandas NA)
MISSING = -1


def key_array(column: pd.Series | npt.ArrayLike) -> IntArray:
    """A rank, device or pid column as int64, NA as `MISSING`, for numpy grouping and
    matching (`np.unique`, `searchsorted`, equality with a known key)."""
    return pd.Series(column).astype("Int64").fillna(MISSING).to_numpy(np.int64)


def key_column(values: pd.Series | npt.ArrayLike) -> pd.Series:
    """int64 key values back as a nullable Int64 column: `MISSING` becomes NA."""
    column = pd.Series(values).astype("Int64")
    return column.mask(column == MISSING)


def pick(values: np.ndarray, at: IntArray, missing: Any) -> np.ndarray:
    """`values[at]` where `at` >= 0, `missing` where it is -1 (a lookup that found nothing).
    Safe when `values` is empty (a window with no event of its kind), where indexing with
    the clipped positions would fail."""
    if not len(values):
        return np.full(len(at), missing)
    return np.where(at >= 0, values[np.maximum(at, 0)], missing)


def codes(*columns: pd.Series | npt.ArrayLike) -> IntArray:
    """One int64 per row identifying the combination of the columns' values."""
    out = np.zeros(len(columns[0]), dtype=np.int64)  # type: ignore[arg-type]
    top = 1
    for col in columns:
        c, uniques = pd.factorize(pd.Series(col), use_na_sentinel=False)
        if top * (len(uniques) + 1) >= 2**62:  # renumber densely before it could overflow
            out, _ = pd.factorize(out)
            top = int(out.max()) + 1
        out = out * np.int64(len(uniques) + 1) + c.astype(np.int64)
        top *= len(uniques) + 1
    return out


def join(left: list[pd.Series], right: list[pd.Series]) -> IntArray:
    """For each left row, the position of the first right row with equal key columns
    (NA equals NA), or -1.

    Each column is factorized on the right side only and the left side looked up in its
    distinct values: no concatenation of both sides (which doubled the memory of joining
    ten million kernels to ten million launch calls)."""
    n_left = len(left[0])
    lkey = np.zeros(n_left, dtype=np.int64)
    rkey = np.zeros(len(right[0]), dtype=np.int64)
    miss = np.zeros(n_left, dtype=bool)
    top = 1
    for a, b in zip(left, right, strict=True):
        rc, uniques = pd.factorize(pd.Series(b), use_na_sentinel=False)
        lc = pd.Index(uniques).get_indexer(pd.Series(a))
        miss |= lc < 0
        width = len(uniques) + 1
        if top * width >= 2**62:  # renumber densely before it could overflow
            both, _ = pd.factorize(np.concatenate([lkey, rkey]))
            lkey, rkey = both[:n_left].astype(np.int64), both[n_left:].astype(np.int64)
            top = int(both.max()) + 1 if len(both) else 1
        lkey = lkey * width + lc.astype(np.int64)
        rkey = rkey * width + rc.astype(np.int64)
        top *= width
    order = np.argsort(rkey, kind="stable")
    sorted_keys = rkey[order]
    if len(order) == 0:
        return np.full(n_left, -1, dtype=np.int64)
    i = np.searchsorted(sorted_keys, lkey, side="left")
    safe = np.minimum(i, len(order) - 1)
    hit = (i < len(order)) & (sorted_keys[safe] == lkey) & ~miss
    return np.where(hit, order[safe], -1).astype(np.int64)


def isin(left: list[pd.Series], right: list[pd.Series]) -> npt.NDArray[np.bool_]:
    """Whether each left row's key occurs among the right rows."""
    return join(left, right) >= 0


class Searcher(Protocol):
    """Anything with `re.Pattern.search`'s shape (a compiled regex, or a predicate)."""

    def search(self, string: str, /) -> object: ...


def matches(names: pd.Series, pattern: str | Searcher) -> npt.NDArray[np.bool_]:
    """Does each name match (re.search) `pattern`; False for missing names. One regex
    call per distinct name."""
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    cat = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    hit = np.array([bool(regex.search(str(c))) for c in cat.cat.categories] + [False],
                   dtype=bool)
    return hit[cat.cat.codes.to_numpy()]


def process_codes(*frames: pd.DataFrame) -> list[IntArray]:
    """One code per (rank, pid) shared by all frames (rank NA counts as one rank of its
    own), -1 where pid is NA: host-side joins must never match a process of one rank with
    a process of another that reuses its pid (containers all run pid 1)."""
    rank = pd.concat([frame["rank"].astype("Int64") for frame in frames], ignore_index=True)
    pid = pd.concat([f["pid"].astype("Int64") for f in frames], ignore_index=True)
    out = codes(rank, pid)
    out[pid.isna().to_numpy()] = -1
    return np.split(out, np.cumsum([len(f) for f in frames])[:-1])


def time_keys(group: list[IntArray], times: list[IntArray]) -> tuple[list[IntArray],
                                                                     IntArray]:
    """Order-preserving int64 keys for (group, time) pairs, and the sorted distinct times.

    `group * span + time` overflows int64 when a merged trace mixes clocks (nsys counts
    from the session start, Kineto from the epoch); ranking the times first keeps every
    key below (groups x distinct times). `key % len(times)` indexes the returned times."""
    uniq, inverse = np.unique(np.concatenate(times), return_inverse=True)
    n = np.int64(len(uniq))
    split = np.split(inverse.astype(np.int64), np.cumsum([len(t) for t in times])[:-1])
    return [g.astype(np.int64) * n + r for g, r in zip(group, split, strict=True)], uniq


def positions(*keys: np.ndarray) -> Iterator[tuple[tuple[Any, ...], np.ndarray]]:
    """(key values, their row positions) for each distinct combination of the equal-length
    `keys`, in ascending order, each group's positions ascending (the groups of a sorted
    pandas groupby, without building one)."""
    count = len(keys[0])
    if not count:
        return
    order = np.lexsort(keys[::-1])  # stable: ties keep their order
    change = np.zeros(count, dtype=bool)
    change[0] = True
    for key in keys:
        ordered = key[order]
        change[1:] |= ordered[1:] != ordered[:-1]
    for first, end in itertools.pairwise(np.r_[np.flatnonzero(change), count]):
        rows = order[first:end]
        yield tuple(key[rows[0]] for key in keys), rows


def texts(column: pd.Series) -> npt.NDArray[np.object_]:
    """Each value as its text in an object array (NaN where missing): what
    `column.astype(str).to_numpy()` gives, but a categorical's categories are converted
    once, not every row (pandas builds a string array of all the rows first)."""
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return column.astype(str).to_numpy(dtype=object)
    names = np.empty(len(column.cat.categories) + 1, dtype=object)
    names[:-1] = [str(name) for name in column.cat.categories]
    names[-1] = np.nan  # code -1
    return names[column.cat.codes.to_numpy()]
