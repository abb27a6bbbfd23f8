"""The HTML opens, draws and reads well in a real browser (headless Chromium, Playwright).

Two kinds of pages: small ones built here with plotly (a heatmap page; two figures sharing one
inlined plotly.js), plus broken pages that the harness must catch, so it cannot pass silently;
and the pages `gpudiag report`, `gpudiag heatmap` and `gpudiag compare -o` write for real
fixtures (Kineto, Nsight Systems, Nsight Compute, a memory snapshot). Those must draw without
an error and read at a glance at a 1280 px wide window: every check of
`tests.browser.LAYOUT_CHECKS` (no sideways scroll of the page or of a table, no overlapping
legend labels, no clipped or scrolling legend, no figure box taller than its figure, no
heading with nothing under it) is one test per page, and a page built with each defect
shows that the checks do fail.

Skips with the reason when chromium or playwright is missing; CI sets
GPUDIAG_REQUIRE_BROWSER=1 so there it fails instead. Screenshots: under pytest's tmp dir
(paths printed, see `-s`/`-rA`), copied into $GPUDIAG_BROWSER_ARTIFACTS when set.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from tests.browser import LAYOUT_CHECKS, Result, open_report, require_browser

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


# -- the pages the commands write, from the real fixtures ---------------------------------

# page -> the command and its fixtures. Chosen so that each page kind and each known layout
# defect of issue 11 is on some page: a findings table and a waterfall (Kineto, nsys), the
# utilization heatmap's cause key (Kineto, nsys, heatmap of a Kineto trace), ncu's health key
# and a kernel without metrics (a10g), ncu rule findings with long demangled names (a100pcie)
# and none at all (transpose), the collective waits of two ranks, and wide comparison tables.
PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kineto_report": ("report", ("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz",)),
    "nsys_report": ("report", ("nsys/rtx3090x4_tensorrt_nvtx.sqlite",)),
    "memory_report": ("report", ("memsnap/cs336_ctx256_forward_segment_free.pickle",)),
    "ranks_report": ("report", ("kineto/world128_sampled_rank0.json.gz",
                                "kineto/world128_sampled_rank1.json.gz")),
    # the same pair analyzed rank by rank: the job's report, from its Diagnosis alone
    "job_report": ("report --workers 2", ("kineto/world128_sampled_rank0.json.gz",
                                          "kineto/world128_sampled_rank1.json.gz")),
    "ncu_report": ("report", ("ncu/a10g_esmm_4kernels_default.ncu-rep",)),
    "ncu_heatmap": ("heatmap", ("ncu/rtx4090_smem_transpose_15sections_source.ncu-rep",)),
    "ncu_heatmap_no_metrics": ("heatmap", ("ncu/a10g_esmm_4kernels_default.ncu-rep",)),
    "ncu_heatmap_rules": ("heatmap", ("ncu/a100pcie_selfjoin_setfull_ncu2022.ncu-rep",)),
    "kineto_heatmap": ("heatmap", ("kineto/h100_cuda_sync_category_small.json",)),
    "kineto_compare": ("compare", ("kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz",
                                   "kineto/v100_rank1of2_nccl_profile_memory.json.gz")),
    # a CPU-only torch run: the host step breakdown, top ops and CPU memory sections
    "cpu_report": ("report", ("tests/data/torch_cpu_train.pt.trace.json.gz",)),
}
# the report kinds whose figures are counted trace by trace against the figure builders
KINDS = {"ncu_heatmap": "ncu_heatmap", "kineto_report": "kineto_report",
         "nsys_report": "nsys_report", "memory_report": "memory_report"}


def write_page(name: str, folder: Path) -> Path:
    """The page the CLI writes for PAGES[name] (through click's runner, as a user runs it)."""
    from click.testing import CliRunner

    from gpudiag.cli import cli
    from tests.conftest import fixture

    command, sources = PAGES[name]
    out = folder / f"{name}.html"
    here = Path(__file__).resolve().parents[1]
    args = [*command.split(), *(str(here / s if s.startswith("tests/") else fixture(s))
                       for s in sources), "-o", str(out)]
    done = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return out


@pytest.fixture(scope="module")
def opened(pages: Path) -> Callable[[str], Result]:
    """Each CLI page written and opened once for the whole module (opening takes seconds)."""
    seen: dict[str, Result] = {}

    def result(name: str) -> Result:
        if name not in seen:
            path = write_page(name, pages)
            seen[name] = open_report(path, pages / "shots" / f"{name}.png")
            print(f"{name}: {seen[name].plots} plots, screenshot {seen[name].screenshot_path}")
        return seen[name]

    return result


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_report_kind_draws_without_errors(kind: str,
                                                opened: Callable[[str], Result]) -> None:
    import gpudiag
    from gpudiag.reports.build import report_figures
    from tests.conftest import fixture

    result = opened(KINDS[kind])
    assert result.ok, (result.console_errors, result.page_errors, result.external_requests)
    if kind == "ncu_heatmap":
        assert result.plots == 1 and result.drawn == 1
        return
    trace = gpudiag.load(fixture(PAGES[kind][1][0]))
    figs = list(report_figures(trace, gpudiag.diagnose(trace)).values())
    assert result.plots == len(figs) and result.drawn == result.plots
    assert result.traces_per_plot == [len(f.data) for f in figs]


@pytest.mark.parametrize("check", sorted(LAYOUT_CHECKS))
@pytest.mark.parametrize("name", sorted(PAGES))
def test_cli_pages_read_at_a_glance(name: str, check: str,
                                    opened: Callable[[str], Result]) -> None:
    """At 1280 px: nothing scrolls sideways, no legend label sits on another, no legend is
    clipped, no figure box has a blank band, no heading stands over nothing."""
    result = opened(name)
    assert result.ok, (result.console_errors, result.page_errors, result.external_requests)
    found = result.layout[check]
    assert found == [], f"{name}: {LAYOUT_CHECKS[check]}:\n  " + "\n  ".join(found)


def test_ncu_rule_findings_show_short_names_with_the_full_name_on_hover(
        opened: Callable[[str], Result], pages: Path) -> None:
    """The rule table names kernels by their short name; the demangled one is the title."""
    opened("ncu_heatmap_rules")
    html = (pages / "ncu_heatmap_rules.html").read_text(encoding="utf-8")
    section = html[html.index("rule findings per kernel"):]
    assert '<td title="nodeByPoint5(' in section  # the full name, parameters and all
    assert ">nodeByPoint5</td>" in section


# -- the layout checks catch each defect -----------------------------------------------------


def defects_page() -> str:
    """One page with every defect the layout checks look for (issue 11's findings)."""
    wide = "<tr>" + "".join(f"<td style='white-space:nowrap'>{'x' * 40} {i}</td>"
                            for i in range(8)) + "</tr>"
    squeezed = go.Figure(go.Bar(x=[1], y=["a"], orientation="h"))  # a legend clipped to a row
    for i in range(8):
        squeezed.add_bar(x=[1], y=["a"], orientation="h", name=f"cause {i}")
    squeezed.update_layout(height=200, barmode="stack")
    crowded = go.Figure(go.Heatmap(z=[[0, 1, 2, 3, 4, 5, 6]], colorbar={
        "len": 0.2, "tickvals": list(range(7)), "ticktext": [f"label {i}" for i in range(7)]}))
    crowded.update_layout(height=260)
    one = pio.to_html(squeezed, include_plotlyjs=True, full_html=False,
                      default_height="400px")
    two = pio.to_html(crowded, include_plotlyjs=False, full_html=False)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>defects</title></head>"
            "<body><section><h2>Wide</h2><div><table><tbody>" + wide + "</tbody></table>"
            "</div></section><section><h2>Squeezed legend</h2>" + one + "</section>"
            "<section><h2>Crowded colorbar</h2>" + two + "</section>"
            "<section><h2>Blank band</h2><div id='blank' class='plotly-graph-div' "
            "style='height:420px'></div><script>Plotly.newPlot('blank', [{type: 'bar', "
            "y: [1, 2]}], {height: 200});</script></section>"
            "<section><h2>Empty</h2></section>"
            "<section><h2>Header only</h2><table><thead><tr><th>a</th></tr></thead>"
            "<tbody></tbody></table></section></body></html>")


