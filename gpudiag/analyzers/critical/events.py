"""The events a dependency graph is made of, from a Trace, as flat arrays.

    found = graph_events(trace, window=(start_ns, end_ns))
    found.start[found.kind == GPU]

One row per event of four kinds: a host op (a torch op, Kineto's `cpu_op`), a CUDA API call,
GPU work (a kernel, copy or memset, with the API call that launched it) and a CUDA sync the
driver recorded (with the API call it belongs to). Which of them are in the graph follows
Holistic Trace Analysis's critical path analysis (../shared/REFERENCE.md), so the two paths
can be held side by side: host events that start inside the window and last longer than
zero; GPU work whose launch call is such an event; syncs whose API call is one, and every
stream wait (it ties two streams whatever the window).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: event kinds
HOST_OP, API, GPU, SYNC = 0, 1, 2, 3
#: the tables events come from (`Events.table`), in `TABLES` order
TABLES = ("ranges", "api", "kernels", "copies", "syncs")
#: the CUDA (and HIP) calls that enqueue GPU work (HTA's runtime launch events)
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                          "cudaMemcpyAsync", "cudaMemsetAsync", "hipLaunchKernel",
                          "hipExtModuleLaunchKernel", "hipMemcpyAsync", "hipMemsetAsync",
                          "hipMemcpyWithStream"})
#: calls that block their thread until the GPU is done (their own time is waiting)
BLOCKING_CALLS = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize",
                            "cudaEventQuery", "cudaEventSynchronize", "cudaMemcpy",
                            "cudaMemcpyAsync"})


@dataclass
class Events:
    """Every candidate event (see the module docstring), in table order, and which are in
    the graph. `rank` is the event's rank (`keys.key_array`); `pid` and `device` are codes
    of (rank, pid) and (rank, device), `raw_pid` the recorded pid. `launch`: the event of
    each GPU work's launch call, or of each sync's API call (-1: none); `stream` is -1 on
    the host. `queue_at_launch`, `queue_at_start`: how many launches were pending on the
    work's stream right after its launch call and right after it started (HTA's queue
    length, over the whole trace; -1 for work without a launch call)."""

    kind: IntArray
    table: IntArray
    row: IntArray
    start: IntArray
    end: IntArray
    rank: IntArray
    pid: IntArray
    tid: IntArray
    device: IntArray
    stream: IntArray
    correlation: IntArray
    name: npt.NDArray[np.object_]
    sync_kind: npt.NDArray[np.object_]
    record_correlation: IntArray
    record_stream: IntArray
    raw_pid: IntArray
    launch: IntArray
    in_graph: BoolArray
    queue_at_launch: IntArray
    queue_at_start: IntArray
    window: tuple[int, int]

    def __len__(self) -> int:
        return len(self.kind)


def graph_events(trace: Trace, window: tuple[int, int] | None = None) -> Events:
    """The events of `trace`'s dependency graph in `window` (None: the whole trace). Ranks
    of a merged job reuse pids, devices and streams: `pid` and `device` are codes of
    (rank, pid) and (rank, device), so each rank is a graph of its own (`raw_pid` keeps
    the pid)."""
    frames = _frames(trace, window)
    columns = {name: np.concatenate([frame[name] for frame in frames]) for name in frames[0]}
    columns["raw_pid"] = columns["pid"]
    columns["pid"] = keys.codes(columns["rank"], columns["pid"])
    columns["device"] = keys.codes(columns["rank"], columns["device"])
    start, end = columns["start"], columns["end"]
    if window is None:
        window = (int(start.min()), int(end.max())) if len(start) else (0, 0)
    kind = columns["kind"]
    launch = _launch_events(kind, columns["pid"], columns["correlation"], columns["start"])
    host = np.isin(kind, (HOST_OP, API))
    in_graph = host & (start >= window[0]) & (start <= window[1]) & (end > start)
    linked = launch >= 0
    in_graph |= (kind == GPU) & linked & in_graph[np.maximum(launch, 0)]
    synced = (kind == SYNC) & linked & in_graph[np.maximum(launch, 0)]
    in_graph |= synced | ((kind == SYNC) & (columns["sync_kind"] == "stream_wait"))
    at_launch, at_start = _queue_lengths(kind, launch, columns)
    return Events(**columns, launch=launch, in_graph=in_graph, queue_at_launch=at_launch,
                  queue_at_start=at_start, window=window)


def _frames(trace: Trace, window: tuple[int, int] | None) -> list[dict[str, np.ndarray]]:
    """Each table's events as columns of one shape (`row`: the position in its table).
    With a window, only what can be in its graph (`_chosen`), so a window of a long trace
    costs its own size."""
    out = []
    for (kind, table, frame), keep in zip(_sources(trace), _chosen(trace, window), strict=True):
        rows = np.flatnonzero(keep)
        out.append(_columns(kind, table, frame if len(rows) == len(frame) else
                            frame.iloc[rows], rows))
    return out


def _sources(trace: Trace) -> list[tuple[int, int, pd.DataFrame]]:
    """The tables events come from: (kind, `TABLES` index, frame)."""
    return [(HOST_OP, 0, trace.ranges), (API, 1, trace.api), (GPU, 2, trace.kernels),
            (GPU, 3, trace.copies), (SYNC, 4, trace.syncs)]


def _chosen(trace: Trace, window: tuple[int, int] | None) -> list[BoolArray]:
    """Which rows of each table (`_sources`) a graph over `window` can hold: torch ops and
    calls starting in it, GPU work and syncs of those calls (by rank, pid and correlation
    id), and stream waits in it."""
    tables = _sources(trace)
    ops = (trace.ranges["source"] == "torch_op").to_numpy(bool)
    chosen = [ops.copy() if kind == HOST_OP else np.ones(len(frame), dtype=bool)
              for kind, _, frame in tables]
    if window is None:
        return chosen
    for index, (kind, _, frame) in enumerate(tables):
        if kind in (HOST_OP, API):
            start = frame["start_ns"].to_numpy(np.int64)
            chosen[index] &= (start >= window[0]) & (start <= window[1])
    calls = trace.api[chosen[1]]
    for index, (kind, _, frame) in enumerate(tables):
        if kind in (GPU, SYNC) and len(frame):
            mine = keys.isin([frame["rank"], frame["pid"], frame["correlation"]],
                             [calls["rank"], calls["pid"], calls["correlation"]])
            if kind == SYNC:
                start = frame["start_ns"].to_numpy(np.int64)
                mine |= ((frame["kind"] == "stream_wait").to_numpy(bool)
                         & (start >= window[0]) & (start <= window[1]))
            chosen[index] &= mine
    return chosen


def replay_rows(trace: Trace, window: tuple[int, int] | None) -> Trace:
    """The rows of `trace` that a graph over `window` reads, as a Trace of their own (with
    the collective rows of its kernels, its devices and meta): what a job's batch sends so
    that its ranks are replayed together where the job is reduced. Its graph is the one
    `trace` gives over `window`, but for the `row` positions."""
    ranges, api, kernels, copies, syncs = (
        frame if keep.all() else frame[keep]
        for (_, _, frame), keep in zip(_sources(trace), _chosen(trace, window), strict=True))
    calls = trace.collectives
    calls = calls[calls["kernel_id"].isin(kernels["kernel_id"]).to_numpy(bool)]
    return Trace(meta=dict(trace.meta), ranges=ranges.reset_index(drop=True),
                 api=api.reset_index(drop=True), kernels=kernels.reset_index(drop=True),
                 copies=copies.reset_index(drop=True), syncs=syncs.reset_index(drop=True),
                 collectives=calls.reset_index(drop=True), devices=trace.devices)


def _columns(kind: int, table: int, frame: pd.DataFrame, rows: IntArray
             ) -> dict[str, np.ndarray]:
    count = len(frame)

    none = np.full(count, -1, dtype=np.int64)

    def ints(name: str) -> IntArray:
        return keys.key_array(frame[name]) if name in frame.columns else none.copy()

    name = (frame["name"].astype(object).to_numpy() if "name" in frame.columns
            else np.full(count, None, dtype=object))
    sync_kind = (frame["kind"].astype(object).to_numpy() if TABLES[table] == "syncs"
                 else np.full(count, None, dtype=object))
    return {
        "kind": np.full(count, kind, dtype=np.int64),
        "table": np.full(count, table, dtype=np.int64),
        "row": rows.astype(np.int64),
        "start": frame["start_ns"].to_numpy(np.int64),
        "end": frame["end_ns"].to_numpy(np.int64),
        "rank": ints("rank"), "pid": ints("pid"),
        "tid": ints("tid") if kind in (HOST_OP, API) else none.copy(),
        "device": ints("device"), "stream": ints("stream") if kind != HOST_OP else none.copy(),
        "correlation": ints("correlation"), "name": name, "sync_kind": sync_kind,
        "record_correlation": ints("record_correlation"),
        "record_stream": ints("record_stream"),
    }


def named(names: npt.NDArray[np.object_], test: Callable[[str], object]) -> BoolArray:
    """`test` of each name, called once per distinct name (a trace repeats a few hundred
    names millions of times); False for missing names."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object), use_na_sentinel=True)
    hit = np.array([bool(test(str(name))) for name in uniques] + [False], dtype=bool)
    return hit[codes]


