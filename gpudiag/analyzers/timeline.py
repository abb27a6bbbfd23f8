"""Busy and idle time of each GPU stream and device, as Holistic Trace Analysis counts it.

Three views of the GPU timeline, each reproducing one HTA analysis in integer nanoseconds
(HTA rounds Kineto's microseconds to whole µs first; tests/test_hta_oracle.py checks that
we agree with HTA on real traces):
- `stream_summary`: per stream, the span from its first to its last GPU event, the union
  of its events (busy) and the rest (idle), HTA's per-stream idle time;
- `temporal_breakdown`: per device, HTA's temporal breakdown into idle, compute and
  non-compute time;
- `idle_breakdown`: per stream, HTA's idle-time breakdown into host wait, kernel wait and
  other, so our own idle-gap causes can say how they map onto HTA's;
- `idle_gaps` (from gaps.py): per *device*, every idle gap with the cause the loss model
  attributes to it (docs/analysis.md maps those causes onto HTA's three).

A GPU event is a kernel or a copy (memcpy or memset). Host waits (`syncs`) are not: HTA
0.5.0 counts `cuda_sync` spans as GPU time in its temporal breakdown, which makes a stream
look busy while the host is blocked. Events without a stream form their own stream (NA).
Groups never mix ranks or devices; a rank's devices are reported separately.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers.callsites import launch_calls
from gpudiag.analyzers.findings import Contract, Result
from gpudiag.analyzers.findings import frame as no_findings
from gpudiag.analyzers.losses.gaps import idle_gaps
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]

__all__ = ["analyze", "idle_breakdown", "idle_gaps", "is_compute", "stream_summary",
           "temporal_breakdown"]

#: HTA 0.5.0 (hta/utils/utils.py `get_kernel_type`) calls a kernel COMPUTATION unless its
#: name matches one of these with `re.match` (anchored at the start): communication
#: (`^nccl.*Kernel`), memory (`^Memcpy`, `^Memset`, `^dma`) or the exclusions of
#: `is_compute_kernel` (`.*Memcpy`, `^Memset`, `.*Sync`). HTA's git HEAD has a longer list
#: (hip*, hccl*, runtime names); none of its extra patterns matches a kernel in our fixtures.
HTA_NON_COMPUTE = (r"nccl.*Kernel", r".*Memcpy", r"Memset", r"dma", r".*Sync")
_NON_COMPUTE = re.compile("|".join(f"(?:{pattern})" for pattern in HTA_NON_COMPUTE))

#: HTA's idle categories, in the order of its IdleTimeType enum
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")

STREAM_KEYS = ["rank", "device", "stream"]
DEVICE_KEYS = ["rank", "device"]
_EVENT_COLUMNS = ["rank", "device", "stream", "pid", "correlation", "start_ns", "end_ns"]
_KEY_DTYPES = {"rank": "Int64", "device": "Int64", "stream": "Int64"}
STREAM_SUMMARY: dict[str, Any] = {**_KEY_DTYPES, "span_ns": "int64", "busy_ns": "int64",
                                  "idle_ns": "int64", "events": "int64"}
TEMPORAL: dict[str, Any] = {
    "rank": "Int64", "device": "Int64", "kernel_time_ns": "int64", "idle_time_ns": "int64",
    "compute_time_ns": "int64", "non_compute_time_ns": "int64", "idle_pct": "float64",
    "compute_pct": "float64", "non_compute_pct": "float64"}
IDLE_BREAKDOWN: dict[str, Any] = {
    **_KEY_DTYPES, "category": pd.CategoricalDtype(IDLE_CATEGORIES), "idle_ns": "int64",
    "ratio": "float64", "gaps": "int64"}


def analyze(trace: Trace) -> Result:
    """The timeline's one result for `diagnose`: the per-stream `stream_summary`.

        timeline.analyze(trace).tables["stream_summary"]

    No findings of its own: its idle time is the waterfall's.
    """
    return combine([part(trace)])


def part(trace: Trace) -> pd.DataFrame:
    """One rank's share of a job's analysis: its streams' rows (a stream is one rank's)."""
    return stream_summary(trace)


def combine(parts: list[pd.DataFrame]) -> Result:
    """The job's result from its ranks' parts: their streams in the summary's order."""
    summary = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True).sort_values(
        STREAM_KEYS, kind="stable", na_position="last", ignore_index=True)
    return Result(no_findings(), {"stream_summary": summary})


