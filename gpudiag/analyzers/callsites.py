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

import re

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.trace import Trace

#: Python frames from these top-level packages are library code, not the user's call site
LIBRARY_ROOTS = (
    "torch", "torchvision", "torchaudio", "triton", "numpy", "jax", "jaxlib", "flax", "optax",
    "functools", "contextlib", "logging", "threading", "typing", "importlib", "abc", "copy",
    "collections", "enum", "inspect", "weakref", "warnings", "site-packages", "dist-packages",
    "multiprocessing", "queue", "selectors", "socket", "traceback", "os", "posixpath",
)
_PY_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
_LIBRARY = re.compile(r"(^|/)(" + "|".join(re.escape(r) for r in LIBRARY_ROOTS) + r")(/|\.py)"
                      r"|^<|/lib/python3|/usr/lib/")


def frame_label(name: str) -> str:
    """Kineto's `file.py(42): func` as `file.py:42 (func)`; other names unchanged."""
    m = _PY_FRAME.match(name)
    return f"{m['file']}:{m['line']} ({m['func']})" if m else name


def is_user_frame(name: str) -> bool:
    m = _PY_FRAME.match(name)
    return m is not None and not _LIBRARY.search(m["file"])


def launch_calls(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    """For GPU rows with `pid` and `correlation`, the issuing API call: `tid, api_start_ns,
    api_end_ns, api_name` (NA where the trace has no matching call), index aligned."""
    api = trace.derived("api_with_correlation",
                        lambda: trace.api.dropna(subset=["correlation"]))
    pos = keys.join([rows["pid"], rows["correlation"]], [api["pid"], api["correlation"]])
    found = (pos >= 0) & rows["correlation"].notna().to_numpy(bool)
    safe = np.where(found, pos, 0)

    def take(col: str) -> pd.Series:
        if api.empty:
            dtype = "category" if col == "name" else "Int64"
            return pd.Series(pd.NA, index=rows.index, dtype=dtype)
        values = pd.Series(api[col].array.take(safe), index=rows.index)
        return values.where(found)

    return pd.DataFrame({"tid": take("tid"), "api_start_ns": take("start_ns").astype("Int64"),
                         "api_end_ns": take("end_ns").astype("Int64"),
                         "api_name": take("name")}, index=rows.index)


def kernel_launches(trace: Trace) -> pd.DataFrame:
    """`launch_calls` for every kernel, computed once per trace (several analyzers need it);
    do not modify the result."""
    return trace.derived("kernel_launches", lambda: launch_calls(trace, trace.kernels))


def where_at(trace: Trace, pid: npt.ArrayLike, tid: npt.ArrayLike,
             t: npt.ArrayLike) -> npt.NDArray[np.object_]:
    """The call site label at each host time (None where nothing is known)."""
    pid_a = pd.array(pid, dtype="Int64")
    tid_a = pd.array(tid, dtype="Int64")
    t_a = np.asarray(t, dtype=np.int64)
    out = np.full(len(t_a), None, dtype=object)
    ranges = trace.ranges
    if ranges.empty or len(t_a) == 0:
        return out
    host = ranges[ranges["tid"].notna() & ranges["pid"].notna()]
    python = host[host["source"] == "python"]
    user = python[python["name"].astype(str).map(is_user_frame)] if len(python) else python
    ops = host[host["source"] == "torch_op"]
    marks = host[host["source"].isin(["nvtx", "annotation", "step"])]
    for layer, label in ((user, frame_label), (ops, str), (marks, str)):
        missing = pd.isna(out)
        if not missing.any() or layer.empty:
            continue
        found = innermost(layer, pid_a[missing], tid_a[missing], t_a[missing])
        hit = np.unique(found[found >= 0])
        names = layer["name"].astype(str).to_numpy()
        labels = np.full(len(names), None, dtype=object)
        labels[hit] = [label(names[i]) for i in hit]  # one per distinct range hit
        picked = labels[np.maximum(found, 0)]
        picked[found < 0] = None
        out[missing] = picked
    return out


def innermost(ranges: pd.DataFrame, pid: pd.api.extensions.ExtensionArray,
              tid: pd.api.extensions.ExtensionArray, t: npt.NDArray[np.int64]
              ) -> npt.NDArray[np.int64]:
    """Row position in `ranges` of the deepest range on (pid, tid) containing t, or -1."""
    threads = pd.MultiIndex.from_arrays([ranges["pid"], ranges["tid"]])
    codes, uniques = pd.factorize(threads)
    qcodes = uniques.get_indexer(pd.MultiIndex.from_arrays([pid, tid]))
    start = ranges["start_ns"].to_numpy(np.int64)
    end = ranges["end_ns"].to_numpy(np.int64)
    depth = ranges["depth"].fillna(0).to_numpy(np.int64)
    span = np.int64(max(int(end.max()), int(t.max()) if len(t) else 0) + 1
                    - min(int(start.min()), int(t.min()) if len(t) else 0))
    base = np.int64(min(int(start.min()), int(t.min()) if len(t) else 0))
    best = np.full(len(t), -1, dtype=np.int64)
    best_depth = np.full(len(t), -1, dtype=np.int64)
    qkey = np.where(qcodes >= 0, qcodes.astype(np.int64) * span + (t - base), -1)
    for d in np.unique(depth):
        rows = np.flatnonzero(depth == d)
        key = codes[rows].astype(np.int64) * span + (start[rows] - base)
        order = np.argsort(key, kind="stable")
        rows, key = rows[order], key[order]
        i = np.searchsorted(key, qkey, side="right") - 1
        hit = (i >= 0) & (qcodes >= 0)
        cand = rows[np.maximum(i, 0)]
        hit &= (codes[cand] == qcodes) & (end[cand] > t) & (d > best_depth)
        best = np.where(hit, cand, best)
        best_depth = np.where(hit, d, best_depth)
    return best
