"""What-if replays: a trace's schedule replayed with one cause of lost time taken away.

    replay = Replay.of(trace)                 # or window=(start_ns, end_ns)
    replay.length_ns                          # the replayed window, as recorded
    replay.without_waits(calls).saving()      # what removing those waits saves

Each rank of a merged job is replayed on its own (`lengths`: one per rank, their
collectives as recorded); a transformation's saving is the most it shortens a rank.

A replay runs every event as early as its dependencies allow: the longest path through the
replay graph is the replayed length. The replay graph is the critical-path graph
(`graph.build`) with what a replay must keep and the critical path does not need:
- host time between outermost ops counts (Python, untraced work: a host that stays as
  slow stays as slow), where the path's `dependency` edges weigh nothing;
- GPU work never starts before its launch call starts nor before its stream's previous
  work ends (the critical-path graph draws only the edge that held it);
- a blocking call returns as long after the work it waited for as it did (the path's sync
  edges weigh nothing), and one that waited for nothing takes its own time (the path
  weighs the end of every call on HTA's blocking list at nothing);
- every blocking host call waits for what it waited for, whether or not the trace holds
  CUDA sync records: a synchronous copy for its copy; a synchronize for the last work
  started before it returned on the streams it waited on (its stream when the sync record
  names one, else every stream of its process). Edges already drawn from sync records are
  kept as they are.
Each transformation keeps everything else fixed: what it is optimistic about is said at
each (and in docs/analysis.md, "Expected savings").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals as iv
from gpudiag.analyzers.critical.events import (
    API,
    BLOCKING_CALLS,
    GPU,
    HOST_OP,
    TABLES,
    Events,
    named,
)
from gpudiag.analyzers.critical.graph import DEPENDENCY, LAUNCH, QUEUE, SPAN, SYNCED, Graph, build
from gpudiag.analyzers.critical.path import longest_lengths, longest_paths
from gpudiag.analyzers.keys import MISSING
from gpudiag.analyzers.losses.waits import SYNC_APIS, SYNC_COPY_APIS
from gpudiag.trace import Trace

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: how soon after another stream's work ends a work that waited for no launch nor stream
#: started, for the replay to take it as held by that work (`_held_by_other_streams`)
HELD_NS = 10_000
#: the replay's edges between ranks: matched collectives' calls through their join node
PEERS = 6
#: the event kinds of a host thread
HOST = (HOST_OP, API)
#: the replay graph's own edges: GPU work after its launch call and its stream's previous
#: work, where the critical-path graph drew only the other (zero: they only order)
ORDER = 5


@dataclass
class Replay:
    """A trace's replay graph (see the module docstring) and its replayed length."""

    graph: Graph
    src: IntArray
    dst: IntArray
    weight: IntArray
    kind: IntArray
    group: IntArray  # each node's rank, numbered 0.. in `ranks` order (joins: len(ranks))
    ranks: IntArray  # the ranks (`keys.key_array` values) of the graph's events, sorted
    lengths: IntArray  # each rank's replayed length
    owner: IntArray  # the event each edge's time belongs to (-1: none)
    _on_path: BoolArray | None = field(default=None, repr=False)

    @classmethod
    def of(cls, trace: Trace, window: tuple[int, int] | None = None,
           skew: pd.DataFrame | None = None) -> Replay:
        """The replay of `trace` over `window` (None: all of it), each rank on its own but
        for their matched collectives: `skew`, the `arrival_skew` of the trace (None: found
        here; a job replayed from its batches' rows gives the job's)."""
        graph = build(trace, window)
        times = graph.node_time()
        weight = graph.weight.copy()
        between = graph.kind == DEPENDENCY
        weight[between] = times[graph.dst[between]] - times[graph.src[between]]
        order_src, order_dst, wait_src, wait_dst = _order_edges(graph)
        src = np.concatenate([graph.src, order_src, wait_src])
        dst = np.concatenate([graph.dst, order_dst, wait_dst])
        kind = np.concatenate([graph.kind, np.full(len(order_src), ORDER),
                               np.full(len(wait_src), SYNCED)])
        weight = np.concatenate([weight, np.zeros(len(order_src) + len(wait_src),
                                                  dtype=np.int64)])
        waited = kind == SYNCED  # a call returns as long after its work as it did
        weight[waited] = np.maximum(times[dst[waited]] - times[src[waited]], 0)
        # a "blocking" call that waited for nothing (a cudaMemcpyAsync from pinned memory
        # returns at once): its own time counts, as any call's
        free = (kind == SPAN) & (weight == 0) & (dst % 2 == 1) & ~np.isin(dst, dst[waited])
        weight[free] = np.maximum(times[dst[free]] - times[src[free]], 0)
        ranks, group = np.unique(np.repeat(graph.events.rank, 2), return_inverse=True)
        group = group.astype(np.int64)
        owner = np.concatenate([graph.owner, np.full(len(src) - len(graph.src), -1)])
        joins = _peer_joins(trace, graph, times, group, len(ranks), skew=skew)
        if joins is not None:
            weight[joins.own] = joins.own_weight
            src, dst = np.concatenate([src, joins.src]), np.concatenate([dst, joins.dst])
            kind = np.concatenate([kind, np.full(len(joins.src), PEERS)])
            weight = np.concatenate([weight, joins.weight])
            owner = np.concatenate([owner, joins.owner])
            group = np.concatenate([group, joins.group])
        return cls(graph, src, dst, weight, kind, group, ranks,
                   longest_lengths(src, dst, weight, group, len(ranks) + 1)[:-1], owner)

    @property
    def length_ns(self) -> int:
        """The replayed window: the longest of the ranks'."""
        return int(self.lengths.max()) if len(self.lengths) else 0

    def lengths_with(self, weight: IntArray | None = None, keep: BoolArray | None = None
                     ) -> IntArray:
        """Each rank's replayed length with some edges reweighted and some taken away."""
        weight = self.weight if weight is None else weight
        groups = len(self.ranks) + 1  # the last: join nodes, of no rank's length
        if keep is None:
            return longest_lengths(self.src, self.dst, weight, self.group, groups)[:-1]
        return longest_lengths(self.src[keep], self.dst[keep], weight[keep], self.group,
                               groups)[:-1]

    def without_waits(self, calls: IntArray) -> Outcome:
        """The length if these blocking calls (events) did not wait for the GPU: their
        sync edges are taken away (the call returns as soon as it is made). Optimistic
        where a later call would then wait longer for the same work: that wait is kept."""
        ends = 2 * np.asarray(calls, dtype=np.int64) + 1
        keep = ~((self.kind == SYNCED) & self._nodes(ends)[self.dst])
        return Outcome(self, self.weight, keep)

    def faster_calls(self, calls: IntArray, cost_ns: int) -> Outcome:
        """The length if these host calls (launches) took at most `cost_ns` each, and their
        work followed them as soon as it did before (a CUDA graph replay: one launch for
        many kernels). The host time they save moves everything after them earlier."""
        weight = self.weight.copy()
        owned = self._owned_by(calls) & (self.kind == SPAN)
        weight[owned] = np.minimum(weight[owned], cost_ns)
        return Outcome(self, weight, None)

    def faster_host(self, events: IntArray) -> Outcome:
        """The length if these host ops took no time (data loading made as fast as the GPU
        needs): their spans weigh nothing, the host time around them stays."""
        weight = self.weight.copy()
        weight[self._owned_by(events) & (self.kind == SPAN)] = 0
        return Outcome(self, weight, None)

    def shorter_work(self, events: IntArray, factor: npt.ArrayLike) -> Outcome:
        """The length if this GPU work ran in `factor` of its time (a full wave: its
        under-occupied share taken away; a collective hidden under compute), its transfer
        after its peers' arrival too."""
        weight = self.weight.copy()
        scale = np.ones(len(self.graph.events))
        scale[np.asarray(events, dtype=np.int64)] = factor
        spans = np.isin(self.kind, (SPAN, PEERS)) & (self.owner >= 0)
        owner = self.owner[spans]
        weight[spans] = np.round(weight[spans] * scale[owner]).astype(np.int64)
        return Outcome(self, weight, None)

    def without_host_time(self, pid: IntArray, tid: IntArray, start: IntArray,
                          end: IntArray) -> Outcome:
        """The length if each thread (`pid`: its process's code, `Events.pid`; `tid`,
        `keys.MISSING`: every thread of the process) spent no time in its intervals
        [start, end): its ops, calls and the time between them shorten by what lies inside
        (a host section made as fast as the GPU needs). Waiting inside them still waits
        for the GPU work it waited for."""
        events, times = self.graph.events, self.graph.node_time()
        weight = self.weight.copy()
        real = (self.src < 2 * len(events)) & (self.dst < 2 * len(events))
        first = np.where(real, self.src // 2, 0)
        second = np.where(real, self.dst // 2, 0)
        host = (real & np.isin(self.kind, (SPAN, DEPENDENCY))
                & np.isin(events.kind[first], HOST) & np.isin(events.kind[second], HOST))
        pairs: IntArray = np.unique(np.column_stack([pid, tid]), axis=0) if len(pid) \
            else np.zeros((0, 2), dtype=np.int64)
        for lane_pid, lane_tid in pairs.tolist():
            mine = (pid == lane_pid) & (tid == lane_tid)
            spans = iv.union(start[mine], end[mine])
            edges = np.flatnonzero(host & (events.pid[first] == lane_pid)
                                   & ((events.tid[first] == lane_tid) | (lane_tid == MISSING)))
            cut = (iv.covered_before(spans, times[self.dst[edges]])
                   - iv.covered_before(spans, times[self.src[edges]]))
            weight[edges] = np.maximum(weight[edges] - np.maximum(cut, 0), 0)
        return Outcome(self, weight, None)

    def without_peer_waits(self, works: IntArray, factor: npt.ArrayLike) -> Outcome:
        """The length if these collectives did not wait for late peers: matched across
        ranks (`_peer_joins`), a rank's call ends its transfer time after its own start;
        unmatched, it runs in `factor` of its time (its recorded wait taken off)."""
        works = np.asarray(works, dtype=np.int64)
        ends = 2 * works + 1
        joined = (self.kind == PEERS) & self._nodes(ends)[self.dst]
        alone = ~self._nodes(self.dst[joined])[ends]
        weight = self.shorter_work(works[alone],
                                   np.broadcast_to(np.asarray(factor, dtype=np.float64),
                                                   len(works))[alone]).weight
        return Outcome(self, weight, ~joined)

    def without_dependencies(self, works: IntArray) -> Outcome:
        """The length if this queued GPU work started as soon as its stream's previous work
        ended: what it waited for on other streams (an event, a stream wait) is dropped."""
        starts = 2 * np.asarray(works, dtype=np.int64)
        into = self._nodes(starts)[self.dst]
        weight = self.weight.copy()
        weight[into & (self.kind == QUEUE)] = 0
        return Outcome(self, weight, ~(into & (self.kind == SYNCED)))

    def without_gaps(self) -> Outcome:
        """The length if work on every stream followed the previous work at once (no idle
        between queued kernels, no launch delay): the GPU's own gaps taken away."""
        weight = self.weight.copy()
        weight[np.isin(self.kind, (LAUNCH, QUEUE))] = 0
        return Outcome(self, weight, None)

    def on_path(self) -> BoolArray:
        """Which edges lie on a rank's longest path (parallel edges between two of its
        nodes all count): what bounds a transformation's saving (`Outcome.bound`)."""
        if self._on_path is None:
            span = len(self.group) + 1
            pairs = [np.asarray(nodes[:-1], dtype=np.int64) * span
                     + np.asarray(nodes[1:], dtype=np.int64)
                     for nodes in longest_paths(self.src, self.dst, self.weight, self.group,
                                                len(self.ranks) + 1)[:-1]]
            self._on_path = np.isin(self.src * span + self.dst,
                                    np.concatenate([np.zeros(0, dtype=np.int64), *pairs]))
        return self._on_path

    def _nodes(self, nodes: npt.ArrayLike) -> BoolArray:
        """A mask over the graph's nodes (join nodes too) set at `nodes`."""
        mask = np.zeros(len(self.group), dtype=bool)
        mask[np.asarray(nodes, dtype=np.int64)] = True
        return mask

    def _owned_by(self, events: npt.ArrayLike) -> BoolArray:
        """Which edges' time belongs to one of `events`."""
        mask = np.zeros(len(self.graph.events) + 1, dtype=bool)  # the last: owner -1
        mask[np.asarray(events, dtype=np.int64)] = True
        return mask[self.owner]


@dataclass(frozen=True)
class Outcome:
    """A transformation of a replay: its reweighted edges (`keep`: the edges left, None:
    all). `length()` replays it; `bound()` is the most it can save without replaying."""

    replay: Replay
    weight: IntArray
    keep: BoolArray | None

    def length(self) -> int:
        """The replayed length (the longest rank's)."""
        return int(self.lengths().max(initial=0))

    def lengths(self) -> IntArray:
        """Each rank's replayed length."""
        return self.replay.lengths_with(self.weight, self.keep)

    def saving(self) -> int:
        """How much shorter the replay of the rank it shortens most gets."""
        return int((self.replay.lengths - self.lengths()).max(initial=0))

    def bound(self) -> int:
        """An upper bound on `saving()`: each rank's longest path is still a path, shorter
        only by what the transformation took off its own edges; None of that holds when
        an edge of it is taken away (then the whole length)."""
        on = self.replay.on_path()
        if self.keep is not None and (on & ~self.keep).any():
            return self.replay.length_ns
        cut = np.maximum(self.replay.weight - self.weight, 0)[on]
        rank = self.replay.group[self.replay.src[on]]
        return int(np.bincount(rank, weights=cut, minlength=1).max())


@dataclass(frozen=True)
class _Joins:
    """Edges that tie matched collectives across ranks: each call's start to its match's
    join node, the join to each call's end (weighing that call's transfer time: its time
    once the last peer arrived), and each call's own span reweighted to that transfer."""

    src: IntArray
    dst: IntArray
    weight: IntArray
    owner: IntArray
    group: IntArray  # each join node's group: one past the ranks' (none of theirs)
    own: IntArray  # the calls' own span edges
    own_weight: IntArray


def _peer_joins(trace: Trace, graph: Graph, times: IntArray, group: IntArray, ranks: int, *,
                skew: pd.DataFrame | None = None) -> _Joins | None:
    """The joins of the collectives matched across ranks (`collectives.skew.arrival_skew`,
    clock-suspect matches left out), whose kernels are in the graph; None without any. A
    call ends when the last peer has arrived plus its own transfer time, so a late rank's
    delay reaches its peers' schedules, and taking it away pulls them earlier too."""
    if trace.collectives.empty or trace.kernels.empty:
        return None
    if skew is None:
        from gpudiag.analyzers.collectives.skew import arrival_skew

        skew = arrival_skew(trace)
    skew = skew[~skew["clock_suspect"].fillna(False).to_numpy(bool)
                & skew["kernel_id"].notna().to_numpy(bool)]
    if skew.empty:
        return None
    events = graph.events
    row = pd.Index(trace.kernels["kernel_id"]).get_indexer(skew["kernel_id"])
    kernels = np.flatnonzero((events.table == TABLES.index("kernels")) & events.in_graph)
    at = pd.Index(events.row[kernels]).get_indexer(row)
    found = (row >= 0) & (at >= 0)
    call = kernels[at[found]]
    match = skew["match_id"].to_numpy(np.int64)[found]
    # a match ties calls of two or more ranks, each once: one that holds a rank twice (a
    # rank profiled twice, its two windows' calls of one sequence number) would tie a
    # rank's later window to its earlier one, a cycle
    twice = pd.DataFrame({"match": match, "rank": group[2 * call]}).duplicated(keep=False)
    twice = np.isin(match, match[twice.to_numpy(bool)])
    peers = ~twice & (pd.Series(match).groupby(match).transform("size").to_numpy() >= 2)
    call, match = call[peers], match[peers]
    if not len(call):
        return None
    matches, join = np.unique(match, return_inverse=True)
    node = len(group) + join  # one join node per match, after every event's nodes
    start, end = times[2 * call], times[2 * call + 1]
    latest = pd.Series(start).groupby(join).transform("max").to_numpy()
    transfer = np.maximum(end - np.maximum(latest, start), 0)
    spans = np.flatnonzero((graph.kind == SPAN) & np.isin(graph.owner, call))
    own_weight = transfer[pd.Index(call).get_indexer(graph.owner[spans])]
    join_group = np.full(len(matches), ranks, dtype=np.int64)  # no rank's: see Replay
    return _Joins(src=np.concatenate([2 * call, node]), dst=np.concatenate([node, 2 * call + 1]),
                  weight=np.concatenate([np.zeros(len(call), dtype=np.int64), transfer]),
                  owner=np.concatenate([np.full(len(call), -1, dtype=np.int64), call]),
                  group=join_group, own=spans, own_weight=own_weight)


def _order_edges(graph: Graph) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """The replay's own edges: work after its launch call's start and after its stream's
    previous work (where the graph drew the other), and blocking calls after the work they
    waited for (where no sync record drew it): (src, dst) of each."""
    events = graph.events
    work = np.flatnonzero(events.in_graph & (events.kind == GPU))
    launched = work[(events.launch[work] >= 0)
                    & ~np.isin(2 * work, graph.dst[graph.kind == LAUNCH])]
    previous, following = _stream_order(events, work)
    queued = np.isin(following, graph.dst[graph.kind == QUEUE])
    source = np.concatenate([2 * events.launch[launched], previous[~queued]])
    target = np.concatenate([2 * launched, following[~queued]])
    waits = _waited_for(graph, work)
    held = _held_by_other_streams(graph, work)
    return (source, target, np.concatenate([waits[0], held[0]]),
            np.concatenate([waits[1], held[1]]))


def _held_by_other_streams(graph: Graph, work: IntArray) -> tuple[IntArray, IntArray]:
    """Work that started later than its launch and its stream allowed, within `HELD_NS`
    of another stream's work ending on its device, and without a stream-wait edge drawn
    from a sync record: held by that work (an event wait the trace did not record, e.g.
    compute waiting for an NCCL stream). (end node, start node) pairs."""
    events = graph.events
    if not len(work):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    start, end = events.start[work], events.end[work]
    ready = np.full(len(work), np.iinfo(np.int64).min)
    launched = events.launch[work] >= 0
    ready[launched] = events.start[events.launch[work][launched]]
    previous, following = _stream_order(events, work)
    position = np.searchsorted(work, following // 2)
    ready[position] = np.maximum(ready[position], events.end[previous // 2])
    recorded = np.isin(2 * work, graph.dst[graph.kind == SYNCED])
    held = np.flatnonzero((start - ready > HELD_NS) & ~recorded)
    if not len(held):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    by_end = np.lexsort((end, events.device[work]))
    key = events.device[work][by_end] * (2**40) + (end[by_end] - end.min())
    wanted = events.device[work][held] * (2**40) + (start[held] - end.min())
    found = np.searchsorted(key, wanted, side="right") - 1
    valid = found >= 0
    source = by_end[np.maximum(found, 0)]
    valid &= events.device[work][source] == events.device[work][held]
    valid &= events.stream[work][source] != events.stream[work][held]
    valid &= start[held] - end[source] <= HELD_NS
    return 2 * work[source[valid]] + 1, 2 * work[held[valid]]


def _stream_order(events: Events, work: IntArray) -> tuple[IntArray, IntArray]:
    """Each work after the previous work on its stream: (end node, start node) pairs."""
    stream = events.device[work] * (2**32) + events.stream[work]
    order = np.lexsort((events.start[work], stream))
    ordered = work[order]
    same = stream[order][1:] == stream[order][:-1]
    return 2 * ordered[:-1][same] + 1, 2 * ordered[1:][same]


def _waited_for(graph: Graph, work: IntArray) -> tuple[IntArray, IntArray]:
    """Blocking calls without a sync edge, after the work they waited for: a synchronous
    copy after its copy, a synchronize after the last work of its process started before
    it returned on each stream (sync records name the stream where they exist)."""
    events = graph.events
    synced = set(graph.dst[graph.kind == SYNCED].tolist())
    calls = np.flatnonzero(events.in_graph & (events.kind == API))
    calls = calls[named(events.name[calls], _blocks)]
    calls = calls[~np.isin(2 * calls + 1, list(synced))]
    sources: list[int] = []
    targets: list[int] = []
    launched = work[events.launch[work] >= 0]
    by_call = launched[np.argsort(events.launch[launched], kind="stable")]
    calls_of = events.launch[by_call]
    streams = _streams(events, work)
    copying = named(events.name[calls], _is_copy)
    for call, is_copy in zip(calls.tolist(), copying.tolist(), strict=True):
        if is_copy:  # waited for its copy if it returned after it
            found = int(np.searchsorted(calls_of, call))
            copied = int(by_call[found]) if found < len(by_call) and calls_of[found] == call \
                else None
            if copied is not None and events.end[copied] <= events.end[call]:
                sources.append(2 * copied + 1)
                targets.append(2 * call + 1)
            continue
        for key, (starts, ids) in streams.items():
            if key[0] != events.pid[call]:
                continue
            position = int(np.searchsorted(starts, events.end[call], side="right")) - 1
            if position >= 0 and events.end[ids[position]] <= events.end[call]:
                sources.append(2 * int(ids[position]) + 1)
                targets.append(2 * call + 1)
    return np.array(sources, dtype=np.int64), np.array(targets, dtype=np.int64)


def _blocks(name: str) -> bool:
    """A call whose end waits for the GPU: HTA's blocking calls (its path weighs their
    end at nothing: a cudaMemcpyAsync from pageable memory blocks too) and the loss
    model's synchronize and synchronous copy calls."""
    return name in BLOCKING_CALLS or bool(SYNC_APIS.search(name) or SYNC_COPY_APIS.search(name))


def _is_copy(name: str) -> bool:
    """A copy call: it waits for its own copy, not for its stream."""
    return name == "cudaMemcpyAsync" or bool(SYNC_COPY_APIS.search(name))


def _streams(events: Events, work: IntArray) -> dict[tuple[int, int, int], tuple[IntArray,
                                                                                  IntArray]]:
    """Each (process, device, stream)'s work, by start: starts and event ids."""
    order = np.lexsort((events.start[work], events.stream[work], events.device[work],
                        events.pid[work]))
    ordered = work[order]
    keys = np.column_stack([events.pid[ordered], events.device[ordered],
                            events.stream[ordered]])
    if not len(ordered):
        return {}
    first = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
    bounds = np.r_[first, len(ordered)]
    return {(int(keys[low, 0]), int(keys[low, 1]), int(keys[low, 2])):
            (events.start[ordered[low:high]], ordered[low:high])
            for low, high in pairwise(bounds.tolist())}
