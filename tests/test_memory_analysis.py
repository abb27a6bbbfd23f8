"""The memory analyzer: fragmentation over time, OOM verdicts, churn, call sites, the grid.

Real snapshots are checked against numbers computed here from `memory_blocks` alone, and
the backwards replay against the allocator's own rules (the state before the history holds
no negative bytes, replaying forwards rebuilds the snapshot exactly, every allocation is the
best fit the allocator would have chosen). Synthetic layouts built by hand give exact answers
for splitting, merging, unsplit remainders, expandable segments and OOM verdicts.
"""

from __future__ import annotations

import inspect
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpudiag
from gpudiag.analyzers.findings import ADVICE, COLUMNS
from gpudiag.analyzers.memory import allocator as memory
from gpudiag.analyzers.memory import grid as memory_grid
from gpudiag.analyzers.memory import replay as memory_replay
from gpudiag.analyzers.memory import sites as memory_sites
from gpudiag.analyzers.memory.allocator import (
    FRAGMENTATION_COLUMNS,
    REUSE_ADVICE,
    churn,
    findings,
    fragmentation,
    free_pieces,
    internal_waste,
    occupancy_grid,
    ooms,
    sites,
)
from gpudiag.analyzers.memory.layout import ALLOC, CODES, SEG_ALLOC, SMALL_SIZE, Layout
from gpudiag.analyzers.memory.replay import layout_of, replay_devices
from gpudiag.readers.torch_memory.reader import read_snapshot, read_timeline
from gpudiag.trace import Trace
from tests.builders import KinetoTrace
from tests.conftest import fixture

TRAINING = "cs336_medium_ctx1024_training_18gb_inactive.pickle"
INFERENCE = "cs336_medium_ctx128_inference_lowfrag.pickle"
SEGMENT_FREE = "cs336_ctx256_forward_segment_free.pickle"
SNAPSHOTS = [TRAINING, INFERENCE, SEGMENT_FREE]
MiB = 1 << 20
BASE = 0x7F00_0000_0000

_CACHE: dict[str, Trace] = {}


def snapshot(name: str) -> Trace:
    """A fixture snapshot, read once per test session."""
    if name not in _CACHE:
        _CACHE[name] = read_snapshot(fixture(f"memsnap/{name}"))
    return _CACHE[name]


# -- synthetic snapshots ----------------------------------------------------------------------


def segment(addr: int, *blocks: tuple[int, str] | tuple[int, str, int, str], pool: str = "large",
            expandable: bool = False) -> list[dict[str, Any]]:
    """`memory_blocks` rows of one segment: blocks are (size, state[, requested, site])."""
    rows, at = [], addr
    total = sum(b[0] for b in blocks)
    for b in blocks:
        size, state = b[0], b[1]
        requested = b[2] if len(b) > 2 else size  # type: ignore[misc]
        site = b[3] if len(b) > 3 else None  # type: ignore[misc]
        rows.append({"device": 0, "pool": pool, "segment_addr": addr, "segment_bytes": total,
                     "addr": at, "bytes": size, "requested_bytes": requested, "state": state,
                     "stream": 0, "expandable": expandable,
                     "site": site if state != "inactive" else None})
        at += size
    return rows


def event(action: str, addr: int | None, size: int, ts: int, **extra: Any) -> dict[str, Any]:
    return {"device": 0, "ts_ns": ts, "action": action, "addr": addr, "bytes": size,
            "stream": 0, **extra}


def snap(blocks: list[dict[str, Any]], events: list[dict[str, Any]] | None = None,
         **settings: Any) -> Trace:
    return Trace(meta={"allocator_settings": {"expandable_segments": False, **settings}},
                 memory=pd.DataFrame(events) if events else None,
                 memory_blocks=pd.DataFrame(blocks) if blocks else None)