def test_each_layout_check_fails_on_a_page_with_its_defect(pages: Path) -> None:
    page = pages / "defects.html"
    page.write_text(defects_page(), encoding="utf-8")
    result = open_report(page)
    show(result)
    assert result.ok  # it draws: only the layout is wrong
    for check in LAYOUT_CHECKS:
        assert result.layout[check], f"{check} found nothing on a page built to fail it"
    assert any("Header only" in p for p in result.layout["empty_section"])
    assert any('"Empty"' in p for p in result.layout["empty_section"])
    assert set(result.layout) == set(LAYOUT_CHECKS)
    assert len(result.layout_problems) == sum(map(len, result.layout.values()))


def test_a_cpu_only_run_has_something_to_act_on(opened: Callable[[str], Result],
                                                pages: Path) -> None:
    """A torch CPU run (no GPU activity) gets the host sections, drawn and readable."""
    result = opened("cpu_report")
    assert result.page_errors == [] and result.drawn == result.plots
    html = (pages / "cpu_report.html").read_text()
    for title in ("Host time per step", "Host ops by self time", "CPU memory",
                  "Findings, by host time lost"):
        assert f">{title}<" in html, title


def test_the_compare_page_draws_each_runs_waterfall(opened: Callable[[str], Result]) -> None:
    """`compare -o`: one figure, a stacked bar per run with a segment per cause."""
    result = opened("kineto_compare")
    assert result.ok, (result.console_errors, result.page_errors)
    assert result.plots == 1 and result.drawn == 1 and result.traces_per_plot == [7]
