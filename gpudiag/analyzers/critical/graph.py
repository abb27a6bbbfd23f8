"""The dependency graph of a trace: what each host op, launch and GPU work waited for.

    graph = build(trace, window=(start_ns, end_ns))
    graph.src, graph.dst, graph.weight, graph.kind     # one edge each

Nodes are the start and the end of each event of `events.graph_events` (node `2 e` and
`2 e + 1`). Edges, as Holistic Trace Analysis's critical path analysis draws them
(../shared/REFERENCE.md), so the longest path through them is comparable with its:
- `span` on a host thread: its ops and API calls in call order, an op's start to its first
  child's start, a child's end to the next child's start, the last child's end to the op's
  end, each weighing the time between; into the end of a blocking call (a sync, a
  synchronous copy) the edge weighs nothing: that time was waiting, which a `sync` edge
  accounts for. GPU work's own start to end (its duration) is a `span` too;
- `dependency`: one outermost op's end to the next one's start on its thread (nothing:
  the thread was free, nothing held it);
- `launch`: a launch call's start to its work's start, when the stream was idle (the
  only launch pending, the previous work done before the call): the work waited for it;
- `queue`: otherwise, the previous work's end on the stream to this work's start;
- `sync`: a GPU work's end to the end of the host call that waited for it (a stream
  sync: the stream's last work started before the sync ended; a context sync: every
  stream's; an event sync: the work last launched on the event's stream before its
  cudaEventRecord), and the work an event was recorded after to the first work launched
  on a stream after it waited for that event (cudaStreamWaitEvent). Both weigh nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpudiag.analyzers.critical.events import (
    API,
    BLOCKING_CALLS,
    GPU,
    HOST_OP,
    LAUNCH_CALLS,
    SYNC,
    Events,
    graph_events,
    named,
)
from gpudiag.intervals import nesting_depth
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]

#: edge kinds (`Graph.kind`), in this order
EDGE_KINDS = ("span", "dependency", "launch", "queue", "sync")
SPAN, DEPENDENCY, LAUNCH, QUEUE, SYNCED = range(5)


@dataclass
class Graph:
    """The graph's events and its edges (parallel arrays; nodes are `2 e` and `2 e + 1`).
    `owner` is the event each edge's time belongs to: the op or work it spans, the parent
    op between two children, the launched work for a launch, the later work for a gap on
    a stream; -1 for edges that weigh nothing."""

    events: Events
    src: IntArray
    dst: IntArray
    weight: IntArray
    kind: IntArray
    owner: IntArray

    def node_time(self) -> IntArray:
        """Each node's time: its event's start (even nodes) or end (odd nodes)."""
        times = np.empty(2 * len(self.events), dtype=np.int64)
        times[0::2] = self.events.start
        times[1::2] = self.events.end
        return times


class _Edges:
    """Edges as they are added, then one array each."""

    def __init__(self) -> None:
        self.parts: list[tuple[IntArray, ...]] = []

    def add(self, src: npt.ArrayLike, dst: npt.ArrayLike, kind: int, weight: npt.ArrayLike,
            owner: npt.ArrayLike) -> None:
        count = len(np.atleast_1d(np.asarray(src)))
        self.parts.append(tuple(np.broadcast_to(np.asarray(value, dtype=np.int64), count)
                                for value in (src, dst, np.full(count, kind), weight, owner)))

    def arrays(self) -> tuple[IntArray, ...]:
        if not self.parts:
            return tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
        return tuple(np.concatenate([part[column] for part in self.parts])
                     for column in range(5))


def build(trace: Trace, window: tuple[int, int] | None = None) -> Graph:
    """The dependency graph of `trace` over `window` (None: all of it): one graph of its
    own per rank, none of their edges between ranks."""
    events = graph_events(trace, window)
    edges = _Edges()
    _host_edges(events, edges)
    _gpu_edges(events, edges)
    src, dst, kind, weight, owner = edges.arrays()
    return Graph(events, src, dst, weight, kind, owner)


def _host_edges(events: Events, edges: _Edges) -> None:
    """Each thread's ops and calls in call order (see the module docstring)."""
    chosen = np.flatnonzero(events.in_graph & np.isin(events.kind, (HOST_OP, API)))
    if not len(chosen):
        return
    lane = events.pid[chosen] * (2**32) + events.tid[chosen]
    start, end = events.start[chosen], events.end[chosen]
    depth = nesting_depth(lane, start, end)
    parent = _parents(lane, start, end, depth)
    # every start and end point, in call order: by thread, time, ends before starts at the
    # same time, the outer start first and the inner end first
    count = len(chosen)
    is_start = np.concatenate([np.ones(count, bool), np.zeros(count, bool)])
    point_event = np.concatenate([np.arange(count), np.arange(count)])
    point_time = np.concatenate([start, end])
    point_depth = np.concatenate([depth, -depth])
    order = np.lexsort((point_depth, is_start, point_time, np.concatenate([lane, lane])))
    event, starting = point_event[order], is_start[order]
    same_lane = lane[event[1:]] == lane[event[:-1]]
    left, right = np.flatnonzero(same_lane), np.flatnonzero(same_lane) + 1
    node = 2 * chosen[event] + (~starting)
    outer_end = ~starting[left] & (depth[event[left]] == 0)
    edges.add(node[left[outer_end]], node[right[outer_end]], DEPENDENCY, 0, -1)
    left, right = left[~outer_end], right[~outer_end]
    gap = point_time[order][right] - point_time[order][left]
    blocking = named(events.name[chosen], BLOCKING_CALLS.__contains__)
    into_blocking_end = ~starting[right] & blocking[event[right]]
    owner = np.where(starting[left], event[left],
                     np.where(~starting[right], event[right], parent[event[left]]))
    owner_event = np.where(owner >= 0, chosen[np.maximum(owner, 0)], -1)
    edges.add(node[left], node[right], SPAN, np.where(into_blocking_end, 0, gap),
              np.where(into_blocking_end, -1, owner_event))


