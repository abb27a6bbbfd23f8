"""Training steps: where they are, which are warm-up, and the loss waterfall per step.

    steps = training_steps(trace)                  # one row per step, warm-up flagged
    summary(steps)["median_ns"]                    # median step time, warm-up left out
    gpudiag.diagnose(trace, steps=True).by_step    # the waterfall of every step

The steps are the trace's step ranges (Kineto `ProfilerStep#N`, `gpudiag.step()`, the
profiler's step hook) or, without any, the steps `step_detection` finds (torch optimizer
steps, jax jitted-step executions, a repeating op sequence); `method` and `detail` say
which. A step's host range marks when the host worked on it; the GPU runs that work a
little later, so each step's window runs from its start to the next step's start on its
process (the last step: to its own end), and the GPU causes inside it come from the same
loss layers as the whole-trace waterfall (cumulative sums at the step edges).

**Warm-up.** The first steps of a run pay one-time costs: compilation (torch.compile,
jax.jit), cuDNN autotuning, CUDA context and allocator growth, lazy optimizer state. Of a
process's n steps, each of the first `w = min(max_warmup, n // 2)` (3) whose duration is more
than `warmup_factor` (1.5) x the median of the steps after the first w is flagged
`warmup`. Warm-up steps are reported apart, left out of the median step time, and a
finding whose time lies mostly inside them is never ranked first (`diagnose`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses.waterfall import LossTimeline
from gpudiag.analyzers.steps.detection import METHODS, detect_steps
from gpudiag.trace import Trace

COLUMNS = ("rank", "device", "step", "start_ns", "end_ns", "warmup", "cause", "lost_ns",
           "share")

#: columns of `training_steps`: rank and pid are NA where the trace names none
STEP_COLUMNS = ("rank", "pid", "tid", "step", "index", "start_ns", "end_ns", "dur_ns",
                "warmup", "method", "detail")


def training_steps(trace: Trace, *, warmup_factor: float = 1.5,
                   max_warmup: int = 3) -> pd.DataFrame:
    """One row per step: `rank` (NA: none), `pid`, `tid`, `step` (its name), `index` (0-based
    per process), `start_ns`, `end_ns` (window edges as in the module docstring), `dur_ns`,
    `warmup`, `method` and `detail` (how the step was found).

        steps = training_steps(trace)
        steps.loc[~steps["warmup"], "dur_ns"].median()

    Computed once per trace for each setting.
    """
    key = f"training_steps:{warmup_factor}:{max_warmup}"
    return trace.derived(key, lambda: _training_steps(trace, warmup_factor, max_warmup))


def _training_steps(trace: Trace, warmup_factor: float, max_warmup: int) -> pd.DataFrame:
    raw = detect_steps(trace)
    if raw.empty:
        return pd.DataFrame({col: pd.Series(dtype=_DTYPES.get(col, "object"))
                             for col in STEP_COLUMNS})
    steps = raw.astype({"rank": "Int64", "pid": "Int64"})
    # per process (rank, pid), NA a rank or pid of its own; NA first, as detect_steps sorts
    steps = steps.sort_values(["rank", "pid", "start_ns"], kind="stable", ignore_index=True,
                              na_position="first")
    process = [steps["rank"], steps["pid"]]
    group = steps.groupby(process, sort=False, dropna=False)
    nxt = steps["start_ns"].astype("Int64").groupby(process, dropna=False).shift(-1)
    end = nxt.fillna(steps["end_ns"].astype("Int64")).to_numpy(np.int64)  # exact ns
    steps["end_ns"] = np.maximum(end, steps["start_ns"].to_numpy(np.int64))
    steps["index"] = group.cumcount().astype("int64")
    steps["dur_ns"] = steps["end_ns"] - steps["start_ns"]
    steps["warmup"] = False
    for rows in group.indices.values():  # positions, which the RangeIndex labels repeat
        steps.loc[rows, "warmup"] = flag_warmup(steps.loc[rows, "dur_ns"].to_numpy(np.int64),
                                                factor=warmup_factor, max_warmup=max_warmup)
    return steps.loc[:, list(STEP_COLUMNS)].astype(
        {"warmup": bool, "index": "int64", "dur_ns": "int64"})


_DTYPES = {"rank": "Int64", "pid": "Int64", "tid": "Int64", "index": "int64",
           "start_ns": "int64", "end_ns": "int64", "dur_ns": "int64", "warmup": "bool"}


def flag_warmup(dur_ns: npt.ArrayLike, *, factor: float = 1.5,
                max_warmup: int = 3) -> npt.NDArray[np.bool_]:
    """Which of one process's steps (in order) are warm-up, by the rule in the module
    docstring.

        flag_warmup([900, 100, 110, 95, 105, 100])   # -> [True, False, False, ...]
    """
    dur = np.asarray(dur_ns, dtype=np.float64)
    out = np.zeros(len(dur), dtype=bool)
    first = min(max_warmup, len(dur) // 2)
    if first == 0:
        return out
    out[:first] = dur[:first] > factor * float(np.median(dur[first:]))
    return out


def step_windows(trace: Trace) -> pd.DataFrame:
    """`training_steps` with the default warm-up rule (`rank, step, start_ns, end_ns` and
    the rest of its columns).

        step_windows(trace).head()
    """
    return training_steps(trace)


def summary(steps: pd.DataFrame) -> dict[str, Any]:
    """What the steps say in a few numbers (JSON-ready): `count`, `warmup` (how many),
    `median_ns` (of the steps that are not warm-up), `warmup_ns` (their summed time),
    `method` and `detail` (how they were found; the first process's when several) and
    `processes`.

        summary(training_steps(trace))
    """
    if steps.empty:
        return {"count": 0, "warmup": 0, "median_ns": None, "warmup_ns": 0, "method": None,
                "method_text": None, "detail": None, "processes": 0}
    steady = steps.loc[~steps["warmup"], "dur_ns"]
    method = str(steps["method"].iloc[0])
    return {
        "count": len(steps), "warmup": int(steps["warmup"].sum()),
        "median_ns": int(steady.median()) if len(steady) else None,
        "warmup_ns": int(steps.loc[steps["warmup"], "dur_ns"].sum()),
        "method": method, "method_text": METHODS.get(method, method),
        "detail": str(steps["detail"].iloc[0]),
        "processes": int(steps[["rank", "pid"]].drop_duplicates().shape[0]),
    }


def warmup_window(steps: pd.DataFrame) -> tuple[int, int] | None:
    """(start, end) spanning every warm-up step of every process, or None without any."""
    warm = steps[steps["warmup"]]
    if warm.empty:
        return None
    return int(warm["start_ns"].min()), int(warm["end_ns"].max())


def losses_by_step(trace: Trace, timeline: LossTimeline) -> pd.DataFrame:
    """One row per (device, step, cause): `rank, device, step, start_ns, end_ns, warmup,
    cause, lost_ns, share` (share of the step's window on that device).

        dx = gpudiag.diagnose(trace, steps=True)
        dx.by_step.pivot_table(index="step", columns="cause", values="share")
    """
    windows = step_windows(trace)
    step_rank = keys.key_array(windows["rank"])  # the timeline's keys hold keys.MISSING
    frames = []
    for key in timeline.windows:
        # the device's rank's steps, else the steps of no rank (a trace without ranks)
        same = step_rank == key[0]
        mine = windows[same] if same.any() else windows[step_rank == keys.MISSING]
        if mine.empty:
            continue
        edges = np.column_stack([mine["start_ns"], mine["end_ns"]]).ravel()
        amounts = timeline.amounts(key, edges)
        first, last = timeline.windows[key]
        length = (np.clip(mine["end_ns"].to_numpy(), first, last)
                  - np.clip(mine["start_ns"], first, last))
        lost_by_cause = {cause: np.rint(amounts[cause][::2]).astype(np.int64)
                         for cause in LOSS_CAUSES if cause != "useful" and cause in amounts}
        lost_by_cause["useful"] = length - sum(lost_by_cause.values(), np.zeros(len(mine),
                                                                               np.int64))
        for cause, lost in lost_by_cause.items():
            frames.append(pd.DataFrame({
                "rank": key[0], "device": key[1], "step": mine["step"].to_numpy(),
                "start_ns": mine["start_ns"].to_numpy(), "end_ns": mine["end_ns"].to_numpy(),
                "warmup": mine["warmup"].to_numpy(bool),
                "cause": cause, "lost_ns": lost,
                "share": np.where(length > 0, lost / np.maximum(length, 1), np.nan)}))
    if not frames:
        return pd.DataFrame({col: pd.Series(dtype="object") for col in COLUMNS})
    out = pd.concat(frames, ignore_index=True)
    out["rank"] = keys.key_column(out["rank"])
    out["device"] = keys.key_column(out["device"])
    return out.sort_values(["rank", "device", "start_ns"], kind="stable", ignore_index=True,
                           na_position="first")
