"""Stragglers: which rank holds a many-rank job back, in which collectives and steps.

A collective starts everywhere only when its last rank arrives, so one slow rank makes every
other rank wait (`collectives.skew`). The waterfall charges that wait to the ranks that
waited (comm_wait); this module names the rank that caused it:

- `late_arrivals`: per collective op and rank, how often the rank arrived last, by how much
  (the skew), how much waiting it caused (the other ranks' `wait_ns` in those calls) and its
  `margin_ns`: how much earlier those calls would have started had it been only as late as
  the next-latest rank (what fixing that one rank alone buys, at most).
- `step_stragglers`: per training step, the slowest rank (the longest step window), how much
  longer than the median rank, and the rank that arrived last at that step's collectives
  most costly to the others.
- `rank_losses`: the loss waterfall per rank, one row per rank with a share per cause,
  the worst (least useful time) first: what the report's rank x cause heatmap draws.

Everything here reads the Diagnosis' own tables (`arrival_skew`, `steps`, `losses`), so a
job diagnosed rank by rank (`gpudiag.diagnose_job`) gets the same tables as the merged trace,
and nothing more has to cross from the ranks to the coordinator. Calls flagged
`clock_suspect` (offset clocks, not waiting) are left out, as the findings leave them out.
"""

from __future__ import annotations

import pandas as pd

from gpudiag.analyzers.findings import LOSS_CAUSES

LATE_COLUMNS = ("op", "rank", "last_calls", "op_calls", "share", "ranks", "skew_median_ns",
                "skew_max_ns", "margin_ns", "caused_wait_ns")
STEP_COLUMNS = ("step", "index", "warmup", "ranks", "slowest_rank", "slowest_ns",
                "median_ns", "excess_ns", "last_rank", "last_calls", "caused_wait_ns",
                "wait_ns")
SHARE_COLUMNS = tuple(f"{cause}_share" for cause in LOSS_CAUSES)