def stream_summary(trace: Trace) -> pd.DataFrame:
    """Span, busy and idle nanoseconds of each (rank, device, stream), HTA's per-stream idle.

        from gpudiag.analyzers.timeline import stream_summary
        summary = stream_summary(gpudiag.load("rank0.pt.trace.json.gz"))
        summary.sort_values("idle_ns", ascending=False).head()

    `span_ns` runs from the stream's first event start to its last event end; `busy_ns` is
    the union of its kernels and copies (overlaps counted once, touching events merged, as
    HTA's `merge_kernel_intervals` does); `idle_ns = span_ns - busy_ns`. Zero-length events
    count in the span and in `events` but add no busy time.
    """
    events = _gpu_events(trace)
    codes, keys, counts = _groups(events, STREAM_KEYS)
    span = _span(codes, events, len(counts))
    busy = _busy(codes, events, len(counts))
    return _typed({**keys, "span_ns": span, "busy_ns": busy, "idle_ns": span - busy,
                   "events": counts}, STREAM_SUMMARY)


def temporal_breakdown(trace: Trace) -> pd.DataFrame:
    """HTA's temporal breakdown per (rank, device): idle, compute and non-compute time.

        from gpudiag.analyzers.timeline import temporal_breakdown
        tb = temporal_breakdown(gpudiag.load("rank0.pt.trace.json.gz"))
        tb[["rank", "device", "idle_pct", "compute_pct", "non_compute_pct"]]

    `kernel_time_ns` runs from the first GPU event's start to the last one's end, over all
    streams; `idle_time_ns` is the part of it where no event runs; `compute_time_ns` is the
    union of COMPUTATION kernels (names not matching `HTA_NON_COMPUTE`; copies never are);
    `non_compute_time_ns` is the rest of the busy time: communication and memory work that no
    compute kernel overlaps. Percentages are of `kernel_time_ns`, unrounded (HTA rounds them
    to two places); NaN when the device has no positive kernel time.
    """
    events = _gpu_events(trace)
    codes, keys, counts = _groups(events, DEVICE_KEYS)
    devices = len(counts)
    kernel_time = _span(codes, events, devices)
    busy = _busy(codes, events, devices)
    compute = events["compute"].to_numpy(dtype=bool)
    compute_time = _busy(codes[compute], events[compute], devices)
    idle = kernel_time - busy
    with np.errstate(divide="ignore", invalid="ignore"):
        whole = np.where(kernel_time > 0, kernel_time, np.nan)
        pct = {name: 100.0 * part / whole for name, part in
               (("idle_pct", idle), ("compute_pct", compute_time),
                ("non_compute_pct", busy - compute_time))}
    return _typed({**keys, "kernel_time_ns": kernel_time, "idle_time_ns": idle,
                   "compute_time_ns": compute_time, "non_compute_time_ns": busy - compute_time,
                   **pct}, TEMPORAL)


def idle_breakdown(trace: Trace, *, kernel_wait_ns: int = 30_000) -> pd.DataFrame:
    """HTA's idle-time breakdown: each stream's idle gaps as host wait, kernel wait or other.

        from gpudiag.analyzers.timeline import idle_breakdown
        ib = idle_breakdown(gpudiag.load("rank0.pt.trace.json.gz"))
        ib.pivot_table("idle_ns", ["rank", "device", "stream"], "category", observed=True)

    A gap is the time between an event's start and the latest end of the events before it
    on its stream. It is `host_wait` when the API call that launched the event started after
    that end (the host had not yet asked for the work when the stream ran dry), else
    `kernel_wait` when shorter than `kernel_wait_ns` (launch overhead between back-to-back
    kernels), else `other` (syncs, event waits, dependencies on other streams). HTA's default
    `consecutive_kernel_delay=30` is documented as ns but applies to µs data, so it is
    30 µs: our default. Events without a launch call found are never host wait.

    One row per stream and category (all three, zero when absent); `ratio` is the share of
    the stream's idle time (NaN when it has none), `gaps` the number of positive gaps. Gaps
    sum to `stream_summary`'s `idle_ns`. HTA sums `start - previous end` instead, which goes
    negative where events on one stream overlap; we count an overlap as no gap.
    """
    events = _gpu_events(trace)
    codes, keys, counts = _groups(events, STREAM_KEYS)
    group, gap, host = _gaps(trace, events, codes)
    kinds = len(IDLE_CATEGORIES)
    cell = group * kinds + np.where(host, 0, np.where(gap < kernel_wait_ns, 1, 2))
    idle = np.zeros(len(counts) * kinds, dtype=np.int64)
    np.add.at(idle, cell, gap)
    gaps = np.bincount(cell[gap > 0], minlength=len(idle)).astype(np.int64)
    per_stream = idle.reshape(len(counts), kinds).sum(axis=1).repeat(kinds)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(per_stream > 0, idle / per_stream, np.nan)
    rows = {name: column.array.repeat(kinds) for name, column in keys.items()}
    category = pd.Categorical.from_codes(np.tile(np.arange(kinds), len(counts)),
                                         IDLE_CATEGORIES)
    return _typed({**rows, "category": category, "idle_ns": idle, "ratio": ratio,
                   "gaps": gaps}, IDLE_BREAKDOWN)


