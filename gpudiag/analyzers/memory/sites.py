"""Which allocations cause the memory the caching allocator cannot use, at the snapshot.

    s = sites(trace)
    s.head()                          # call sites stranding the most inactive bytes
    internal_waste(trace).head()      # call sites whose blocks are most over-sized

Two kinds of lost memory have an owner in a snapshot:
- *stranded* bytes (external fragmentation): an inactive block in a segment that still
  holds a block in use. It cannot go back to the driver (cudaFree takes whole segments) and
  cannot merge into a larger free block, because the blocks in use beside it are in the way.
  Those neighbours are who to blame: each hole is attributed to the blocks in use directly
  before and after it in its segment, half to each (the left one gets the odd byte), or all
  to the one neighbour when the hole touches the segment's edge. A segment with no block in
  use is merely cached (empty_cache would return it), so its bytes are attributed to no one.
- *internal waste*: the bytes a block in use holds beyond what was requested (512-byte
  rounding, and remainders too small to split off).

Both are vectorized over the block table: one sort by (device, segment, address), shifts to
find each hole's neighbours, one group-by.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.names import short_name
from gpudiag.trace import Trace

ORDER = ["rank", "device", "segment_addr", "addr"]


def sites(trace: Trace) -> pd.DataFrame:
    """Call sites whose blocks in use strand the most inactive bytes (module docstring).

        s = sites(trace)
        s[["site", "inactive_bytes", "share", "holes"]].head()
        s.inactive_bytes.sum()            # all stranded bytes

    Columns `rank, device, site, inactive_bytes, share, holes, blocks, segments`:
    attributed bytes, their share of the device's stranded bytes, the holes the site's
    blocks border, how many blocks and segments. `site` is NA where the snapshot was
    recorded without stacks. Sorted by bytes, largest first.
    """
    blocks = _ordered(trace.memory_blocks)
    credit, touching = _credits(blocks)
    blocks = blocks.assign(inactive_bytes=credit, holes=touching)[credit > 0]
    keys = ["rank", "device", "site"]
    out = blocks.groupby(keys, dropna=False, observed=True).agg(
        inactive_bytes=("inactive_bytes", "sum"), holes=("holes", "sum"),
        blocks=("inactive_bytes", "size"), segments=("segment_addr", "nunique")).reset_index()
    total = out.groupby(["rank", "device"], dropna=False)["inactive_bytes"].transform("sum")
    out.insert(4, "share", out["inactive_bytes"] / total.where(total > 0))
    out = out.sort_values("inactive_bytes", ascending=False, kind="stable", ignore_index=True)
    return out.astype({"rank": "Int64", "device": "Int64", "site": "string",
                       "inactive_bytes": "int64", "share": "float64", "holes": "int64",
                       "blocks": "int64", "segments": "int64"})


def _ordered(blocks: pd.DataFrame) -> pd.DataFrame:
    usable = blocks[blocks[["segment_addr", "addr", "bytes"]].notna().all(axis=1).to_numpy()]
    return usable.sort_values(ORDER, kind="stable", na_position="first", ignore_index=True)


def _credits(blocks: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Stranded bytes credited to each block in use, and how many holes it borders."""
    count = len(blocks)
    segment = blocks.groupby(["rank", "device", "segment_addr"], dropna=False,
                             sort=False).ngroup().to_numpy(np.int64)
    free = (blocks["state"] == "inactive").fillna(False).to_numpy(bool)
    used = ~free
    in_use = np.bincount(segment, weights=used,
                         minlength=segment.max() + 1 if count else 0) > 0
    hole = free & in_use[segment] if count else free
    size = blocks["bytes"].to_numpy(np.int64)
    same_prev = np.r_[False, segment[1:] == segment[:-1]]
    same_next = np.r_[segment[1:] == segment[:-1], False]
    left = hole & same_prev & np.r_[False, used[:-1]]
    right = hole & same_next & np.r_[used[1:], False]
    both = left & right
    to_left = np.where(both, size - size // 2, np.where(left, size, 0))
    to_right = np.where(both, size // 2, np.where(right, size, 0))
    credit = np.zeros(count, dtype=np.int64)
    touching = np.zeros(count, dtype=np.int64)
    credit[:-1] += to_left[1:]  # the block before hole i is i - 1
    credit[1:] += to_right[:-1]
    touching[:-1] += left[1:]
    touching[1:] += right[:-1]
    return credit, touching


def free_pieces(trace: Trace) -> pd.DataFrame:
    """Per device at the snapshot, the free bytes split into stranded and cached.

        p = free_pieces(trace)
        p[["stranded_bytes", "stranded_holes", "stranded_segments"]]
        p.cached_bytes                    # wholly free segments: cache, not fragmentation

    Columns `rank, device, stranded_bytes, stranded_holes, stranded_segments, cached_bytes,
    cached_segments` (module docstring for the definitions).
    """
    blocks = _ordered(trace.memory_blocks)
    free = (blocks["state"] == "inactive").fillna(False).to_numpy(bool)
    segment = blocks.groupby(["rank", "device", "segment_addr"], dropna=False,
                             sort=False).ngroup()
    in_use = pd.Series(~free).groupby(segment.to_numpy()).transform("any").to_numpy(bool)
    blocks = blocks.assign(stranded=np.where(free & in_use, blocks["bytes"], 0),
                           hole=free & in_use,
                           cached=np.where(free & ~in_use, blocks["bytes"], 0),
                           stranded_seg=segment.where(free & in_use),
                           cached_seg=segment.where(~in_use))
    out = blocks.groupby(["rank", "device"], dropna=False).agg(
        stranded_bytes=("stranded", "sum"), stranded_holes=("hole", "sum"),
        stranded_segments=("stranded_seg", "nunique"), cached_bytes=("cached", "sum"),
        cached_segments=("cached_seg", "nunique")).reset_index()
    return out.astype({"rank": "Int64", "device": "Int64"} | {
        col: "int64" for col in out.columns if col not in ("rank", "device")})


def internal_waste(trace: Trace) -> pd.DataFrame:
    """Bytes the allocator holds beyond what was requested, per call site, at the snapshot.

        w = internal_waste(trace)
        w.waste_bytes.sum()               # total internal waste
        w.head()                          # the sites that waste most

    Columns `rank, device, site, blocks, bytes, requested_bytes, waste_bytes` over blocks in
    use (waste = block size - requested size). Blocks without a requested size are left out.
    Sorted by waste, largest first.
    """
    blocks = trace.memory_blocks
    blocks = blocks[((blocks["state"] != "inactive").fillna(True)
                     & blocks["requested_bytes"].notna()).to_numpy(bool)]
    blocks = blocks.assign(waste_bytes=blocks["bytes"] - blocks["requested_bytes"])
    out = blocks.groupby(["rank", "device", "site"], dropna=False, observed=True).agg(
        blocks=("bytes", "size"), bytes=("bytes", "sum"),
        requested_bytes=("requested_bytes", "sum"), waste_bytes=("waste_bytes", "sum"))
    out = out.reset_index().sort_values("waste_bytes", ascending=False, kind="stable")
    return out.astype({"rank": "Int64", "device": "Int64", "site": "string", "blocks": "int64",
                       "bytes": "int64", "requested_bytes": "int64", "waste_bytes": "int64"}
                      ).reset_index(drop=True)


#: a site as the snapshot reader writes it: 'file:line (function)'
_SITE = re.compile(r"^(?P<file>.+?):(?P<line>\d+|\?) \((?P<func>.*)\)$", re.S)
#: the op inside autograd's generated wrappers (VariableType_N.cpp), templates or not
_AUTOGRAD_OP = re.compile(r"VariableType::\(anonymous namespace\)::(\w+)")


def site_label(site: str) -> str:
    """A call site as a finding names it: Python frames whole, C++ frames short.

        s = sites(trace)
        s["site"].dropna().map(site_label).head()
        site_label("/u/model.py:39 (forward)")       # unchanged

    The reader picks a C++ frame only when the stack holds no Python frame (autograd's
    backward thread), so such a site says so and names the op it runs
    (`VariableType_2.cpp:0 (new_empty_strided; C++ stack, no Python frame)`) rather than
    hundreds of characters of dispatcher templates.
    """
    parts = _SITE.match(site)
    if parts is None:
        return short_name(site)
    path = parts["file"]
    if path.endswith(".py") or path.startswith("<"):
        return site
    wrapped = _AUTOGRAD_OP.search(parts["func"])
    func = wrapped[1] if wrapped else short_name(parts["func"])
    return f"{path}:{parts['line']} ({func}; C++ stack, no Python frame)"
