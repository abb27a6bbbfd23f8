"""The allocator's figure: address x time occupancy under the fragmentation curve.

Drawn from `analyzers.memory.occupancy_grid` (what each stacked address bin held at each
sampled moment) and `analyzers.memory.allocator` (the allocator's state after every
event). Both are bounded before they reach the figure: the grid by its own
`max_addresses` x `max_times`, the curve by keeping the worst point of each of at most
`max_points` consecutive runs of events, so a peak survives the thinning.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gpudiag.analyzers import keys
from gpudiag.analyzers.memory.allocator import fragmentation, occupancy_grid
from gpudiag.analyzers.memory.grid import STATES
from gpudiag.trace import Trace

#: one fixed color per allocator state
STATE_COLORS = {"allocated": "#1f77b4", "inactive": "#ff7f0e", "unreserved": "#e5e5e5"}


def memory(trace: Trace, *, grid: pd.DataFrame | None = None,
           frag: pd.DataFrame | None = None, max_addresses: int = 128,
           max_times: int = 200, max_points: int = 2000) -> go.Figure | None:
    """Per device: the fragmentation curve above the allocator's address x time heatmap.

        trace = gpudiag.load("memory_snapshot.pickle")
        fig = figures.memory(trace)
        fig.show() if fig else print("no allocator snapshot")

    Each heatmap cell is colored by what most of its bytes did (allocated, inactive = free
    inside a segment, unreserved); the hover gives the three shares. Pass `grid` / `frag`
    to reuse analyzer results. Without a snapshot there is no block layout to draw: then
    the allocated / reserved curves of `memory_curves`, or None without memory data.
    """
    if grid is None:
        grid = occupancy_grid(trace, max_addresses=max_addresses, max_times=max_times) \
            if layout_fits(trace) else pd.DataFrame()  # else: the curves, which need no layout
    if grid.empty:
        return memory_curves(trace, frag=frag, max_points=max_points)
    frag = fragmentation(trace) if frag is None else frag
    devices = sorted(set(zip(*_keys(grid), strict=True)))
    fig = make_subplots(rows=2 * len(devices), cols=1, shared_xaxes=True,
                        vertical_spacing=0.04, row_heights=[0.25, 0.75] * len(devices))
    t0 = _origin(grid)
    for i, (rank, device) in enumerate(devices):
        cells = grid[_is(grid, rank, device)]
        _add_curve(fig, frag[_is(frag, rank, device)], t0, 2 * i + 1, max_points)
        _add_grid(fig, cells, t0, 2 * i + 2, first=i == 0)
        fig.update_yaxes(title_text="fragmentation", range=[0, 1], row=2 * i + 1, col=1)
        fig.update_yaxes(title_text=f"GPU {device}: stacked address (GB)",
                         row=2 * i + 2, col=1)
    fig.update_xaxes(title_text="time since the first allocator event (ms)",
                     row=2 * len(devices), col=1)
    fig.update_layout(title="Allocator occupancy and fragmentation",
                      height=200 + 420 * len(devices), showlegend=False)
    return fig


def _keys(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rank and device of each row as int64 keys (`keys.key_array`: NA as keys.MISSING;
    the memory table's host device, -1, is the same number and drawn apart from GPUs)."""
    return keys.key_array(frame["rank"]), keys.key_array(frame["device"])


def _is(frame: pd.DataFrame, rank: int, device: int) -> np.ndarray:
    r, d = _keys(frame)
    return np.asarray((r == rank) & (d == device))


def _origin(grid: pd.DataFrame) -> int:
    """The first known event time: the time axis's zero (-1 marks an unknown time)."""
    ts = grid["ts_ns"].to_numpy(np.int64)
    known = ts[ts >= 0]
    return int(known.min()) if len(known) else 0


def _ms(ts: np.ndarray, t0: int) -> np.ndarray:
    """ms since t0; unknown times (-1, a snapshot without history) are put at 0."""
    return np.where(ts >= 0, (ts - t0) / 1e6, 0.0)


def _add_curve(fig: go.Figure, frag: pd.DataFrame, t0: int, row: int,
               max_points: int) -> None:
    """The fragmentation ratio, thinned to the worst point of each run of events."""
    ratio = frag["fragmentation"].to_numpy(np.float64)
    keep = ~np.isnan(ratio)
    if not keep.any():
        return
    rows = np.flatnonzero(keep)
    chunks = np.array_split(np.arange(len(rows)), min(len(rows), max_points))
    pick = rows[[c[np.argmax(ratio[rows[c]])] for c in chunks]]  # per chunk, not per event
    free_gb = frag["free_bytes"].to_numpy(np.float64, na_value=np.nan)[pick] / 1e9
    largest_gb = frag["largest_free_bytes"].to_numpy(np.float64, na_value=np.nan)[pick] / 1e9
    fig.add_scatter(x=_ms(frag["ts_ns"].to_numpy(np.int64)[pick], t0), y=ratio[pick].round(4),
                    mode="lines", line={"color": "#d62728"}, name="fragmentation",
                    customdata=np.column_stack([free_gb, largest_gb]).round(4), row=row, col=1,
                    hovertemplate="%{x:.3f} ms: fragmentation %{y:.1%}<br>free %{customdata[0]"
                    ":.3f} GB, largest free block %{customdata[1]:.3f} GB<extra></extra>")


