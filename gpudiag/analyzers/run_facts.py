"""What `compare` reads of a run besides its Diagnosis, small enough to come from a job.

A run compared from one trace has its events at hand; a job diagnosed rank by rank
(`gpudiag.diagnose_job`) does not, its events stayed with its ranks. Both give a `RunFacts`:
`of_trace` from the events, `of_parts` from the ranks' `summary.Part`s (each rank's GPU
window, host span and kernel time by name, which the map sends anyway) and the merged
job's meta. The two are equal for the same ranks: windows are a min and a max, kernel time
and launches sums, so summing per rank first changes nothing.

    facts = run_facts.of_trace(trace)
    facts.kernels.loc["nccl AllReduce RING LL Sum f32", "sum"]     # GPU ns of that kernel
    job_facts = run_facts.of_parts(job.summary_parts, job.meta)     # == of_trace(merged)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudiag.trace import Trace

if TYPE_CHECKING:
    from gpudiag.analyzers.summary import Part


@dataclass(frozen=True)
class RunFacts:
    """`window_ns`: the GPU window (None without kernels or copies); `process_time_ns`:
    the longest profiled process's wall time, else the span of the host events (NaN
    without either); `kernels`: GPU ns (`sum`) and launches (`size`) per `kernel_key`;
    `memory`: the run holds allocator events or snapshot blocks; `peak_rss_bytes`: the
    program's peak resident set, as a `gpudiag profile` session measured it (NaN for a
    trace that is not such a run)."""

    window_ns: tuple[int, int] | None
    process_time_ns: float
    kernels: pd.DataFrame
    memory: bool
    peak_rss_bytes: float = math.nan


def of_trace(trace: Trace) -> RunFacts:
    """The facts of one trace (or of a merged job)."""
    kernels = trace.kernels
    grouped = (kernels["end_ns"] - kernels["start_ns"]).groupby(
        kernel_key(kernels["name"])).agg(["sum", "size"])
    return RunFacts(trace.gpu_window_ns(), process_time(trace.meta, host_span(trace)),
                    grouped, not (trace.memory.empty and trace.memory_blocks.empty),
                    peak_rss(trace.meta))


def of_parts(parts: Sequence[Part], meta: dict[str, Any]) -> RunFacts:
    """The facts of the job whose ranks' summary parts these are, with its merged meta;
    the parts must cover the whole trace (no window)."""
    windows = [piece.gpu_window for piece in parts if piece.gpu_window is not None]
    spans = [piece.host_span for piece in parts if piece.host_span is not None]
    frames = [piece.kernels for piece in parts if len(piece.kernels)]
    if frames:
        by_name = pd.concat(frames).groupby(level=0).sum()
        grouped = by_name.groupby(kernel_key(pd.Series(by_name.index, index=by_name.index))
                                  ).sum().rename(columns={"count": "size"})[["sum", "size"]]
    else:
        grouped = pd.DataFrame({"sum": pd.Series(dtype="int64"),
                                "size": pd.Series(dtype="int64")})
    rows = [piece.rows for piece in parts]
    return RunFacts(
        (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None,
        process_time(meta, (min(s[0] for s in spans), max(s[1] for s in spans))
                     if spans else None),
        grouped, any(row.get("memory", 0) or row.get("memory_blocks", 0) for row in rows),
        peak_rss(meta))


def peak_rss(meta: dict[str, Any]) -> float:
    """The peak resident set a `gpudiag profile` session measured of its program (its
    meta.json's `peak_rss_bytes`); NaN for anything else."""
    run = meta.get("run")
    value = run.get("peak_rss_bytes") if isinstance(run, dict) else None
    return float(value) if isinstance(value, int) and value > 0 else math.nan


def host_span(trace: Trace) -> tuple[int, int] | None:
    """(first start, last end) of the host events (ranges on a thread); None without."""
    host = trace.ranges[trace.ranges["tid"].notna()]
    if host.empty:
        return None
    return int(host["start_ns"].min()), int(host["end_ns"].max())


def process_time(meta: dict[str, Any], span: tuple[int, int] | None) -> float:
    """The longest profiled process's wall time (a `gpudiag profile` run records each
    process's start and end), else the length of the host span; NaN without either."""
    spans = [process.get("end_ns", 0) - process.get("start_ns", 0)
             for process in meta.get("processes", []) or []
             if isinstance(process, dict) and isinstance(process.get("start_ns"), int)
             and isinstance(process.get("end_ns"), int)]
    if spans and max(spans) > 0:
        return float(max(spans))
    return math.nan if span is None else float(span[1] - span[0])


#: NCCL kernel names: ncclKernel_<op>_<algo>_<proto>[_<redop>_<type>] (NCCL < 2.19) and
#: ncclDevKernel_<op>[_<redop>_<type>]_<algo>_<proto> (2.19 on), with the parameter list cut
_NCCL_ALGO = r"(?P<algo>RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)"
_NCCL_PROTO = r"(?P<proto>LL128|LL|SIMPLE)"
_NCCL_NAMES = [re.compile(p) for p in (
    rf"nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)_{_NCCL_ALGO}_{_NCCL_PROTO}"
    r"(?:_(?P<redop>[A-Za-z]+)_(?P<type>\w+))?",
    rf"nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)(?:_(?P<redop>[A-Za-z]+)_(?P<type>\w+?))?"
    rf"_{_NCCL_ALGO}_{_NCCL_PROTO}",
    r"nccl(?:Dev)?Kernel_(?P<op>SendRecv|Send|Recv)(?:_\w+)?",
)]
#: NCCL < 2.19 element types -> the newer names
_NCCL_TYPES = {"int8_t": "i8", "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32",
               "int64_t": "i64", "uint64_t": "u64", "half": "f16", "float": "f32",
               "double": "f64", "__nv_bfloat16": "bf16", "__nv_fp8_e4m3": "f8e4m3",
               "__nv_fp8_e5m2": "f8e5m2"}
#: ops whose kernel does not depend on a reduction or element type (older NCCL still named
#: them, as Sum_int8_t), and the point-to-point ops, whose newer kernel names no algorithm
_NCCL_COPY_OPS = ("AllGather", "Broadcast")
_NCCL_P2P_OPS = ("SendRecv", "Send", "Recv")


def kernel_key(names: pd.Series) -> pd.Series:
    """The name kernels are matched by across runs: the name itself, except NCCL kernels,
    keyed by op, algorithm, protocol, reduction and element type so that one collective
    keeps one row across NCCL versions, e.g. `ncclKernel_AllReduce_RING_LL_Sum_float
    (ncclWorkElem)` and `ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, ...)` are
    both 'nccl AllReduce RING LL Sum f32'. Computed once per distinct name."""
    cat = names.astype(str).astype("category")
    keys = [_nccl_key(str(category)) or str(category) for category in cat.cat.categories]
    return pd.Series(np.asarray(keys, dtype=object)[cat.cat.codes.to_numpy()],
                     index=names.index, dtype=object)


def _nccl_key(name: str) -> str | None:
    head = name.strip().removeprefix("void ").split("(", 1)[0].strip()
    match = next((found for pattern in _NCCL_NAMES if (found := pattern.fullmatch(head))), None)
    if match is None:
        return None
    parts = match.groupdict()
    if parts["op"] in _NCCL_P2P_OPS:
        return f"nccl {parts['op']}"
    words = [parts["op"], parts.get("algo"), parts.get("proto")]
    if parts["op"] not in _NCCL_COPY_OPS:
        words += [parts.get("redop"), _NCCL_TYPES.get(parts.get("type") or "", parts.get("type"))]
    return " ".join(["nccl", *(word for word in words if word)])
