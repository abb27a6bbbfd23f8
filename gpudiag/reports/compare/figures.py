"""The figure of `gpudiag compare -o`: each run's loss waterfall, before and after, as one
stacked bar per run (`figures_bars`, as the report draws a device's)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from gpudiag.analyzers.compare import Comparison
from gpudiag.reports.compare.text import letter
from gpudiag.reports.figures_bars import Shares, share_bars


def runs_waterfall(cmp: Comparison) -> go.Figure | None:
    """One bar per run with a waterfall (summed over its devices), labelled as the tables
    head them ('A: fp32'); None when no run has one (no timeline in any of them).

        fig = compare.figures.runs_waterfall(compare([a, b], ["before", "after"]))
    """
    runs = [(f"{letter(i)}: {label}", label) for i, label in enumerate(cmp.labels)
            if not pd.isna(cmp.shares[label]).all()]
    if not runs:
        return None
    by_cause: dict[str, Shares] = {}
    for cause in cmp.shares.index:
        shown = [(name, float(cmp.shares.at[cause, label]),
                  float(cmp.losses.at[cause, label])) for name, label in runs]
        by_cause[str(cause)] = ([n for n, _, _ in shown], [s for _, s, _ in shown],
                                [lost for _, _, lost in shown])
    return share_bars(by_cause, title="Where the GPU time went, run by run",
                      axis="share of the run's GPU windows (summed over devices)")
