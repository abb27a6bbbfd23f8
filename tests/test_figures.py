"""Figures, tested on their data (`fig.to_dict()`), not on pixels: exact busy shares per
bin, loss rows that add up to the waterfall, bounded size for ten million kernels, input
strings kept as data, and every real fixture drawn without error."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.collectives.skew import arrival_skew
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.analyzers.findings import LOSS_CAUSES
from gpudiag.analyzers.losses.waterfall import LossTimeline
from gpudiag.analyzers.memory.allocator import fragmentation
from gpudiag.reports import figures
from gpudiag.trace import Trace
from tests.builders import kernel, trace
from tests.conftest import fixture, fixtures, plotly_array

FIVE_MB = 5 * 1024 * 1024
EVIL = "<script>alert(1)</script>"
TIMELINE_FIXTURES = [*fixtures("kineto/*.json*"), *fixtures("nsys/*.sqlite")]
SNAPSHOTS = [p.name for p in fixtures("memsnap/*.pickle")]
PAIR = ["kineto/world128_sampled_rank0.json.gz", "kineto/world128_sampled_rank1.json.gz"]




def _heatmaps(fig: Any) -> list[dict[str, Any]]:
    return [t for t in fig.to_dict()["data"] if t["type"] == "heatmap"]


def _loss_totals_from_figure(fig: Any) -> dict[str, np.ndarray]:
    """Per cause, the time of the loss rows summed over bins (share x bin width), in ns."""
    rows = _heatmaps(fig)[1]
    width_ns = np.diff(plotly_array(rows["x"])) * 1e6
    shares = plotly_array(rows["customdata"])  # devices x bins x causes
    summed = (shares * width_ns[None, :, None]).sum(axis=1)
    return {c: summed[:, i] for i, c in enumerate(LOSS_CAUSES)}


def _two_streams() -> Trace:
    # stream 7: [0,100) and [50,150) overlap, [300,400); stream 8 busy throughout
    return trace(kernels=[kernel(0, 100), kernel(50, 150), kernel(300, 400),
                          kernel(0, 400, "other", stream=8)])


def test_busy_shares_per_bin_are_the_union_of_each_streams_events() -> None:
    fig = figures.utilization(_two_streams(), None, bins=4)
    (busy,) = _heatmaps(fig)
    assert plotly_array(busy["x"]) == pytest.approx([0, 1e-4, 2e-4, 3e-4, 4e-4])  # edges in ms
    assert list(plotly_array(busy["y"])) == ["GPU 0 · stream 7", "GPU 0 · stream 8"]
    assert plotly_array(busy["z"]).tolist() == [[1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]


def test_bins_tile_the_span_when_bins_do_not_divide_it() -> None:
    tr = trace(kernels=[kernel(0, 7), kernel(10, 1003, stream=9)])
    (busy,) = _heatmaps(figures.utilization(tr, None, bins=7))
    width = np.diff(plotly_array(busy["x"]) * 1e6)
    assert width.sum() == pytest.approx(1003)
    covered = (plotly_array(busy["z"]) * width).sum(axis=1)
    assert covered == pytest.approx([7, 993], abs=0.01)  # z is float32


def test_hover_names_the_kernel_with_most_time_in_each_cell() -> None:
    tr = trace(kernels=[kernel(0, 10, "a"), kernel(10, 90, "b"), kernel(100, 200, "a")])
    (busy,) = _heatmaps(figures.utilization(tr, None, bins=2))
    assert plotly_array(busy["customdata"]).tolist() == [["b", "a"]]


def test_loss_row_shows_the_dominant_cause_and_adds_up_to_the_waterfall() -> None:
    tr = _two_streams()
    tr.kernels = tr.kernels[tr.kernels["stream"] == 7]  # idle [150, 300): launch_bound
    dx = gpudiag.diagnose(tr)
    fig = figures.utilization(tr, dx, bins=4)
    rows = _heatmaps(fig)[1]
    cause = [LOSS_CAUSES[int(c)] for c in plotly_array(rows["z"])[0]]
    assert cause == ["useful", "launch_bound", "launch_bound", "useful"]
    totals = _loss_totals_from_figure(fig)
    lost = dx.losses.set_index("cause")["lost_ns"]
    for c in LOSS_CAUSES:
        assert totals[c][0] == pytest.approx(lost[c], abs=0.5)


@pytest.mark.parametrize("path", TIMELINE_FIXTURES, ids=lambda p: p.name)
def test_every_timeline_fixture_draws_bounded_figures(path: Any) -> None:
    tr = gpudiag.load(path)
    dx = gpudiag.diagnose(tr)
    bars = figures.waterfall(dx)
    per_device = pd.DataFrame([
        (y, x) for t in bars.to_dict()["data"]
        for y, x in zip(plotly_array(t["y"]), plotly_array(t["x"]), strict=True)])
    assert per_device.groupby(0)[1].sum().to_numpy() == pytest.approx(1.0)
    heat = figures.utilization(tr, dx)
    assert len(heat.to_json()) < FIVE_MB
    assert len(_heatmaps(heat)[0]["x"]) <= 401
    if dx.timeline is not None and dx.timeline.windows:
        totals = _loss_totals_from_figure(heat)
        keys = sorted(dx.timeline.windows)
        for i, key in enumerate(keys):
            window = dx.timeline.windows[key][1] - dx.timeline.windows[key][0]
            mine = dx.losses[(dx.losses["rank"].fillna(-1) == key[0])
                             & (dx.losses["device"] == key[1])].set_index("cause")["lost_ns"]
            for c in LOSS_CAUSES:  # shares are float32
                assert totals[c][i] == pytest.approx(mine[c], abs=1e-3 * window)
    assert figures.collective_waits(dx) is None  # one rank per file: no skew


def test_waterfall_keeps_the_cause_order_and_colors() -> None:
    dx = gpudiag.diagnose(_two_streams())
    data = figures.waterfall(dx).to_dict()["data"]
    assert [t["name"] for t in data] == list(LOSS_CAUSES)
    assert [t["marker"]["color"] for t in data] == [figures.CAUSE_COLORS[c] for c in LOSS_CAUSES]


def test_collective_waits_of_the_world128_pair_sum_each_ranks_waits() -> None:
    tr = gpudiag.load([fixture(p) for p in PAIR])
    skew = arrival_skew(tr)
    fig = figures.collective_waits(gpudiag.diagnose(tr))
    assert fig is not None
    (heat,) = _heatmaps(fig)
    z = plotly_array(heat["z"])
    assert list(plotly_array(heat["y"])) == ["rank 0", "rank 1"]
    assert z.shape == (2, skew["match_id"].nunique())
    per_rank = skew.groupby("rank")["wait_ns"].sum().to_numpy() / 1e6
    assert z.sum(axis=1) == pytest.approx(per_rank, abs=1e-5)
    binned = _heatmaps(figures.collective_waits(tr, max_calls=3))[0]
    assert plotly_array(binned["z"]).shape == (2, 3)
    assert plotly_array(binned["z"]).sum(axis=1) == pytest.approx(per_rank, abs=1e-5)


def _skew_rows(comm: str) -> pd.DataFrame:
    return pd.DataFrame({"match_id": [0, 0], "rank": [0, 1], "op": ["all_reduce"] * 2,
                         "comm": [comm, comm], "wait_ns": [5_000, 0]})


def test_input_strings_are_data_never_markup() -> None:
    tr = trace(kernels=[kernel(0, 100, EVIL), kernel(200, 300, EVIL)])
    built = [figures.utilization(tr, gpudiag.diagnose(tr), bins=3),
             figures.collective_waits(_skew_rows(EVIL))]
    for fig in built:
        assert fig is not None
        as_dict = fig.to_dict()
        assert "<script>" not in repr(as_dict["layout"])
        assert all("<script>" not in t.get("hovertemplate", "") for t in as_dict["data"])
        assert "<script>" not in repr(as_dict["data"])  # plotly renders label HTML:
        assert "&lt;script&gt;" in repr(as_dict["data"])  # shown as text, escaped for it
        page = fig.to_html(include_plotlyjs=False)  # the string survives only escaped
        assert "<script>alert" not in page and "&lt;script&gt;alert" in page
        assert page.count("<script") == page.count("</script>") == 1  # plotly's own


def test_collective_waits_is_none_without_skew() -> None:
    assert figures.collective_waits(_skew_rows("0").assign(wait_ns=0)) is None
    assert figures.collective_waits(_skew_rows("0").iloc[:1]) is None


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_memory_figure_of_each_snapshot(name: str) -> None:
    tr = gpudiag.load(fixture(f"memsnap/{name}"))
    fig = figures.memory(tr)
    assert fig is not None
    assert len(fig.to_json()) < FIVE_MB
    (heat,) = _heatmaps(fig)
    shares = plotly_array(heat["customdata"])
    assert shares.shape[:2] == plotly_array(heat["z"]).shape
    assert shares.shape[0] <= 128 and shares.shape[1] <= 200
    assert shares.sum(axis=2) == pytest.approx(1.0, abs=1e-3)
    (curve,) = [t for t in fig.to_dict()["data"] if t["type"] == "scatter"]
    frag = fragmentation(tr)["fragmentation"]
    assert max(plotly_array(curve["y"])) == pytest.approx(frag.max(), abs=1e-4)  # the peak survives
    assert len(plotly_array(curve["y"])) <= 2000


def test_memory_heatmap_needs_a_snapshot_curves_need_memory_events() -> None:
    timeline = figures.memory(gpudiag.load(fixture("memsnap/hta_memory_timeline.raw.json.gz")))
    assert timeline is not None  # allocated bytes over time, but no block layout to draw
    assert {d.type for d in timeline.data} == {"scatter"}
    assert figures.memory(_two_streams()) is None


def _ten_million() -> tuple[Trace, Diagnosis]:
    """10M back-to-back kernels on 4 streams, built with numpy, and the diagnosis a
    launch-bound gap model gives them (built directly: diagnose() itself takes a minute)."""
    n = 10_000_000
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.integers(500, 1500, n)).astype(np.int64)
    end = start + rng.integers(100, 500, n)
    kernels = pd.DataFrame({
        "device": np.zeros(n, np.int64), "stream": np.arange(n, dtype=np.int64) % 4,
        "start_ns": start, "end_ns": end, "kernel_id": np.arange(n, dtype=np.int64),
        "name": pd.Categorical.from_codes(np.arange(n) % 3, ["gemm", "relu", EVIL])})
    gaps = (end[:-1], start[1:], np.ones(n - 1))
    timeline = LossTimeline(windows={(-1, 0): (int(start[0]), int(end[-1]))},
                            layers={(-1, 0): {"launch_bound": gaps}})
    dx = Diagnosis(losses=timeline.totals(), findings=pd.DataFrame(), timeline=timeline)
    return Trace(kernels=kernels), dx


@pytest.mark.slow
def test_ten_million_kernels_stay_under_five_megabytes() -> None:
    tr, dx = _ten_million()
    began = time.perf_counter()
    fig = figures.utilization(tr, dx)
    assert time.perf_counter() - began < 60  # a Python loop per kernel would take minutes
    assert len(fig.to_json()) < FIVE_MB
    busy, causes = _heatmaps(fig)
    assert plotly_array(busy["z"]).shape == (4, 400)
    totals = _loss_totals_from_figure(fig)
    lost = dx.losses.set_index("cause")["lost_ns"]
    window = dx.timeline.windows[(-1, 0)][1] - dx.timeline.windows[(-1, 0)][0]  # type: ignore[union-attr]
    assert totals["launch_bound"][0] == pytest.approx(lost["launch_bound"], abs=1e-3 * window)
    assert plotly_array(causes["z"]).shape == (1, 400)


def test_memory_curves_without_a_snapshot_keep_the_peak() -> None:
    from gpudiag.analyzers.memory.allocator import fragmentation
    from gpudiag.reports import figures_memory

    t = gpudiag.load(fixture("kineto/v100_rank1of2_nccl_profile_memory.json.gz"))
    fig = figures_memory.memory(t)
    assert fig is not None and len(fig.data) == 2
    frag = fragmentation(t)
    peak = float(frag["allocated_bytes"].max()) / 1e9
    allocated = next(d for d in fig.data if d.name.endswith("allocated"))
    assert max(plotly_array(allocated.y)) == pytest.approx(peak)
    assert len(plotly_array(allocated.x)) <= 2000
    alexnet = gpudiag.load(fixture("kineto/a100_alexnet_sync_critical_path.json.gz"))
    assert figures_memory.memory(alexnet) is None


# -- sized from their content (issue 11) -----------------------------------------------------


def test_waterfall_is_as_tall_as_its_devices_and_shows_its_whole_key() -> None:
    """The cause key is one row over the bars (a vertical legend beside one bar scrolled),
    and the height is the title, the key, the axis and 40 px a device: no blank band."""
    one = figures.waterfall(gpudiag.diagnose(_two_streams()))
    pair = figures.waterfall(gpudiag.diagnose(gpudiag.load([fixture(p) for p in PAIR])))
    for fig, devices in ((one, 1), (pair, 2)):
        assert fig.layout.legend.orientation == "h" and fig.layout.legend.yanchor == "bottom"
        fixed = fig.layout.margin.t + fig.layout.margin.b
        assert fig.layout.height == fixed + 40 * devices
    assert pair.layout.height - one.layout.height == 40


def test_utilization_cause_key_is_a_legend_of_every_cause() -> None:
    """The device rows' colors are explained by a legend swatch per cause (a colorbar as
    short as one device row printed its labels on top of each other); swatches draw no data."""
    tr = _two_streams()
    fig = figures.utilization(tr, gpudiag.diagnose(tr), bins=4)
    causes = _heatmaps(fig)[1]
    assert causes.get("showscale") is False
    swatches = [t for t in fig.to_dict()["data"] if t["type"] == "scatter"]
    assert [t["name"] for t in swatches] == list(LOSS_CAUSES)
    assert [t["marker"]["color"] for t in swatches] == [figures.CAUSE_COLORS[c]
                                                        for c in LOSS_CAUSES]
    assert all(list(t["x"]) == [None] and t["showlegend"] for t in swatches)
    assert fig.layout.legend.itemclick is False
    assert fig.layout.height >= fig.layout.margin.t + fig.layout.margin.b + 120
    without = figures.utilization(tr, None, bins=4)  # no loss rows: no key
    assert [t.type for t in without.data] == ["heatmap"]


def test_collective_waits_of_two_ranks_keep_room_for_their_colorbar() -> None:
    """Two rank rows are 48 px: the figure keeps 120 px of plot so the wait colorbar's
    ticks do not print on top of each other."""
    fig = figures.collective_waits(gpudiag.diagnose(gpudiag.load([fixture(p) for p in PAIR])))
    assert fig is not None and len(fig.data[0].y) == 2
    assert fig.layout.height == fig.layout.margin.t + fig.layout.margin.b + 120
