"""The findings in the order a user fixes them: warm-up findings last, then by expected
saving (or lost time), GPU time before host time."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from gpudiag.analyzers import findings as findings_mod
from gpudiag.analyzers.frameworks import in_words_of


def flag_warmup(found: pd.DataFrame, early: pd.DataFrame, steps: pd.DataFrame, *,
                min_share: float = 0.5) -> pd.DataFrame:
    """Mark findings whose lost time lies mostly (`min_share`) inside the warm-up steps:
    `early` holds the same analyzers' findings on the warm-up window, matched by (cause,
    where, advice)."""
    if early.empty:
        return found
    key = ["cause", "where", "advice"]
    lost = early.groupby(key, dropna=False)["lost_ns"].sum().rename("warm_ns")
    joined = found.join(lost, on=key)
    share = joined["warm_ns"].fillna(0) / found["lost_ns"].where(found["lost_ns"] > 0)
    flagged = (share >= min_share).to_numpy(bool)
    names = ", ".join(steps.loc[steps["warmup"], "step"].astype(str).head(3))
    out = found.copy()
    out["evidence"] = out["evidence"].astype(object)
    out.loc[flagged, "evidence"] = [
        f"warm-up: {100 * min(s, 1):.0f}% of this time is in the warm-up step(s) {names} "
        f"(one-time costs: compilation, cuDNN autotuning, allocator growth); {e}"
        for s, e in zip(share[flagged], found.loc[flagged, "evidence"], strict=True)]
    out["evidence"] = out["evidence"].astype("string")
    out["_warmup"] = flagged
    return out



def joined(found: pd.DataFrame, host: list[pd.DataFrame]) -> pd.DataFrame:
    """The GPU findings and the host findings in one frame, before they are ranked (what
    `rank_findings` gives its `savings`; the warm-up flags change no row's position)."""
    host_found = findings_mod.frame(pd.concat([h for h in host if len(h)], ignore_index=True)) \
        if any(len(h) for h in host) else findings_mod.frame()
    gpu = found if "_warmup" in found else found.assign(_warmup=False)
    return pd.concat([gpu.assign(_group=0), host_found.assign(_group=1, _warmup=False)],
                     ignore_index=True)


#: how findings can be ranked (`diagnose(rank_by=...)`, `--rank-by`)
RANKINGS = ("saving", "lost")


def rank_findings(found: pd.DataFrame, host: list[pd.DataFrame], *, rank_by: str = "saving",
                  savings: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
                  framework: str | None = None) -> pd.DataFrame:
    """The findings in the order a user fixes them: warm-up ones last (a one-time cost is
    never the top finding); `rank_by="saving"`: by expected saving first (findings without
    one after those with one), `"lost"`: GPU findings by lost time, then host findings
    (host time, their own share of step time). `savings` adds the saving columns to the
    joined findings (`critical.savings.expected_savings`); the advice is then put in the
    words of `framework` (`frameworks.in_words_of`)."""
    if rank_by not in RANKINGS:
        raise ValueError(f"rank_by must be one of {', '.join(RANKINGS)}, not {rank_by!r}")
    both = joined(found, host)
    if both.empty:
        return findings_mod.frame()
    if savings is not None:
        both = savings(both)
    order = ["_warmup", "_group", "lost_ns", "count"]
    ascending = [True, True, False, False]
    if rank_by == "saving" and "saving_ns" in both:
        both = both.assign(_saved=both["saving_ns"].notna().to_numpy(bool),
                           _saving=both["saving_ns"].fillna(0).to_numpy(np.int64))
        order[1:1] = ["_saved", "_saving"]
        ascending[1:1] = [False, False]
    both = both.sort_values(order, ascending=ascending, kind="stable")
    return findings_mod.frame(in_words_of(both.drop(
        columns=["_warmup", "_group", "_saved", "_saving"], errors="ignore"), framework))
