"""The loss waterfall per training step.

Steps are the trace's step ranges (Kineto `ProfilerStep#N`, `gpudiag.step()` markers).
A step's host range marks when the host worked on it; the GPU runs that work a little
later, so each step's GPU window runs from the step's start to the next step's start (the
last step: to its own end), and the causes inside it come from the same loss layers as the
whole-trace waterfall (cumulative sums at the step edges, no re-analysis).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses import LossTimeline
from gpudiag.trace import Trace

COLUMNS = ("rank", "device", "step", "start_ns", "end_ns", "cause", "lost_ns", "share")


def step_windows(trace: Trace) -> pd.DataFrame:
    """`rank, step, start_ns, end_ns` per step range, edges as in the module docstring.

        step_windows(trace).head()
    """
    steps = trace.ranges[trace.ranges["source"] == "step"].copy()
    if steps.empty:
        return pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns"])
    steps["rank"] = steps["rank"].fillna(-1)
    steps = steps.sort_values(["rank", "start_ns"], kind="stable")
    nxt = steps["start_ns"].astype("Int64").groupby(steps["rank"]).shift(-1)  # exact ns
    end = nxt.fillna(steps["end_ns"].astype("Int64")).astype("int64")
    return pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["name"].astype(str),
                         "start_ns": steps["start_ns"].to_numpy(), "end_ns": end.to_numpy()})


def losses_by_step(trace: Trace, timeline: LossTimeline) -> pd.DataFrame:
    """One row per (device, step, cause): `rank, device, step, start_ns, end_ns, cause,
    lost_ns, share` (share of the step's window on that device).

        dx = gpudiag.diagnose(trace, steps=True)
        dx.by_step.pivot_table(index="step", columns="cause", values="share")
    """
    windows = step_windows(trace)
    frames = []
    for key in timeline.windows:
        mine = windows[windows["rank"] == key[0]] if (windows["rank"] == key[0]).any() \
            else windows[windows["rank"] == -1]
        if mine.empty:
            continue
        edges = np.column_stack([mine["start_ns"], mine["end_ns"]]).ravel()
        amounts = timeline.amounts(key, edges)
        lo, hi = timeline.windows[key]
        length = np.clip(mine["end_ns"].to_numpy(), lo, hi) - np.clip(mine["start_ns"], lo, hi)
        lost_by_cause = {c: np.rint(amounts[c][::2]).astype(np.int64)
                         for c in LOSS_CAUSES if c != "useful" and c in amounts}
        lost_by_cause["useful"] = length - sum(lost_by_cause.values(), np.zeros(len(mine),
                                                                               np.int64))
        for cause, lost in lost_by_cause.items():
            frames.append(pd.DataFrame({
                "rank": key[0], "device": key[1], "step": mine["step"].to_numpy(),
                "start_ns": mine["start_ns"].to_numpy(), "end_ns": mine["end_ns"].to_numpy(),
                "cause": cause, "lost_ns": lost,
                "share": np.where(length > 0, lost / np.maximum(length, 1), np.nan)}))
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    out["rank"] = out["rank"].astype("Int64").mask(out["rank"] == -1)
    return out.sort_values(["rank", "device", "start_ns"], kind="stable", ignore_index=True)
