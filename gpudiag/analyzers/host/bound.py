"""Findings for idle time the host caused without a sync: launch-bound and host-bound gaps.

The gaps come attributed from `gaps.idle_gaps`; this module says *where*: for a
launch_bound piece, the call site that issued the next launch (the op the host was slowly
launching); for a host_bound piece, the innermost user frame the launching thread was in at
the middle of the piece (what the host was busy with while the GPU waited: a DataLoader
`__next__`, a logging call, a Python loop).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import callsites, keys
from gpudiag.analyzers.findings import ADVICE, Contract, Result, format_ns, frame
from gpudiag.analyzers.losses.gaps import idle_gaps
from gpudiag.names import job_short_names, short_names
from gpudiag.trace import Trace


def host_gaps(trace: Trace, gaps: pd.DataFrame | None = None, **gap_options: Any
              ) -> pd.DataFrame:
    """launch_bound and host_bound gap pieces with `where` (call site, else the next
    kernel's short name).

        pieces = host_gaps(trace)
        pieces.groupby(["cause", "where"]).size()
    """
    gaps = idle_gaps(trace, **gap_options) if gaps is None else gaps
    pieces = gaps[gaps["cause"].isin(["launch_bound", "host_bound"])].copy()
    if pieces.empty:
        return pieces.assign(where=pd.Series(dtype="string"))
    # a host wait: what the host ran mid-piece; otherwise: the op that launched the work
    host_wait = (pieces["rule"] == "host_wait").to_numpy(bool)
    launch = pieces["launch_ns"].to_numpy(np.int64, na_value=-1)
    at = np.where(host_wait, (pieces["start_ns"] + pieces["end_ns"]) // 2,
                  np.where(launch >= 0, launch, pieces["start_ns"])).astype(np.int64)
    where = callsites.where_at(trace, pieces["pid"], pieces["tid"], at, pieces["rank"])
    pieces["where"] = pd.array(np.where(pd.isna(where), _next_names(trace, pieces), where),
                               dtype="string")
    pieces["site_known"] = ~pd.isna(where)
    pieces["next_short"] = _next_short(trace, pieces)
    return pieces


def _next_short(trace: Trace, pieces: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Whether the kernel after each piece ran shorter than its launch call (HTA's short
    GPU kernel: the call took at most 50 µs and longer than the kernel): such kernels
    cannot keep the GPU busy however fast the host loop is."""
    out = np.zeros(len(pieces), dtype=bool)
    mine = (pieces["next_table"] == "kernels").to_numpy(bool)
    if not mine.any():
        return out
    rows = pieces["next_row"].to_numpy()[mine].astype(np.int64)
    k = trace.kernels
    calls = callsites.launch_calls(trace, k.loc[rows])
    api = (calls["api_end_ns"] - calls["api_start_ns"]).to_numpy("float64", na_value=np.nan)
    gpu = (k["end_ns"].loc[rows] - k["start_ns"].loc[rows]).to_numpy(np.float64)
    out[mine] = (api <= SHORT_KERNEL_API_NS) & (gpu < api)
    return out


#: HTA's runtime cutoff for "short GPU kernels" (cuda_kernel_analysis.py)
SHORT_KERNEL_API_NS = 50_000


def _next_names(trace: Trace, pieces: pd.DataFrame) -> np.ndarray:
    """The short name of the GPU event after each piece ('(end of window)' if none)."""
    out = np.full(len(pieces), "(unknown launch)", dtype=object)
    for table in ("kernels", "copies"):
        mine = (pieces["next_table"] == table).to_numpy()
        if not mine.any():
            continue
        rows = getattr(trace, table).loc[pieces["next_row"].to_numpy()[mine].astype(np.int64)]
        label = (short_names(rows["name"]) if table == "kernels"
                 else "copy " + rows["kind"].astype(str))
        out[mine] = np.asarray(label, dtype=object)
    return out


def analyze(trace: Trace, gaps: pd.DataFrame | None = None, **gap_options: Any) -> Result:
    """The host-gaps analyzer's one result: launch_bound and host_bound findings, and the
    pieces they come from with their call sites (table `host_gaps`, what the Perfetto
    export labels its idle slices with).

        result = bound.analyze(trace)
        result.findings[["cause", "where", "lost_ns"]]
        bound.analyze(trace, dx.gaps)           # the waterfall's pieces, not found again

    `gaps`: the idle gaps already found (cut to the window), else
    `idle_gaps(trace, **gap_options)`; `host_gaps` keeps their index.
    """
    return combine([part(trace, gaps, **gap_options)])


@dataclass(frozen=True)
class Part:
    """One rank's share of a job's host-gaps analysis: its pieces (indexed like its gaps),
    the full name of the kernel after each piece that has no call site (its `where` is
    that kernel's short name, and short names are made unique over the whole job's kernel
    names), and the rank's kernel names."""

    pieces: pd.DataFrame | None  # None in a compact part (`compact`)
    next_names: npt.NDArray[np.object_]
    kernel_names: tuple[str, ...]
    sums: Sums | None = None  # a compact part's pieces, summed with their next kernel


def compact(piece: Part) -> Part:
    """The part without its pieces: summed per finding key and next kernel name, with each
    gap's size (what the findings need), for a job that keeps no gap rows."""
    assert piece.pieces is not None
    named = piece.pieces.assign(next_name=pd.array(piece.next_names, dtype="string"))
    return Part(None, np.empty(0, dtype=object), piece.kernel_names,
                _aggregate(named, [*BY, "next_name"]))


def part(trace: Trace, gaps: pd.DataFrame | None = None, **gap_options: Any) -> Part:
    """This rank's pieces with their call sites (see `Part`)."""
    pieces = host_gaps(trace, gaps, **gap_options)
    names = np.full(len(pieces), None, dtype=object)
    if len(pieces):
        named = (~pieces["site_known"] & (pieces["next_table"] == "kernels")).to_numpy(bool)
        rows = pieces["next_row"].to_numpy()[named].astype(np.int64)
        names[named] = keys.texts(trace.kernels["name"].loc[rows])
    categories = trace.kernels["name"].astype("category").cat.categories
    return Part(pieces, names, tuple(str(name) for name in categories))


def renumber_gaps(piece: Part, labels: npt.NDArray[np.int64], gaps: pd.DataFrame) -> Part:
    """The part numbered as the job's gaps (`labels[i]`: the job's label of this part's
    gap `i`), naming the next event by its merged row as the part's `gaps` do."""
    if piece.pieces is None:
        return piece
    pieces = piece.pieces.assign(next_row=gaps["next_row"].reindex(piece.pieces.index))
    return Part(pieces.set_axis(labels[pieces.index.to_numpy()]), piece.next_names,
                piece.kernel_names)


def combine(parts: list[Part]) -> Result:
    """The job's result: every rank's pieces in gap order, the kernel short names of the
    pieces without a call site made unique over the job's names (as a merged trace's
    `short_names` does), then the findings. Compact parts (`compact`) give the findings
    alone: the job keeps no `host_gaps` rows."""
    if any(piece.pieces is None for piece in parts):
        return Result(_findings_of(_compact_sums(parts)), {})
    if len(parts) == 1:
        pieces = parts[0].pieces
    else:
        pieces = pd.concat([piece.pieces for piece in parts]).sort_index(kind="stable")
        names = pd.Series(np.concatenate([piece.next_names for piece in parts]),
                          index=pd.concat([piece.pieces for piece in parts]).index
                          ).reindex(pieces.index)
        pieces = _named(pieces, names.to_numpy(dtype=object),
                        job_short_names([piece.kernel_names for piece in parts]))
    assert pieces is not None
    return Result(findings(Trace(), pieces=pieces), {"host_gaps": pieces})


def named_pieces(piece: Part, shorts: Mapping[str, str]) -> pd.DataFrame:
    """The part's pieces, those without a call site named by `shorts` (the job's short
    names of its kernels' full names, `names.job_short_names`): a batch's pieces as the
    job's `host_gaps` table names them."""
    assert piece.pieces is not None
    return _named(piece.pieces, piece.next_names, shorts)


def _named(pieces: pd.DataFrame, next_names: npt.NDArray[np.object_],
           shorts: Mapping[str, str]) -> pd.DataFrame:
    """`pieces` whose next kernel's full name is known (`next_names`, None elsewhere),
    their `where` that name's short form in `shorts`."""
    named = pd.notna(next_names)
    if not named.any():
        return pieces
    where = pieces["where"].astype(object).to_numpy().copy()
    where[named] = [shorts[name] for name in next_names[named]]
    return pieces.assign(where=pd.array(where, dtype="string"))


def _compact_sums(parts: list[Part]) -> Sums:
    """The compact parts' sums, their named keys renamed with the job's short names."""
    shorts = job_short_names([piece.kernel_names for piece in parts])

    def renamed(frame_: pd.DataFrame) -> pd.DataFrame:
        known = frame_["next_name"].notna().to_numpy(bool)
        where = frame_["where"].astype(object).to_numpy().copy()
        where[known] = frame_["next_name"][known].astype(str).map(shorts).to_numpy(object)
        return frame_.assign(where=where).drop(columns="next_name")
    sums = [piece.sums for piece in parts if piece.sums is not None]
    offsets = np.cumsum([0] + [len(s.groups) for s in sums])
    return Sums(pd.concat([renamed(s.groups) for s in sums], ignore_index=True),
                pd.concat([s.gaps.assign(group=s.gaps["group"] + offset)
                           for s, offset in zip(sums, offsets, strict=False)],
                          ignore_index=True))


def findings(trace: Trace, gaps: pd.DataFrame | None = None, *, top: int = 20,
             python_gap_ns: int = 1_000_000, pieces: pd.DataFrame | None = None,
             **gap_options: Any) -> pd.DataFrame:
    """launch_bound and host_bound findings, one per (cause, where), the `top` largest of
    each cause.

        findings(trace).head()

    Host-bound advice depends on what the host was doing: data loading when the frame says
    so (DATA_FRAMES), Python between launches when the median gap is below `python_gap_ns`
    (1 ms: eager per-op overhead), else host work in the step in general. `pieces`: a
    `host_gaps` result to reuse (read, never changed).
    """
    pieces = host_gaps(trace, gaps, **gap_options) if pieces is None else pieces
    return _findings_of(_aggregate(pieces), top=top, python_gap_ns=python_gap_ns)


#: a finding's keys: its cause, whether the work was already queued, its call site
BY = ["cause", "queued", "where"]


@dataclass(frozen=True)
class Sums:
    """Pieces summed per finding key (`BY`, and `next_name` in a rank's compact part) and
    the whole gaps under each key (`group`: its row of `groups`; rank, device, start and
    size: a gap split in pieces counts once, and the median gap needs every size)."""

    groups: pd.DataFrame
    gaps: pd.DataFrame


def _aggregate(pieces: pd.DataFrame, by: list[str] = BY) -> Sums:
    if pieces.empty:
        return Sums(pd.DataFrame(columns=[*by, "lost", "site_known", "short", "no_launch"]),
                    pd.DataFrame(columns=["group", "rank", "device", "gap_start_ns", "size"]))
    pieces = pieces.assign(length=pieces["end_ns"] - pieces["start_ns"],
                           queued=pieces["rule"] == "queued",
                           no_launch=pieces["rule"] == "no_launch")
    grouped = pieces.groupby(by, observed=True, dropna=False)
    groups = grouped.agg(
        lost=("length", "sum"), site_known=("site_known", "any"), short=("next_short", "sum"),
        no_launch=("no_launch", "all")).reset_index()
    whole = pieces.assign(group=grouped.ngroup()).drop_duplicates(
        ["rank", "device", "gap_start_ns", "group"])
    whole = whole.assign(size=whole["gap_end_ns"] - whole["gap_start_ns"])
    return Sums(groups, whole[["group", "rank", "device", "gap_start_ns", "size"]]
                .reset_index(drop=True))


def _findings_of(sums: Sums, *, top: int = 20, python_gap_ns: int = 1_000_000) -> pd.DataFrame:
    """The findings of pieces summed per key (`_aggregate`)."""
    if sums.groups.empty:
        return frame()
    grouped = sums.groups.groupby(BY, observed=True).agg(
        lost=("lost", "sum"), site_known=("site_known", "any"), short=("short", "sum"),
        no_launch=("no_launch", "all")).reset_index()
    keyed = sums.groups[BY].iloc[sums.gaps["group"].to_numpy(np.int64)].reset_index(drop=True)
    whole = pd.concat([keyed, sums.gaps.drop(columns="group").reset_index(drop=True)], axis=1)
    whole = whole.drop_duplicates(["rank", "device", "gap_start_ns", *BY])
    per_key = whole.groupby(BY, observed=True)["size"]
    grouped = grouped.join(per_key.size().rename("gaps"), on=BY).join(
        per_key.median().rename("median"), on=BY)
    grouped = grouped.sort_values("lost", ascending=False).groupby("cause").head(top)
    rows = [{
        "cause": g.cause, "lost_ns": g.lost, "where": g.where, "count": g.gaps,
        "evidence": _evidence(g), "advice": ADVICE[_advice_key(g, python_gap_ns)],
        "kind": _advice_key(g, python_gap_ns),
    } for g in grouped.itertuples()]  # one per call site, bounded by `top`
    return frame(rows)


def _evidence(g: Any) -> str:
    gaps = f"{g.gaps} idle gap{'s' if g.gaps != 1 else ''} (median {format_ns(g.median)})"
    tiny = (f"; {g.short} of the kernels after them ran shorter than their launch call"
            if g.short else "")
    if g.no_launch:
        return (f"GPU idle {format_ns(g.lost)} in {gaps} before this work; the trace has no "
                "launch calls, so the gaps are attributed by their length alone")
    if g.queued and g.cause == "host_bound":
        return (f"GPU idle {format_ns(g.lost)} in {gaps} although this work was already "
                "queued: it waited on a dependency (an event, another stream or rank)")
    if g.queued:
        return (f"{gaps} between queued launches, {format_ns(g.lost)} in all: launch and "
                f"dispatch latency of work issued ahead of the GPU{tiny}")
    if g.cause == "launch_bound":
        return (f"{gaps} before launches from here, {format_ns(g.lost)} in all: the host "
                f"issued the next launch after the GPU ran out of work{tiny}")
    ran = "while the host ran this" if g.site_known else "before this kernel was launched"
    return f"GPU idle {format_ns(g.lost)} in {gaps} {ran}, with no CUDA work queued"


#: frames that load data: a host-bound gap spent there wants a faster input pipeline
DATA_FRAMES = re.compile(r"data_?load|dataset|__next__|collate|fetch|prefetch|decode|"
                         r"load_batch|get_batch|next_batch|\bread_", re.IGNORECASE)


def _advice_key(g: Any, python_gap_ns: int) -> str:
    """Which advice fits: a dependency for queued work; data loading by the frame's name;
    Python between launches when the typical gap is short (eager per-op overhead, not one
    long host task)."""
    if g.queued and g.cause == "host_bound":
        return "dependency"
    if g.cause != "host_bound" or g.no_launch:
        return str(g.cause)
    if DATA_FRAMES.search(str(g.where)):
        return "host_data"
    return "host_python" if g.median < python_gap_ns else "host_bound"


#: what `diagnose` and a job call (`findings.Contract`)
CONTRACT = Contract(analyze, part, combine, compact=compact, renumber_gaps=renumber_gaps)
