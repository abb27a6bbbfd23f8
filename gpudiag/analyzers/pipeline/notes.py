"""The notes a diagnosis writes: why there is no waterfall, what was not measured, what
the training steps are. One text per fact, whether the trace was diagnosed whole or rank
by rank."""

from __future__ import annotations

import pandas as pd

from gpudiag.analyzers.findings import format_ns


def timeline_notes(*, has_gpu: bool, timeline: bool) -> tuple[bool, list[str]]:
    """Whether there is a loss waterfall (GPU work on a timeline), and the note when not."""
    if not has_gpu:
        return False, ["no loss waterfall: the trace has no kernels or copies on a timeline"]
    if not timeline:
        return False, ["no loss waterfall: the times in this source are not a timeline "
                       "(e.g. Nsight Compute replays kernels one by one)"]
    return True, []



def occupancy_notes(unknown: int, kernels: int, reason: str | None) -> list[str]:
    """The note when small grids could not be measured for `unknown` of the `kernels`."""
    if unknown == kernels:
        return ["small_grid not measured: " + (reason or "no launch configuration")]
    if unknown:
        return [f"small_grid not measured for {unknown} of {kernels} kernels (launch "
                "configuration or device properties missing)"]
    return []



def step_notes(steps: pd.DataFrame, has_ops: bool) -> list[str]:
    """What the steps are and how they were found; which are warm-up (`has_ops`: the
    trace has host ops, where steps were looked for)."""
    from gpudiag.analyzers.steps.training import summary

    info = summary(steps)
    if not info["count"]:
        return ["no training steps found (no step markers, optimizer steps, jitted step "
                "executions or repeating ops): host tables cover the whole trace"] \
            if has_ops else []
    line = (f"steps: {info['count']} ({info['method_text']}: {info['detail']}); median "
            f"{format_ns(info['median_ns'])}")
    if info["warmup"]:
        warm = steps[steps["warmup"]]
        names = ", ".join(warm["step"].astype(str).head(3))
        line += (f"; warm-up: {names} ({format_ns(info['warmup_ns'])}), left out of the "
                 "median and of the ranking of findings")
    return [line]