def _launch_events(kind: IntArray, pid: IntArray, correlation: IntArray,
                   start: IntArray) -> IntArray:
    """For GPU work and syncs, the API call of the same process and correlation id: the
    latest one that started before it where several share them (a rank profiled twice in
    one process reuses its correlation ids; linking work to the other window's call would
    put a cycle in the graph), else the first."""
    out = np.full(len(kind), -1, dtype=np.int64)
    calls = np.flatnonzero((kind == API) & (correlation >= 0))
    wanted = np.flatnonzero(np.isin(kind, (GPU, SYNC)) & (correlation >= 0))
    if not len(calls) or not len(wanted):
        return out
    key = keys.codes(np.concatenate([pid[calls], pid[wanted]]),
                     np.concatenate([correlation[calls], correlation[wanted]]))
    # (key, time) as one sortable number: the key, then the rank of the start time
    times = np.concatenate([start[calls], start[wanted]])
    ranked = np.empty(len(times), dtype=np.int64)
    ranked[np.argsort(times, kind="stable")] = np.arange(len(times))
    both = key * (len(times) + 1) + ranked
    call_key, wanted_key = key[:len(calls)], key[len(calls):]
    order = np.argsort(both[:len(calls)], kind="stable")
    sorted_keys = call_key[order]
    first = np.minimum(np.searchsorted(sorted_keys, wanted_key), len(calls) - 1)
    hit = sorted_keys[first] == wanted_key
    before = np.searchsorted(both[:len(calls)][order], both[len(calls):], side="right") - 1
    latest = np.where((before >= 0) & (sorted_keys[np.maximum(before, 0)] == wanted_key),
                      before, first)
    out[wanted[hit]] = calls[order[latest[hit]]]
    return out


