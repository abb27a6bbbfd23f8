"""Arrival skew: which rank reaches a collective last, and how long the others wait for it.

A collective cannot finish on any rank before every rank has started it, so the NCCL kernel
of an early rank spends `latest start - own start` spinning: time lost to the late rank, not
to the network (a gloo call's work, which gives its row's time, waits the same way).
Comparing starts across ranks needs two things this module states openly:

**Matching.** The same collective on different ranks is found by `(comm, seq)`: `seq` counts
the calls of one communicator within one rank (kineto_collectives), so it lines up across
ranks when every rank's trace holds every call from the same first one. Traces that were
sampled or started at different calls break that (the world128 fixture pair is such a case:
rank 0 records an all_to_all that rank 1's file lacks, and from there on `seq` is off by
one). `match="auto"` therefore trusts `seq` only when the matched calls agree: same op on
every rank and, for ops whose size is the same everywhere (all_reduce, all_gather,
reduce_scatter, broadcast, reduce), the same bytes, in at least `agree_share` of the
multi-rank groups. Otherwise calls are matched by their *end*: a collective ends on all ranks
within a few protocol steps of each other, while consecutive calls of one rank end at least
one call duration apart. Sorted by `(comm, op, end)`, a call joins the previous one's group
when their ends are closer than `end_tolerance` x the shorter of the two durations; groups
holding one rank twice are dropped as ambiguous. `comm` is part of that key only when every
rank records the same communicator names (Process Group names are global; the fallback
'stream N' names are equal only when ranks create their streams in the same order, as in
the world128 pair); otherwise ops and ends alone match.

**Clocks.** Starts of different ranks are compared as they are: this assumes the ranks ran on
one host, or on hosts with synchronized clocks (NTP/PTP, well under a millisecond). Offset
clocks cannot be corrected from kernels alone, but they show: a true skew is at most the
early rank's own kernel duration (it waits inside its kernel). A skew more than
`clock_factor` (default 100) times the longest duration of the matched kernels is flagged
`clock_suspect` and left out of `wait_intervals` and the findings instead of being reported
as waiting.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.trace import Trace

#: ops whose message size is the same on every rank (all_to_all and send/recv may differ)
SAME_SIZE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

SKEW_COLUMNS = {
    "match_id": "int64", "comm": "string", "op": "string", "rank": "Int64", "device": "Int64",
    "kernel_id": "Int64", "seq": "Int64", "bytes": "Int64", "start_ns": "int64",
    "end_ns": "int64", "wait_ns": "int64", "last_rank": "Int64", "skew_ns": "int64",
    "ranks": "int64", "matched_by": "string", "clock_suspect": "bool",
}
WAIT_COLUMNS = {"rank": "Int64", "device": "Int64", "kernel_id": "Int64",
                "start_ns": "int64", "end_ns": "int64"}


def typed(frame: pd.DataFrame | None, columns: dict[str, str]) -> pd.DataFrame:
    """`frame` with exactly `columns` at their dtypes (an empty frame from None)."""
    if frame is None or frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in columns.items()})
    return frame.loc[:, list(columns)].astype(columns).reset_index(drop=True)


def arrival_skew(trace: Trace, *, match: str = "auto", agree_share: float = 0.9,
                 end_tolerance: float = 0.5, clock_factor: float = 100.0) -> pd.DataFrame:
    """One row per rank per collective matched across ranks (see the module docstring).

        skew = arrival_skew(gpudiag.load(["rank0.json.gz", "rank1.json.gz"]))
        per_call = skew.drop_duplicates("match_id")          # one row per collective
        per_call.groupby("last_rank")["skew_ns"].agg(["count", "sum"])

    `wait_ns` = latest start of the group - own start, clipped to [0, own duration]: the part
    of this rank's kernel spent waiting for the last rank. `last_rank` arrived last,
    `skew_ns` = latest - earliest start, `ranks` = ranks present in the group (the skew is
    among the ranks in the trace, not the whole communicator). `matched_by` is 'seq' or
    'end'. A trace with fewer than two ranks has no skew: the frame is empty. Computed once
    per trace and options (the loss model's comm_wait and the collectives analyzer share
    it); do not modify the frame you get back.
    """
    options = (match, agree_share, end_tolerance, clock_factor)
    return trace.derived(f"arrival_skew:{options!r}", lambda: _arrival_skew(trace, *options))


def _arrival_skew(trace: Trace, match: str, agree_share: float, end_tolerance: float,
                  clock_factor: float) -> pd.DataFrame:
    calls = _timed_calls(trace)
    if calls.empty or calls["rank"].nunique() < 2:
        return typed(None, SKEW_COLUMNS)
    how = match if match != "auto" else ("seq" if _seq_agrees(calls, agree_share) else "end")
    ids = _by_seq(calls) if how == "seq" else _by_end(calls, end_tolerance)
    calls = calls.assign(match_id=ids)
    calls = calls[calls["match_id"] >= 0]
    per = calls.groupby("match_id", sort=False)
    calls = calls[(per["rank"].transform("nunique") >= 2).to_numpy()]
    return typed(_measure(calls, how, clock_factor), SKEW_COLUMNS)


def wait_intervals(trace: Trace, *, skew: pd.DataFrame | None = None) -> pd.DataFrame:
    """The waiting part `[start, start + wait_ns)` of each collective (kernel or work), per rank.

        waits = wait_intervals(trace)
        (waits.end_ns - waits.start_ns).groupby(waits["rank"]).sum()   # ns waited per rank
        waits = wait_intervals(trace, skew=arrival_skew(trace, match="seq"))

    Columns `rank, device, kernel_id, start_ns, end_ns`. Matches flagged `clock_suspect` are
    left out: their waits are an artifact of offset clocks. Pass `skew` to reuse (or tune)
    an `arrival_skew` result. The loss model intersects these intervals with the time the
    GPU ran communication only.
    """
    skew = arrival_skew(trace) if skew is None else skew
    rows = skew[(skew["wait_ns"] > 0) & ~skew["clock_suspect"]]
    return typed(rows.assign(end_ns=rows["start_ns"] + rows["wait_ns"]), WAIT_COLUMNS)


def wait_note(trace: Trace) -> str | None:
    """What the notes say of comm_wait for a trace with collectives: why it is not measured
    (fewer than two ranks' calls matched; every match `clock_suspect`), how many matches
    were left out of it (some `clock_suspect`), or None when every match counts.

        note = wait_note(gpudiag.load(["rank0.json.gz", "rank1.json.gz"]))
    """
    skew = arrival_skew(trace)
    if skew.empty:
        return "comm_wait needs collectives from two or more ranks; not measured"
    calls = skew.drop_duplicates("match_id")
    suspect = calls[calls["clock_suspect"]]
    if suspect.empty:
        return None
    from gpudiag.analyzers.findings import format_ns

    which = (f"all {len(calls)}" if len(suspect) == len(calls)
             else f"{len(suspect)} of {len(calls)}")
    left = "not measured" if len(suspect) == len(calls) else "those left out of it"
    return (f"comm_wait: {which} collectives matched across ranks start up to "
            f"{format_ns(int(suspect['skew_ns'].max()))} apart, over 100x the calls' own "
            "time: the ranks' clocks disagree (hosts without NTP/PTP, or files of different "
            f"runs), so those starts say nothing of waiting; {left}")


def _timed_calls(trace: Trace) -> pd.DataFrame:
    """Collectives with a rank on a real timeline, with `dur_ns`."""
    c = trace.collectives
    if not trace.meta.get("timeline", True) or c.empty:
        return c.iloc[0:0].assign(dur_ns=pd.Series(dtype="int64"))
    c = c[c["rank"].notna()]
    c = c.assign(comm=c["comm"].astype("string").fillna(""), op=c["op"].astype("string"))
    return c.assign(dur_ns=c["end_ns"] - c["start_ns"]).reset_index(drop=True)


def _seq_agrees(calls: pd.DataFrame, agree_share: float) -> bool:
    """True when (comm, seq) groups spanning several ranks agree on op (and bytes where the
    size is the same on every rank) in at least `agree_share` of the groups."""
    groups = calls.groupby(["comm", "seq"], sort=False, dropna=False)
    stats = groups.agg(ranks=("rank", "nunique"), ops=("op", "nunique"),
                       sizes=("bytes", "nunique"), op=("op", "first"))
    multi = stats[stats["ranks"] >= 2]
    if multi.empty:
        return False
    same_size = multi["op"].isin(SAME_SIZE_OPS)
    agree = (multi["ops"] == 1) & (~same_size | (multi["sizes"] <= 1))
    return bool(agree.mean() >= agree_share)


def _by_seq(calls: pd.DataFrame) -> np.ndarray:
    ids = calls.groupby(["comm", "seq"], sort=False, dropna=False).ngroup().to_numpy()
    return np.where(calls["seq"].notna().to_numpy(), ids, -1)


def _by_end(calls: pd.DataFrame, end_tolerance: float) -> np.ndarray:
    """Group ids by near-equal ends within (comm, op) or (op); -1 for ambiguous groups."""
    shared = bool((calls.groupby("comm")["rank"].nunique() == calls["rank"].nunique()).all())
    keys = ["comm", "op"] if shared else ["op"]
    order = calls.sort_values([*keys, "end_ns"], kind="stable")
    key = order.groupby(keys, sort=False, dropna=False).ngroup().to_numpy()
    end = order["end_ns"].to_numpy(np.int64)
    dur = order["dur_ns"].to_numpy(np.int64)
    new = np.ones(len(order), dtype=bool)
    close = (end[1:] - end[:-1]) <= end_tolerance * np.minimum(dur[1:], dur[:-1])
    new[1:] = (key[1:] != key[:-1]) | ~close
    ids = pd.Series(np.cumsum(new) - 1, index=order.index)
    rank = order["rank"]
    twice = rank.groupby(ids).transform("count") != rank.groupby(ids).transform("nunique")
    return ids.where(~twice, -1).sort_index().to_numpy()


def _measure(calls: pd.DataFrame, how: str, clock_factor: float) -> pd.DataFrame:
    """Skew, last rank and per-rank wait of each matched group (groupby/transform only)."""
    per = calls.groupby("match_id", sort=False)
    latest = per["start_ns"].transform("max")
    skew = latest - per["start_ns"].transform("min")
    longest = per["dur_ns"].transform("max")
    last = calls.loc[per["start_ns"].idxmax(), ["match_id", "rank"]]
    last_rank = calls["match_id"].map(pd.Series(last["rank"].to_numpy(), last["match_id"]))
    wait = np.clip(latest - calls["start_ns"], 0, calls["dur_ns"])
    out = calls.assign(
        wait_ns=wait, last_rank=last_rank, skew_ns=skew, ranks=per["rank"].transform("nunique"),
        matched_by=how, clock_suspect=skew > clock_factor * longest,
        first_ns=per["start_ns"].transform("min"),
    ).sort_values(["first_ns", "match_id", "rank"], kind="stable")
    return out.assign(match_id=pd.factorize(out["match_id"])[0])  # numbered in time order
