"""The critical path: the longest chain of dependencies through a trace's graph.

    cp = critical_path(trace)                         # or window=(start_ns, end_ns)
    cp.length_ns                                      # what set the window's length
    cp.edges.groupby("bound_by")["ns"].sum()          # host, GPU compute, launch, gaps
    cp.edges.sort_values("ns").tail()                 # the events that weigh most on it

The longest path of the graph of `graph.build` (edge weights are the time between their
ends; waits weigh nothing, so the path goes through what was waited for), found without a
Python step per node: almost every node has one incoming edge, so each node is reached from
its nearest ancestor with several (a join: a sync, a stream wait) or none by pointer
jumping, and only the joins are walked in order. As Holistic Trace Analysis's does, a path
with a negative edge (clock skew: a child ending after its parent) counts it as zero.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.analyzers.critical.events import GPU, TABLES, Events, named
from gpudiag.analyzers.critical.graph import EDGE_KINDS, Graph, build
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]

#: `bound_by` of each edge kind on the path (HTA's classes); spans by where they ran
BOUND_BY = {"launch": "launch_overhead", "queue": "kernel_gap", "dependency": "",
            "sync": ""}


@dataclass
class CriticalPath:
    """The path: its length, its edges in order (`edges`: one row each, with the event its
    time belongs to and `bound_by`), and the graph it runs through."""

    length_ns: int
    edges: pd.DataFrame
    graph: Graph
    window: tuple[int, int]

    def summary(self) -> pd.Series:
        """ns of the path per `bound_by` (host, gpu_compute, gpu_communication,
        launch_overhead, kernel_gap), largest first."""
        timed = self.edges[self.edges["bound_by"] != ""]
        return timed.groupby("bound_by")["ns"].sum().sort_values(ascending=False)


def critical_path(trace: Trace, window: tuple[int, int] | None = None) -> CriticalPath:
    """The critical path of `trace` over `window` (None: the whole trace); of a merged
    job, the longest rank's (`rank_paths`: every rank's)."""
    graph = build(trace, window)
    nodes, length = longest_path(graph)
    return CriticalPath(length, _path_edges(graph, nodes), graph, graph.events.window)


#: the most launch calls and GPU work a report draws the critical path of: past it the
#: path's own pass (about 9 s per million kernels) would outweigh the page it draws on
DRAW_LIMIT = 1_000_000


def drawable(trace: Trace) -> bool:
    """Whether the reports draw `trace`'s critical paths: it has launch calls and GPU work,
    and no more than `DRAW_LIMIT` of them."""
    gpu = len(trace.kernels) + len(trace.copies)
    return bool(len(trace.api)) and gpu > 0 and len(trace.api) + gpu <= DRAW_LIMIT


def rank_paths(trace: Trace, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """Every rank's critical path: `CriticalPath.edges`' columns and `rank` (NA: none
    given), rank by rank, each path's edges in order.

        paths = rank_paths(trace)
        paths.groupby(["rank", "bound_by"])["ns"].sum()
    """
    graph = build(trace, window)
    ranks, group = np.unique(np.repeat(graph.events.rank, 2), return_inverse=True)
    paths = longest_paths(graph.src, graph.dst, graph.weight, group.astype(np.int64),
                          len(ranks))
    frames = [_path_edges(graph, nodes).assign(rank=rank)
              for rank, nodes in zip(ranks.tolist(), paths, strict=True)]
    out = pd.concat(frames, ignore_index=True) if frames else _describe(
        graph, np.zeros(0, dtype=np.int64)).assign(rank=pd.Series(dtype="int64"))
    out["rank"] = keys.key_column(out["rank"])
    return out


def longest_path(graph: Graph) -> tuple[list[int], int]:
    """The nodes of the longest path, in order, and its length (ns)."""
    return longest(graph.src, graph.dst, graph.weight, 2 * len(graph.events))


def longest(src: IntArray, dst: IntArray, weight: IntArray, count: int
            ) -> tuple[list[int], int]:
    """The longest path through `count` nodes and these edges (negative weights count as
    zero): its nodes in order and its length."""
    if not len(src):
        return [], 0
    distance, indegree, pred, chosen = _distances(src, dst, weight, count)
    end = int(np.argmax(distance))
    return _back_from(end, indegree, pred, chosen), int(distance[end])


def _back_from(end: int, indegree: IntArray, pred: IntArray, chosen: dict[int, int]
               ) -> list[int]:
    """The longest path's nodes that end at `end`, in order."""
    nodes = [end]
    node = end
    while indegree[node]:
        node = int(pred[node]) if indegree[node] == 1 else chosen[node]
        nodes.append(node)
    return nodes[::-1]


