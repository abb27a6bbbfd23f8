"""The NVML samples figure: utilization, memory, power, temperature, SM clock and link
traffic of every GPU over time.

Drawn from `analyzers.gpu_samples.nvml_rows` (the NVML metrics of the `samples` table in
their documented units): this module only lays them out. Each line keeps at most
`max_points` points, so a ten-hour run at 10 Hz (360,000 samples per metric and GPU) gives
the same JSON size as a ten-minute one: consecutive samples are bucketed, each bucket drawn
at its highest sample (a power spike or memory peak survives the thinning) with the
bucket's mean and size in the hover. Names and labels are ours (metric names, device
numbers), never input strings.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from gpudiag.analyzers import keys
from gpudiag.analyzers.gpu_samples import nvml_rows
from gpudiag.trace import Trace

#: one subplot row per group: (title, unit shown, ((metric, label, scale to the unit), ...))
GROUPS: tuple[tuple[str, str, tuple[tuple[str, str, float], ...]], ...] = (
    ("utilization", "%", (("gpu_util", "GPU util", 1.0), ("mem_util", "memory util", 1.0))),
    ("memory", "GiB", (("mem_used", "memory used", 2.0**-30),
                       ("mem_total", "memory total", 2.0**-30))),
    ("power", "W", (("power", "power", 1.0),)),
    ("temperature", "°C", (("temperature", "temperature", 1.0),)),
    ("SM clock", "MHz", (("sm_clock", "SM clock", 1.0),)),
    ("PCIe / NVLink", "GB/s", (("pcie_tx", "PCIe tx", 1e-9), ("pcie_rx", "PCIe rx", 1e-9),
                               ("nvlink_tx", "NVLink tx", 1e-9),
                               ("nvlink_rx", "NVLink rx", 1e-9))),
)
#: the line style of the metrics within a row; the color is the device's
DASHES = ("solid", "dash", "dot", "dashdot")
COLORS = qualitative.Plotly
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Line = tuple[IntArray, FloatArray]


def gpu_samples(trace: Trace, *, max_points: int = 2000) -> go.Figure | None:
    """One row per metric group, one line per GPU and metric, on a shared time axis.

        trace = gpudiag.load("runs/latest/trace")
        fig = figures_samples.gpu_samples(trace)
        fig.show() if fig else print("no NVML samples")

    Rows (only those with data): utilization (gpu_util, mem_util, %), memory (used and total,
    GiB), power (W), temperature (°C), SM clock (MHz), PCIe / NVLink throughput (GB/s, each
    direction). x is seconds since the trace's start: its first GPU event or first sample,
    whichever is earlier, so the rows line up with the utilization heatmap's kernels. Lines
    longer than `max_points` are bucketed (see the module docstring). None when the trace
    has no NVML samples.
    """
    rows = nvml_rows(trace)
    lines = _lines(rows)
    groups = [g for g in GROUPS if any(key[2] == m for key in lines for m, _, _ in g[2])]
    if not groups:
        return None
    t0 = _origin(trace, rows)
    gpus = sorted({key[:2] for key in lines})
    fig = make_subplots(rows=len(groups), cols=1, shared_xaxes=True, vertical_spacing=0.03)
    for row, (title, unit, metrics) in enumerate(groups, start=1):
        for color, (rank, device) in enumerate(gpus):
            label = _gpu_label(rank, device)
            for dash, (metric, name, scale) in enumerate(metrics):
                line = lines.get((rank, device, metric))
                if line is not None:
                    style = {"color": COLORS[color % len(COLORS)],
                             "dash": DASHES[dash % len(DASHES)], "width": 1.5}
                    _add_line(fig, line, row=row, t0=t0, max_points=max_points, group=label,
                              name=f"{label} {name}", unit=unit, scale=scale, style=style)
        fig.update_yaxes(title_text=f"{title} ({unit})", row=row, col=1,
                         range=[0, 105] if unit == "%" else None, rangemode="tozero")
    fig.update_xaxes(title_text="time since the trace's start (s)", row=len(groups), col=1)
    fig.update_layout(title="GPU samples (NVML)", height=160 + 180 * len(groups),
                      hovermode="closest")
    return fig


def _lines(rows: pd.DataFrame) -> dict[tuple[int, int, str], Line]:
    """(rank, device, metric) -> (ts_ns, value) of each series; `rows` is sorted by them,
    so each series is one slice (found with one diff, no grouping per row)."""
    if rows.empty:
        return {}
    rank, device = keys.key_array(rows["rank"]), keys.key_array(rows["device"])
    code = rows["metric"].cat.codes.to_numpy(np.int64)
    change = (np.diff(rank) != 0) | (np.diff(device) != 0) | (np.diff(code) != 0)
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    ends = np.append(starts[1:], len(rows))
    ts, value = rows["ts_ns"].to_numpy(np.int64), rows["value"].to_numpy(np.float64)
    names = rows["metric"].cat.categories
    return {(int(rank[a]), int(device[a]), str(names[code[a]])): (ts[a:b], value[a:b])
            for a, b in zip(starts, ends, strict=True)}  # one entry per series


def _origin(trace: Trace, rows: pd.DataFrame) -> int:
    """The x axis's zero: the first GPU event or the first sample, whichever is earlier."""
    first = int(rows["ts_ns"].min())
    window = trace.gpu_window_ns()
    return min(first, window[0]) if window is not None else first