def _parents(lane: IntArray, start: IntArray, end: IntArray, depth: IntArray) -> IntArray:
    """Each event's enclosing event one level up on its thread (-1: outermost), as a
    position in the arrays given: the last event one level up that opened before it."""
    order = np.lexsort((-end, start, lane))
    rank_of = np.empty(len(order), dtype=np.int64)
    rank_of[order] = np.arange(len(order))
    parent = np.full(len(lane), -1, dtype=np.int64)
    for level in range(1, int(depth.max()) + 1 if len(depth) else 1):
        inner = np.flatnonzero(depth == level)
        outer = np.flatnonzero(depth == level - 1)
        if not len(inner) or not len(outer):
            continue
        outer = outer[np.argsort(rank_of[outer])]
        last = np.searchsorted(rank_of[outer], rank_of[inner], side="right") - 1
        candidate = outer[np.maximum(last, 0)]
        found = (last >= 0) & (lane[candidate] == lane[inner])
        parent[inner[found]] = candidate[found]
    return parent


def _gpu_edges(events: Events, edges: _Edges) -> None:
    """Work on its streams, launches, syncs and stream waits (see the module docstring),
    in HTA's walk order (work by its start, syncs by their end), without a Python step per
    work: only syncs and stream waits are taken one by one."""
    work = np.flatnonzero(events.in_graph & (events.kind == GPU))
    syncs = np.flatnonzero(events.in_graph & (events.kind == SYNC))
    edges.add(2 * work, 2 * work + 1, SPAN, events.end[work] - events.start[work], work)
    walked = np.concatenate([work, syncs])
    walked = walked[np.argsort(np.concatenate([events.start[work], events.end[syncs]]),
                               kind="stable")]
    position = np.full(len(events), -1, dtype=np.int64)
    position[walked] = np.arange(len(walked))
    stream = events.device * (2**32) + events.stream
    ordered = work[np.lexsort((position[work], stream[work]))]  # each stream's, in turn
    previous = np.full(len(ordered), -1, dtype=np.int64)  # each stream's first has none
    same_stream = stream[ordered][1:] == stream[ordered][:-1]
    previous[1:][same_stream] = ordered[:-1][same_stream]
    waits = _stream_waits(events, syncs)
    before = _held_by(events, waits, position)[ordered]
    _queued(events, edges, ordered, previous, before)
    _synced(events, edges, syncs[np.argsort(position[syncs])], waits,
            (ordered, stream[ordered], position[ordered]), position=position)


def _held_by(events: Events, waits: dict[int, tuple[int, int]], position: IntArray
             ) -> IntArray:
    """For each work, the work a stream wait holds it for (-1: none): the wait must come
    before it in the walk, and a later wait for the same work replaces an earlier one."""
    held = np.full(len(events), -1, dtype=np.int64)
    for sync in sorted(waits, key=lambda event: int(position[event])):
        source, target = waits[sync]
        if (events.sync_kind[sync] == "stream_wait" and target >= 0
                and position[sync] < position[target] and events.in_graph[source]):
            held[target] = source
    return held


def _queued(events: Events, edges: _Edges, ordered: IntArray, previous: IntArray,
            before: IntArray) -> None:
    """Each work's incoming edges: the stream wait that held it, then its launch (the
    stream was idle) or else the stream's previous work."""
    held = before >= 0
    edges.add(2 * before[held] + 1, 2 * ordered[held], SYNCED, 0, -1)
    call = events.launch[ordered]
    call_start = events.start[np.maximum(call, 0)]
    has_previous = previous >= 0
    previous_end = events.end[np.maximum(previous, 0)]
    held_end = events.end[np.maximum(before, 0)]
    idle = ((events.queue_at_launch[ordered] == 1) & (events.queue_at_start[ordered] == 0)
            & (~has_previous | (previous_end < call_start))
            & (~held | (held_end < call_start)))
    queued = ~idle & has_previous & (~held | (held_end < previous_end))
    starts = events.start[ordered]
    edges.add(2 * call[idle], 2 * ordered[idle], LAUNCH, (starts - call_start)[idle],
              ordered[idle])
    edges.add(2 * previous[queued] + 1, 2 * ordered[queued], QUEUE,
              (starts - previous_end)[queued], ordered[queued])