def longest_length(src: IntArray, dst: IntArray, weight: IntArray, count: int) -> int:
    """The length of the longest path alone (what a replay needs)."""
    return int(_distances(src, dst, weight, count)[0].max()) if len(src) else 0


def longest_lengths(src: IntArray, dst: IntArray, weight: IntArray, group: IntArray,
                    groups: int) -> IntArray:
    """The longest path's length in each group of nodes (`group`: each node's, 0 to
    `groups` - 1; a graph of several ranks, none of its edges between groups)."""
    out = np.zeros(groups, dtype=np.int64)
    if len(src):
        np.maximum.at(out, group, _distances(src, dst, weight, len(group))[0])
    return out


def longest_paths(src: IntArray, dst: IntArray, weight: IntArray, group: IntArray,
                  groups: int) -> list[list[int]]:
    """Each group's longest path (its nodes in order; `longest_lengths`' groups)."""
    if not len(src):
        return [[] for _ in range(groups)]
    distance, indegree, pred, chosen = _distances(src, dst, weight, len(group))
    order = np.lexsort((-distance, group))  # by group, the longest distance first
    first = np.searchsorted(group[order], np.arange(groups))
    return [_back_from(int(order[at]), indegree, pred, chosen)
            if at < len(order) and group[order[at]] == index else []
            for index, at in enumerate(first.tolist())]


def _distances(src: IntArray, dst: IntArray, weight: IntArray, count: int
               ) -> tuple[IntArray, IntArray, IntArray, dict[int, int]]:
    """Each node's longest distance from a root, its indegree, its one predecessor and,
    for joins, the predecessor the longest distance came through."""
    weight = np.maximum(weight, 0)
    indegree = np.bincount(dst, minlength=count)
    pred, anchor, above = _anchors(src, dst, weight, indegree)
    distance, chosen = _join_distances(src, dst, weight, indegree, anchors=(anchor, above))
    return distance[anchor] + above, indegree, pred, chosen


def _anchors(src: IntArray, dst: IntArray, weight: IntArray, indegree: IntArray
             ) -> tuple[IntArray, IntArray, IntArray]:
    """Each node's one predecessor (-1 for joins and roots), its nearest ancestor that is
    a join or a root (itself for those), and the time between them along the chain."""
    count = len(indegree)
    pred = np.full(count, -1, dtype=np.int64)
    step = np.zeros(count, dtype=np.int64)
    single = indegree[dst] == 1
    pred[dst[single]] = src[single]
    step[dst[single]] = weight[single]
    nodes = np.arange(count, dtype=np.int64)
    anchor = np.where(pred >= 0, pred, nodes)
    above = step.copy()
    moving = np.flatnonzero(indegree[anchor] == 1)
    moving = moving[pred[moving] >= 0]
    while len(moving):  # pointer jumping: the distance to the anchor doubles each round
        hop = anchor[moving]
        above[moving] += above[hop]
        anchor[moving] = anchor[hop]
        moving = moving[indegree[anchor[moving]] == 1]
    return pred, anchor, above


