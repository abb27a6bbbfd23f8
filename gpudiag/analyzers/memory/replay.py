"""The caching allocator's layout over time, replayed backwards from a snapshot.

    steps = replay_devices(trace)[(None, 0)]      # keyed by (rank, device)
    steps.free[-1], steps.largest[-1]             # the snapshot's inactive, largest free bytes
    steps.layout.blocks                           # {addr: end} before the history

A snapshot knows the exact layout once (at dump time); the history (`memory` rows) says what
changed before it. So every earlier layout comes from undoing the history from the last event
back: an `alloc` undone frees its block, a `free_completed` undone makes it active again, a
`segment_alloc` undone gives the segment back, a `segment_free` undone brings it back all
free, `segment_map` / `segment_unmap` (expandable segments) shrink or grow a mapped range.
`free_requested` changes nothing here: the block stays in use until `free_completed`. How
the layout splits and merges blocks, and what it must infer, is `memory_layout`'s docstring.

Cost: the replay is sequential by nature (each merge depends on the one before), so it is one
tight loop over the layout-changing events: dict look-ups for neighbours, `bisect` into a
sorted list of free-region starts (its inserts are C memmoves over a few thousand entries),
and a lazy max-heap of free sizes, which keeps the largest free block exact at every step in
O(log n). The 22k-event fixture (15k layout changes) replays in about 0.07 s. Whole-layout
copies are taken only at the `samples` states a caller asks for (the occupancy grid).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers.memory.layout import CODES, Frozen, Layout
from gpudiag.trace import Trace

Key = tuple[Any, Any]  # (rank, device); None where NA


@dataclass
class Steps:
    """One device's states: index 0 before the history, k after its k-th event.

    `row` is the `memory` row label of the event that led to each state (-1 for the start);
    `moved` the bytes each event moved when undone (0: skipped, it did not fit the layout).
    """

    row: npt.NDArray[np.int64]
    reserved: npt.NDArray[np.int64]
    allocated: npt.NDArray[np.int64]
    free: npt.NDArray[np.int64]
    largest: npt.NDArray[np.int64]
    moved: npt.NDArray[np.int64]
    codes: npt.NDArray[np.int64]
    addrs: npt.NDArray[np.int64]
    skipped: int
    layout: Layout  # the state before the history, once replayed
    kept: dict[int, Frozen] = field(default_factory=dict)


def layout_of(blocks: pd.DataFrame, settings: dict[str, Any] | None = None) -> Layout:
    """The layout that one device's `memory_blocks` rows describe.

        layout = layout_of(trace.memory_blocks[trace.memory_blocks.device == 0])
        layout.free_bytes, layout.largest()       # inactive bytes, largest inactive block
        sorted(layout.free.items())[:3]           # free regions (start, end)

    Each segment starts all free and its active (allocated or awaiting-free) blocks are
    carved out, so free regions are whatever the active blocks leave: the inactive blocks
    of a well-formed snapshot, merged if a snapshot ever lists two side by side. Blocks that
    overlap or fall outside their segment are counted in `Layout.unplaced`.
    """
    settings = settings or {}
    split = settings.get("max_split_size")
    layout = Layout(expandable=bool(settings.get("expandable_segments"))
                    or bool(blocks["expandable"].fillna(False).any()),
                    max_split=split if type(split) is int and split > 0 else 0)
    segments = blocks.dropna(subset=["segment_addr", "segment_bytes"]).drop_duplicates(
        ["segment_addr", "segment_bytes"])
    for addr, size in zip(segments["segment_addr"].tolist(), segments["segment_bytes"].tolist(),
                          strict=True):
        layout.unplaced += not layout.add_segment(addr, size)
    active = blocks[(blocks["state"] != "inactive").fillna(True) & blocks["addr"].notna()
                    & blocks["bytes"].notna()]
    for addr, size in zip(active["addr"].tolist(), active["bytes"].tolist(), strict=True):
        layout.unplaced += not layout.alloc(addr, size)
    return layout


def replay(layout: Layout, events: pd.DataFrame, samples: int = 0) -> Steps:
    """Undo `events` (one device's `memory` rows, in recorded order) from the last one back.

        steps = replay(layout_of(blocks), history(trace))
        steps.free[0], steps.free[-1]       # inactive bytes before the history, at the snapshot
        steps.layout                        # now the layout before the history

    `samples` evenly spaced states (always the first and last among them) are copied whole
    into `Steps.kept`, for pictures of the layout; the totals are kept for every state.
    """
    codes = events["action"].astype("object").map(CODES).to_numpy(np.int64)
    addrs = events["addr"].to_numpy(np.int64)
    sizes = events["bytes"].to_numpy(np.int64)
    n = len(codes)
    wanted = set(sample_states(n, samples).tolist())
    kept = {n: layout.frozen()} if n in wanted else {}
    states = [(layout.reserved, layout.allocated, layout.free_bytes, layout.largest())]
    moved = []
    undo, largest = layout.undo, layout.largest
    for i, code, addr, size in zip(range(n - 1, -1, -1), codes[::-1].tolist(),
                                   addrs[::-1].tolist(), sizes[::-1].tolist(), strict=True):
        moved.append(undo(code, addr, size))
        states.append((layout.reserved, layout.allocated, layout.free_bytes, largest()))
        if i in wanted:
            kept[i] = layout.frozen()
    out = np.array(states[::-1], dtype=np.int64).reshape(-1, 4).T
    moved_bytes = np.array(moved[::-1], dtype=np.int64)
    rows = np.concatenate([[-1], events.index.to_numpy(np.int64)])
    return Steps(rows, out[0], out[1], out[2], out[3], moved_bytes, codes, addrs,
                 int((moved_bytes == 0).sum()), layout, kept)


def sample_states(n: int, samples: int) -> npt.NDArray[np.int64]:
    """Up to `samples` evenly spaced states among 0..n, including both ends when >= 2.

        sample_states(10, 3)              # array([ 0,  5, 10])
        sample_states(2, 100)             # array([0, 1, 2])
        sample_states(10, 1)              # array([10]): the snapshot alone
    """
    if samples <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(n, 0, min(samples, n + 1)).round().astype(np.int64))


def history(trace: Trace) -> pd.DataFrame:
    """The `memory` rows a replay undoes: layout-changing actions with an address and size.

        events = history(trace)
        events.action.value_counts()
        events.groupby("device").size()

    Host rows (`device == -1`) are left out: they are not the CUDA caching allocator.
    """
    mem = trace.memory
    usable = (mem["action"].isin(list(CODES)) & mem["addr"].notna() & mem["bytes"].notna()
              & mem["device"].fillna(0).ge(0))
    return mem[usable.to_numpy(bool)]


def replay_devices(trace: Trace, samples: int = 0) -> dict[Key, Steps]:
    """Replay every (rank, device) of a snapshot trace; {} when the trace has no snapshot.

        steps = replay_devices(trace)
        {key: s.free[-1] for key, s in steps.items()}     # inactive bytes per device
        {key: s.skipped for key, s in steps.items()}      # events that did not fit

    Keys are (rank, device) with None for NA. A device is replayed when it has blocks at
    dump time or history rows without totals (snapshot entries carry none; profiler
    `[memory]` events carry both totals and are read as they are). A device whose history
    gave every segment back before the dump replays from an empty layout. Replayed once per
    trace and `samples` (fragmentation, the findings and the report's figures share it).
    """
    return trace.derived(f"replay_devices:{samples}", lambda: _replay_devices(trace, samples))


def _replay_devices(trace: Trace, samples: int) -> dict[Key, Steps]:
    blocks, events = trace.memory_blocks, history(trace)
    events = events[(events["total_allocated_bytes"].isna()
                     & events["total_reserved_bytes"].isna()).to_numpy(bool)]
    settings = trace.meta.get("allocator_settings")
    out = {}
    for key in sorted(set(keys_of(blocks)) | set(keys_of(events)),
                      key=lambda k: (_order(k[0]), _order(k[1]))):
        layout = layout_of(select(blocks, key), settings if isinstance(settings, dict) else None)
        out[key] = replay(layout, select(events, key), samples)
    return out


def keys_of(frame: pd.DataFrame) -> list[Key]:
    """The distinct (rank, device) of the rows, None for NA, NA first then ascending.

        keys_of(trace.memory_blocks)      # [(None, 0)] for a one-GPU snapshot
        for key in keys_of(trace.memory):
            rows = select(trace.memory, key)
    """
    pairs = frame[["rank", "device"]].drop_duplicates().astype("object")
    keys = {(None if pd.isna(r) else int(r), None if pd.isna(d) else int(d))
            for r, d in pairs.itertuples(index=False, name=None)}  # a few devices, not rows
    return sorted(keys, key=lambda k: (_order(k[0]), _order(k[1])))


def select(frame: pd.DataFrame, key: Key) -> pd.DataFrame:
    """The rows of `frame` on one (rank, device), as `keys_of` names it.

        select(trace.memory_blocks, (None, 0))
        select(trace.memory, (3, 1))      # rank 3, device 1
        {k: len(select(trace.memory, k)) for k in keys_of(trace.memory)}
    """
    rank, device = key
    keep = (frame["rank"].isna() if rank is None else frame["rank"].eq(rank).fillna(False))
    keep &= frame["device"].isna() if device is None else frame["device"].eq(device).fillna(False)
    return frame[keep.to_numpy(bool)]


def _order(value: Any) -> int:
    return -1 if value is None else int(value)
