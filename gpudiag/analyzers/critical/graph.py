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
    """The dependency graph of `trace` (one rank's) over `window` (None: all of it)."""
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
    blocking = np.fromiter((name in BLOCKING_CALLS for name in events.name[chosen]), bool,
                           count)
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
    walked in HTA's order: work by its start, syncs by their end."""
    work = np.flatnonzero(events.in_graph & (events.kind == GPU))
    syncs = np.flatnonzero(events.in_graph & (events.kind == SYNC))
    edges.add(2 * work, 2 * work + 1, SPAN, events.end[work] - events.start[work], work)
    walk = _StreamWalk(events, edges, _stream_waits(events, syncs))
    order = np.concatenate([work, syncs])
    at = np.concatenate([events.start[work], events.end[syncs]])
    for event in order[np.argsort(at, kind="stable")].tolist():
        if events.kind[event] == SYNC:
            walk.sync(event)
        else:
            walk.work(event)


class _StreamWalk:
    """The GPU side walked in time order: each stream's latest work, and the stream waits
    that hold a later work until an earlier one ends."""

    def __init__(self, events: Events, edges: _Edges, waits: dict[int, tuple[int, int]]
                 ) -> None:
        self.events, self.edges, self.waits = events, edges, waits
        self.last: dict[tuple[int, int], int] = {}  # stream -> its latest work's end node
        self.waited: dict[int, int] = {}  # work -> the work a stream wait holds it for

    def work(self, event: int) -> None:
        """One work's incoming edge: a stream wait, its launch or the stream's previous
        work."""
        events, edges = self.events, self.edges
        stream = (int(events.device[event]), int(events.stream[event]))
        start = 2 * event
        before = self.waited.pop(event, None)
        if before is not None and not events.in_graph[before]:
            before = None
        if before is not None:
            edges.add(2 * before + 1, start, SYNCED, 0, -1)
        call = int(events.launch[event])
        previous = self.last.get(stream)
        previous_end = None if previous is None else int(events.end[previous // 2])
        before_end = None if before is None else int(events.end[before])
        call_start = int(events.start[call])
        idle = (events.queue_at_launch[event] == 1 and events.queue_at_start[event] == 0
                and (previous_end is None or previous_end < call_start)
                and (before_end is None or before_end < call_start))
        if idle:
            edges.add(2 * call, start, LAUNCH, int(events.start[event]) - call_start, event)
        elif previous is not None and previous_end is not None and (
                before_end is None or before_end < previous_end):
            edges.add(previous, start, QUEUE, int(events.start[event]) - previous_end, event)
        self.last[stream] = 2 * event + 1

    def sync(self, event: int) -> None:
        """A sync's edges: GPU work to the host call that waited for it, or a stream wait."""
        events, kind = self.events, self.events.sync_kind[event]
        if kind == "stream_wait":
            pair = self.waits.get(event)
            if pair is not None:
                self.waited[pair[1]] = pair[0]
            return
        call = int(events.launch[event])
        if call < 0 or not events.in_graph[call]:
            return
        if kind == "event":
            source = self.waits.get(event)
            ends = [2 * source[0] + 1] if source is not None and events.in_graph[source[0]] \
                else []
        elif kind == "context":
            ends = list(self.last.values())
        elif kind == "stream":
            stream = (int(events.device[event]), int(events.stream[event]))
            ends = [self.last[stream]] if stream in self.last else []
        else:
            ends = []
        for end in ends:
            self.edges.add(end, 2 * call + 1, SYNCED, 0, -1)


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
    work = work[np.fromiter((name in LAUNCH_CALLS for name in names), bool, len(work))]
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
