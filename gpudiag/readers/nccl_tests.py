"""nccl-tests output (`all_reduce_perf`, `alltoall_perf`, ... logs) as collectives.

Each table line of a log is one message size measured twice (out-of-place, in-place); each
measurement becomes one `collectives` row named '<op> out-of-place' / '<op> in-place' with
`bytes` = the size column and the duration = the measured time. There is no timeline (the
tool averages `iters` runs), so rows are laid end to end and `meta["timeline"]` is False.
nccl-tests' own algbw/busbw columns are not stored: gpudiag computes them from bytes and time,
and the log's printed values serve as the test oracle.

The op is not printed in the log: it comes from the file name (`allreduce`, `all_gather`...)
or else from the ratio busbw/algbw that nccl-tests applies (2(n-1)/n for all_reduce, (n-1)/n
for all_gather / reduce_scatter / all_to_all, 1 for broadcast / reduce / send_recv).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes
from gpudiag.trace import Trace

_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
# size count type [redop] [root] time algbw busbw error time algbw busbw error
_ROW = re.compile(
    rf"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?:(?P<redop>[a-z]+)\s+)?"
    rf"(?:(?P<root>-?\d+)\s+)?(?P<t1>{_NUMBER})\s+(?P<alg1>{_NUMBER})\s+(?P<bus1>{_NUMBER})\s+"
    rf"(?P<err1>\S+)\s+(?P<t2>{_NUMBER})\s+(?P<alg2>{_NUMBER})\s+(?P<bus2>{_NUMBER})\s+\S+\s*$",
    re.MULTILINE,
)
_RANK = re.compile(r"^#\s+Rank\s+\d+\s", re.MULTILINE)
_HEADER = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_NAME_OPS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
    ("reduce", "reduce"),
)
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}


def read(path: Path) -> Trace:
    text = read_bytes(path).decode("utf-8", errors="replace")
    rows = pd.DataFrame([match.groupdict() for match in _ROW.finditer(text)])
    if rows.empty:
        raise InputError(path, "is an nccl-tests log without any result rows",
                         "the run may have failed before its first size; check the log's end")
    ranks = len(_RANK.findall(text)) or _ranks_from_header(text)
    operation = _op(path, rows, ranks)
    frames = []
    for placement, suffix in (("out-of-place", "1"), ("in-place", "2")):
        frames.append(pd.DataFrame({
            "bytes": pd.to_numeric(rows["size"]).astype("int64"),
            "dtype": rows["type"],
            "dur_ns": np.rint(pd.to_numeric(rows[f"t{suffix}"]) * 1000).astype("int64"),
            "name": f"{operation} {placement}",
            "line": np.arange(len(rows)),
            "placement": 0 if suffix == "1" else 1,
        }))
    measured = pd.concat(frames).sort_values(["line", "placement"]).reset_index(drop=True)
    end = measured["dur_ns"].cumsum().to_numpy()
    collectives = pd.DataFrame({
        "start_ns": end - measured["dur_ns"].to_numpy(),
        "end_ns": end,
        "op": operation,
        "bytes": measured["bytes"],
        "dtype": measured["dtype"],
        "group_size": ranks or pd.NA,
        "seq": np.arange(len(measured)),
        "name": measured["name"],
    })
    meta = {"format": "nccl-tests", "timeline": False, "vendor": "nvidia",
            "world_size": ranks or None}
    return Trace(meta=meta, collectives=collectives)


def _ranks_from_header(text: str) -> int:
    match = _HEADER.search(text)
    return int(match.group(1)) * int(match.group(2)) if match else 0


def _op(path: Path, rows: pd.DataFrame, ranks: int) -> str:
    stem = re.sub(r"[^a-z]", "", path.name.lower())
    for fragment, operation in _NAME_OPS:
        if fragment in stem:
            return operation
    return _op_from_factor(rows, ranks)


def _op_from_factor(rows: pd.DataFrame, ranks: int) -> str:
    """Infer the op from busbw/algbw on the largest message (where both are precise)."""
    last = rows.iloc[-1]
    alg, bus = float(last["alg1"]), float(last["bus1"])
    if not ranks or alg <= 0:
        return "other"
    factor = bus / alg
    reduces = isinstance(last["redop"], str) and bool(last["redop"])
    if abs(factor - 2 * (ranks - 1) / ranks) < 0.02:
        return "all_reduce"
    if abs(factor - (ranks - 1) / ranks) < 0.02:
        return "reduce_scatter" if reduces else "other"  # all_gather and all_to_all look alike
    if abs(factor - 1) < 0.02:
        return "reduce" if reduces else "broadcast"
    return "other"