def tables(losses: pd.DataFrame, steps: pd.DataFrame | None,
           skew: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """The straggler tables that apply (two or more ranks), by their Diagnosis names.

        dx.tables.update(stragglers.tables(dx.losses, dx.steps, dx.tables.get("arrival_skew")))
    """
    calls = _matched(skew)
    per = _per_call(calls) if len(calls) else None  # one row per call: both tables read it
    out = {"late_arrivals": late_arrivals(calls, per),
           "step_stragglers": step_stragglers(steps, calls, per),
           "rank_losses": rank_losses(losses)}
    return {name: frame for name, frame in out.items() if len(frame)}


def _matched(skew: pd.DataFrame | None) -> pd.DataFrame:
    """The matched calls that measure waiting (not clock offsets), with a known rank."""
    if skew is None or skew.empty:
        return pd.DataFrame(columns=["match_id", "op", "rank", "start_ns", "wait_ns",
                                     "last_rank", "skew_ns", "ranks"])
    keep = ~skew["clock_suspect"].to_numpy(bool) & skew["rank"].notna().to_numpy()
    return skew.loc[keep]


def _per_call(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per matched collective: op, last rank, its start, skew, group size, the
    waiting it caused (every rank's wait) and its margin over the next-latest rank."""
    ordered = calls.sort_values(["match_id", "start_ns"], kind="stable")
    group = ordered.groupby("match_id", sort=True)
    per = group.agg(op=("op", "first"), last_rank=("last_rank", "first"),
                    start_ns=("start_ns", "max"), skew_ns=("skew_ns", "first"),
                    ranks=("ranks", "first"), caused_wait_ns=("wait_ns", "sum"))
    from_end = group.cumcount(ascending=False).to_numpy()
    second = ordered.loc[from_end == 1].set_index("match_id")["start_ns"]
    per["margin_ns"] = (per["start_ns"] - second.reindex(per.index)
                        .fillna(per["start_ns"])).astype("int64")
    return per.reset_index()


def late_arrivals(calls: pd.DataFrame, per: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (op, rank that arrived last): the counts, skew, margin and waiting it caused,
    the costliest first. `share` is of the op's matched calls: 1 / ranks is what chance
    gives when no rank is slower than the others. `per`: `_per_call(calls)`, when the
    caller has it."""
    if calls.empty:
        return _typed(None, LATE_COLUMNS)
    per = (_per_call(calls) if per is None else per).assign(op=lambda rows:
                                                             rows["op"].astype(str))
    out = per.groupby(["op", "last_rank"], sort=True).agg(
        last_calls=("match_id", "size"), ranks=("ranks", "median"),
        skew_median_ns=("skew_ns", "median"), skew_max_ns=("skew_ns", "max"),
        margin_ns=("margin_ns", "sum"), caused_wait_ns=("caused_wait_ns", "sum"))
    out = out.reset_index().rename(columns={"last_rank": "rank"})
    out["op_calls"] = out["op"].map(per.groupby("op").size()).astype("int64")
    out["share"] = out["last_calls"] / out["op_calls"]
    out = out.sort_values(["caused_wait_ns", "last_calls", "op", "rank"],
                          ascending=[False, False, True, True], kind="stable")
    return _typed(out, LATE_COLUMNS)


def step_stragglers(steps: pd.DataFrame | None, calls: pd.DataFrame,
                    per: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per training step that two or more ranks ran (see the module docstring).

    Steps line up across ranks by name when every process names its steps uniquely (step
    markers, `ProfilerStep#N`), else by position. A rank with several processes counts
    its longest. A collective belongs to the step of its last rank's start.
    """
    if steps is None or steps.empty or steps["rank"].dropna().nunique() < 2:
        return _typed(None, STEP_COLUMNS)
    ranked = steps.loc[steps["rank"].notna()].copy()
    by_name = not ranked.duplicated(["rank", "pid", "step"]).any()
    ranked["key"] = ranked["step"].astype(str) if by_name else ranked["index"].astype(str)
    longest = ranked.groupby(["key", "rank"], sort=False).agg(
        dur_ns=("dur_ns", "max"), index=("index", "min"), warmup=("warmup", "any"))
    rows = []
    for key, group in longest.groupby(level="key", sort=False):
        if len(group) < 2:
            continue
        durations = group["dur_ns"]
        slowest = durations.idxmax()[1]  # ties: the lowest rank, as sorted
        rows.append({"step": key, "index": int(group["index"].min()),
                     "warmup": bool(group["warmup"].any()), "ranks": len(group),
                     "slowest_rank": int(slowest), "slowest_ns": int(durations.max()),
                     "median_ns": int(durations.median())})
    out = pd.DataFrame(rows)
    if out.empty:
        return _typed(None, STEP_COLUMNS)
    out["excess_ns"] = out["slowest_ns"] - out["median_ns"]
    out = out.merge(_late_by_step(ranked, calls, per), how="left", on="step")
    out = out.sort_values(["index", "step"], kind="stable")
    return _typed(out, STEP_COLUMNS)


def _late_by_step(steps: pd.DataFrame, calls: pd.DataFrame, per: pd.DataFrame | None
                  ) -> pd.DataFrame:
    """Per step key: the rank whose late arrivals cost the others most, with its calls and
    that cost, and all the waiting in the step's collectives."""
    empty = pd.DataFrame(columns=["step", "last_rank", "last_calls", "caused_wait_ns",
                                  "wait_ns"])
    if calls.empty:
        return empty
    per = (_per_call(calls) if per is None else per).astype({"last_rank": "int64",
                                                               "start_ns": "int64"})
    windows = steps.assign(rank=steps["rank"].astype("int64"))[
        ["rank", "start_ns", "end_ns", "key"]].sort_values("start_ns", kind="stable")
    found = pd.merge_asof(per.sort_values("start_ns", kind="stable"), windows,
                          left_on="start_ns", right_on="start_ns", left_by="last_rank",
                          right_by="rank", direction="backward")
    inside = found["key"].notna() & (found["start_ns"] < found["end_ns"])
    found = found.loc[inside]
    if found.empty:
        return empty
    cost = found.groupby(["key", "last_rank"], sort=True).agg(
        last_calls=("match_id", "size"), caused_wait_ns=("caused_wait_ns", "sum"))
    cost = cost.reset_index().sort_values(["key", "caused_wait_ns", "last_calls", "last_rank"],
                                          ascending=[True, False, False, True], kind="stable")
    top = cost.drop_duplicates("key").set_index("key")
    top["wait_ns"] = found.groupby("key")["caused_wait_ns"].sum()
    return top.reset_index().rename(columns={"key": "step"})


def rank_losses(losses: pd.DataFrame) -> pd.DataFrame:
    """One row per rank of a job of two or more: devices, window and the share of each
    cause (every device of the rank together), the least useful first."""
    ranked = losses.loc[losses["rank"].notna()]
    if ranked["rank"].nunique() < 2:
        return _typed(None, ("rank", "devices", "window_ns", *SHARE_COLUMNS))
    time = ranked.pivot_table(index="rank", columns="cause", values="lost_ns", aggfunc="sum",
                              observed=True, fill_value=0)
    time = time.reindex(columns=list(LOSS_CAUSES), fill_value=0)
    window = time.sum(axis=1)
    shares = time.div(window.where(window > 0), axis=0)
    shares.columns = list(SHARE_COLUMNS)
    out = shares.assign(devices=ranked.groupby("rank")["device"].nunique(dropna=False),
                        window_ns=window).reset_index()
    out = out.sort_values(["useful_share", "rank"], kind="stable", na_position="last")
    return _typed(out, ("rank", "devices", "window_ns", *SHARE_COLUMNS))


def _typed(frame: pd.DataFrame | None, columns: tuple[str, ...]) -> pd.DataFrame:
    """`frame`'s `columns` in order, index reset (an empty frame with them from None: the
    schema gives the dtypes)."""
    if frame is None:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in columns})
    return frame.loc[:, list(columns)].reset_index(drop=True)

