"""Plotly figures of a diagnosed trace: the loss waterfall, the utilization heatmap, the
collective waits and (figures_memory.py) the allocator's occupancy.

Each builder takes what the analyzers computed (a `Diagnosis`, an analyzer's table) and
only lays it out: reports never compute a diagnosis. The notebook user places the figures
wherever they like; the HTML report embeds the same figures.

Two rules hold for every figure:
- **bounded size**: time is cut into at most `bins` bins and collectives into at most
  `max_calls` columns, so a figure holds rows x bins cells whatever the trace's size (ten
  million kernels give the same JSON size as ten thousand);
- **input strings are data**: kernel names, stream and communicator labels go into the
  traces' `x`/`y`/`customdata` arrays, never into titles, templates or layout text, and
  each goes through `safe_text.plotly_label` first: plotly renders a subset of HTML in
  hover, tick and legend text, so a kernel named `<a href=...>` is shown, never a link.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpudiag import intervals
from gpudiag.analyzers import keys
from gpudiag.analyzers.collectives.skew import arrival_skew
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.names import short_names
from gpudiag.reports.figures_bars import (
    AXIS_BOTTOM_PX,
    CAUSE_COLORS,
    KEY_LEGEND,
    KEY_TOP_PX,
    share_bars,
)
from gpudiag.reports.figures_memory import memory
from gpudiag.reports.ncu.heatmap import figure as ncu_heatmap
from gpudiag.reports.safe_text import plotly_label
from gpudiag.trace import Trace

__all__ = ["CAUSE_COLORS", "collective_waits", "memory", "ncu_heatmap", "utilization",
           "waterfall"]

LOSSES = LOSS_CAUSES[1:]  # the causes that are not useful work
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def waterfall(dx: Diagnosis) -> go.Figure:
    """The loss waterfall: one stacked bar per device, one segment per cause.

        dx = gpudiag.diagnose(gpudiag.load("rank0.pt.trace.json.gz"))
        fig = figures.waterfall(dx)
        fig.show()

    Bars are shares of each device's window (devices with different windows compare on
    one axis); the hover gives the share and the time in ms. Causes keep LOSS_CAUSES'
    order and CAUSE_COLORS' colors, keyed by a legend in one row over the bars; the height
    is the title, that key and the axis plus 40 px a device. A diagnosis without a
    waterfall gives an empty figure.
    """
    loss = dx.losses
    labels = _device_labels(loss["rank"], loss["device"])
    by_cause = {}
    for cause in LOSS_CAUSES:
        rows = (loss["cause"] == cause).to_numpy(bool)
        by_cause[cause] = (labels[rows], loss["share"][rows], loss["lost_ns"][rows])
    return share_bars(by_cause, title="Where the GPU time went",
                      axis="share of the device's window")


_ROW_PX = 24  # one heatmap row


def utilization(trace: Trace, dx: Diagnosis | None, *, bins: int = 400) -> go.Figure:
    """Time x stream heatmap of busy shares, over one row per device of loss causes.

        dx = gpudiag.diagnose(trace)
        fig = figures.utilization(trace, dx, bins=200)
        fig.show()

    Top: per (rank, device, stream), the share of each time bin covered by the union of
    that stream's kernels and copies (exact: cumulative coverage at the bin edges), with
    the kernel that started the most time in the bin in the hover; under them, per rank,
    its critical path (`critical.path.rank_paths`): the share of the bin the path spends
    on the GPU, and where most of its time in the bin went. Bottom: per device, the
    cause that lost the most time in the bin (`useful` when nothing was lost), from
    `dx.timeline.amounts`; the hover lists every cause's share of the bin, a legend over
    the plot keys the causes' colors. Without `dx` (or a timeline) the bottom rows are left
    out. Cells: (streams + devices) x `bins`; 24 px a row (at least 120 px in all).
    """
    ev = _stream_events(trace)
    if ev is None:
        return _empty("no kernels or copies on a timeline")
    edges = _edges(int(ev["start"].min()), int(ev["end"].max()), bins)
    x = (edges - edges[0]) / 1e6  # ms since the first event; n+1 values: bin edges
    busy = _busy_shares(ev, edges)
    top = _top_names(ev, edges)
    labels = list(ev["labels"])
    path_labels, path_busy, path_top = _path_rows(dx, edges)
    if path_labels:  # each rank's critical path under its streams' rows
        labels += path_labels
        busy = np.vstack([busy, path_busy])
        top = np.vstack([top, path_top])
    rows = 2 if dx is not None and dx.timeline is not None and dx.timeline.windows else 1
    streams = len(labels)
    devices = len(dx.timeline.windows) if rows == 2 and dx is not None and dx.timeline else 0
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        row_heights=[streams, devices] if rows == 2 else None)
    fig.add_heatmap(x=x, y=labels, z=busy.astype(np.float32),  # 4 bytes a cell
                    customdata=top, zmin=0, zmax=1, colorscale="Blues", name="busy", row=1, col=1,
                    colorbar={"title": {"text": "busy share", "side": "right"},
                              "tickformat": ".0%", "tickvals": [0, 0.5, 1]},
                    hovertemplate="%{y}<br>%{x:.3f} ms: busy %{z:.1%}<br>"
                    "most time: %{customdata}<extra></extra>")
    if rows == 2:
        assert dx is not None and dx.timeline is not None
        _add_cause_rows(fig, dx, edges, x)
    # the rows, but never so few pixels that the colorbar's three ticks and title collide
    plot_px = max(_ROW_PX * (streams + devices), _MIN_PLOT_PX)
    top_px = KEY_TOP_PX if rows == 2 else _TITLE_TOP_PX
    fig.update_layout(title={"text": "GPU utilization per stream, and what the idle time "
                             "lost to", "y": 1.0, "yref": "container", "yanchor": "top",
                             "pad": {"t": 14}},
                      legend={**KEY_LEGEND, "title": {"text": "loss cause: "},
                              "itemclick": False, "itemdoubleclick": False},
                      margin={"t": top_px, "b": AXIS_BOTTOM_PX},
                      height=top_px + AXIS_BOTTOM_PX + plot_px)
    fig.update_xaxes(title_text="time since the first GPU event (ms)", row=rows, col=1)
    fig.update_yaxes(autorange="reversed")
    return fig


_TITLE_TOP_PX = 60  # a title alone
_MIN_PLOT_PX = 120


def collective_waits(source: Diagnosis | Trace | pd.DataFrame, *,
                     max_calls: int = 400, max_ranks: int = 64) -> go.Figure | None:
    """Rank x collective heatmap of the time each rank waited for the last one to arrive.

        trace = gpudiag.load(["rank0.json.gz", "rank1.json.gz"])
        fig = figures.collective_waits(gpudiag.diagnose(trace))
        fig.show() if fig else print("one rank: no skew")

    `source`: a Diagnosis (its `arrival_skew` table), a Trace (`arrival_skew` is run on
    it) or an `arrival_skew` frame. Columns are the matched collectives in time order; past
    `max_calls` consecutive ones share a column and the cells sum their waits; past
    `max_ranks`, consecutive ranks share a row the same way. None when fewer than two ranks
    matched a collective or nobody waited.
    """
    skew = _skew_of(source)
    if skew.empty or skew["rank"].nunique() < 2 or not (skew["wait_ns"] > 0).any():
        return None
    n = int(skew["match_id"].max()) + 1
    column = skew["match_id"].to_numpy(np.int64) * min(n, max_calls) // n
    ranks, rank_row = np.unique(skew["rank"].to_numpy(np.int64), return_inverse=True)
    rows = min(len(ranks), max_ranks)
    group = np.arange(len(ranks)) * rows // len(ranks)  # consecutive ranks share a row
    z = np.zeros((rows, min(n, max_calls)))
    np.add.at(z, (group[rank_row], column), skew["wait_ns"].to_numpy(np.float64) / 1e6)
    labels = _call_labels(skew, column, z.shape[1])
    fig = go.Figure(go.Heatmap(
        x=labels, y=_rank_labels(ranks, group, rows), z=z.round(6), colorscale="Reds", zmin=0,
        colorbar={"title": "wait (ms)"},
        hovertemplate="%{y}<br>%{x}<br>waited %{z:.3f} ms<extra></extra>"))
    fig.update_layout(title={"text": "Time each rank waited for its peers, per collective",
                             "y": 1.0, "yref": "container", "yanchor": "top",
                             "pad": {"t": 14}},
                      xaxis={"title": "collective (in time order)", "type": "category",
                             "showticklabels": False},
                      yaxis={"autorange": "reversed"}, margin={"t": _TITLE_TOP_PX,
                                                               "b": AXIS_BOTTOM_PX},
                      # the rows, but tall enough that the colorbar's ticks stay apart
                      height=_TITLE_TOP_PX + AXIS_BOTTOM_PX
                      + max(_ROW_PX * rows, _MIN_PLOT_PX))
    return fig


def _rank_labels(ranks: IntArray, group: IntArray, rows: int) -> list[str]:
    """'rank 3' per row, or 'ranks 8-15' for a row that several consecutive ranks share."""
    labels = []
    for row in range(rows):
        members = ranks[group == row]
        labels.append(f"rank {members[0]}" if len(members) == 1
                      else f"ranks {members[0]}-{members[-1]}")
    return labels


# -- utilization --------------------------------------------------------------------------


def _stream_events(trace: Trace) -> dict[str, np.ndarray] | None:
    """Kernels and copies as columns: start, end, a dense stream id (rows sorted by rank,
    device, stream), a name code, and the stream labels and names those codes refer to."""
    frames = [trace.kernels, trace.copies]
    if not trace.meta.get("timeline", True) or not any(len(f) for f in frames):
        return None
    cols = np.vstack([np.concatenate([keys.key_array(frame[column]) for frame in frames])
                      for column in ("rank", "device", "stream")])
    row, streams = _dense_rows(cols)
    kernel_names = short_names(trace.kernels["name"])
    copy_names = ("memcpy " + trace.copies["kind"].astype("string").fillna("?")).astype(
        "category")
    names = np.array([plotly_label(n) for n in  # per distinct name: plotly renders HTML
                      (*kernel_names.cat.categories, *copy_names.cat.categories)], dtype=object)
    name = np.concatenate([kernel_names.cat.codes.to_numpy(np.int64),
                           np.where(copy_names.cat.codes.to_numpy(np.int64) < 0, -1,
                                    copy_names.cat.codes.to_numpy(np.int64)
                                    + len(kernel_names.cat.categories))])
    labels = _device_labels(streams[0], streams[1])
    labels = np.array([f"{d} · stream {s}" if s >= 0 else f"{d} · no stream"
                       for d, s in zip(labels, streams[2], strict=True)], dtype=object)
    return {"start": np.concatenate([f["start_ns"].to_numpy(np.int64) for f in frames]),
            "end": np.concatenate([f["end_ns"].to_numpy(np.int64) for f in frames]),
            "row": row, "name": name, "names": names, "labels": labels}


def _dense_rows(cols: IntArray) -> tuple[IntArray, IntArray]:
    """Per event, a dense id of its (rank, device, stream) in sorted key order, and the
    (3 x streams) keys. Small ids (the usual case) combine arithmetically, so one hash
    pass over the events suffices; huge ones fall back to `keys.codes`."""
    lo = cols.min(axis=1)
    span = cols.max(axis=1) - lo + 1
    if float(np.prod(span.astype(float))) < 2**62:
        code = ((cols[0] - lo[0]) * span[1] + cols[1] - lo[1]) * span[2] + cols[2] - lo[2]
        inverse, uniq = pd.factorize(code)
        keys_of = np.vstack([uniq // (span[1] * span[2]), uniq // span[2] % span[1],
                             uniq % span[2]]) + lo[:, None]
    else:
        inverse, _ = pd.factorize(keys.codes(*cols))
        _, first = np.unique(inverse, return_index=True)
        keys_of = cols[:, first]
    order = np.lexsort(keys_of[::-1])
    dense = np.empty(len(order), np.int64)
    dense[order] = np.arange(len(order))
    return dense[inverse], keys_of[:, order]


def _edges(t0: int, t1: int, bins: int) -> IntArray:
    """`bins` + 1 strictly increasing integer edges from t0 to t1 (fewer bins when the
    span has fewer nanoseconds)."""
    n = int(max(1, min(bins, t1 - t0)))
    return t0 + np.round(np.linspace(0, max(t1 - t0, 1), n + 1)).astype(np.int64)


#: `bound_by` classes of a path that run on the GPU
_GPU_BOUND = ("gpu_compute", "gpu_communication")


def _path_rows(dx: Diagnosis | None, edges: IntArray
               ) -> tuple[list[str], FloatArray, npt.NDArray[np.object_]]:
    """Per rank, its critical path (`Diagnosis.critical_paths`) as a row: the share of each
    bin the path spends on GPU work, and the `bound_by` class holding most of its time
    there ("" where the path does not pass). No rows where the diagnosis has no paths."""
    paths = dx.critical_paths() if dx is not None else None
    if paths is None:
        return [], np.zeros((0, len(edges) - 1)), np.zeros((0, len(edges) - 1), dtype=object)
    paths = paths[(paths["ns"] > 0).to_numpy(bool) & (paths["bound_by"] != "").to_numpy(bool)]
    labels, busy, top = [], [], []
    width = np.diff(edges).astype(np.float64)
    for rank, path in paths.groupby(keys.key_array(paths["rank"]), sort=True):
        classes = sorted(set(path["bound_by"]))
        times = np.vstack([np.diff(intervals.covered_before(intervals.union(
            part["start_ns"], part["end_ns"]), edges)) for part in
            (path[path["bound_by"] == name] for name in classes)])
        gpu = sum((times[classes.index(name)] for name in _GPU_BOUND if name in classes),
                  np.zeros(len(width)))
        busy.append(gpu / width)
        top.append(np.where(times.sum(axis=0) > 0,
                            np.asarray(classes, dtype=object)[times.argmax(axis=0)], ""))
        labels.append("critical path" if rank == keys.MISSING else f"rank {rank} · critical path")
    if not labels:
        return [], np.zeros((0, len(edges) - 1)), np.zeros((0, len(edges) - 1), dtype=object)
    return labels, np.vstack(busy), np.vstack(top).astype(object)


def _busy_shares(ev: dict[str, np.ndarray], edges: IntArray) -> FloatArray:
    """(streams x bins) busy share: per stream, the union of its events, measured at the
    edges by cumulative coverage. One pass per stream, none per event."""
    order = np.argsort(ev["row"], kind="stable")
    bounds = np.searchsorted(ev["row"][order], np.arange(len(ev["labels"]) + 1))
    out = np.zeros((len(ev["labels"]), len(edges) - 1))
    for row in range(len(ev["labels"])):
        idx = order[bounds[row]:bounds[row + 1]]
        spans = intervals.union(ev["start"][idx], ev["end"][idx])
        out[row] = np.diff(intervals.covered_before(spans, edges))
    return np.asarray(out / np.diff(edges), dtype=np.float64)


def _top_names(ev: dict[str, np.ndarray], edges: IntArray) -> np.ndarray:
    """(streams x bins) name of the kernel (or copy) with the most time starting in each
    cell ("" where nothing started): a hint of what ran, grouped on the event's start."""
    rows, bins = len(ev["labels"]), len(edges) - 1
    cell = ev["row"] * bins + np.clip(np.searchsorted(edges, ev["start"], side="right") - 1,
                                      0, bins - 1)
    ncodes = len(ev["names"]) + 1
    per = pd.Series(ev["end"] - ev["start"]).groupby(cell * ncodes + ev["name"] + 1).sum()
    per = per.sort_values(ascending=False, kind="stable")
    key = per.index.to_numpy(np.int64)
    best = pd.Series(key % ncodes - 1, index=key // ncodes)
    best = best[~best.index.duplicated(keep="first")]
    names = np.append(ev["names"], "?")  # -1 (no name) picks the last entry
    out = np.full(rows * bins, "", dtype=object)
    out[best.index.to_numpy()] = names[best.to_numpy()]
    return out.reshape(rows, bins)


def _add_cause_rows(fig: go.Figure, dx: Diagnosis, edges: IntArray, x: FloatArray) -> None:
    """Per device, the bin's dominant loss cause as a categorical heatmap (row 2)."""
    assert dx.timeline is not None
    labels, codes, shares = [], [], []
    for key in sorted(dx.timeline.windows):
        amounts = dx.timeline.amounts(key, edges)
        times = np.vstack([amounts.get(c, np.zeros(len(edges) - 1)) for c in LOSS_CAUSES])
        lost = times[1:]
        code = np.where(lost.max(axis=0) > 0, lost.argmax(axis=0) + 1, 0).astype(float)
        code[times.sum(axis=0) <= 0] = np.nan  # outside the device's window
        labels.append(_device_labels(np.array([key[0]]), np.array([key[1]]))[0])
        codes.append(code)
        shares.append((times / np.diff(edges)).T.astype(np.float32))
    n = len(LOSS_CAUSES)
    scale = [[pos, CAUSE_COLORS[c]] for i, c in enumerate(LOSS_CAUSES)
             for pos in (i / n, (i + 1) / n)]
    hover = "<br>".join(f"{c}: %{{customdata[{i}]:.1%}}" for i, c in enumerate(LOSS_CAUSES))
    z = np.vstack(codes).astype(np.float32)
    fig.add_heatmap(x=x, y=labels, z=z, customdata=np.stack(shares),
                    zmin=-0.5, zmax=n - 0.5, colorscale=scale, name="causes", row=2, col=1,
                    showscale=False,
                    hovertemplate="%{y} at %{x:.3f} ms<br>" + hover + "<extra></extra>")
    # The colors' key is a legend (one swatch per cause, in a row over the plot): a
    # colorbar squeezed beside one or two device rows printed its seven labels on top of
    # each other. The swatches are empty scatters: they draw nothing and move no axis.
    for cause in LOSS_CAUSES:
        fig.add_scatter(x=[None], y=[None], mode="markers", name=cause, showlegend=True,
                        marker={"symbol": "square", "size": 12, "color": CAUSE_COLORS[cause]},
                        hoverinfo="skip", row=2, col=1)


# -- shared -------------------------------------------------------------------------------


def _device_labels(rank: pd.Series | np.ndarray, device: pd.Series | np.ndarray) -> np.ndarray:
    """'GPU d' or 'rank r · GPU d' per row (rank NA: not a distributed run; device NA:
    'GPU ?')."""
    ranks, devices = keys.key_array(rank), keys.key_array(device)
    gpus = [f"GPU {number}" if number != keys.MISSING else "GPU ?" for number in devices]
    return np.array([f"rank {number} · {gpu}" if number != keys.MISSING else gpu
                     for number, gpu in zip(ranks, gpus, strict=True)], dtype=object)


def _empty(reason: str) -> go.Figure:
    """A figure that says why it is empty (the reason is ours, never an input string)."""
    fig = go.Figure()
    fig.add_annotation(text=reason, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis={"visible": False}, yaxis={"visible": False}, height=160)
    return fig


# -- collectives --------------------------------------------------------------------------


def _skew_of(source: Diagnosis | Trace | pd.DataFrame) -> pd.DataFrame:
    if isinstance(source, pd.DataFrame):
        return source
    if isinstance(source, Diagnosis):
        return source.tables.get("arrival_skew", pd.DataFrame(columns=["rank", "wait_ns"]))
    return arrival_skew(source)


def _call_labels(skew: pd.DataFrame, column: IntArray, columns: int) -> list[str]:
    """One label per column: the collectives it holds, op and communicator of the first."""
    calls = skew.assign(column=column).drop_duplicates("match_id")
    per = calls.groupby("column").agg(first=("match_id", "min"), last=("match_id", "max"),
                                      op=("op", "first"), comm=("comm", "first"))
    per = per.reindex(range(columns))
    return [plotly_label(f"#{a}" + (f"-{b}" if b != a else "") + f" {op} ({comm})")
            for a, b, op, comm in per.itertuples(index=False, name=None)]
