"""The sample a replay runs on: the analyzed window's events (`extent`, of one trace or
summed over a job's ranks), and, past `SAMPLE_EVENTS` of them, the steady steps around the
median one that hold about that many (`sample_of`), the savings scaled to the window.

Light on purpose (numpy and pandas only): a job's map computes each rank's `extent` on
its first pass, before anything is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]


#: the most graph events (torch ops, calls, GPU work) a replay takes whole; a larger window
#: is replayed on a sample of about this many and its savings scaled to the window
SAMPLE_EVENTS = 60_000


def _steps_sample(steps: pd.DataFrame | None, low: int, high: int, span: float
                  ) -> tuple[tuple[int, int] | None, str]:
    """Consecutive steady steps around the median one lasting about `span` (one at least)."""
    if steps is None or steps.empty:
        return None, ""
    rank = keys.key_array(steps["rank"])
    mine = steps[(rank == rank.min()) & ~steps["warmup"].fillna(False).to_numpy(bool)
                 & (steps["start_ns"] >= low).to_numpy(bool)
                 & (steps["end_ns"] <= high).to_numpy(bool)].sort_values("start_ns")
    if mine.empty:
        return None, ""
    count = max(1, min(len(mine), int(span // max(float(mine["dur_ns"].median()), 1))))
    first = max(0, len(mine) // 2 - count // 2)
    chosen = mine.iloc[first:first + count]
    names = chosen["step"].astype(str)
    label = names.iloc[0] if count == 1 else f"{names.iloc[0]} to {names.iloc[-1]}"
    return (int(chosen["start_ns"].iloc[0]), int(chosen["end_ns"].iloc[-1])), \
        f"{count} steady step{'s' if count > 1 else ''} ({label})"


@dataclass(frozen=True)
class Extent:
    """What the sample of a replay is chosen from: the analyzed window's first and last
    time (the bounds, else the first start and the last end of the events the replay
    reads) and how many of those events start in it (`below`: before the last end,
    `at_end`: at it), of one trace or, summed (`joined`), of a job's ranks."""

    low: int
    high: int
    below: int
    at_end: int
    bounded: bool

    def joined(self, other: Extent) -> Extent:
        """The extent of two parts of one job (the same bounds, or none)."""
        high = max(self.high, other.high)
        return Extent(min(self.low, other.low), high,
                      self.below + other.below + sum(part.at_end for part in (self, other)
                                                     if part.high < high),
                      sum(part.at_end for part in (self, other) if part.high == high),
                      self.bounded)

    @property
    def count(self) -> int:
        """The events starting inside [low, high)."""
        return self.below


def _starts(trace: Trace) -> tuple[IntArray, IntArray]:
    """The start times of the events a replay reads (GPU work, calls, torch ops) and their
    ends."""
    frames = [trace.kernels, trace.copies, trace.api,
              trace.ranges[(trace.ranges["source"] == "torch_op").to_numpy(bool)]]
    return (np.concatenate([frame["start_ns"].to_numpy(np.int64) for frame in frames]),
            np.concatenate([frame["end_ns"].to_numpy(np.int64) for frame in frames]))


def extent(trace: Trace, bounds: tuple[int, int] | None) -> Extent | None:
    """The `Extent` of a trace's events in `bounds` (None: all of them; no events: None)."""
    start, end = _starts(trace)
    if not len(start):
        return None
    if bounds is not None:
        inside = (start >= bounds[0]) & (start < bounds[1])
        return Extent(bounds[0], bounds[1], int(inside.sum()), 0, True)
    high = int(end.max())
    return Extent(int(start.min()), high, int((start < high).sum()),
                  int((start >= high).sum()), False)


def count_in(trace: Trace, window: tuple[int, int] | None) -> int:
    """How many of the events a replay reads start inside `window`."""
    start, _ = _starts(trace)
    if window is None:
        return len(start)
    return int(((start >= window[0]) & (start < window[1])).sum())


@dataclass(frozen=True)
class Sample:
    """The window the replays run on (None: all of the trace), the factor their savings
    scale by, what the sample is ("" when the whole window is replayed), how many events
    the window holds and its length (0: unknown)."""

    window: tuple[int, int] | None
    scale: float = 1.0
    what: str = ""
    events: int = 0
    span: int = 0

    def note(self, count: int) -> str:
        """The note saying what was replayed, `count` events of the window's."""
        return (f"expected savings replayed on {self.what} ({count:,} of {self.events:,} "
                f"events) and scaled to the window (x{self.scale:.1f})")


def sample_of(found: Extent | None, steps: pd.DataFrame | None) -> Sample:
    """The window the replays run on, from the `Extent` of the analyzed window (None: no
    events). Over `SAMPLE_EVENTS` events: the steady steps around the median one (of the
    first rank with steps) that hold about that many, else the middle of the window; each
    replay costs a longest-path pass over its events, and the steps of a training run
    repeat."""
    if found is None:
        return Sample(None)
    bounds = (found.low, found.high) if found.bounded else None
    low, high, count = found.low, found.high, found.count
    if count <= SAMPLE_EVENTS or high <= low:
        return Sample(bounds, span=high - low)
    span = (high - low) * SAMPLE_EVENTS / count
    window, what = _steps_sample(steps, low, high, span)
    if window is None:
        middle = (low + high) // 2
        window = (int(middle - span / 2), int(middle + span / 2))
        what = "the middle of the window"
    return Sample(window, (high - low) / max(window[1] - window[0], 1), what, count,
                  high - low)