def _gpu_label(rank: int, device: int) -> str:
    gpu = f"GPU {device}" if device >= 0 else "GPU ?"
    return gpu if rank < 0 else f"rank {rank} · {gpu}"


def _add_line(fig: go.Figure, line: Line, *, row: int, t0: int, max_points: int, group: str,
              name: str, unit: str, scale: float, style: dict[str, object]) -> None:
    """One series as a line, bucketed past `max_points`; the hover says how it was thinned."""
    ts, peak, mean, count = bucketed(line[0], line[1], max_points)
    thinned = bool((count > 1).any())
    hover = (f"{name}<br>%{{x:.3f}} s: max %{{y:.4g}} {unit} of %{{customdata[1]}} samples "
             f"(mean %{{customdata[0]:.4g}} {unit})<extra></extra>" if thinned else
             f"{name}<br>%{{x:.3f}} s: %{{y:.4g}} {unit}<extra></extra>")
    fig.add_scatter(x=(ts - t0) / 1e9, y=(peak * scale).astype(np.float32),  # 4 bytes a point
                    customdata=np.column_stack([mean * scale, count]).astype(np.float32)
                    if thinned else None,
                    mode="lines", name=name, legendgroup=group, line=style,
                    hovertemplate=hover, row=row, col=1)


def bucketed(ts: IntArray, values: FloatArray, max_points: int
             ) -> tuple[IntArray, FloatArray, FloatArray, IntArray]:
    """At most `max_points` buckets of consecutive samples, each kept by its highest one.

        ts, peak, mean, n = bucketed(ts, power, 2000)
        assert peak.max() == power.max()      # the peak survives
        assert n.sum() == len(power)

    Per bucket: the time and value of its highest sample, its mean and its size (all
    vectorized: `reduceat` over the bucket starts, one sort for the argmax). Series of
    `max_points` or fewer come back whole (size 1 each).
    """
    n = len(values)
    if n <= max_points:
        return ts, values, values, np.ones(n, dtype=np.int64)
    bucket = np.arange(n, dtype=np.int64) * max_points // n  # n > max_points: none empty
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    sizes = np.diff(np.append(starts, n))
    best = np.lexsort((-values, bucket))[starts]  # per bucket, its highest sample first
    means = np.add.reduceat(values, starts) / sizes
    return ts[best], values[best], means, sizes.astype(np.int64)
