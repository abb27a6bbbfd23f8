"""A table's rows as named numpy arrays, for loops that cut one frame into many small ones.

The host-step analysis walks every process of a trace and selects its rows a dozen times
(its ops, its training thread, its backward ops, ...). A pandas boolean selection costs
about 0.3 ms whatever its size, so on a job of many small ranks those selections were
most of the analysis (about 70 per process). The same selections on arrays cost
microseconds: the frame is converted once, and each process gets a slice.

    rows = Columns.of(frame, ["start_ns", "end_ns"], tid=frame["tid"].to_numpy(float))
    mine = rows.take(rows["tid"] == 7)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.analyzers.keys import positions as key_positions


class Columns:
    """Equal-length numpy arrays by name; `take` selects rows of all of them."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.length = len(next(iter(arrays.values()))) if arrays else 0

    @classmethod
    def of(cls, frame: pd.DataFrame, names: Sequence[str], **more: np.ndarray) -> Columns:
        """The frame's `names` columns as numpy arrays (nullable integers as float64 with
        NaN, categories and strings as object arrays), and `more` arrays beside them."""
        arrays = {name: _array(frame[name]) for name in names}
        arrays.update(more)
        return cls(arrays)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __len__(self) -> int:
        return self.length

    def take(self, rows: np.ndarray | slice) -> Columns:
        """These rows (a boolean mask, positions or a slice) of every column."""
        return Columns({name: values[rows] for name, values in self.arrays.items()})

    def groups(self, *keys: np.ndarray) -> Iterator[tuple[tuple[Any, ...], Columns]]:
        """(key values, their rows) for each distinct combination of `keys`
        (`keys.positions`)."""
        for values, rows in key_positions(*keys):
            yield values, self.take(rows)


def _array(column: pd.Series) -> np.ndarray:
    if column.dtype.kind in "iub":
        return column.to_numpy()
    if column.dtype.kind == "f" or pd.api.types.is_integer_dtype(column.dtype):
        return column.to_numpy(dtype=np.float64, na_value=np.nan)
    return column.to_numpy(dtype=object)
