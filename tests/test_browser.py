"""The HTML opens and draws in a real browser (headless Chromium through Playwright).

For now the pages are built here with plotly (a heatmap page; two figures sharing one inlined
plotly.js), plus broken pages that the harness must catch, so it cannot pass silently. Skips
with the reason when chromium or playwright is missing; CI sets GPUDIAG_REQUIRE_BROWSER=1 so
there it fails instead. Screenshots: under pytest's tmp dir (paths printed, see `-s`/`-rA`),
copied into $GPUDIAG_BROWSER_ARTIFACTS when set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from tests.browser import Result, open_report, require_browser

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def _browser_available() -> None:
    require_browser()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("browser")


def heatmap_figure() -> go.Figure:
    rng = np.random.default_rng(0)
    z = rng.random((8, 40))
    fig = go.Figure(go.Heatmap(z=z, y=[f"rank {i}" for i in range(8)], colorscale="Viridis"))
    fig.update_layout(title="rank × time-bin utilisation")
    return fig


def bar_figure() -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=["compute", "comm", "idle"], y=[60, 25, 15], name="step 1")
    fig.add_bar(x=["compute", "comm", "idle"], y=[55, 30, 15], name="step 2")
    fig.add_scatter(x=["compute", "comm", "idle"], y=[57, 28, 15], name="mean")
    return fig


def two_figure_page(first: go.Figure, second: go.Figure, extra: str = "") -> str:
    """One page, plotly.js inlined once (with the first figure), the second div reusing it."""
    one = pio.to_html(first, include_plotlyjs=True, full_html=False)
    two = pio.to_html(second, include_plotlyjs=False, full_html=False)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>two figures</title></head>"
        f"<body><h1>Report</h1>{one}<h2>Second</h2>{two}{extra}</body></html>"
    )


def show(result: Result) -> None:
    print(f"screenshot: {result.screenshot_path} ({result.seconds:.1f} s)")


def assert_clean(result: Result, traces: list[int]) -> None:
    assert result.console_errors == []
    assert result.page_errors == []
    assert result.external_requests == []
    assert not result.timed_out
    assert result.plots == len(traces)
    assert result.drawn == result.plots
    assert result.traces_per_plot == traces
    assert result.ok
    assert result.screenshot_path.stat().st_size > 1000


def test_heatmap_page_draws(pages: Path) -> None:
    fig = heatmap_figure()
    page = pages / "heatmap.html"
    page.write_text(pio.to_html(fig, include_plotlyjs=True, full_html=True), encoding="utf-8")
    result = open_report(page)
    show(result)
    assert_clean(result, [len(fig.data)])


def test_two_figures_share_one_plotlyjs(pages: Path) -> None:
    first, second = heatmap_figure(), bar_figure()
    html = two_figure_page(first, second)
    assert html.count("window.Plotly = Plotly") == 1  # plotly.js really is inlined once
    page = pages / "two_figures.html"
    page.write_text(html, encoding="utf-8")
    result = open_report(page, pages / "shots" / "two_figures.png")
    show(result)
    assert result.screenshot_path == pages / "shots" / "two_figures.png"
    assert_clean(result, [len(first.data), len(second.data)])


def test_script_error_is_caught(pages: Path) -> None:
    """A page that throws and logs an error must not pass, even though its plots drew."""
    extra = (
        "<script>console.error('gpudiag deliberate console error');</script>"
        "<script>null.gpudiagDeliberate();</script>"
    )
    page = pages / "broken_script.html"
    page.write_text(two_figure_page(heatmap_figure(), bar_figure(), extra), encoding="utf-8")
    result = open_report(page)
    show(result)
    assert any("gpudiag deliberate console error" in e for e in result.console_errors)
    assert any("gpudiagDeliberate" in e for e in result.page_errors)
    assert not result.ok


def test_missing_plotlyjs_is_caught(pages: Path) -> None:
    """A report that forgot to inline plotly.js: ReferenceError, and nothing drawn."""
    page = pages / "no_plotlyjs.html"
    html = pio.to_html(heatmap_figure(), include_plotlyjs=False, full_html=True)
    page.write_text(html, encoding="utf-8")
    result = open_report(page, timeout_s=10)
    show(result)
    assert any("plotly.js never loaded" in e for e in result.page_errors)
    assert result.plots == 1
    assert result.drawn == 0
    assert not result.ok


def test_cdn_plotlyjs_is_caught(pages: Path) -> None:
    """A report that loads plotly.js from a CDN is not self-contained: the request is blocked
    and recorded, and the plot does not draw (as it would not offline)."""
    page = pages / "cdn.html"
    html = pio.to_html(heatmap_figure(), include_plotlyjs="cdn", full_html=True)
    page.write_text(html, encoding="utf-8")
    result = open_report(page, timeout_s=10)
    show(result)
    assert any(url.startswith("https://") for url in result.external_requests)
    assert result.drawn == 0
    assert not result.ok


def test_failing_newplot_is_caught(pages: Path) -> None:
    """Plotly.newPlot on a missing element throws (plotly.js 4; a rejected promise is
    reported the same way); the two good plots still draw, and the page still fails."""
    extra = "<script>Plotly.newPlot('no-such-div', [{type: 'bar', y: [1]}]);</script>"
    page = pages / "rejected.html"
    page.write_text(two_figure_page(heatmap_figure(), bar_figure(), extra), encoding="utf-8")
    result = open_report(page, timeout_s=10)
    show(result)
    assert any("no-such-div" in e for e in result.page_errors)
    assert result.drawn == result.plots == 2
    assert not result.ok


# -- the real report kinds ------------------------------------------------------------------

REPORTS = {
    "ncu_heatmap": "ncu/rtx4090_smem_transpose_15sections_source.ncu-rep",
    "kineto_report": "kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz",
    "nsys_report": "nsys/rtx3090x4_tensorrt_nvtx.sqlite",
    "memory_report": "memsnap/cs336_ctx256_forward_segment_free.pickle",
}


@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_every_report_kind_draws_without_errors(kind: str, pages: Path) -> None:
    import gpudiag
    from gpudiag.reports.build import heatmap_page, report_figures, report_page
    from tests.conftest import fixture

    trace = gpudiag.load(fixture(REPORTS[kind]))
    if kind == "ncu_heatmap":
        html, figs = heatmap_page(trace, None), [None]
    else:
        dx = gpudiag.diagnose(trace)
        html, figs = report_page(trace, dx), list(report_figures(trace, dx).values())
    path = pages / f"{kind}.html"
    path.write_text(html, encoding="utf-8")
    result = open_report(path, pages / f"{kind}.png")
    print(f"{kind}: {result.plots} plots, screenshot {result.screenshot_path}")
    assert result.ok, (result.console_errors, result.page_errors, result.external_requests)
    assert result.plots == len(figs) and result.drawn == result.plots
    if kind != "ncu_heatmap":
        assert result.traces_per_plot == [len(f.data) for f in figs]