def numbers(frame: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    """(reserved, allocated, free, largest free) per row."""
    cols = ["reserved_bytes", "allocated_bytes", "free_bytes", "largest_free_bytes"]
    return [tuple(int(v) for v in row) for row in frame[cols].itertuples(index=False)]


# -- real snapshots -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_last_row_is_the_snapshot_computed_from_its_blocks(name: str) -> None:
    trace = snapshot(name)
    b = trace.memory_blocks
    free = b[b["state"] == "inactive"]["bytes"]
    reserved = int(b.drop_duplicates("segment_addr")["segment_bytes"].sum())
    allocated = int(b[b["state"] != "inactive"]["bytes"].sum())
    last = fragmentation(trace).iloc[-1]
    assert last["source"] == "snapshot"
    assert (int(last["reserved_bytes"]), int(last["allocated_bytes"]),
            int(last["free_bytes"]), int(last["largest_free_bytes"])) == (
        reserved, allocated, int(free.sum()), int(free.max()))
    assert last["fragmentation"] == pytest.approx(1 - free.max() / free.sum())
    assert reserved == allocated + free.sum()


def test_training_snapshot_is_clearly_more_fragmented_than_the_inference_control() -> None:
    high = fragmentation(snapshot(TRAINING)).iloc[-1]
    low = fragmentation(snapshot(INFERENCE)).iloc[-1]
    assert high["fragmentation"] > 0.95
    assert high["fragmentation"] - low["fragmentation"] > 0.25
    assert high["free_bytes"] / high["reserved_bytes"] > 10 * (
        low["free_bytes"] / low["reserved_bytes"])
    hot, cold = findings(snapshot(TRAINING)), findings(snapshot(INFERENCE))
    assert len(hot) == 1 and cold.empty
    assert hot["cause"].iloc[0] == "fragmentation" and hot["lost_ns"].iloc[0] == 0
    assert hot["advice"].iloc[0] == ADVICE["fragmentation"]  # 52 segments hold the holes
    assert "stranded" in hot["evidence"].iloc[0]
    assert list(hot.columns) == list(COLUMNS)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_replay_reaches_a_consistent_first_state_and_replays_forward_to_the_snapshot(
        name: str) -> None:
    trace = snapshot(name)
    (key, steps), = replay_devices(trace).items()
    assert steps.skipped == 0
    assert len(steps.moved) == len(memory_replay.history(trace))
    frag = fragmentation(trace)
    for col in ("reserved_bytes", "allocated_bytes", "free_bytes", "largest_free_bytes"):
        assert (frag[col] >= 0).all()
    assert (frag["reserved_bytes"] == frag["allocated_bytes"] + frag["free_bytes"]).all()
    assert (frag["largest_free_bytes"] <= frag["free_bytes"]).all()
    assert frag["fragmentation"].between(0, 1).all()
    # the layout before the history, replayed forwards with the sizes the replay inferred
    layout = steps.layout
    for code, addr, size in zip(steps.codes, steps.addrs, steps.moved, strict=True):
        assert layout.redo(int(code), int(addr), int(size))
    again = layout_of(memory_replay.select(trace.memory_blocks, key))
    assert (layout.blocks, layout.free, layout.segs) == (again.blocks, again.free, again.segs)


def test_every_replayed_allocation_is_the_allocators_best_fit() -> None:
    """Independent oracle: CUDACachingAllocator gives an allocation the smallest free block
    of its pool (2 MiB segments are the small pool) that fits the rounded size, and puts the
    block at that free block's start. The replayed layout just before each allocation must
    show exactly that."""
    trace = snapshot(INFERENCE)
    (key, _), = replay_devices(trace).items()
    layout = layout_of(memory_replay.select(trace.memory_blocks, key))
    events = memory_replay.history(trace)
    codes = events["action"].astype(object).map(CODES).tolist()
    addrs, sizes = events["addr"].tolist(), events["bytes"].tolist()
    checked = 0
    for i in range(len(codes) - 1, -1, -1):
        layout.undo(codes[i], addrs[i], sizes[i])
        if codes[i] != ALLOC or (i and codes[i - 1] == SEG_ALLOC):
            continue
        rounded = max(512, -(-sizes[i] // 512) * 512)
        small = rounded <= SMALL_SIZE
        fits = [end - start for start, end in layout.free.items()
                if _is_small(layout, start) == small and end - start >= rounded]
        chosen = layout.region(addrs[i])
        assert chosen is not None and chosen[0] == addrs[i]
        assert chosen[1] - chosen[0] == min(fits)
        checked += 1
    assert checked == 1280


def _is_small(layout: Layout, addr: int) -> bool:
    start = layout.seg_starts[bisect_right(layout.seg_starts, addr) - 1]
    return layout.segs[start] - start == 2 * MiB


def test_replay_of_the_22k_event_history_takes_well_under_a_second() -> None:
    trace = snapshot(TRAINING)
    assert len(trace.memory) > 22_000
    best = min(_timed(lambda: replay_devices(trace)) for _ in range(3))
    assert best < 1.0


def _timed(work: Any) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def test_stranded_bytes_are_attributed_in_full_to_call_sites() -> None:
    for name in SNAPSHOTS:
        trace = snapshot(name)
        pieces = free_pieces(trace).iloc[0]
        s = sites(trace)
        assert s["inactive_bytes"].sum() == pieces["stranded_bytes"]
        assert pieces["stranded_bytes"] + pieces["cached_bytes"] == \
            fragmentation(trace).iloc[-1]["free_bytes"]
        assert s["share"].sum() == pytest.approx(1.0)


def test_internal_waste_sums_block_minus_requested_bytes() -> None:
    trace = snapshot(TRAINING)
    b = trace.memory_blocks
    used = b[b["state"] != "inactive"]
    assert internal_waste(trace)["waste_bytes"].sum() == \
        (used["bytes"] - used["requested_bytes"]).sum()


def test_segment_churn_of_the_segment_free_snapshot_matches_the_manifest() -> None:
    c = churn(snapshot(SEGMENT_FREE))
    assert len(c) == 1 and pd.isna(c["step"].iloc[0])
    assert (c["segment_allocs"].iloc[0], c["segment_frees"].iloc[0]) == (471, 287)
    assert c["alloc_site"].iloc[0].endswith("(forward)")


def test_occupancy_grid_of_a_fixture_is_bounded_and_ends_at_the_snapshot() -> None:
    trace = snapshot(INFERENCE)
    g = occupancy_grid(trace, max_addresses=64, max_times=20)
    assert len(g) == 64 * 20
    shares = g[["allocated_share", "inactive_share", "unreserved_share"]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    last = g[g["time_bin"] == 19]
    final = fragmentation(trace).iloc[-1]
    assert (last["inactive_share"] * last["bin_bytes"]).sum() == pytest.approx(
        final["free_bytes"])
    assert last["bin_bytes"].sum() == final["reserved_bytes"]  # no segment freed: no gaps


def test_memory_timeline_fixture_gives_running_tensor_bytes_and_no_finding() -> None:
    trace = read_timeline(fixture("memsnap/hta_memory_timeline.raw.json.gz"))
    frag = fragmentation(trace)
    assert len(frag) == len(trace.memory) and set(frag["source"]) == {"deltas"}
    assert (frag["allocated_bytes"] >= 0).all()
    assert frag["fragmentation"].isna().all() and frag["reserved_bytes"].isna().all()
    for empty in (findings(trace), ooms(trace), churn(trace), sites(trace),
                  occupancy_grid(trace), internal_waste(trace)):
        assert empty.empty


# -- synthetic: exact answers -------------------------------------------------------------------


def test_one_segment_split_by_allocations_then_merged_by_a_free() -> None:
    blocks = segment(BASE, (4 * MiB, "inactive"), (2 * MiB, "allocated", 2 * MiB, "b.py:2 (f)"),
                     (14 * MiB, "inactive"))
    events = [event("segment_alloc", BASE, 20 * MiB, 10),
              event("alloc", BASE, 4 * MiB, 20, site="a.py:1 (f)"),
              event("alloc", BASE + 4 * MiB, 2 * MiB, 30, site="b.py:2 (f)"),
              event("free_requested", BASE, 4 * MiB, 40),
              event("free_completed", BASE, 4 * MiB, 41)]
    frag = fragmentation(snap(blocks, events))
    assert numbers(frag) == [
        (0, 0, 0, 0),
        (20 * MiB, 0, 20 * MiB, 20 * MiB),
        (20 * MiB, 4 * MiB, 16 * MiB, 16 * MiB),  # the allocation splits the segment
        (20 * MiB, 6 * MiB, 14 * MiB, 14 * MiB),
        (20 * MiB, 2 * MiB, 18 * MiB, 14 * MiB),  # a hole the 14 MiB block cannot join
    ]
    assert frag["ts_ns"].tolist() == [10, 10, 20, 30, 41]
    assert frag["event"].tolist()[1:] == [0, 1, 2, 4] and pd.isna(frag["event"].iloc[0])
    assert frag["source"].tolist() == ["replay"] * 4 + ["snapshot"]
    assert frag["fragmentation"].iloc[-1] == pytest.approx(1 - 14 / 18)
    assert frag["fragmentation"].iloc[:4].tolist() == [0, 0, 0, 0]
    s = sites(snap(blocks, events))
    assert s[["site", "inactive_bytes", "holes"]].values.tolist() == [["b.py:2 (f)", 18 * MiB, 2]]


def test_a_remainder_too_small_to_split_stays_in_the_freed_block() -> None:
    # 14 MiB then 5.5 MiB asked of a 20 MiB segment: the last 0.5 MiB is not split off
    blocks = segment(BASE, (14 * MiB, "allocated"), (6 * MiB, "inactive"))
    events = [event("alloc", BASE, 14 * MiB, 1),
              event("alloc", BASE + 14 * MiB, 11 * MiB // 2, 2),
              event("free_completed", BASE + 14 * MiB, 11 * MiB // 2, 3)]
    assert numbers(fragmentation(snap(blocks, events))) == [
        (20 * MiB, 0, 20 * MiB, 20 * MiB),
        (20 * MiB, 14 * MiB, 6 * MiB, 6 * MiB),
        (20 * MiB, 20 * MiB, 0, 0),  # the 5.5 MiB request held the whole 6 MiB
        (20 * MiB, 14 * MiB, 6 * MiB, 6 * MiB),
    ]


def test_small_pool_requests_round_up_to_512_bytes() -> None:
    blocks = segment(BASE, (2 * MiB, "inactive"), pool="small")
    events = [event("alloc", BASE, 100, 1), event("free_completed", BASE, 100, 2)]
    frag = fragmentation(snap(blocks, events))
    assert frag["allocated_bytes"].tolist() == [0, 512, 0]
    assert frag["largest_free_bytes"].tolist() == [2 * MiB, 2 * MiB - 512, 2 * MiB]


def test_segments_are_walls_even_when_their_addresses_touch() -> None:
    blocks = (segment(BASE, (2 * MiB, "inactive"), (18 * MiB, "allocated"))
              + segment(BASE + 20 * MiB, (20 * MiB, "inactive")))
    last = fragmentation(snap(blocks)).iloc[-1]
    assert (last["free_bytes"], last["largest_free_bytes"]) == (22 * MiB, 20 * MiB)


def test_segment_free_undone_brings_the_segment_back_all_free() -> None:
    blocks = segment(BASE, (20 * MiB, "allocated"))
    events = [event("segment_free", BASE + 64 * MiB, 20 * MiB, 5),
              event("segment_alloc", BASE, 20 * MiB, 6), event("alloc", BASE, 20 * MiB, 7)]
    frag = fragmentation(snap(blocks, events))
    assert numbers(frag) == [(20 * MiB, 0, 20 * MiB, 20 * MiB), (0, 0, 0, 0),
                             (20 * MiB, 0, 20 * MiB, 20 * MiB),
                             (20 * MiB, 20 * MiB, 0, 0)]
    c = churn(snap(blocks, events))
    assert c[["segment_allocs", "segment_frees", "alloc_bytes", "free_bytes"]].values.tolist() \
        == [[1, 1, 20 * MiB, 20 * MiB]]


def test_expandable_segments_map_and_unmap_pages() -> None:
    blocks = segment(BASE, (2 * MiB, "allocated"), (2 * MiB, "inactive"), expandable=True)
    events = [event("segment_map", BASE, 2 * MiB, 1), event("alloc", BASE, 2 * MiB, 2),
              event("segment_map", BASE + 2 * MiB, 4 * MiB, 3),
              event("segment_unmap", BASE + 4 * MiB, 2 * MiB, 4)]
    frag = fragmentation(snap(blocks, events, expandable_segments=True))
    assert numbers(frag) == [(0, 0, 0, 0), (2 * MiB, 0, 2 * MiB, 2 * MiB),
                             (2 * MiB, 2 * MiB, 0, 0), (6 * MiB, 2 * MiB, 4 * MiB, 4 * MiB),
                             (4 * MiB, 2 * MiB, 2 * MiB, 2 * MiB)]
    (_, steps), = replay_devices(snap(blocks, events, expandable_segments=True)).items()
    assert steps.skipped == 0


def test_oom_despite_free_bytes_is_a_fragmentation_verdict() -> None:
    # 16 MiB free in two 8 MiB holes: 10 MiB fits the bytes, not any hole
    blocks = segment(BASE, (8 * MiB, "inactive"), (4 * MiB, "allocated", 4 * MiB, "x.py:9 (g)"),
                     (8 * MiB, "inactive"))
    events = [event("alloc", BASE + 8 * MiB, 4 * MiB, 1),
              event("oom", None, 10 * MiB, 2, device_free_bytes=MiB),
              event("oom", None, 17 * MiB, 3, device_free_bytes=2 * MiB),
              event("oom", None, 100 * MiB, 4, device_free_bytes=2 * MiB),
              event("oom", None, 17 * MiB, 5)]
    trace = snap(blocks, events)
    o = ooms(trace)
    assert o["verdict"].tolist() == ["fragmentation", "fragmentation_with_driver", "exhausted",
                                     "exhausted"]
    assert o["free_bytes"].tolist() == [16 * MiB] * 4
    assert o["largest_free_bytes"].tolist() == [8 * MiB] * 4
    f = findings(trace)  # far below the byte thresholds, but an OOM had the bytes free
    assert len(f) == 1 and f["where"].iloc[0] == "x.py:9 (g)"
    assert "1 fragmentation" in f["evidence"].iloc[0]
    assert f["advice"].iloc[0] == REUSE_ADVICE  # one segment: expandable segments won't help
    assert f["count"].iloc[0] == 2


def test_oom_before_any_known_state_is_unknown() -> None:
    trace = Trace(memory=pd.DataFrame([event("oom", None, MiB, 1)]))
    assert ooms(trace)["verdict"].tolist() == ["unknown"]


def test_expandable_segments_are_not_advised_when_already_on() -> None:
    blocks = []
    for i in range(8):  # 8 segments, each 1 GiB free beside 1 GiB in use
        blocks += segment(BASE + i * (4 << 30), (1 << 30, "allocated"), (1 << 30, "inactive"),
                          expandable=True)
    off = snap([dict(b, expandable=False) for b in blocks])
    on = snap(blocks, expandable_segments=True)
    assert findings(off)["advice"].tolist() == [ADVICE["fragmentation"]]
    assert findings(on)["advice"].tolist() == [REUSE_ADVICE]
    assert findings(off, min_stranded_bytes=16 << 30).empty
    assert "expandable segments already on" in findings(on)["evidence"].iloc[0]


def test_snapshot_without_history_is_one_row() -> None:
    frag = fragmentation(snap(segment(BASE, (MiB * 4, "allocated"), (MiB * 16, "inactive"))))
    assert numbers(frag) == [(20 * MiB, 4 * MiB, 16 * MiB, 16 * MiB)]
    assert frag[["ts_ns", "action", "source"]].values.tolist() == [[-1, "snapshot", "snapshot"]]


def test_profiler_totals_give_free_bytes_but_no_fragmentation(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.memory(ts=10, nbytes=4096, addr=1, allocated=4096, reserved=2 * MiB)
    kt.memory(ts=20, nbytes=-4096, addr=1, allocated=0, reserved=2 * MiB)
    trace = gpudiag.load(kt.write(tmp_path / "t.json"))
    frag = fragmentation(trace)
    assert frag["source"].tolist() == ["totals", "totals"]
    assert frag["free_bytes"].tolist() == [2 * MiB - 4096, 2 * MiB]
    assert frag["fragmentation"].isna().all() and frag["largest_free_bytes"].isna().all()
    assert findings(trace).empty and occupancy_grid(trace).empty


def test_churn_is_counted_per_step_when_the_trace_has_steps() -> None:
    blocks = segment(BASE, (20 * MiB, "allocated"))
    events = [event("segment_alloc", BASE + 40 * MiB, 20 * MiB, 150, site="s.py:1 (a)"),
              event("segment_free", BASE + 40 * MiB, 20 * MiB, 160),
              event("segment_alloc", BASE, 20 * MiB, 250, site="s.py:2 (b)"),
              event("alloc", BASE, 20 * MiB, 251)]
    steps = pd.DataFrame({"pid": 1, "tid": 1, "start_ns": [100, 200], "end_ns": [190, 290],
                          "name": ["ProfilerStep#1", "ProfilerStep#2"], "depth": 0,
                          "source": "step"})
    trace = Trace(memory=pd.DataFrame(events), memory_blocks=pd.DataFrame(blocks),
                  ranges=steps)
    c = churn(trace)
    assert c[["step", "segment_allocs", "segment_frees", "alloc_site"]].values.tolist() == [
        ["ProfilerStep#1", 1, 1, "s.py:1 (a)"], ["ProfilerStep#2", 1, 0, "s.py:2 (b)"]]


def test_occupancy_grid_stacks_segments_and_skips_the_gaps_between_them() -> None:
    blocks = (segment(BASE, (MiB, "allocated"), (MiB, "inactive"))
              + segment(BASE + (1 << 40), (2 * MiB, "inactive")))
    g = occupancy_grid(snap(blocks), max_addresses=4, max_times=3)
    assert len(g) == 4 and (g["time_bin"] == 0).all()  # no history: the snapshot only
    assert g["state"].tolist() == ["allocated", "inactive", "inactive", "inactive"]
    assert g["offset_bytes"].tolist() == [0, MiB, 2 * MiB, 3 * MiB]
    assert g["unreserved_share"].tolist() == [0, 0, 0, 0]


def test_occupancy_grid_shows_a_segment_before_it_was_reserved() -> None:
    blocks = segment(BASE, (2 * MiB, "allocated"))
    events = [event("segment_alloc", BASE, 2 * MiB, 1), event("alloc", BASE, 2 * MiB, 2)]
    g = occupancy_grid(snap(blocks, events), max_addresses=2, max_times=10)
    states = g.pivot_table(index="time_bin", columns="address_bin", values="state",
                           aggfunc="first", observed=True)
    assert states.values.tolist() == [
        ["unreserved", "unreserved"], ["inactive", "inactive"], ["allocated", "allocated"]]
    assert g["ts_ns"].unique().tolist() == [1, 2]


def test_an_event_that_does_not_fit_the_layout_is_skipped_and_counted() -> None:
    blocks = segment(BASE, (2 * MiB, "inactive"), (18 * MiB, "allocated"))
    events = [event("alloc", BASE + 99 * MiB, MiB, 1),  # no such block at the snapshot
              event("alloc", BASE + 2 * MiB, 18 * MiB, 2)]
    (_, steps), = replay_devices(snap(blocks, events)).items()
    assert steps.skipped == 1 and steps.moved.tolist() == [0, 18 * MiB]
    assert "1 events did not fit" in memory._evidence(
        fragmentation(snap(blocks, events)).iloc[-1], free_pieces(snap(blocks)).iloc[0],
        steps, ooms(snap(blocks)), False)


# -- property: replaying a simulated allocator backwards gives its states exactly -------------


class Simulator:
    """A forward caching allocator (best fit, split at the start, merge on free, 20 MiB
    segments for small requests), recording the history a snapshot would hold and its true
    state after every event. Sizes are multiples of 2 MiB, so no remainder is ever left
    unsplit and the replay has nothing to guess."""

    def __init__(self) -> None:
        self.segments: dict[int, list[list[Any]]] = {}  # start -> [[addr, size, used, req]]
        self.events: list[dict[str, Any]] = []
        self.states: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]
        self.live: list[tuple[int, int]] = []  # (addr, requested) in use
        self.next_addr = BASE

    def alloc(self, size: int, requested: int) -> None:
        fits = [(b[1], b[0], start) for start, blocks in self.segments.items()
                for b in blocks if not b[2] and b[1] >= size]
        if not fits:
            total = max(20 * MiB, size)
            start, self.next_addr = self.next_addr, self.next_addr + total + 64 * MiB
            self.segments[start] = [[start, total, False, 0]]
            self._record("segment_alloc", start, total)
            fits = [(total, start, start)]
        _, addr, start = min(fits)
        blocks = self.segments[start]
        i = next(j for j, b in enumerate(blocks) if b[0] == addr)
        if blocks[i][1] > size:
            blocks.insert(i + 1, [addr + size, blocks[i][1] - size, False, 0])
        blocks[i] = [addr, size, True, requested]
        self.live.append((addr, requested))
        self._record("alloc", addr, requested)

    def free(self, which: int) -> None:
        addr, requested = self.live.pop(which % len(self.live))
        for blocks in self.segments.values():
            for i, b in enumerate(blocks):
                if b[0] == addr:
                    b[2] = False
                    for j in (i + 1, i):  # merge the right neighbour, then into the left
                        if 0 < j < len(blocks) and not blocks[j - 1][2] and not blocks[j][2]:
                            blocks[j - 1][1] += blocks.pop(j)[1]
                    self._record("free_completed", addr, requested)
                    return

    def empty_cache(self) -> None:
        for start in [s for s, b in self.segments.items() if len(b) == 1 and not b[0][2]]:
            size = self.segments.pop(start)[0][1]
            self._record("segment_free", start, size)

    def _record(self, action: str, addr: int, size: int) -> None:
        self.events.append(event(action, addr, size, len(self.events)))
        blocks = [b for bs in self.segments.values() for b in bs]
        free = [b[1] for b in blocks if not b[2]]
        self.states.append((sum(b[1] for b in blocks), sum(b[1] for b in blocks if b[2]),
                            sum(free), max(free, default=0)))

    def snapshot(self) -> Trace:
        rows = []
        for start, blocks in self.segments.items():
            rows += segment(start, *[(b[1], "allocated" if b[2] else "inactive", b[3] or b[1])
                                     for b in blocks])
        return snap(rows, self.events)


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 12), st.integers(0, 511)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("empty_cache"), st.just(0), st.just(0))), max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_replaying_a_simulated_allocator_backwards_gives_every_state_it_went_through(
        operations: list[tuple[str, int, int]]) -> None:
    sim = Simulator()
    for op, n, offset in operations:
        if op == "alloc":
            sim.alloc(n * 2 * MiB, n * 2 * MiB - offset)
        elif op == "free" and sim.live:
            sim.free(n)
        elif op == "empty_cache":
            sim.empty_cache()
    trace = sim.snapshot()
    if trace.memory_blocks.empty and trace.memory.empty:
        assert fragmentation(trace).empty
        return
    assert numbers(fragmentation(trace)) == (sim.states if sim.events else sim.states[-1:])
    (_, steps), = replay_devices(trace).items()
    assert steps.skipped == 0


# -- edges and contracts --------------------------------------------------------------------------


def test_empty_trace_gives_empty_typed_frames() -> None:
    trace = Trace()
    frag = fragmentation(trace)
    assert frag.empty and dict(frag.dtypes.astype(str)) == FRAGMENTATION_COLUMNS
    g = occupancy_grid(trace)
    assert g.empty and dict(g.dtypes.astype(str)) == memory_grid.COLUMNS
    f = findings(trace)
    assert f.empty and list(f.columns) == list(COLUMNS)
    for frame in (ooms(trace), churn(trace), sites(trace), internal_waste(trace),
                  free_pieces(trace)):
        assert frame.empty and len(frame.columns) > 3
    assert str(ooms(trace)["verdict"].dtype) == "category"


def test_fragmentation_columns_are_typed_on_a_real_snapshot() -> None:
    frag = fragmentation(snapshot(INFERENCE))
    assert dict(frag.dtypes.astype(str)) == FRAGMENTATION_COLUMNS


@pytest.mark.parametrize("module", [memory, memory_sites, memory_grid, memory_replay])
def test_public_functions_open_with_a_notebook_example(module: Any) -> None:
    public = [f for name, f in inspect.getmembers(module, inspect.isfunction)
              if not name.startswith("_") and f.__module__ == module.__name__]
    assert public
    for f in public:
        lines = (f.__doc__ or "").splitlines()
        example = [line for line in lines[2:5] if line.startswith("        ")]
        assert lines[1] == "" and len(example) == 3, f.__name__
