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

Odd lines are counted in `meta["warnings"]`, never dropped unsaid: a line that starts like a
result but is not a whole one (a column missing, cut short, a negative size, binary
garbage), a size past int64, and a time that is not a number (`N/A`, `nan`, `inf`),
negative or longer than a day (only that measurement: the line's other one stays).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes
from gpudiag.trace import Trace

# size count type [redop] [root] then, out-of-place and in-place: time algbw busbw error.
# The eight measured fields are read as tokens and parsed after: `N/A`, `nan` or `-inf`
# where a time belongs drops that one measurement (counted), not the whole line.
_ROW = re.compile(
    r"^[ \t]*(?P<size>\d+)[ \t]+(?P<count>\d+)[ \t]+(?P<type>\w+)[ \t]+"
    r"(?:(?P<redop>[a-z]+)[ \t]+)?(?:(?P<root>-?\d+)[ \t]+)?"
    r"(?P<t1>\S+)[ \t]+(?P<alg1>\S+)[ \t]+(?P<bus1>\S+)[ \t]+\S+[ \t]+"
    r"(?P<t2>\S+)[ \t]+(?P<alg2>\S+)[ \t]+(?P<bus2>\S+)[ \t]+\S+[ \t]*$",
    re.MULTILINE,
)
#: a line that starts as a result row does (a size, a count, a type): one that is not a
#: whole row (a column missing, cut short, a negative size) is counted, never dropped unsaid
_ROW_START = re.compile(r"^[ \t]*[-+]?\d+[ \t]+[-+]?\d+[ \t]+[A-Za-z]\w*", re.MULTILINE)
_RANK = re.compile(r"^#\s+Rank\s+\d+\s", re.MULTILINE)
_HEADER = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_NAME_OPS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
    ("reduce", "reduce"),
)
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float": 4, "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
#: the longest measured time believed, µs: one day (as one Kineto event's duration)
MAX_TIME_US = 86_400e6
UNREAD_LINES = "nccl-tests lines that start like a result but are not one (skipped)"
BAD_TIMES = ("nccl-tests measurements whose time is not a number, negative or over a day "
             "(dropped)")
BAD_SIZES = "nccl-tests sizes past int64 (their lines dropped)"


def read(path: Path) -> Trace:
    """The log's measurements as collectives, laid end to end (no timeline)."""
    text = read_bytes(path).decode("utf-8", errors="replace")
    rows = pd.DataFrame([match.groupdict() for match in _ROW.finditer(text)],
                        columns=list(_ROW.groupindex))
    warnings = {UNREAD_LINES: len(_ROW_START.findall(text)) - len(rows)}
    sizes = np.array([int(size) if int(size) < 2**63 else -1 for size in rows["size"]],
                     dtype=np.int64)
    warnings[BAD_SIZES] = int((sizes < 0).sum())
    rows = rows.assign(size=sizes)[sizes >= 0].reset_index(drop=True)
    measured, warnings[BAD_TIMES] = _measurements(rows)
    if measured.empty:
        unread = sum(warnings.values())
        raise InputError(path, "is an nccl-tests log without any result rows"
                         + (f" ({unread} lines or measurements could not be read)"
                            if unread else ""),
                         "the run may have failed before its first size; check the log's end")
    ranks = len(_RANK.findall(text)) or _ranks_from_header(text)
    trace = Trace(meta={"format": "nccl-tests", "timeline": False, "vendor": "nvidia",
                        "world_size": ranks or None},
                  collectives=_collectives(path, measured, _op(path, rows, ranks), ranks))
    for kind, count in warnings.items():
        trace.warn(kind, count)
    return trace


def _measurements(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """One row per measurement (out-of-place, then in-place, per line) whose time is a
    number in [0, MAX_TIME_US], and how many were not."""
    frames = []
    dropped = 0
    for placement, suffix in ((0, "1"), (1, "2")):
        time_us = pd.to_numeric(rows[f"t{suffix}"], errors="coerce").to_numpy(np.float64)
        good = np.isfinite(time_us) & (time_us >= 0) & (time_us <= MAX_TIME_US)
        dropped += int((~good).sum())
        frames.append(pd.DataFrame({
            "bytes": rows["size"].to_numpy(np.int64)[good], "dtype": rows["type"][good],
            "dur_ns": np.rint(time_us[good] * 1000).astype(np.int64),
            "line": np.flatnonzero(good), "placement": placement,
        }))
    measured = pd.concat(frames).sort_values(["line", "placement"], kind="stable")
    return measured.reset_index(drop=True), dropped


def _collectives(path: Path, measured: pd.DataFrame, operation: str,
                 ranks: int) -> pd.DataFrame:
    """The measurements end to end from 0 ns: there is no timeline."""
    if float(measured["dur_ns"].sum()) >= 2**62:  # a million lines of a day each
        raise InputError(path, "holds measured times that add up past 146 years",
                         "the log is damaged: check its result lines")
    end = measured["dur_ns"].cumsum().to_numpy()
    placements = np.array([f"{operation} out-of-place", f"{operation} in-place"])
    return pd.DataFrame({
        "start_ns": end - measured["dur_ns"].to_numpy(),
        "end_ns": end,
        "op": operation,
        "bytes": measured["bytes"].to_numpy(),
        "dtype": measured["dtype"].to_numpy(),
        "group_size": ranks or pd.NA,
        "seq": np.arange(len(measured)),
        "name": placements[measured["placement"].to_numpy()],
    })


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
    if rows.empty:
        return "other"
    last = rows.iloc[-1]
    alg, bus = (pd.to_numeric(pd.Series([last["alg1"], last["bus1"]]), errors="coerce")
                .to_numpy(np.float64))
    if not ranks or not (np.isfinite(alg) and np.isfinite(bus)) or alg <= 0:
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