# -- helpers ---------------------------------------------------------------------------


def _gpu_events(trace: Trace) -> pd.DataFrame:
    """Kernels and copies (memcpy and memset) in one frame, with HTA's compute flag."""
    kernels = trace.kernels[_EVENT_COLUMNS].assign(compute=is_compute(trace.kernels["name"]))
    copies = trace.copies[_EVENT_COLUMNS].assign(compute=False)
    return pd.concat([frame for frame in (kernels, copies) if len(frame)] or [kernels],
                     ignore_index=True)


def is_compute(names: pd.Series) -> npt.NDArray[np.bool_]:
    """HTA's COMPUTATION class of each kernel name, matched once per distinct name.

        from gpudiag.analyzers.timeline import is_compute
        trace = gpudiag.load("rank0.pt.trace.json.gz")
        trace.kernels[~is_compute(trace.kernels["name"])]["name"].value_counts()

    An unnamed kernel counts as compute: HTA has no such rows, and a kernel ran.
    """
    categories = names.cat.categories
    hit = np.array([_NON_COMPUTE.match(str(category)) is None for category in categories]
                   + [True])
    return hit[names.cat.codes.to_numpy()]  # code -1 (no name) picks the last entry


def _gaps(trace: Trace, events: pd.DataFrame,
          codes: IntArray) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
    """Every gap before an event on its stream: the stream's group code, the gap (0 where
    the event overlaps earlier ones) and whether its launch call began after the stream's
    last end (host wait)."""
    launch = launch_calls(trace, events)["api_start_ns"]  # NA: never host wait
    api_start = launch.to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).min)
    start = events["start_ns"].to_numpy(dtype=np.int64)
    order = np.lexsort((start, codes))
    group = codes[order]
    reach = _cummax_by_group(group, events["end_ns"].to_numpy(dtype=np.int64)[order])
    follows = group[1:] == group[:-1]  # the first event of a stream has no gap before it
    gap = np.maximum(start[order][1:] - reach[:-1], 0)[follows]
    host = (api_start[order][1:] > reach[:-1])[follows]
    return group[1:][follows], gap, host


def _groups(events: pd.DataFrame, keys: list[str]) -> tuple[IntArray, dict[str, pd.Series],
                                                             IntArray]:
    """Group code of each event, the key columns of each group and its event count.

    NA keys form groups of their own (sorted last), so no event is silently dropped.
    """
    grouped = events.groupby(keys, dropna=False, sort=True)
    codes = grouped.ngroup().to_numpy(dtype=np.int64)
    sizes = grouped.size()
    frame = sizes.index.to_frame(index=False)
    columns = {key: frame[key].astype("Int64").reset_index(drop=True) for key in keys}
    return codes, columns, sizes.to_numpy(dtype=np.int64)


def _span(codes: IntArray, events: pd.DataFrame, groups: int) -> IntArray:
    """Last end minus first start of each group (HTA's `kernel_time`)."""
    if groups == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.full(groups, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(groups, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, codes, events["start_ns"].to_numpy(dtype=np.int64))
    np.maximum.at(last, codes, events["end_ns"].to_numpy(dtype=np.int64))
    return np.where(last >= first, last - first, 0)


def _busy(codes: IntArray, events: pd.DataFrame, groups: int) -> IntArray:
    """Length of the union of each group's intervals, with one sort for all groups."""
    start = events["start_ns"].to_numpy(dtype=np.int64)
    end = events["end_ns"].to_numpy(dtype=np.int64)
    keep = end > start
    group, starts, ends = codes[keep], start[keep], end[keep]
    busy = np.zeros(groups, dtype=np.int64)
    if len(starts) == 0:
        return busy
    order = np.lexsort((starts, group))
    group, starts, ends = group[order], starts[order], ends[order]
    reach = _cummax_by_group(group, ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = (group[1:] != group[:-1]) | (starts[1:] > reach[:-1])  # touching ones merge
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(starts) - 1)
    np.add.at(busy, group[first], reach[last] - starts[first])
    return busy


def _cummax_by_group(group: IntArray, values: IntArray) -> IntArray:
    """Running maximum of `values` that restarts at each group (rows sorted by group)."""
    return pd.Series(values).groupby(group, sort=False).cummax().to_numpy(dtype=np.int64)


def _typed(columns: dict[str, object], dtypes: dict[str, Any]) -> pd.DataFrame:
    """The result frame with its declared dtypes, also when it has no rows."""
    frame = pd.DataFrame({name: columns[name] for name in dtypes})
    return frame.astype(dtypes) if len(frame) else pd.DataFrame(
        {name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
