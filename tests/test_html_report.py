"""The HTML report page: offline, deterministic, escaped, sortable; real fixtures render.

The page is parsed with `html.parser`, which tokenizes `<script>` contents the way browsers
do (raw text up to the first `</script`), so counting the `<script>` elements it sees is a
faithful check that no input string opened or closed one.
"""

from __future__ import annotations

import json
from html import escape as html_escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest

import gpudiag
from gpudiag.reports.html import Section, figure_json, page
from gpudiag.reports.html_report import FIGURE_SLOTS, report
from gpudiag.reports.html_tables import Table, table
from tests.builders import KinetoTrace
from tests.conftest import fixture

EVIL = "</script><script>alert(1)</script>"
EVIL_CELL = "<script>alert(1)</script>"
PLOTLY_MARKER = "* plotly.js v"  # the banner at the top of the bundled plotly.js


class Structure(HTMLParser):
    """What the tests rely on: tags in order, script bodies, ids, text, well-nestedness."""

    VOID = frozenset({"meta", "link", "br", "wbr", "img", "input", "hr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "script":
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] == "script":
            self.scripts[-1] += data
        else:
            self.text.append(data)

    def tags(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs in self.starts if tag == name]


def parse(document: str) -> Structure:
    parser = Structure()
    parser.feed(document)
    parser.close()
    assert not parser.errors, parser.errors[:5]
    assert parser.stack == [], f"unclosed: {parser.stack}"
    return parser


def evil_figure() -> go.Figure:
    return go.Figure(go.Bar(x=[EVIL, "b"], y=[1, 2], name=EVIL,
                            hovertext=[EVIL_CELL, EVIL], text=[EVIL_CELL, "x"]))


def small_sections(figures: int = 2) -> list[Section]:
    frame = pd.DataFrame({"kernel": ["gemm", "relu"], "dur_ns": [1_500_000, 2_000],
                          "share": [0.9, 0.1]})
    figs = [go.Figure(go.Bar(x=[1, 2], y=[3, 4], name=f"f{i}")) for i in range(figures)]
    return [Section("Kernels", text="why", notes=["a note"], figures=figs[:1], table=frame,
                    formats={"dur_ns": "ns", "share": "share"}),
            Section("More", figures=figs[1:])]


# -- the page ------------------------------------------------------------------------------


def test_same_input_gives_byte_identical_pages() -> None:
    first = page("run", small_sections(), generated_for="python train.py")
    second = page("run", small_sections(), generated_for="python train.py")
    assert first.encode() == second.encode()


def test_plotly_js_is_inlined_once_and_every_figure_drawn_from_json() -> None:
    document = page("run", small_sections(figures=3))
    assert document.count(PLOTLY_MARKER) == 1
    doc = parse(document)
    plots = [a for a in doc.tags("div") if "plot" in (a.get("class") or "").split()]
    assert [p["id"] for p in plots] == ["s1-fig1", "s2-fig1", "s2-fig2"]
    data = {a["id"]: body for a, body in zip(doc.tags("script"), doc.scripts, strict=True)
            if a.get("type") == "application/json"}
    assert sorted(data) == ["s1-fig1-data", "s2-fig1-data", "s2-fig2-data"]
    assert [json.loads(data[f"{p['id']}-data"])["data"][0]["name"] for p in plots] == \
        ["f0", "f1", "f2"]
    assert document.count("Plotly.newPlot") == 1  # one shared loop, not one call per figure


def test_a_page_without_figures_carries_no_plotly() -> None:
    document = page("run", [Section("Only a table", table=pd.DataFrame({"a": [1]}))])
    assert PLOTLY_MARKER not in document
    assert len(document) < 20_000


def test_cdn_variant_links_a_pinned_plotly_and_stays_small() -> None:
    from plotly.offline import get_plotlyjs_version

    document = page("run", small_sections(), cdn=True)
    assert PLOTLY_MARKER not in document
    assert len(document.encode()) < 200_000
    srcs = [a.get("src") for a in parse(document).tags("script") if a.get("src")]
    assert srcs == [f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"]


def test_table_of_contents_links_every_section_in_order() -> None:
    doc = parse(page("run", small_sections()))
    links = [a["href"] for a in doc.tags("a")]
    sections = [a["id"] for a in doc.tags("section")]
    assert links == ["#s1", "#s2"] and sections == ["s1", "s2"]


# -- escaping ------------------------------------------------------------------------------


def test_script_in_a_figure_trace_name_or_hover_stays_data() -> None:
    text = figure_json(evil_figure())
    assert "<" not in text and ">" not in text
    assert json.loads(text)["data"][0]["name"] == EVIL  # the exact string once parsed
    document = page("run", [Section("Evil", figures=[evil_figure()])], cdn=True)
    doc = parse(document)
    assert len(doc.scripts) == 3  # the CDN link, the figure's JSON, the page's own script
    figure = json.loads(doc.scripts[1])
    assert figure["data"][0]["hovertext"] == [EVIL_CELL, EVIL]
    assert "alert(1)" not in doc.scripts[0] + doc.scripts[2]


def test_script_in_a_table_cell_title_note_or_header_is_escaped() -> None:
    frame = pd.DataFrame({EVIL_CELL: [EVIL_CELL, EVIL], "n": [1, 2]})
    document = page(EVIL, [Section(EVIL, text=EVIL, notes=[EVIL_CELL], table=frame)],
                    generated_for=EVIL)
    assert "<script>alert" not in document
    doc = parse(document)
    assert len(doc.scripts) == 1  # only the page's sorter
    assert "alert" not in doc.scripts[0]
    shown = "".join(doc.text)
    assert shown.count(EVIL_CELL) >= 5  # title, heading x2, text, note, header, cells


def test_report_escapes_a_kernel_named_like_a_script(tmp_path: Path) -> None:
    kt = KinetoTrace()
    for i in range(3):
        c = kt.launch(ts=100 * i)
        kt.kernel(EVIL, ts=100 * i + 10, dur=50, correlation=c)
    trace = gpudiag.load(kt.write(tmp_path / "evil.pt.trace.json.gz"))
    dx = gpudiag.diagnose(trace)
    document = report(trace, dx, figures={"waterfall": evil_figure()}, cdn=True)
    assert "<script>alert" not in document
    doc = parse(document)
    assert all("alert" not in s for s, a in zip(doc.scripts, doc.tags("script"), strict=True)
               if a.get("type") != "application/json")
    # shown as text in the kernels table (the short name drops the "(1)" parameter list)
    assert "</script><script>alert</script>" in "".join(doc.text)


# -- tables --------------------------------------------------------------------------------


def test_tables_are_sortable_with_raw_values_behind_formatted_numbers() -> None:
    frame = pd.DataFrame({"kernel": ["a", "b", "c"], "time": [1_200_000, 3_000, None],
                          "bytes": pd.array([2048, None, 10], dtype="Int64")})
    doc = parse(table(frame, formats={"time": "ns", "bytes": "bytes"}))
    assert doc.tags("table")[0]["class"] == "sortable"
    heads = doc.tags("th")
    assert [h.get("class") for h in heads] == [None, "num", "num"]
    values = [c["data-value"] for c in doc.tags("td") if "data-value" in c]
    assert values == ["1200000.0", "2048", "3000.0", "", "", "10"]
    assert "1.2 ms" in "".join(doc.text) and "2 KiB" in "".join(doc.text)


def test_sorter_script_is_on_the_page_once() -> None:
    document = page("run", small_sections())
    assert document.count('querySelectorAll("table.sortable")') == 1
    assert 'class="sortable"' in document


def test_unsortable_table_and_unknown_format() -> None:
    assert "sortable" not in Table(pd.DataFrame({"a": ["x"]}), sortable=False).render()
    with pytest.raises(ValueError, match="unknown column format"):
        table(pd.DataFrame({"a": [1]}), formats={"a": "furlongs"})


# -- reports from real fixtures -------------------------------------------------------------


def build(relative: str, **kwargs: Any) -> tuple[str, gpudiag.Diagnosis]:
    trace = gpudiag.load(fixture(relative))
    dx = gpudiag.diagnose(trace)
    return report(trace, dx, **kwargs), dx


def shown_text(document: str) -> str:
    return " ".join("".join(parse(document).text).split())


def advice_shown(document: str, dx: gpudiag.Diagnosis) -> None:
    text = shown_text(document)
    for advice in dx.findings["advice"].head(50).dropna().unique():
        assert " ".join(str(advice).split()) in text


def test_kineto_report_has_summary_waterfall_findings_and_tables() -> None:
    document, dx = build("kineto/a100_alexnet_sync_critical_path.json.gz", cdn=True)
    assert len(dx.findings) > 0
    advice_shown(document, dx)
    titles = [a for a in parse(document).tags("section")]
    assert len(titles) >= 6
    text = shown_text(document)
    for heading in ("Run summary", "Where the GPU time went", "Findings, by expected saving",
                    "Top kernels", "Sync points", "NVIDIA A100-PG509-200"):
        assert heading in text
    assert document == build("kineto/a100_alexnet_sync_critical_path.json.gz", cdn=True)[0]


def test_figures_go_to_their_slots_and_unknown_slots_get_sections() -> None:
    figs = {slot: go.Figure(go.Bar(x=[1], y=[1], name=slot)) for slot in FIGURE_SLOTS}
    figs["extra view"] = go.Figure(go.Bar(x=[1], y=[1], name="extra"))
    document, _ = build("kineto/a100_alexnet_sync_critical_path.json.gz", figures=figs)
    assert document.count(PLOTLY_MARKER) == 1
    doc = parse(document)
    names = [json.loads(s)["data"][0]["name"] for s, a in
             zip(doc.scripts, doc.tags("script"), strict=True)
             if a.get("type") == "application/json"]
    assert sorted(names) == sorted([*FIGURE_SLOTS, "extra"])
    assert names.index("waterfall") < names.index("utilization") < names.index("extra")


def test_ncu_report_shows_kernel_metrics_and_rule_results() -> None:
    document, dx = build("ncu/a10g_esmm_4kernels_default.ncu-rep", cdn=True)
    advice_shown(document, dx)
    text = shown_text(document)
    assert "Nsight Compute metrics per kernel" in text and "esmm_shmem_multi" in text
    assert "replayed one by one" in text  # no timeline, said in the summary


def test_memory_snapshot_report_shows_allocator_peaks() -> None:
    document, dx = build("memsnap/cs336_medium_ctx1024_training_18gb_inactive.pickle",
                         cdn=True)
    advice_shown(document, dx)
    text = shown_text(document)
    assert "Allocator memory per device" in text and "GiB" in text
    assert "expandable_segments" in text


def test_collective_report_shows_busbw() -> None:
    document, _ = build("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz", cdn=True)
    text = shown_text(document)
    assert "busbw" in text and "GB/s" in text and "all_reduce" in text


# -- in a browser (headless Chromium, when installed) --------------------------------------


def chromium_dom(tmp_path: Path, document: str) -> str:
    """The DOM after the page's scripts ran; skips without Chromium (CI installs it)."""
    import shutil
    import subprocess

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed (Debian's `chromium` package; .ci/run has it)")
    path = tmp_path / "page.html"
    path.write_text(document, encoding="utf-8")
    done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_in_a_browser_plots_draw_tables_sort_numerically_and_nothing_executes(
        tmp_path: Path) -> None:
    frame = pd.DataFrame({"kernel": [EVIL_CELL, "b", "c"],
                          "time": [2_000_000_000, 3_000, 1_200_000]})
    sections = [Section("Evil", figures=[evil_figure()], table=frame, formats={"time": "ns"})]
    trap = ('<body><script>window.alert = function () '
            '{ document.documentElement.setAttribute("data-alerted", "1"); };</script>')
    click = '<script>document.querySelectorAll("th")[1].click();</script></body>'
    document = page(EVIL, sections).replace("<body>", trap).replace("</body>", click)
    dom = chromium_dom(tmp_path, document)
    assert 'data-alerted="1"' not in dom  # the attribute, not the trap's own text
    assert dom.count('class="main-svg"') >= 1  # plotly drew the figure
    body = dom[dom.index("<tbody>"):]
    order = [body.index(f">{t}<") for t in ("3 µs", "1.2 ms", "2 s")]
    assert order == sorted(order)  # by data-value, not by the text '1.2 ms' < '2 s' < '3 µs'


# -- reads at a glance (issue 11) ------------------------------------------------------------


def test_a_section_with_nothing_to_show_is_left_out_heading_and_all() -> None:
    sections = [Section("Nothing"), Section("No rows", table=pd.DataFrame({"a": []})),
                Section("Kept", text="one line", tables=[Table(pd.DataFrame({"b": []}))])]
    doc = parse(page("run", sections))
    assert [a["href"] for a in doc.tags("a")] == ["#s1"]
    text = "".join(doc.text)
    assert "Kept" in text and "Nothing" not in text and "No rows" not in text
    assert doc.tags("table") == []  # a header without rows says nothing either


def test_a_figure_box_is_as_tall_as_its_figure() -> None:
    short = go.Figure(go.Bar(x=[1], y=[1])).update_layout(height=188)
    doc = parse(page("run", [Section("Figs", figures=[short, go.Figure(go.Bar(x=[1]))])]))
    plots = [a for a in doc.tags("div") if "plot" in (a.get("class") or "").split()]
    assert [p.get("style") for p in plots] == ["height:188px;min-height:0", None]


def test_cells_carry_escaped_hover_titles() -> None:
    frame = pd.DataFrame({"kernel": ["gemm", "relu"], "n": [1, 2]})
    doc = parse(table(frame, titles={"kernel": [EVIL, None]}))
    cells = doc.tags("td")
    assert cells[0]["title"] == EVIL and "title" not in cells[2]  # parsed back: exact text
    assert "<script>" not in table(frame, titles={"kernel": [EVIL, ""]})
    with pytest.raises(ValueError, match="unknown column"):
        table(frame, titles={"name": ["a", "b"]})
    with pytest.raises(ValueError, match="2 rows but 1 titles"):
        table(frame, titles={"kernel": ["a"]})


def test_long_names_get_places_to_wrap_and_short_words_stay_whole() -> None:
    from gpudiag.reports.html_tables import breakable

    assert breakable("host_bound") == "host_bound"
    assert breakable("aten::max_pool2d_with_indices") == \
        "aten::<wbr>max_<wbr>pool2d_<wbr>with_<wbr>indices"
    assert breakable("MemoryCacheAccessPattern") == "Memory<wbr>Cache<wbr>Access<wbr>Pattern"
    assert breakable("x" * 40) == "x" * 16 + "<wbr>" + "x" * 16 + "<wbr>" + "x" * 8
    evil = breakable(EVIL * 2)
    assert "<script" not in evil and evil.replace("<wbr>", "") == html_escape(EVIL * 2)
    doc = parse(table(pd.DataFrame({"where": ["aten::max_pool2d_with_indices"]})))
    assert "".join(doc.text).strip().endswith("\naten::max_pool2d_with_indices")  # as text


def test_heatmap_rule_findings_name_kernels_short_with_the_full_name_on_hover() -> None:
    from gpudiag.reports.build import heatmap_page

    trace = gpudiag.load(fixture("ncu/a100pcie_selfjoin_setfull_ncu2022.ncu-rep"))
    doc = parse(heatmap_page(trace, gpudiag.diagnose(trace), cdn=True))
    cells = [a for a in doc.tags("td") if a.get("title")]
    assert cells and all(str(a["title"]).startswith("nodeByPoint5(unsigned int, double *")
                         for a in cells)
    text = "".join(doc.text)
    assert "nodeByPoint5" in text and "nodeByPoint5(unsigned" not in text


def test_heatmap_without_rule_findings_says_so_in_one_line() -> None:
    from gpudiag.reports.build import heatmap_page

    trace = gpudiag.load(fixture("ncu/rtx4090_smem_transpose_15sections_source.ncu-rep"))
    text = shown_text(heatmap_page(trace, gpudiag.diagnose(trace), cdn=True))
    assert "Nsight Compute's rule findings per kernel None: ncu reported no warnings" in text


def test_ncu_report_says_which_kernel_ncu_measured_nothing_for() -> None:
    from gpudiag.reports.html_report import NO_METRICS

    document, _ = build("ncu/a10g_esmm_4kernels_default.ncu-rep", cdn=True)
    text = shown_text(document)
    assert NO_METRICS in text
    assert "not in this report (not collected, columns left out): L1 hit %, L2 hit %" in text
    assert ">SM %</th>" in document
    assert ">L1 hit %</th>" not in document  # the column is gone, not a column of blanks


def test_compare_page_names_kernels_short_with_the_full_name_on_hover() -> None:
    from gpudiag.analyzers.compare import compare
    from gpudiag.reports.build import compare_page

    runs = [gpudiag.load(fixture(p)) for p in ("kineto/world128_sampled_rank0.json.gz",
                                               "kineto/world128_sampled_rank1.json.gz")]
    doc = parse(compare_page(compare(runs, ["r0", "r1"]), cdn=True))
    titled = [a["title"] for a in doc.tags("td") if a.get("title")]
    assert titled and any("(" in str(t) for t in titled)  # parameter lists only on hover
