"""Stacked bars of the loss causes' shares: the diagnosis's waterfall (a bar per device) and
the comparison's (a bar per run) drawn the same way, so the two read alike.

Bars are shares of each bar's window (windows of different lengths compare on one axis);
the hover gives the share and the time in ms. Causes keep LOSS_CAUSES' order and
CAUSE_COLORS' colors, keyed by a legend in one row over the bars; the height is the title,
that key and the axis plus 40 px a bar. Labels are data (they may come from file names):
they go through `plotly_label` here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.reports.safe_text import plotly_label

#: one fixed color per waterfall cause, so every figure and report reads the same way
CAUSE_COLORS = {"useful": "#2ca02c", "sync_stall": "#d62728", "launch_bound": "#ff7f0e",
                "host_bound": "#9467bd", "copy": "#1f77b4", "comm_wait": "#8c564b",
                "small_grid": "#e377c2"}

#: the cause key: one row over the plot, under the title, so every entry shows at once (a
#: vertical legend beside a short figure scrolls; plotly wraps this row on a narrow page)
KEY_LEGEND = {"orientation": "h", "traceorder": "normal", "x": 0.0, "xanchor": "left",
              "y": 1.0, "yanchor": "bottom", "yref": "paper"}
KEY_TOP_PX = 84  # title + the key's row
AXIS_BOTTOM_PX = 64  # tick labels + the x axis title
BAR_PX = 40  # one bar and the gap around it

Shares = tuple[Sequence[str], Sequence[float], Sequence[float]]
"""Per cause: the bars' labels, their shares (0-1) and the lost time (ns) of each."""


def share_bars(by_cause: Mapping[str, Shares], *, title: str, axis: str) -> go.Figure:
    """One horizontal stacked bar per label, one segment per cause (see the module)."""
    order = list(dict.fromkeys(plotly_label(label) for labels, _, _ in by_cause.values()
                               for label in labels))
    fig = go.Figure()
    for cause in LOSS_CAUSES:
        labels, shares, lost = by_cause.get(cause, ((), (), ()))
        fig.add_bar(name=cause, orientation="h", y=[plotly_label(x) for x in labels],
                    x=list(shares), customdata=(np.asarray(lost, float) / 1e6).round(6),
                    marker_color=CAUSE_COLORS[cause],
                    hovertemplate="%{y}<br>" + cause
                    + ": %{x:.1%} (%{customdata:.3f} ms)<extra></extra>")
    fig.update_layout(barmode="stack", title={"text": title, "y": 1.0, "yref": "container",
                                              "yanchor": "top", "pad": {"t": 14}},
                      xaxis={"tickformat": ".0%", "range": [0, 1], "title": axis},
                      yaxis={"categoryorder": "array", "categoryarray": order,
                             "autorange": "reversed"},
                      legend=KEY_LEGEND, margin={"t": KEY_TOP_PX, "b": AXIS_BOTTOM_PX},
                      height=KEY_TOP_PX + AXIS_BOTTOM_PX + BAR_PX * max(len(order), 1))
    return fig
