"""The figures of a job of many ranks: the rank x cause heatmap of the loss waterfall.

Bounded like every figure here (`figures` module docstring): a job of any size draws at most
`max_rows` rows. Ranks come sorted as `stragglers.rank_losses` sorts them, the least useful
first, so binning keeps its meaning: one row holds consecutive ranks of that order (the
worst tenth of the job, say), each cell their window-weighted share, and its hover names
the ranks it holds. Causes are the columns (seven, whatever the job): the colour is the
share, so there is no legend to outgrow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.stragglers import SHARE_COLUMNS

#: rows of the heatmap: more ranks than this share rows
MAX_ROWS = 128
_ROW_PX = 18
_FRAME_PX = 120  # title and the cause labels over the plot
_MIN_PLOT_PX = 160  # the colorbar's ticks and title stay apart


def rank_causes(source: Diagnosis | pd.DataFrame, *, max_rows: int = MAX_ROWS
                ) -> go.Figure | None:
    """Rank x cause heatmap of the loss waterfall, the least useful ranks at the top.

        dx = gpudiag.diagnose_job("traces/")        # or gpudiag.diagnose(trace)
        fig = figures_ranks.rank_causes(dx)                 # None with fewer than two ranks

    `source`: a Diagnosis (its `rank_losses` table) or that table.
    """
    ranks = source.tables.get("rank_losses") if isinstance(source, Diagnosis) else source
    if ranks is None or len(ranks) < 2:
        return None
    rows = binned(ranks, max_rows)
    z = rows[list(SHARE_COLUMNS)].to_numpy(np.float64).round(6)
    labels = rows["label"].tolist()
    hover = "%{y}<br>%{x}: %{z:.1%} of the window<extra></extra>"
    # useful time is the good share: on the loss causes' scale a healthy rank would glow
    # as red as a stalled one, so it has a scale of its own (dark green: most useful)
    fig = go.Figure([
        go.Heatmap(x=list(LOSS_CAUSES[:1]), y=labels, z=z[:, :1], zmin=0, zmax=1,
                   colorscale="Greens", name="useful", hovertemplate=hover,
                   colorbar={"title": {"text": "useful", "side": "right"},
                             "tickformat": ".0%", "x": 1.0, "len": 0.9}),
        go.Heatmap(x=list(LOSS_CAUSES[1:]), y=labels, z=z[:, 1:], zmin=0, zmax=1,
                   colorscale="YlOrRd", name="lost", hovertemplate=hover,
                   colorbar={"title": {"text": "lost", "side": "right"},
                             "tickformat": ".0%", "x": 1.12, "len": 0.9})])
    binned_note = "" if len(rows) == len(ranks) else f" ({len(ranks):,} ranks in bins)"
    fig.update_layout(
        title={"text": "Where each rank's GPU time went, least useful first" + binned_note,
               "y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 14}},
        xaxis={"title": "cause", "side": "top", "categoryorder": "array",
               "categoryarray": list(LOSS_CAUSES)},
        yaxis={"type": "category", "autorange": "reversed",
               "showticklabels": len(rows) <= 64},
        margin={"t": 90, "b": 30}, height=_FRAME_PX + max(_ROW_PX * len(rows), _MIN_PLOT_PX))
    return fig


def binned(ranks: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """`ranks` (in their order) in at most `max_rows` rows of consecutive ranks: shares
    weighted by each rank's window, and a label naming the ranks ('rank 3', or 'ranks 3, 7
    ... (12)' for a bin)."""
    n = len(ranks)
    if n <= max_rows:
        return ranks.assign(label=[f"rank {r}" for r in ranks["rank"]])
    bins = np.arange(n) * max_rows // n
    window = ranks["window_ns"].to_numpy(np.float64)
    weighted = ranks[list(SHARE_COLUMNS)].mul(window, axis=0).fillna(0.0)
    sums = weighted.groupby(bins).sum()
    totals = pd.Series(window).groupby(bins).sum()
    shares = sums.div(totals.where(totals > 0), axis=0)
    members = ranks["rank"].astype("int64").groupby(bins).agg(list)
    labels = [f"ranks {m[0]}, {m[1]} ... ({len(m)})" if len(m) > 2
              else ", ".join(f"rank {r}" for r in m) for m in members]
    return shares.assign(label=labels).reset_index(drop=True)
