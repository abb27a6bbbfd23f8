"""Findings: what every analyzer reports to the user, in one shape.

A finding is one problem at one place: its cause (a loss cause of the waterfall, or
`fragmentation` / `kernel` for findings that are not a share of the timeline), the GPU time
it cost, where it happens (a Python call site when the trace has stacks, else the torch
op, NVTX range or kernel name), how often, the evidence in numbers, and one concrete action.
`diagnose()` concatenates every analyzer's findings, fills `share` (of the analyzed GPU
time) and ranks them by `lost_ns`.

Evidence writes every duration with `format_ns`, the one duration formatter of gpudiag
(the terminal and HTML reports use it too), so a 4.64 µs loss never reads "0.00 ms".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

#: the time causes of the waterfall, in the order the report draws them
LOSS_CAUSES = ("useful", "sync_stall", "launch_bound", "host_bound", "copy", "comm_wait",
               "small_grid")

#: host-side causes (`analyzers.host_steps`): host time in the steps, a share of step time
HOST_CAUSES = ("host_data_loading", "host_python_overhead", "host_optimizer", "host_compile",
               "host_op", "host_off_cpu")

#: causes a finding may name besides the waterfall's (not shares of the timeline)
OTHER_CAUSES = ("fragmentation", "kernel", "comm", "throttle", *HOST_CAUSES)

COLUMNS = ("cause", "lost_ns", "share", "where", "count", "evidence", "advice", "saving_ns",
           "saving_share", "saving_step_share", "fix", "kind", "subject")

#: the one action we recommend per finding kind; analyzers refer to these by key so the
#: wording lives in one place and tests can check a finding carries the right advice
ADVICE: Mapping[str, str] = {
    "sync_item": "move `.item()` / `.cpu()` / `.tolist()` out of the step loop (log every N "
                 "steps, or keep the value on the GPU)",
    "sync_device": "remove the explicit synchronize from the step loop; time with CUDA events "
                   "and synchronize only where the host needs a result",
    "sync_event": "wait on the event from the GPU side (stream.wait_event) instead of "
                  "blocking the host",
    "sync_copy": "make the device-to-host copy non_blocking=True into pinned memory and read "
                 "it a step later",
    "launch_bound": "fewer, larger launches: CUDA graphs or torch.compile(mode='reduce-overhead') "
                    "(jax.jit the step in JAX, tf.function(jit_compile=True) in TensorFlow)",
    "host_bound": "overlap host work with the GPU: move this work out of the step loop or to "
                  "a background thread, and keep launches queued ahead of the GPU",
    "dependency": "find what the queued work waits on (cudaStreamWaitEvent on an event recorded "
                  "late, another stream, a collective of another rank) and record or launch "
                  "the producing work earlier",
    "host_data": "load data in the background: DataLoader(num_workers>0, pin_memory=True, "
                 "persistent_workers=True, prefetch_factor>=2)",
    "host_python": "the host runs Python between launches slower than the GPU runs them: capture "
                   "the step with CUDA graphs or torch.compile (mode='reduce-overhead'), or "
                   "batch the small ops",
    "copy_pageable": "pinned memory and non_blocking=True (DataLoader(pin_memory=True) or "
                     "tensor.pin_memory())",
    "copy_sync": "use cudaMemcpyAsync / non_blocking=True on a side stream so copies overlap "
                 "compute",
    "copy_small": "batch small copies into one larger transfer",
    "comm_wait": "balance work across ranks (the late rank arrives last every step); check "
                 "data loading and stragglers on that rank",
    "comm_exposed": "overlap communication with compute (DDP bucket_cap_mb, FSDP prefetch, "
                    "async collectives) or gradient accumulation to communicate less often",
    "comm_slow": "check the transport of these calls (NCCL_DEBUG=INFO: ring/tree, NVLink vs "
                 "PCIe or sockets) and whether other traffic shares the links at that time",
    "small_grid": "give the kernel more blocks than the GPU has SMs x blocks/SM: larger batch, "
                  "split-K / more tiles, or fuse small launches (torch.compile)",
    "tail": "choose a grid that is a whole number of waves (or many waves), so the last wave "
            "is not mostly idle",
    "fragmentation": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "occupancy": "raise occupancy: fewer registers per thread (__launch_bounds__), less shared "
                 "memory per block, or a block size that fits more blocks per SM",
    "throttle_thermal": "check cooling: GPU temperature, fans, airflow and the chassis inlet "
                        "temperature (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE` shows the active "
                        "clocks-event reasons and the slowdown temperatures)",
    "throttle_power": "check the power limit and supply: `nvidia-smi -q -d PERFORMANCE,POWER` "
                      "shows the active clocks-event reasons and the enforced limit; restore a "
                      "lowered limit (`nvidia-smi -pl`) or expect lower clocks on power-heavy "
                      "kernels",
}


#: the kind of each finding by its advice: an analyzer that gives `ADVICE[key]` made a
#: finding of kind `key` (a name scripts and the expected savings read, whatever the wording)
KIND_OF_ADVICE: Mapping[str, str] = {text: key for key, text in ADVICE.items()}

_UNITS = (("s", 1e9), ("ms", 1e6), ("µs", 1e3))


@dataclass(frozen=True)
class Result:
    """What one analyzer returns from its one call, `analyze(trace)`: its findings (in
    `frame()`'s shape) and its detail tables by name. `diagnose` calls each analyzer once
    and keeps both, so a table a finding was derived from is the same object the reports
    read, never a second computation.

        result = gpudiag.analyzers.sync.analyze(trace)
        result.findings.head(); result.tables["sync_points"]
    """

    findings: pd.DataFrame
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)


def _same(piece: Any, *_args: Any) -> Any:
    """A hook that leaves a part as it is (what an analyzer without it needs)."""
    return piece


@dataclass(frozen=True)
class Contract:
    """What an analyzer offers `diagnose` and a job, as its module's `CONTRACT`: the one
    call (`analyze`), and for a job read rank by rank its `part` of a batch of ranks and
    the `combine` of all parts (None: the analyzer has none yet, and a job sends it the
    batch's trace instead). The renumbering hooks make a part's labels the merged job's;
    each leaves the part as it is unless the analyzer's part holds such labels:
    `compact(part)` (what travels when the job keeps no row-level results),
    `shift_rows(part, rows)` (row labels of the batch's tables, `rows(table, labels)`),
    `shift_kernels(part, offset)` (kernel ids), `renumber_gaps(part, labels, gaps)` (gap
    labels)."""

    analyze: Callable[..., Result]
    part: Callable[..., Any] | None = None
    combine: Callable[[list[Any]], Result] | None = None
    compact: Callable[[Any], Any] = _same
    shift_rows: Callable[[Any, Callable[[str, Any], Any]], Any] = _same
    shift_kernels: Callable[[Any, int], Any] = _same
    renumber_gaps: Callable[[Any, Any, pd.DataFrame], Any] = _same


def format_ns(ns: float | None) -> str:
    """A duration in nanoseconds in the unit that fits its size, 3 significant digits.

        format_ns(4_640)          # '4.64 µs'
        format_ns(415_856_500)    # '416 ms'
        format_ns(999_700)        # '1 ms' (rounding never gives '1e+03 µs')

    None and NaN (a duration nobody could measure) are 'n/a'.
    """
    if ns is None or math.isnan(ns):
        return "n/a"
    for unit, scale in _UNITS:
        value = float(f"{ns / scale:.3g}")  # rounded first: 999.7 µs is 1 ms, not 1e+03 µs
        if abs(value) >= 1:
            return f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:g} {unit}"
    return f"{ns:.0f} ns"


def frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame | None = None) -> pd.DataFrame:
    """Findings as a DataFrame with exactly COLUMNS, typed; missing columns filled."""
    out = pd.DataFrame(list(rows) if rows is not None and not isinstance(rows, pd.DataFrame)
                       else rows)
    for col in COLUMNS:
        if col not in out:
            out[col] = pd.NA
    out = out.loc[:, list(COLUMNS)]
    out["cause"] = out["cause"].astype("string")
    out["lost_ns"] = pd.to_numeric(out["lost_ns"], errors="coerce").fillna(0).astype("int64")
    out["share"] = pd.to_numeric(out["share"], errors="coerce").astype("float64")
    out["count"] = pd.to_numeric(out["count"], errors="coerce").fillna(0).astype("int64")
    for col in ("where", "evidence", "advice", "fix", "kind", "subject"):
        out[col] = out[col].astype("string")
    out["kind"] = out["kind"].fillna(out["advice"].map(KIND_OF_ADVICE).astype("string"))
    out["saving_ns"] = pd.to_numeric(out["saving_ns"], errors="coerce").astype("Int64")
    for col in ("saving_share", "saving_step_share"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    return out.reset_index(drop=True)


def combine(parts: Iterable[pd.DataFrame], window_ns: int) -> pd.DataFrame:
    """All findings ranked by lost time, `share` = lost_ns / window_ns (NaN without one)."""
    frames = [frame(p) for p in parts if p is not None and len(p)]
    out = pd.concat(frames, ignore_index=True) if frames else frame()
    out["share"] = out["lost_ns"] / window_ns if window_ns > 0 else float("nan")
    return out.sort_values(["lost_ns", "count"], ascending=False, kind="stable",
                           ignore_index=True)