def _queue_lengths(kind: IntArray, launch: IntArray, columns: dict[str, np.ndarray]
                   ) -> tuple[IntArray, IntArray]:
    """HTA's queue length per stream: +1 at each launch call (of LAUNCH_CALLS) of GPU work,
    -1 when the work starts, in time order over the whole trace; its value right after
    each work's launch and right after its start."""
    at_launch = np.full(len(kind), -1, dtype=np.int64)
    at_start = np.full(len(kind), -1, dtype=np.int64)
    work = np.flatnonzero((kind == GPU) & (launch >= 0))
    if not len(work):
        return at_launch, at_start
    names = columns["name"][launch[work]]
    work = work[named(names, LAUNCH_CALLS.__contains__)]
    stream = keys.codes(columns["device"][work], columns["stream"][work])
    times = np.concatenate([columns["start"][launch[work]], columns["start"][work]])
    lanes = np.concatenate([stream, stream])
    steps = np.concatenate([np.ones(len(work), np.int64), -np.ones(len(work), np.int64)])
    order = np.lexsort((times, lanes))  # stable: a launch before work starting with it
    running = np.cumsum(steps[order])
    first = np.searchsorted(lanes[order], lanes[order], side="left")
    before = np.concatenate([[0], running])[first]  # what the lanes before it summed to
    queue = np.empty(len(order), dtype=np.int64)
    queue[order] = running - before
    at_launch[work] = queue[:len(work)]
    at_start[work] = queue[len(work):]
    return at_launch, at_start