def _synced(events: Events, edges: _Edges, syncs: IntArray, waits: dict[int, tuple[int, int]],
            streams: tuple[IntArray, IntArray, IntArray], *, position: IntArray) -> None:
    """Each sync's edges from the work it waited for to the end of its host call: a stream
    sync's stream's latest work so far in the walk, a context sync's every stream's, an
    event sync's recorded work."""
    ordered, stream_of, walk = streams
    lanes = np.unique(stream_of)
    for sync in syncs.tolist():
        kind = events.sync_kind[sync]
        call = int(events.launch[sync])
        if kind == "stream_wait" or call < 0 or not events.in_graph[call]:
            continue
        if kind == "event":
            source = waits.get(sync)
            ends = [2 * source[0] + 1] if source is not None and events.in_graph[source[0]] \
                else []
        elif kind in ("context", "stream"):
            wanted = lanes if kind == "context" else \
                [int(events.device[sync]) * (2**32) + int(events.stream[sync])]
            at = int(position[sync])
            ends = [end for lane in wanted
                    if (end := _latest(ordered, stream_of, walk, lane, at)) >= 0]
        else:
            ends = []
        for end in ends:
            edges.add(end, 2 * call + 1, SYNCED, 0, -1)


def _latest(ordered: IntArray, stream_of: IntArray, walk: IntArray, lane: int,
            at: int) -> int:
    """The end node of the latest work of `lane` walked before position `at` (-1: none)."""
    first = int(np.searchsorted(stream_of, lane, side="left"))
    last = int(np.searchsorted(stream_of, lane, side="right"))
    count = int(np.searchsorted(walk[first:last], at, side="left"))
    return 2 * int(ordered[first + count - 1]) + 1 if count else -1


def _stream_waits(events: Events, syncs: IntArray) -> dict[int, tuple[int, int]]:
    """For each stream wait and event sync: the work launched last on the recorded event's
    stream before its cudaEventRecord, and (stream waits) the first work launched on the
    waiting stream by the waiting thread after the cudaStreamWaitEvent (-1: none)."""
    waiting = syncs[np.isin(events.sync_kind[syncs], ("stream_wait", "event"))
                    & (events.record_correlation[syncs] >= 0)]
    if not len(waiting):
        return {}
    launches = _launches(events)
    records = _calls_by_correlation(events, "cudaEventRecord")
    out: dict[int, tuple[int, int]] = {}
    for sync in waiting.tolist():
        record = records.get((int(events.pid[sync]), int(events.record_correlation[sync])))
        if record is None:
            continue
        source = _launched_before(events, launches, int(events.device[sync]),
                                  int(events.record_stream[sync]), int(events.start[record]))
        if source < 0:
            continue
        target = -1
        call = int(events.launch[sync])
        if events.sync_kind[sync] == "stream_wait" and call >= 0:
            target = _launched_after(events, launches, call, int(events.stream[sync]))
        out[sync] = (source, target)
    return out


def _launches(events: Events) -> IntArray:
    """GPU work launched by a launch call, in the calls' time order."""
    work = np.flatnonzero((events.kind == GPU) & (events.launch >= 0))
    names = events.name[events.launch[work]]
    work = work[named(names, LAUNCH_CALLS.__contains__)]
    return work[np.argsort(events.start[events.launch[work]], kind="stable")]


def _calls_by_correlation(events: Events, name: str) -> dict[tuple[int, int], int]:
    calls = np.flatnonzero((events.kind == API) & (events.name == name))
    return {(int(events.pid[call]), int(events.correlation[call])): int(call)
            for call in calls.tolist()}


def _launched_before(events: Events, launches: IntArray, device: int, stream: int,
                     time: int) -> int:
    """The work last launched on (device, stream) by a call that started by `time`."""
    mine = launches[(events.stream[launches] == stream) & (events.device[launches] == device)]
    calls = events.start[events.launch[mine]]
    position = int(np.searchsorted(calls, time, side="right")) - 1
    return int(mine[position]) if position >= 0 else -1


def _launched_after(events: Events, launches: IntArray, call: int, stream: int) -> int:
    """The work the thread of `call` launched first on `stream` after `call`."""
    mine = launches[(events.stream[launches] == stream)
                    & (events.pid[events.launch[launches]] == events.pid[call])
                    & (events.tid[events.launch[launches]] == events.tid[call])]
    calls = events.start[events.launch[mine]]
    position = int(np.searchsorted(calls, events.start[call], side="right"))
    return int(mine[position]) if position < len(mine) else -1


__all__ = ["EDGE_KINDS", "GPU", "HOST_OP", "SYNC", "Graph", "build"]
