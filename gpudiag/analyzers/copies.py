"""Memory copies and memsets: how fast they ran, which ones the GPU waited on, and why.

Three questions, one function each:

- `copy_stats`: per (rank, device, kind, host memory) how many copies, how many bytes, how
  long, and the achieved bandwidth. Only device-to-device copies are compared with a peak:
  the devices table's `mem_bandwidth_bytes_per_s` is the DRAM peak, and a host<->device
  copy is limited by the host link (PCIe or NVLink-C2C, whose peak no profile records),
  so a share of the DRAM peak would read one to two orders of magnitude too low and
  mislead. Host copies get achieved bandwidth only.
- `problem_copies`: one row per copy with the flags of Nsight Systems' expert rules
  (`cuda_memcpy_async`, `cuda_memcpy_sync`, `cuda_memset_sync`, REFERENCE.md B2), a `small`
  flag, and the copy's exposed time (no kernel running on its device).
- `findings`: problem copies grouped by problem and call site, with the GPU time they cost.

Flags are three-valued (pandas `boolean`): NA means the trace cannot tell (the issuing API
call is unknown: no `api` table, or no correlation), never a guessed False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag import intervals
from gpudiag.analyzers import callsites
from gpudiag.analyzers import findings as found
from gpudiag.analyzers.findings import Contract, Result
from gpudiag.analyzers.keys import codes as key_codes
from gpudiag.trace import Trace

#: below this a copy is latency-bound: a copy's fixed cost (API call plus DMA setup, a few
#: µs) exceeds its transfer time (64 KiB over PCIe 4.0 x16 at ~25 GB/s is ~2.6 µs). It is
#: also the size the CUDA programming guide lists as asynchronous for H2D cudaMemcpy.
SMALL_BYTES = 64 * 1024
#: `cuda_memcpy_sync` exempts H2D copies of this many bytes or fewer (the driver returns
#: before they are done: CUDA guide, "Asynchronous Concurrent Execution")
SYNC_H2D_EXEMPT_BYTES = 64 * 1024

_MEMCPY_API = r"(?i)^(?:cuda|cu|hip)memcpy"  # runtime, driver and HIP copy calls
_MEMSET_API = r"(?i)^(?:cuda|cu|hip)memset"
_ASYNC = r"(?i)async"  # SQL LIKE, which the nsys rules use, ignores case too

STATS_COLUMNS = {
    "rank": "Int64", "device": "Int64", "kind": "string", "host_mem": "string",
    "count": "int64", "bytes": "Int64", "dur_ns": "int64", "bytes_per_s": "float64",
    "median_bytes_per_s": "float64", "peak_ref": "string", "peak_bytes_per_s": "float64",
    "peak_share": "float64",
}
PROBLEM_COLUMNS = {
    "rank": "Int64", "pid": "Int64", "tid": "Int64", "device": "Int64", "stream": "Int64",
    "start_ns": "int64", "end_ns": "int64", "dur_ns": "int64", "kind": "string",
    "bytes": "Int64", "src_mem": "string", "dst_mem": "string", "host_mem": "string",
    "correlation": "Int64", "api_name": "string", "api_start_ns": "Int64",
    "api_end_ns": "Int64", "where": "string", "pageable": "boolean", "synchronous": "boolean",
    "small": "boolean", "exposed_ns": "int64", "exposed_share_ns": "int64",
    "blocked_ns": "Int64", "idle_blocked_ns": "Int64",
}


# -- statistics ---------------------------------------------------------------------------


#: the keys of a `copy_stats` row
STATS_KEYS = ["rank", "device", "kind", "host_mem"]


def copy_stats(trace: Trace) -> pd.DataFrame:
    """Per (rank, device, kind, host_mem): count, bytes, dur_ns and achieved bandwidth.

        stats = copy_stats(trace)
        stats[["device", "kind", "host_mem", "count", "bytes_per_s"]]
        stats.loc[stats.kind == "DtoD", "peak_share"]        # of the DRAM peak

    `bytes_per_s` is summed bytes / summed duration (what the transfers achieved as a
    whole); `median_bytes_per_s` is the median per-copy rate, which small copies drag down
    (their fixed cost dominates). Both use only copies with known bytes and a non-zero
    duration. `peak_share` is filled for DtoD copies on devices whose DRAM peak is known:
    a DtoD copy reads and writes every byte, so its DRAM traffic is 2 x bytes and
    `peak_share = 2 * bytes_per_s / peak_bytes_per_s` (as CUDA's bandwidthTest counts it).
    Host<->device copies go over the host link, whose peak no profile records: they get
    achieved bandwidth only (`peak_ref` NA).
    """
    copies = trace.copies
    dur = (copies["end_ns"] - copies["start_ns"]).to_numpy(np.int64)
    rated = (copies["bytes"].notna() & (dur > 0)).to_numpy()
    nbytes = copies["bytes"].fillna(0).to_numpy(np.int64)
    rows = pd.DataFrame({
        "rank": copies["rank"], "device": copies["device"],
        "kind": copies["kind"].astype("string"),
        "host_mem": copies["host_mem"].astype("string"), "bytes": copies["bytes"], "dur_ns": dur,
        "rated_bytes": np.where(rated, nbytes, 0), "rated_ns": np.where(rated, dur, 0),
        "rate": np.where(rated, nbytes / np.maximum(dur, 1) * 1e9, np.nan),
    })
    grouped = rows.groupby(STATS_KEYS, dropna=False, sort=True)
    out = grouped.agg(count=("dur_ns", "size"),
                      bytes=("bytes", lambda values: values.sum(min_count=1)),
                      dur_ns=("dur_ns", "sum"), rated_bytes=("rated_bytes", "sum"),
                      rated_ns=("rated_ns", "sum"), median_bytes_per_s=("rate", "median"))
    out = out.reset_index()
    out["bytes_per_s"] = out["rated_bytes"] / out["rated_ns"].where(out["rated_ns"] > 0)
    out["bytes_per_s"] *= 1e9
    return _with_peak(out, trace.devices)


def _with_peak(stats: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
    """Add the DRAM peak and the share of it for DtoD rows (see `copy_stats`). The merge
    matches a rank NA with a rank NA (one unranked process)."""
    peaks = devices[["rank", "device", "mem_bandwidth_bytes_per_s"]].astype(
        {"rank": "Int64", "device": "Int64"})
    peaks = peaks.drop_duplicates(["rank", "device"])
    keyed = stats.astype({"rank": "Int64", "device": "Int64"})
    merged = keyed.merge(peaks, on=["rank", "device"], how="left")
    dtod = (merged["kind"] == "DtoD").fillna(False).to_numpy(bool)
    peak = merged["mem_bandwidth_bytes_per_s"].to_numpy(np.float64)
    has_peak = dtod & np.isfinite(peak) & (peak > 0)
    merged["peak_ref"] = pd.Series("dram", index=merged.index, dtype="string").where(has_peak)
    merged["peak_bytes_per_s"] = np.where(has_peak, peak, np.nan)
    merged["peak_share"] = 2 * merged["bytes_per_s"] / merged["peak_bytes_per_s"]
    return _typed(merged, STATS_COLUMNS)


# -- per-copy flags and exposure ------------------------------------------------------------


def problem_copies(trace: Trace, *, small_bytes: int = SMALL_BYTES,
                   sync_h2d_exempt_bytes: int = SYNC_H2D_EXEMPT_BYTES) -> pd.DataFrame:
    """One row per copy (index = `trace.copies` row) with its API call, call site and flags.

        rows = problem_copies(trace)
        rows[rows.pageable.fillna(False)].groupby("where")["exposed_ns"].sum()
        rows[["kind", "bytes", "api_name", "synchronous", "exposed_ns"]]

    Flags (NA where the issuing API call is unknown and the flag depends on it):
    - `pageable`: nsys `cuda_memcpy_async` — a memcpy whose source or destination is
      pageable host memory, issued by an async memcpy API (`cudaMemcpy*Async*`; driver
      `cuMemcpy*Async` and HIP too). The memory kinds come from CUPTI (nsys srcKind /
      dstKind) or from the Kineto event name (`Memcpy HtoD (Pageable -> Device)`), so both
      sources answer the same question; only the API name may be missing.
    - `synchronous`: nsys `cuda_memcpy_sync` — a memcpy issued by a non-Async memcpy API,
      except DtoD copies (same device: CUPTI reports copies between two devices as PtoP)
      and HtoD copies of <= `sync_h2d_exempt_bytes` (64 KiB = 65536 bytes); and
      nsys `cuda_memset_sync` — a memset issued by a non-async memset API on pinned or
      managed memory (the nsys SQL takes memKind 4 only; static managed memory, kind 6,
      is managed too and counts here).
    - `small`: a memcpy (not a memset) of fewer than `small_bytes` (default 64 KiB: below
      it the per-copy fixed cost exceeds the transfer time; see SMALL_BYTES).

    Times, ns:
    - `exposed_ns`: the part of the copy during which no kernel ran on its device (rank,
      device) — what the copy cost the GPU timeline;
    - `exposed_share_ns`: the same, split equally among copies exposed at the same moment,
      so a device's sum equals the waterfall's `copy` busy time (concurrent copies on two
      copy engines lose the time once, not twice);
    - `blocked_ns`: the part of the API call outside its copy (host time blocked beyond the
      copy's GPU time: implicit stream sync, pageable staging); NA without the call;
    - `idle_blocked_ns`: the part of that call during which the device ran nothing at all
      (no kernel, no copy) — GPU time lost while the host was stuck in the call.
    """
    copies = trace.copies
    calls = callsites.launch_calls(trace, copies)
    flags = _flags(copies, calls["api_name"], small_bytes, sync_h2d_exempt_bytes)
    start, end = copies["start_ns"].to_numpy(np.int64), copies["end_ns"].to_numpy(np.int64)
    exposed, share = _exposure(trace, copies)
    blocked, idle = _blocked(trace, copies, calls)
    out = pd.DataFrame({
        "rank": copies["rank"], "pid": copies["pid"], "tid": calls["tid"],
        "device": copies["device"], "stream": copies["stream"], "start_ns": start,
        "end_ns": end, "dur_ns": end - start, "kind": copies["kind"], "bytes": copies["bytes"],
        "src_mem": copies["src_mem"], "dst_mem": copies["dst_mem"],
        "host_mem": copies["host_mem"], "correlation": copies["correlation"],
        "api_name": calls["api_name"], "api_start_ns": calls["api_start_ns"],
        "api_end_ns": calls["api_end_ns"], "where": _where(trace, copies, calls), **flags,
        "exposed_ns": exposed, "exposed_share_ns": share, "blocked_ns": blocked,
        "idle_blocked_ns": idle,
    }, index=copies.index)
    return _typed(out, PROBLEM_COLUMNS)


def _flags(copies: pd.DataFrame, api_name: pd.Series, small_bytes: int,
           exempt_bytes: int) -> dict[str, pd.Series]:
    """The three flags with Kleene logic: an unknown API name makes a flag NA only where
    the answer depends on it."""
    kind = copies["kind"].to_numpy(dtype=object)  # plain numpy compares: no NA to propagate
    is_set = kind == "memset"
    is_copy = copies["kind"].notna().to_numpy(bool) & ~is_set
    memcpy_api = _name_matches(api_name, _MEMCPY_API)
    async_api = _name_matches(api_name, _ASYNC)
    src = copies["src_mem"].to_numpy(dtype=object)
    dst = copies["dst_mem"].to_numpy(dtype=object)
    pageable = memcpy_api & async_api & ((src == "pageable") | (dst == "pageable")) & is_copy
    small_h2d = (copies["bytes"] <= exempt_bytes).astype("boolean")  # NA where bytes unknown
    exempt = (small_h2d & (kind == "HtoD")) | (kind == "DtoD")
    sync_copy = memcpy_api & ~async_api & ~exempt & is_copy
    set_mem = (dst == "pinned") | (dst == "managed")
    sync_set = _name_matches(api_name, _MEMSET_API) & ~async_api & set_mem & is_set
    small = (copies["bytes"] < small_bytes).astype("boolean") & is_copy
    return {"pageable": pageable, "synchronous": sync_copy | sync_set, "small": small}


def _name_matches(names: pd.Series, pattern: str) -> pd.Series:
    """Does each name match `pattern` (`boolean`, NA for a missing name); one regex per
    distinct name, not per row."""
    cat = names.astype("category")
    cats = cat.cat.categories
    hit = (np.asarray(cats.astype(str).str.contains(pattern, regex=True), dtype=bool)
           if len(cats) else np.zeros(0, dtype=bool))
    codes = cat.cat.codes.to_numpy()
    values = np.append(hit, False)[codes]
    return pd.Series(pd.arrays.BooleanArray(values, codes < 0), index=names.index)


def _device_codes(*frames: pd.DataFrame) -> list[npt.NDArray[np.int64]]:
    """One code per (rank, device), shared by all frames: rows that share a GPU (NA is a
    rank or device of its own)."""
    keys = pd.concat([frame[["rank", "device"]].astype("Int64") for frame in frames],
                     ignore_index=True)
    codes = key_codes(keys["rank"], keys["device"])
    return np.split(codes, np.cumsum([len(frame) for frame in frames])[:-1])


def _exposure(trace: Trace, copies: pd.DataFrame) -> tuple[npt.NDArray[np.int64],
                                                            npt.NDArray[np.int64]]:
    """`exposed_ns` and `exposed_share_ns` of every copy, one pass per device."""
    copy_start = copies["start_ns"].to_numpy(np.int64)
    copy_end = copies["end_ns"].to_numpy(np.int64)
    kernels = trace.kernels
    kernels = kernels[_touching(kernels["start_ns"].to_numpy(np.int64),
                                kernels["end_ns"].to_numpy(np.int64), copy_start, copy_end)]
    kernel_start = kernels["start_ns"].to_numpy(np.int64)
    kernel_end = kernels["end_ns"].to_numpy(np.int64)
    ccode, kcode = _device_codes(copies, kernels)  # only kernels that overlap some copy matter
    exposed = copy_end - copy_start
    share = np.zeros(len(copies), dtype=np.int64)
    for code in np.unique(ccode):  # a handful of devices, never a loop per copy
        rows, busy = ccode == code, kcode == code
        spans = intervals.union(kernel_start[busy], kernel_end[busy])
        exposed[rows] -= intervals.overlap(copy_start[rows], copy_end[rows], spans)
        share[rows] = _shared(copy_start[rows], copy_end[rows],
                              kernel_start[busy], kernel_end[busy])
    return exposed, share


def _touching(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
              query_starts: npt.NDArray[np.int64],
              query_ends: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which intervals overlap the union of the query intervals: copies are few and
    kernels many, so the per-device sweeps only need the kernels near some copy."""
    spans = intervals.union(query_starts, query_ends)
    return intervals.overlap(starts, ends, spans) > 0


def _shared(copy_start: npt.NDArray[np.int64], copy_end: npt.NDArray[np.int64],
            kernel_start: npt.NDArray[np.int64],
            kernel_end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each copy's share of the copy-only time: elementary segments with no kernel are
    divided equally among the copies running in them, integrated with one cumulative sum."""
    is_copy = np.concatenate([np.ones(len(copy_start)), np.zeros(len(kernel_start))])
    weights = np.column_stack([is_copy, 1.0 - is_copy])  # copies, kernels covering
    seg_start, seg_end, covering = intervals.segments(
        np.concatenate([copy_start, kernel_start]), np.concatenate([copy_end, kernel_end]),
        weights)
    n_copy, n_kernel = covering[:, 0], covering[:, 1]
    copy_only = (n_kernel < 0.5) & (n_copy > 0.5)
    density = np.where(copy_only, 1.0 / np.maximum(n_copy, 1.0), 0.0)
    cum = np.concatenate([[0.0], np.cumsum((seg_end - seg_start) * density)])
    before = cum[np.searchsorted(seg_start, copy_start)]
    after = cum[np.searchsorted(seg_start, copy_end)]
    return np.where(copy_end > copy_start, np.rint(after - before), 0).astype(np.int64)


def _blocked(trace: Trace, copies: pd.DataFrame,
             calls: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """`blocked_ns` and `idle_blocked_ns` (see `problem_copies`), NA without the API call."""
    known = calls["api_start_ns"].notna() & calls["api_end_ns"].notna()
    api_start = calls["api_start_ns"].fillna(0).to_numpy(np.int64)
    api_end = np.maximum(calls["api_end_ns"].fillna(0).to_numpy(np.int64), api_start)
    copy_start = copies["start_ns"].to_numpy(np.int64)
    copy_end = copies["end_ns"].to_numpy(np.int64)
    own = np.maximum(np.minimum(api_end, copy_end) - np.maximum(api_start, copy_start), 0)
    kernels = trace.kernels
    near = _touching(kernels["start_ns"].to_numpy(np.int64),
                     kernels["end_ns"].to_numpy(np.int64), api_start, api_end)
    gpu = pd.concat([kernels.loc[near, ["rank", "device", "start_ns", "end_ns"]],
                     copies[["rank", "device", "start_ns", "end_ns"]]], ignore_index=True)
    ccode, gcode = _device_codes(copies, gpu)
    gpu_start, gpu_end = gpu["start_ns"].to_numpy(np.int64), gpu["end_ns"].to_numpy(np.int64)
    busy = np.zeros(len(copies), dtype=np.int64)
    for code in np.unique(ccode):  # one pass per device
        rows, same = ccode == code, gcode == code
        busy[rows] = intervals.overlap(api_start[rows], api_end[rows],
                                       intervals.union(gpu_start[same], gpu_end[same]))
    held = api_end - api_start
    blocked = pd.Series(held - own, index=copies.index, dtype="Int64").where(known)
    idle = pd.Series(held - busy, index=copies.index, dtype="Int64").where(known)
    return blocked, idle


def _where(trace: Trace, copies: pd.DataFrame, calls: pd.DataFrame) -> pd.Series:
    """The user's call site at the API call's start (callsites.where_at), NA without one."""
    out = pd.Series(pd.NA, index=copies.index, dtype="string")
    known = (calls["api_start_ns"].notna() & calls["tid"].notna() & copies["pid"].notna())
    if known.any():
        sites = callsites.where_at(trace, copies["pid"][known], calls["tid"][known],
                                   calls["api_start_ns"][known].to_numpy(np.int64),
                                   copies["rank"][known])
        out[known] = pd.array(sites, dtype="string")
    return out


# -- findings ---------------------------------------------------------------------------------

#: a copy with several problems is reported once, under the first of these that applies:
#: blocking the host is the worst, then pageable staging, then size
PROBLEMS = (("synchronous", "copy_sync"), ("pageable", "copy_pageable"), ("small", "copy_small"))


def analyze(trace: Trace) -> Result:
    """The copies analyzer's one result: its findings and `copy_stats`.

        result = copies.analyze(trace)
        result.findings[["where", "lost_ns", "evidence"]]
        result.tables["copy_stats"]
    """
    return combine([part(trace)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's copies analysis: its `copy_stats` rows (keyed by rank)
    and its flagged copies (the only ones a finding counts)."""

    stats: pd.DataFrame
    flagged: pd.DataFrame


def part(trace: Trace) -> Part:
    """This rank's copy statistics and problem copies (see `Part`)."""
    rows = problem_copies(trace)
    flagged = np.logical_or.reduce([rows[flag].fillna(False).to_numpy(bool)
                                    for flag, _ in PROBLEMS]) if len(rows) else []
    return Part(copy_stats(trace), rows[flagged] if len(rows) else rows)


def combine(parts: list[Part]) -> Result:
    """The job's result: the statistics in key order, the flagged copies in file order."""
    if len(parts) == 1:
        stats, rows = parts[0].stats, parts[0].flagged
    else:
        stats = pd.concat([piece.stats for piece in parts], ignore_index=True).sort_values(
            STATS_KEYS, kind="stable", na_position="last", ignore_index=True)
        rows = pd.concat([piece.flagged for piece in parts])
    return Result(_copy_findings(rows, count_host_blocked=False), {"copy_stats": stats})


def findings(trace: Trace, *, small_bytes: int = SMALL_BYTES,
             sync_h2d_exempt_bytes: int = SYNC_H2D_EXEMPT_BYTES,
             count_host_blocked: bool = False) -> pd.DataFrame:
    """Problem copies grouped by problem x call site, as findings of cause `copy`.

        f = findings(trace)
        f[["where", "lost_ns", "count", "evidence"]]
        f.advice.iloc[0]

    `where` is the user's call site at the API call (else `api_name (kind)`, else the
    kind). `lost_ns` is the copies' `exposed_share_ns` (their exposed time, counted once
    where copies run concurrently), plus for synchronous copies, when `count_host_blocked`,
    their `idle_blocked_ns`: the time the GPU sat idle while the host was held in the call
    beyond the copy itself. Off by default: the gaps analyzer attributes that idle time to
    `sync_stall` (a synchronous memcpy is a blocking wait) and `diagnose` reports the sync
    findings beside these, so counting it here too would count it twice. NA flags count as
    not flagged (no claim without evidence), and groups that cost no GPU time are left out.
    """
    rows = problem_copies(trace, small_bytes=small_bytes,
                          sync_h2d_exempt_bytes=sync_h2d_exempt_bytes)
    return _copy_findings(rows, count_host_blocked=count_host_blocked)


def _copy_findings(rows: pd.DataFrame, *, count_host_blocked: bool) -> pd.DataFrame:
    """The findings of problem copies (`problem_copies` rows)."""
    groups = _grouped(rows, count_host_blocked)
    return found.frame(pd.DataFrame({
        "cause": "copy", "lost_ns": groups["lost_ns"], "where": groups["site"],
        "count": groups["count"], "evidence": [_evidence(group) for group in groups.itertuples()],
        "advice": groups["problem"].map(found.ADVICE), "kind": groups["problem"],
    }, index=groups.index)).sort_values("lost_ns", ascending=False, kind="stable",
                                        ignore_index=True)


def _grouped(rows: pd.DataFrame, count_host_blocked: bool) -> pd.DataFrame:
    """Flagged copies summed per (problem, site); groups that lost nothing dropped."""
    problem, site = problem_sites(rows)
    idle = np.where(problem == "copy_sync", rows["idle_blocked_ns"].fillna(0).to_numpy(np.int64), 0)
    host_mem = rows["host_mem"].astype(object)
    rows = rows.assign(problem=problem, idle=idle,
                       lost=rows["exposed_share_ns"] + (idle if count_host_blocked else 0),
                       site=site,
                       pageable_n=(host_mem == "pageable").astype(int),
                       pinned_n=(host_mem == "pinned").astype(int),
                       nbytes=rows["bytes"].fillna(0).astype("int64"))[problem != ""]
    groups = rows.groupby(["problem", "site"], sort=False).agg(
        lost_ns=("lost", "sum"), count=("lost", "size"), nbytes=("nbytes", "sum"),
        dur_ns=("dur_ns", "sum"), exposed_ns=("exposed_share_ns", "sum"),
        pageable_n=("pageable_n", "sum"), pinned_n=("pinned_n", "sum"), idle=("idle", "sum"),
        kinds=("kind", lambda kinds: ", ".join(sorted(kinds.dropna().unique()))))  # per group
    return groups[groups["lost_ns"] > 0].reset_index()


def problem_sites(rows: pd.DataFrame) -> tuple[npt.NDArray[np.str_], pd.Series]:
    """Per `problem_copies` row, its problem (the ADVICE key of its first flag in
    `PROBLEMS`, "" for none) and the site its finding is named after: a finding is the
    copies of one (problem, site)."""
    flagged = [rows[flag].fillna(False).to_numpy(bool) for flag, _ in PROBLEMS]
    problem = np.select(flagged, [key for _, key in PROBLEMS], "")
    fallback = rows["api_name"] + " (" + rows["kind"] + ")"
    return problem, rows["where"].fillna(fallback).fillna(rows["kind"] + " copy")


def _evidence(group: Any) -> str:
    """One finding's numbers in words (one call per finding, not per copy)."""
    noun = "copy" if group.count == 1 else "copies"
    text = f"{group.count} {group.kinds} {noun}, {_size(group.nbytes)}"
    if group.dur_ns:
        text += f" at {_rate(group.nbytes / group.dur_ns * 1e9)}"
    memory = [f"{count} {name}" for count, name in ((group.pageable_n, "pageable"),
                                                    (group.pinned_n, "pinned")) if count]
    if memory:
        text += "; host memory: " + ", ".join(memory)
    text += f"; {found.format_ns(group.exposed_ns)} with no kernel running"
    if group.problem == "copy_sync" and group.idle:
        text += f"; GPU idle {found.format_ns(group.idle)} while the host was held in the call"
    return text


def _rate(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"


def _typed(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Exactly `columns`, in order, at their dtypes (also for zero rows)."""
    return frame.loc[:, list(columns)].astype(columns)


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine)
