"""`diagnose(trace)`: run every analyzer that applies and rank what they found.

A trace is diagnosed as a job is, over one part: the map (`parts.group_part`) computes
what the trace contributes, the reduce (`reduce.reduced`) makes the Diagnosis of it, as
it does of a job's hundreds of parts read rank by rank (`gpudiag.jobs`). What only a trace
at hand gives is added here: the loss layers the reports draw, the expected savings
(`critical.savings` replays the trace's schedule) and the critical path, computed when a
report first asks for it.

The registry of analyzers is `analyzers.registry`; what did not run is said in
`Diagnosis.notes`, never silently dropped.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pandas as pd

from gpudiag import diagnosis_schema as declared
from gpudiag.analyzers import window as window_mod
from gpudiag.analyzers.losses.options import LAUNCH_GAP_NS, SYNC_TOLERANCE_NS, GapOptions
from gpudiag.analyzers.pipeline import reduce
from gpudiag.analyzers.pipeline.answer import (  # noqa: F401  (where callers found them)
    STRAGGLER_TABLES,
    VIEWS,
    Diagnosis,
    add_views,
    drawn_paths,
)
from gpudiag.analyzers.pipeline.parts import Options, group_part, warm_part
from gpudiag.analyzers.pipeline.ranking import RANKINGS, flag_warmup, rank_findings  # noqa: F401
from gpudiag.analyzers.pipeline.registry import (  # noqa: F401  (where callers found them)
    ANALYZERS,
    HOST_ANALYZERS,
    WARM_SKIPPED,
    Analyzer,
    applies,
    has_host_ops,
)
from gpudiag.analyzers.window import Window
from gpudiag.trace import Trace


def diagnose(trace: Trace, *, window: str | tuple[int, int] | None = None,
             steps: bool = False, launch_gap_ns: int = LAUNCH_GAP_NS,
             sync_tolerance_ns: int = SYNC_TOLERANCE_NS, rank_by: str = "saving",
             savings: bool = True) -> Diagnosis:
    """Every analyzer that applies, the loss waterfall and the ranked findings.

        dx = gpudiag.diagnose(trace)
        dx.losses                      # device x cause -> lost_ns, share
        dx.findings.head()             # ranked, with call sites and advice

    `window`: a time range or a range name (see `analyzers.window`); `steps`: also the
    waterfall of each training step (`by_step`). The thresholds go to the gap rules.
    `savings`: replay the schedule without each finding's cause (`critical.savings`) for
    its expected saving; `rank_by`: "saving" (default) or "lost" (see `rank_findings`).
    """
    if rank_by not in RANKINGS:
        raise ValueError(f"rank_by must be one of {', '.join(RANKINGS)}, not {rank_by!r}")
    options = Options(bounds=bounds_of(trace, window), steps=steps,
                      gap_options=GapOptions(launch_gap_ns, sync_tolerance_ns), keep=True,
                      summary=False)
    part = group_part(Window(trace, options.bounds), options)
    meta = dict(trace.meta)
    dx, found, host = reduce.reduced([reduce.Whole(part, [meta])], options, meta)
    warm = reduce.warm_window(dx, found)
    if warm is not None:  # the warm-up window's parts, from the gaps already found
        assert part.window is not None
        early = warm_part(replace(part, window=None, parts={}), part.window.cut(warm),
                          part.idle, replace(options, warm=warm))
        found = reduce.warm_flagged(found, dx, [reduce.Whole(early, [meta])], options)
    replay = None
    if savings and dx.waterfall:
        from gpudiag.analyzers.critical.savings import expected_savings

        seen = part.window
        assert seen is not None

        def replay(joined: pd.DataFrame) -> pd.DataFrame:
            return expected_savings(seen, joined, dx.tables, gap_options=options.gap_options,
                                    steps=dx.steps, notes=dx.notes)
    dx.findings = declared.conform_frame("findings", rank_findings(
        found, host, rank_by=rank_by, savings=replay, framework=dx.framework))
    dx.source = trace
    dx.paths_of = functools.cache(lambda: drawn_paths(trace))
    add_views(dx)
    return dx


def bounds_of(trace: Trace, window: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """A window spec as bounds; a name that only a detected step has (`step 3` of a run
    without markers) is that step's window."""
    if window is None:
        return None
    if isinstance(window, str) and not (trace.ranges["name"].astype(str) == window).any():
        from gpudiag.analyzers.steps.training import training_steps

        steps = training_steps(trace)
        named = steps[steps["step"].astype(str) == window]
        if len(named):
            return int(named["start_ns"].min()), int(named["end_ns"].max())
    return window_mod.resolve(trace, window)