def _add_grid(fig: go.Figure, cells: pd.DataFrame, t0: int, row: int, *, first: bool) -> None:
    """The occupancy grid as a categorical heatmap: address bins up, sampled moments across."""
    times = int(cells["time_bin"].max()) + 1
    bins = int(cells["address_bin"].max()) + 1
    cells = cells.sort_values(["address_bin", "time_bin"], kind="stable")
    code = pd.Categorical(cells["state"], categories=list(STATES)).codes
    shares = cells[["allocated_share", "inactive_share", "unreserved_share"]].to_numpy(
        np.float64).reshape(bins, times, 3).astype(np.float32)
    ts = cells["ts_ns"].to_numpy(np.int64)[:times]
    n = len(STATES)
    scale = [[pos, STATE_COLORS[s]] for i, s in enumerate(STATES)
             for pos in (i / n, (i + 1) / n)]
    fig.add_heatmap(
        x=_ms(ts, t0), y=(cells["offset_bytes"].to_numpy(np.int64)[::times] / 1e9).round(4),
        z=code.reshape(bins, times).astype(np.int8), customdata=shares, zmin=-0.5, zmax=n - 0.5,
        colorscale=scale, showscale=first, row=row, col=1,
        colorbar={"title": "state", "tickvals": list(range(n)), "ticktext": list(STATES)},
        hovertemplate="%{x:.3f} ms, %{y:.3f} GB<br>allocated %{customdata[0]:.1%}<br>"
        "inactive %{customdata[1]:.1%}<br>unreserved %{customdata[2]:.1%}<extra></extra>")


#: the largest address or stacked offset the allocator replay can hold (int64)
INT64_MAX = np.iinfo(np.int64).max


def layout_fits(trace: Trace) -> bool:
    """True when every block and segment ends inside int64 and their sizes sum inside it.

    A snapshot with addresses or sizes near 2**63 (no allocator has them; a damaged or
    hand-made file can) cannot be laid out on a 64-bit address axis: its figure falls back
    to the allocated / reserved curves instead of overflowing."""
    blocks, events = trace.memory_blocks, trace.memory
    pairs = [(blocks["addr"], blocks["bytes"]), (blocks["segment_addr"], blocks["segment_bytes"]),
             (events["addr"], events["bytes"])]
    for addr, size in pairs:
        a = addr.to_numpy(dtype="float64", na_value=0.0)
        n = np.clip(size.to_numpy(dtype="float64", na_value=0.0), 0, None)
        if len(a) and (np.abs(a) + n >= 2.0 ** 62).any():  # float: exact enough with margin
            return False
    sizes = blocks.drop_duplicates(["device", "segment_addr"])["segment_bytes"]
    return float(sizes.astype("float64").fillna(0).abs().sum()) < 2.0 ** 62


def memory_curves(trace: Trace, *, frag: pd.DataFrame | None = None,
                  max_points: int = 2000) -> go.Figure | None:
    """Allocated and reserved bytes over time per device, for traces with allocator totals
    but no snapshot (PyTorch profiler `profile_memory=True`, `export_memory_timeline`).

        fig = figures.memory_curves(gpudiag.load("rank0.pt.trace.json.gz"))
        fig.show() if fig else print("no memory events")

    Each curve keeps at most `max_points` points, every point the highest of its run of
    events, so peaks survive the thinning. None when the trace has no memory totals.
    """
    frag = fragmentation(trace) if frag is None else frag
    frag = frag[frag["ts_ns"] >= 0]
    if frag.empty:
        return None
    fig = go.Figure()
    t0 = int(frag["ts_ns"].min())
    for rank, device in sorted(set(zip(*_keys(frag), strict=True))):
        mine = frag[_is(frag, rank, device)]
        gpu = f"GPU {device}" if device >= 0 else "device not recorded"
        label = gpu if rank < 0 else f"rank {rank} {gpu}"
        for col, name in (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved")):
            values = mine[col].to_numpy(dtype="float64", na_value=np.nan)
            if np.isnan(values).all():
                continue
            x, y = _thinned(mine["ts_ns"].to_numpy(np.int64), values, max_points)
            fig.add_trace(go.Scatter(x=_ms(x, t0), y=y / 1e9, mode="lines",
                                     name=f"{label} {name}"))
    fig.update_layout(title="Allocator memory over time (no snapshot: no block layout)",
                      xaxis_title="time since the first memory event (ms)",
                      yaxis_title="GB", height=420)
    return fig if fig.data else None


def _thinned(ts: np.ndarray, values: np.ndarray, max_points: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` points: each the maximum of an equal run of samples."""
    if len(ts) <= max_points:
        return ts, values
    groups = np.array_split(np.arange(len(ts)), max_points)
    best = np.array([g[np.nanargmax(values[g])] if not np.isnan(values[g]).all() else g[0]
                     for g in groups])  # one per output point, bounded by max_points
    return ts[best], values[best]