def _join_distances(src: IntArray, dst: IntArray, weight: IntArray, indegree: IntArray, *,
                    anchors: tuple[IntArray, IntArray]) -> tuple[IntArray, dict[int, int]]:
    """The longest distance to every join and root (0 for roots), joins taken in the order
    of their dependencies on each other, and the predecessor each join's came through.
    `anchors`: each node's nearest join or root and the time from it (`_anchors`)."""
    anchor, above = anchors
    distance = np.zeros(len(indegree), dtype=np.int64)
    into_join = np.flatnonzero(indegree[dst] >= 2)
    if not len(into_join):
        return distance, {}
    joins = np.unique(dst[into_join])
    incoming: dict[int, list[int]] = {int(join): [] for join in joins}
    for edge in into_join.tolist():
        incoming[int(dst[edge])].append(edge)
    waiting = {join: sum(1 for edge in edges if indegree[anchor[src[edge]]] >= 2)
               for join, edges in incoming.items()}
    unblocks: dict[int, list[int]] = {}
    for join, edges in incoming.items():
        for edge in edges:
            head = int(anchor[src[edge]])
            if indegree[head] >= 2:
                unblocks.setdefault(head, []).append(join)
    ready = deque(join for join, count in waiting.items() if count == 0)
    chosen: dict[int, int] = {}
    while ready:
        join = ready.popleft()
        best, via = -1, -1
        for edge in incoming[join]:
            origin = int(src[edge])
            length = int(distance[anchor[origin]] + above[origin] + weight[edge])
            if length > best:
                best, via = length, origin
        distance[join], chosen[join] = best, via
        for later in unblocks.get(join, []):
            waiting[later] -= 1
            if waiting[later] == 0:
                ready.append(later)
    return distance, chosen


def _path_edges(graph: Graph, nodes: list[int]) -> pd.DataFrame:
    """One row per edge of the path: kind, ns, the event it belongs to and `bound_by`."""
    if len(nodes) < 2:
        return _describe(graph, np.zeros(0, dtype=np.int64))
    src, dst = np.asarray(nodes[:-1]), np.asarray(nodes[1:])
    key = graph.src * (2 * len(graph.events) + 1) + graph.dst
    order = np.argsort(key, kind="stable")
    wanted = src * (2 * len(graph.events) + 1) + dst
    position = order[np.searchsorted(key[order], wanted)]
    return _describe(graph, position)


def _describe(graph: Graph, edge: IntArray) -> pd.DataFrame:
    events: Events = graph.events
    owner = graph.owner[edge]
    known = owner >= 0
    safe = np.maximum(owner, 0)
    kind = np.asarray(EDGE_KINDS, dtype=object)[graph.kind[edge]]
    names = events.name[safe].copy()
    names[~known] = None
    bound = _bound_by(kind, np.where(known, events.kind[safe], -1), names)
    times = graph.node_time()
    return pd.DataFrame({
        "kind": pd.Categorical(kind, categories=EDGE_KINDS),
        "start_ns": times[graph.src[edge]], "end_ns": times[graph.dst[edge]],
        "ns": np.maximum(graph.weight[edge], 0),
        "table": pd.Categorical(pd.Series(np.asarray(TABLES, dtype=object)[
            events.table[safe]]).where(known), categories=TABLES),
        "row": pd.Series(events.row[safe], dtype="Int64").where(known),
        "name": pd.array(names, dtype="string"),
        "bound_by": bound,
    })


def _bound_by(kind: npt.NDArray[np.object_], event_kind: IntArray,
              names: npt.NDArray[np.object_]) -> npt.NDArray[np.object_]:
    """Where each edge's time went: HTA's classes (host, GPU compute or communication,
    launch overhead, gaps between kernels)."""
    communication = named(names, lambda name: "nccl" in name.lower())
    spans = np.where(event_kind != GPU, "host",
                     np.where(communication, "gpu_communication", "gpu_compute"))
    fixed = pd.Series(kind).map(BOUND_BY).to_numpy(dtype=object)
    return np.where(pd.isna(fixed), spans, fixed).astype(object)
