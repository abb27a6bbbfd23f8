"""The caching allocator's layout of one device, as a model that can run both ways.

    layout = Layout(); layout.add_segment(0, 20 << 20)     # one 20 MiB segment, all free
    layout.alloc(0, 4 << 20)                                 # a 4 MiB block splits it
    layout.free_bytes, layout.largest()                      # (16 MiB, 16 MiB)

The layout is kept as the allocator keeps it: segments (walls nothing merges across), blocks
in use, and free regions. Releasing a range merges it with the free regions touching it in
the same segment (`free_block` / `try_merge_blocks`), so each free region is one inactive
block; an allocation is carved from the start of a free region (the allocator puts the
block at the start and splits the remainder off after it).

**The history does not record a freed block's real size**: entries carry the requested size
(`orig_size`); the block holds it rounded up to 512 bytes plus any remainder too small to split
off (`should_split`: up to 1 MiB in the large pool, up to 20 MiB for requests at or above
`max_split_size`, under 512 bytes in the small pool or with expandable segments). Undoing a
free gives the block the rounded size plus its free region's tail when that tail is too small
to be a block of its own (no large-pool free block is 1 MiB or smaller). A larger tail is
taken as a separate free block, which is wrong only when an unsplit block's right neighbour
was freed before it, and then by at most that remainder. `roundup_power2_divisions` rounding
is not modelled (the tail rule absorbs it within the same limits). An event the layout cannot
undo (no such block, a range not free) is skipped and counted. Checked on the three fixture
snapshots: every one of their 10,457 allocations lands at the start of the smallest free
block of its pool that fits, the allocator's best-fit rule, and no event is skipped.

Every change is O(log n) or a C memmove: neighbours are dict look-ups, the free region holding
an address is a `bisect` into a sorted list of starts, the largest free block a lazy max-heap.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt

MIN_BLOCK = 512  # kMinBlockSize: every block size is a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: rounded requests up to it use the small pool
LARGE_BUFFER = 20 << 20  # kLargeBuffer: how far an oversize block may exceed its request

ALLOC, FREE, SEG_ALLOC, SEG_FREE, SEG_MAP, SEG_UNMAP = range(6)
#: the `memory` actions that change the layout, by code; `free` is torch 2.0's single free
CODES = {"alloc": ALLOC, "free_completed": FREE, "free": FREE, "segment_alloc": SEG_ALLOC,
         "segment_free": SEG_FREE, "segment_map": SEG_MAP, "segment_unmap": SEG_UNMAP}


@dataclass
class Frozen:
    """A copy of a layout at one step: (start, end) rows, int64."""

    segments: npt.NDArray[np.int64]
    blocks: npt.NDArray[np.int64]
    free: npt.NDArray[np.int64]


class Layout:
    """One device's reserved memory: segments, active blocks and merged free regions.

    Running totals (`reserved`, `allocated`, `free_bytes`) and a lazy max-heap of free
    region sizes are updated by every change, so no step rescans the layout.
    """

    def __init__(self, *, expandable: bool = False, max_split: int = 0) -> None:
        self.segs: dict[int, int] = {}  # reserved range start -> end (walls at both ends)
        self.seg_ends: dict[int, int] = {}
        self.seg_starts: list[int] = []
        self.expandable = expandable  # the allocator splits off remainders >= 512 bytes
        self.max_split = max_split  # bytes; 0 = unlimited
        self.blocks: dict[int, int] = {}  # active (allocated or awaiting free) start -> end
        self.free: dict[int, int] = {}
        self.free_ends: dict[int, int] = {}
        self.free_starts: list[int] = []
        self._counts: dict[int, int] = {}
        self._heap: list[int] = []  # negated sizes; stale entries dropped when on top
        self.reserved = self.allocated = self.free_bytes = 0
        self.unplaced = 0  # snapshot segments or blocks that did not fit (layout_of)

    # -- free regions ---------------------------------------------------------------------

    def _add_free(self, start: int, end: int) -> None:
        self.free[start] = end
        self.free_ends[end] = start
        insort(self.free_starts, start)
        size = end - start
        seen = self._counts.get(size, 0)
        self._counts[size] = seen + 1
        if not seen:
            heapq.heappush(self._heap, -size)
        self.free_bytes += size

    def _drop_free(self, start: int) -> None:
        end = self.free.pop(start)
        del self.free_ends[end]
        del self.free_starts[bisect_left(self.free_starts, start)]
        self._counts[end - start] -= 1
        self.free_bytes -= end - start

    def largest(self) -> int:
        """Size of the largest free region (0 when none)."""
        heap, counts = self._heap, self._counts
        while heap and not counts.get(-heap[0]):
            heapq.heappop(heap)
        return -heap[0] if heap else 0

    def release(self, start: int, end: int) -> None:
        """Make [start, end) free, merged with free neighbours inside the same segment."""
        if start not in self.segs:
            left = self.free_ends.get(start)
            if left is not None:
                self._drop_free(left)
                start = left
        if end not in self.seg_ends:
            right = self.free.get(end)
            if right is not None:
                self._drop_free(end)
                end = right
        self._add_free(start, end)

    def region(self, addr: int) -> tuple[int, int] | None:
        """The free region containing `addr`, or None."""
        i = bisect_right(self.free_starts, addr) - 1
        if i < 0:
            return None
        start = self.free_starts[i]
        end = self.free[start]
        return (start, end) if addr < end else None

    def carve(self, start: int, end: int) -> bool:
        """Take [start, end) out of the free region holding it; False when none holds it."""
        found = self.region(start)
        if found is None or end > found[1] or end <= start:
            return False
        self._drop_free(found[0])
        if found[0] < start:
            self._add_free(found[0], start)
        if end < found[1]:
            self._add_free(end, found[1])
        return True

    # -- blocks and segments ----------------------------------------------------------------

    def alloc(self, addr: int, size: int) -> bool:
        if not self.carve(addr, addr + size):
            return False
        self.blocks[addr] = addr + size
        self.allocated += size
        return True

    def free_block(self, addr: int) -> int:
        """Free the active block at `addr`; its size, or 0 when there is none."""
        end = self.blocks.pop(addr, None)
        if end is None:
            return 0
        self.allocated -= end - addr
        self.release(addr, end)
        return end - addr

    def add_segment(self, addr: int, size: int, *, merge: bool = False) -> bool:
        """Reserve [addr, addr+size) all free; `merge` joins touching ranges (mapped pages)."""
        end = addr + size
        i = bisect_right(self.seg_starts, addr)
        before = self.seg_starts[i - 1] if i else None
        if size <= 0 or (before is not None and self.segs[before] > addr) or (
                i < len(self.seg_starts) and self.seg_starts[i] < end):
            return False
        start = addr
        if merge and before is not None and self.segs[before] == addr:
            start = before
            self._drop_segment_entry(before)
        if merge and end in self.segs:
            right = self.segs[end]
            self._drop_segment_entry(end)
            end = right
        self._add_segment_entry(start, end)
        self.reserved += size
        self.release(addr, addr + size)
        return True

    def drop_segment(self, addr: int, size: int) -> bool:
        """Give back [addr, addr+size), which must be free; may cut a mapped range in two."""
        end = addr + size
        i = bisect_right(self.seg_starts, addr) - 1
        if i < 0 or self.segs[self.seg_starts[i]] < end or not self.carve(addr, end):
            return False
        start = self.seg_starts[i]
        outer = self.segs[start]
        self._drop_segment_entry(start)
        if start < addr:
            self._add_segment_entry(start, addr)
        if end < outer:
            self._add_segment_entry(end, outer)
        self.reserved -= size
        return True

    def _add_segment_entry(self, start: int, end: int) -> None:
        self.segs[start] = end
        self.seg_ends[end] = start
        insort(self.seg_starts, start)

    def _drop_segment_entry(self, start: int) -> None:
        del self.seg_ends[self.segs.pop(start)]
        del self.seg_starts[bisect_left(self.seg_starts, start)]

    # -- history --------------------------------------------------------------------------

    def block_size(self, addr: int, requested: int) -> int | None:
        """The real size of a block of `requested` bytes freed at `addr` (module docstring)."""
        rounded = max(MIN_BLOCK, -(-requested // MIN_BLOCK) * MIN_BLOCK)
        found = self.region(addr)
        if found is None or addr + rounded > found[1]:
            return None
        tail = found[1] - addr - rounded
        if self.expandable or rounded <= SMALL_SIZE:
            limit = MIN_BLOCK - 1
        elif self.max_split and rounded >= self.max_split:
            limit = LARGE_BUFFER - 1
        else:
            limit = SMALL_SIZE
        return rounded + tail if tail <= limit else rounded

    def undo(self, code: int, addr: int, size: int) -> int:
        """Undo one event; the bytes it moved (block or segment size), 0 when impossible."""
        if code == ALLOC:
            return self.free_block(addr)
        if code == FREE:
            real = self.block_size(addr, size)
            return real if real is not None and self.alloc(addr, real) else 0
        if code in (SEG_ALLOC, SEG_MAP):
            return size if self.drop_segment(addr, size) else 0
        return size if self.add_segment(addr, size, merge=code == SEG_UNMAP) else 0

    def redo(self, code: int, addr: int, size: int) -> bool:
        """Apply one event forwards with the size `undo` returned for it."""
        if code == ALLOC:
            return self.alloc(addr, size)
        if code == FREE:
            return self.free_block(addr) == size
        if code in (SEG_ALLOC, SEG_MAP):
            return self.add_segment(addr, size, merge=code == SEG_MAP)
        return self.drop_segment(addr, size)

    def frozen(self) -> Frozen:
        def rows(d: dict[int, int]) -> npt.NDArray[np.int64]:
            flat = np.fromiter(chain.from_iterable(d.items()), np.int64, count=2 * len(d))
            pairs = flat.reshape(-1, 2)
            return pairs[np.argsort(pairs[:, 0], kind="stable")]
        return Frozen(rows(self.segs), rows(self.blocks), rows(self.free))
