"""Where on the host a GPU event or a host wait came from.

Two joins every analyzer needs:
- `launch_calls`: a GPU row (kernel, copy) -> the API call that issued it, through the CUPTI
  correlation id, keyed by (pid, correlation) because ids restart in every process;
- `where_at`: a host time on a thread -> the innermost *user* Python frame open there
  (`train.py:42 (step)`), else the innermost torch op, else the innermost NVTX range or
  annotation. Library frames (torch, numpy, jax, the standard library, built-ins) are
  skipped: the answer should be the line the user can change.

Ranges of one depth on one thread never overlap, so "the innermost range containing t" is
found with one `searchsorted` per depth level, never a loop per event.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.names import frame_label, is_user_frame
from gpudiag.trace import Trace


class _UserFrame:
    """`is_user_frame` with the `search` interface `keys.matches` takes (one call per
    distinct frame name, not per range)."""

    def search(self, name: str) -> bool:
        return is_user_frame(name)


USER_FRAME = _UserFrame()


def launch_calls(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    """For GPU rows with `rank`, `pid` and `correlation`, the issuing API call: `tid,
    api_start_ns, api_end_ns, api_name` (NA where the trace has no matching call), index
    aligned. Correlation ids restart in every process and pids repeat across ranks."""
    api = trace.derived("api_with_correlation",
                        lambda: trace.api.dropna(subset=["correlation"]))
    pos = keys.join([_rank(rows), rows["pid"], rows["correlation"]],
                    [_rank(api), api["pid"], api["correlation"]])
    found = (pos >= 0) & rows["correlation"].notna().to_numpy(bool)
    safe = np.where(found, pos, 0)

    def take(col: str) -> pd.Series:
        if api.empty:
            dtype = "category" if col == "name" else "Int64"
            return pd.Series(pd.NA, index=rows.index, dtype=dtype)
        values = pd.Series(api[col].array.take(safe), index=rows.index)
        if pd.api.types.is_integer_dtype(values.dtype):  # NA must not pass through float:
            values = values.astype("Int64")  # epoch ns would round to 256 ns
        return values.where(found)

    return pd.DataFrame({"tid": take("tid"), "api_start_ns": take("start_ns").astype("Int64"),
                         "api_end_ns": take("end_ns").astype("Int64"),
                         "api_name": take("name")}, index=rows.index)


def _rank(frame: pd.DataFrame) -> pd.Series:
    """The rank column as Int64 (NA where unknown), or all NA without one: `keys.join`
    matches NA with NA."""
    if "rank" not in frame:
        return pd.Series(pd.NA, index=frame.index, dtype="Int64")
    return frame["rank"].astype("Int64")


def kernel_launches(trace: Trace) -> pd.DataFrame:
    """`launch_calls` for every kernel, computed once per trace (several analyzers need it);
    do not modify the result."""
    return trace.derived("kernel_launches", lambda: launch_calls(trace, trace.kernels))


def where_at(trace: Trace, pid: npt.ArrayLike, tid: npt.ArrayLike, t: npt.ArrayLike,
             rank: npt.ArrayLike | None = None) -> npt.NDArray[np.object_]:
    """The call site label at each host time (None where nothing is known). With `rank`
    (NA, or `keys.MISSING` from numpy code: none), threads of different ranks that reuse a
    pid are kept apart."""
    times = np.asarray(t, dtype=np.int64)
    out = np.full(len(times), None, dtype=object)
    ranges = trace.ranges
    if ranges.empty or len(times) == 0:
        return out
    ranks = (keys.key_column(np.asarray(rank)).array if rank is not None
             else pd.array([pd.NA] * len(times), dtype="Int64"))
    query = pd.DataFrame({"pid": pd.array(pid, dtype="Int64"), "tid": pd.array(tid, dtype="Int64"),
                          "rank": ranks})
    for layer, label, names in trace.derived("call_site_layers", lambda: _layers(ranges)):
        missing = pd.isna(out)
        if not missing.any() or layer.empty:
            continue
        found = innermost(layer, query[missing], times[missing],
                          ("rank", "pid", "tid") if rank is not None else ("pid", "tid"))
        hit = np.unique(found[found >= 0])
        labels = np.full(len(names), None, dtype=object)
        labels[hit] = [label(names[row]) for row in hit]  # one per distinct range hit
        picked = labels[np.maximum(found, 0)]
        picked[found < 0] = None
        out[missing] = picked
    return out


def _layers(ranges: pd.DataFrame) -> list[tuple[pd.DataFrame, Any, np.ndarray]]:
    """The host ranges `where_at` searches, in the order it tries them, each with its label
    function and its names as text: user Python frames, torch ops, NVTX ranges and
    annotations (not steps: one per step). Built once per trace (analyzers ask it for
    gaps, copies and collectives in turn)."""
    host = ranges[ranges["tid"].notna() & ranges["pid"].notna()]
    python = host[host["source"] == "python"]
    user = python[keys.matches(python["name"], USER_FRAME)] if len(python) else python
    ops = host[host["source"] == "torch_op"]
    marks = host[host["source"].isin(["nvtx", "annotation"])]
    return [(layer, label, keys.texts(layer["name"]))
            for layer, label in ((user, frame_label), (ops, str), (marks, str))]


def innermost(ranges: pd.DataFrame, query: pd.DataFrame, t: npt.NDArray[np.int64],
              thread: tuple[str, ...] = ("rank", "pid", "tid")) -> npt.NDArray[np.int64]:
    """Row position in `ranges` of the deepest range containing t on the query row's
    thread (the `thread` columns: rank NA counts as one rank; pid or tid NA never matches),
    or -1."""
    cols = list(thread)
    both = pd.concat([ranges[cols].reset_index(drop=True), query[cols].reset_index(drop=True)],
                     ignore_index=True)
    if "rank" in cols:
        both["rank"] = both["rank"].astype("Int64")  # NA is a rank of its own in keys.codes
    codes_all = keys.codes(*(both[col] for col in cols))
    codes_, qcodes = codes_all[:len(ranges)], codes_all[len(ranges):]
    unknown = np.zeros(len(query), dtype=bool)
    for col in cols:
        if col != "rank":
            unknown |= query[col].isna().to_numpy()
    qcodes = np.where(unknown, -1, qcodes)
    start = ranges["start_ns"].to_numpy(np.int64)
    end = ranges["end_ns"].to_numpy(np.int64)
    depth = ranges["depth"].fillna(0).to_numpy(np.int64)
    (rkey, qkey), _ = keys.time_keys([codes_, qcodes], [start, t])
    best = np.full(len(t), -1, dtype=np.int64)
    best_depth = np.full(len(t), -1, dtype=np.int64)
    for level in np.unique(depth):  # ranges of one depth on one thread never overlap
        rows = np.flatnonzero(depth == level)
        order = np.argsort(rkey[rows], kind="stable")
        rows = rows[order]
        before = np.searchsorted(rkey[rows], qkey, side="right") - 1
        cand = rows[np.maximum(before, 0)]
        hit = ((before >= 0) & (qcodes >= 0) & (codes_[cand] == qcodes) & (end[cand] > t)
               & (level > best_depth))
        best = np.where(hit, cand, best)
        best_depth = np.where(hit, level, best_depth)
    return best
