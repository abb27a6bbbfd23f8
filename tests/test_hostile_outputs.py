"""Hostile names in what gpudiag prints and writes: the terminal, plotly labels, CSV cells.

Kernel, op, device and file names come from the profile: every output made from them must
show them as text, never obey them (a terminal escape, a rich `[link]`, a plotly `<a href>`,
a spreadsheet formula). The inputs are built here.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.reports import figures
from gpudiag.reports.export import write_tables
from gpudiag.reports.safe_text import csv_cell, plotly_label, printable, terminal
from tests.builders import KinetoTrace, kernel, trace
from tests.conftest import cli_status

ESC_NAME = "\x1b[31mRED\x1b[0m\x1b]8;;http://evil.example/\x1b\\osc\x1b]8;;\x1b\\\x9b2J\x07"
LINK_NAME = "[link=http://evil.example/]click[/link]"
A_NAME = '<a href="http://evil.example/">pwn</a>'
FILE_NAME = (ESC_NAME + LINK_NAME).replace("/", "_")  # the same, as a file name
FORMULAS = ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+1", "-2+3", "@SUM(A1)",
            "\tcmd", "\rcmd"]


def test_safe_text_functions() -> None:
    assert printable("a\x1bb\x9bc\x00d\u202e") == "a\\x1bb\\x9bc\\x00d\\u202e"
    assert "\x1b" not in terminal(ESC_NAME)
    assert terminal(LINK_NAME) == "\\[link=http://evil.example/]click\\[/link]"
    assert plotly_label(A_NAME) == '&lt;a href="http://evil.example/"&gt;pwn&lt;/a&gt;'
    assert plotly_label("a & b") == "a &amp; b"
    assert [csv_cell(f) for f in FORMULAS] == ["'" + f for f in FORMULAS]
    assert csv_cell("ok=1") == "ok=1" and csv_cell(-3) == -3




def _kineto(path: Path, names: list[str]) -> Path:
    kt = KinetoTrace()
    ts = 10.0
    for name in names:
        kt.op(name, ts=ts, dur=30)
        c = kt.launch(ts=ts + 1)
        kt.kernel(name, ts=ts + 10, dur=5, correlation=c)
        kt.cuda_sync("stream", ts=ts + 12, dur=20, correlation=kt.launch(ts=ts + 11))
        ts += 100
    return kt.write(path)


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    folder = tmp_path / f"run{FILE_NAME}"
    folder.mkdir()
    return folder


def test_terminal_output_shows_hostile_names_as_text(hostile_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich as on a terminal: links would be live
    monkeypatch.setenv("COLUMNS", "400")
    path = _kineto(hostile_dir / f"{FILE_NAME}.json", [ESC_NAME, LINK_NAME, A_NAME])
    saved = hostile_dir / "saved"
    loaded = gpudiag.load(path)
    loaded.meta["warnings"][f"odd {ESC_NAME} {LINK_NAME}"] = 1
    loaded.save(saved)
    outputs = []
    for args in (["analyze", str(path), "--steps"], ["analyze", str(saved)],
                 ["compare", str(path), str(saved)]):
        assert cli_status(*args) in (0, 1), args
        out, err = capsys.readouterr()
        outputs.append(out + err)
    text = "".join(outputs)
    assert "\x1b]" not in text  # no OSC: no hyperlink, no title change
    assert "\x9b" not in text and "\x07" not in text
    assert "\x1b[31mRED" not in text and "\x1b[2J" not in text
    assert "\\x1b[31mRED" in text  # shown, made visible
    assert "[link=http://evil.example/]click[/link]" in text  # the markup, as text


def test_one_line_errors_make_control_characters_visible(
        hostile_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = hostile_dir / f"empty{FILE_NAME}\n2nd line.json"
    bad.write_bytes(b"")
    assert cli_status("analyze", str(bad)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "\x1b" not in err and "\x9b" not in err
    assert "\\x1b[31mRED" in err and "\\x0a2nd line" in err


# -- plotly labels ------------------------------------------------------------------------


def _labels_of(fig: Any) -> list[str]:
    """Every string a figure carries (traces' data and names, layout text)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(json.loads(fig.to_json()))
    return found


def _html_trace() -> gpudiag.Trace:
    names = [A_NAME, "<b>bold</b> & <br>x", ESC_NAME]  # one starts in nearly every bin
    kernels = [kernel(1_000 + 2_000 * i, 2_500 + 2_000 * i, names[i % 3]) for i in range(600)]
    return trace(kernels=kernels)


def test_no_figure_carries_raw_html_from_names() -> None:
    t = _html_trace()
    dx = gpudiag.diagnose(t)
    strings = _labels_of(figures.utilization(t, dx)) + _labels_of(figures.waterfall(dx))
    assert not [s for s in strings if "<a " in s or "<b>bold" in s]
    assert any("&lt;a href" in s for s in strings)
    assert not [s for s in strings if "\x1b" in s]


def test_plotly_does_not_render_an_a_from_data(tmp_path: Path) -> None:
    """The mouse goes to the bins whose hover label carries the hostile name (found in the
    figure's data, not guessed from the layout): plotly must show the anchor as text there,
    and draw no `<a>` anywhere. Were escaping to break, the label would hold a live link and
    its text would lose the markup."""
    from tests.browser import require_browser

    require_browser()
    from gpudiag.reports.build import report_page

    t = _html_trace()
    page = tmp_path / "report.html"
    page.write_text(report_page(t, gpudiag.diagnose(t)), encoding="utf-8")
    seen = _hover_hostile_points(page)
    assert seen["plots"] >= 1 and seen["targets"] >= 1, seen
    assert seen["hovers"] == seen["targets"], seen
    assert seen["evil_links"] == 0, seen
    assert seen["svg_anchors"] == 0, seen
    assert all('<a href="http://evil.example/">' in text for text in seen["hover_texts"]), seen


_HOVER_JS = """
() => ({
  plots: document.querySelectorAll('.plotly-graph-div').length,
  svg_anchors: document.querySelectorAll('svg a').length,
  evil_links: document.querySelectorAll('[*|href*="evil.example"]').length,
  hover: Array.from(document.querySelectorAll('.hoverlayer .hovertext'))
    .map(e => e.textContent).filter(text => text.includes('pwn')),
})
"""

# Where on the page (viewport pixels) the heatmap cells whose hover data holds A_NAME
# (its text, 'pwn') lie: up to three per heatmap, from each trace's decoded data and its axes.
_TARGETS_JS = """
() => {
  const targets = [];
  document.querySelectorAll('.plotly-graph-div').forEach((gd) => {
    gd._fullData.forEach((trace) => {
      const rows = trace.customdata;
      if (trace.type !== 'heatmap' || !rows) return;
      const layout = gd._fullLayout;
      const xa = layout[trace.xaxis.replace('x', 'xaxis')];
      const ya = layout[trace.yaxis.replace('y', 'yaxis')];
      let found = 0;
      for (let r = 0; r < rows.length && found < 3; r++) {
        for (let c = 0; c < rows[r].length && found < 3; c++) {
          const cell = rows[r][c];
          if (typeof cell !== 'string' || !cell.includes('pwn')) continue;
          gd.scrollIntoView({block: 'center'});
          const box = gd.getBoundingClientRect();
          // x holds the bins' edges (n + 1 values) or their centres (n)
          const mid = trace.x.length > rows[r].length
            ? (trace.x[c] + trace.x[c + 1]) / 2 : trace.x[c];
          targets.push({
            x: box.left + xa._offset + xa.c2p(mid),
            y: box.top + ya._offset + ya.c2p(ya.d2c(trace.y[r])),
            div: Array.from(document.querySelectorAll('.plotly-graph-div')).indexOf(gd),
          });
          found += 1;
        }
      }
    });
  });
  return targets;
}
"""


def _hover_hostile_points(page: Path) -> dict[str, Any]:
    """Open the page, move the mouse onto each cell whose hover label carries A_NAME, and
    record the anchors plotly drew and those labels' text."""
    from playwright.sync_api import sync_playwright

    from tests.browser import _INIT_SCRIPT, _SETTLED, CHROMIUM_ARGS, chromium_path

    out: dict[str, Any] = {"hovers": 0, "svg_anchors": 0, "evil_links": 0, "hover_texts": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            view = browser.new_page(viewport={"width": 1280, "height": 900})
            view.add_init_script(_INIT_SCRIPT)
            view.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
                "file:") else route.abort())
            view.goto(page.as_uri(), wait_until="load")
            view.wait_for_function(_SETTLED, timeout=60_000)
            targets = view.evaluate(_TARGETS_JS)
            out["targets"] = len(targets)
            for target in targets:
                view.evaluate(f"() => document.querySelectorAll('.plotly-graph-div')"
                              f"[{target['div']}].scrollIntoView({{block: 'center'}})")
                view.mouse.move(target["x"], target["y"])
                view.wait_for_function(
                    "() => document.querySelector('.hoverlayer .hovertext') !== null",
                    timeout=5_000)
                seen = view.evaluate(_HOVER_JS)
                out["plots"] = seen["plots"]
                out["svg_anchors"] = max(out["svg_anchors"], seen["svg_anchors"])
                out["evil_links"] = max(out["evil_links"], seen["evil_links"])
                out["hovers"] += bool(seen["hover"])
                out["hover_texts"] += seen["hover"]
                view.mouse.move(0, 0)
        finally:
            browser.close()
    return out


# -- CSV ------------------------------------------------------------------------------------


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted(tmp_path: Path) -> None:
    t = trace(kernels=[kernel(1_000 * (i + 1), 1_000 * (i + 1) + 500, name)
                       for i, name in enumerate(FORMULAS)])
    written = write_tables(t, tmp_path / "csv", "csv", dx=gpudiag.diagnose(t))
    with written["kernels"].open(newline="") as handle:
        names = [row["name"] for row in csv.DictReader(handle)]
    assert names == ["'" + f for f in FORMULAS]
    for path in written.values():
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                for cell in row:
                    if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
                        float(cell)  # only numbers may start so: ValueError otherwise
    parquet = write_tables(t, tmp_path / "pq", "parquet", tables=["kernels"])
    assert pd.read_parquet(parquet["kernels"])["name"].tolist() == FORMULAS  # as they are


# -- sizes at int64 max ----------------------------------------------------------------------


def test_snapshot_with_int64_max_sizes_and_addresses_reports(tmp_path: Path) -> None:
    top = 2**63 - 1
    segment = {"device": 0, "address": top - 10, "total_size": top, "stream": 0,
               "segment_type": "large", "is_expandable": False,
               "blocks": [{"size": top, "state": "active_allocated", "address": top - 10},
                          {"size": top, "state": "inactive", "address": 0}]}
    entries = [{"action": "alloc", "addr": top, "size": top, "stream": 0, "time_us": 1},
               {"action": "segment_alloc", "addr": top, "size": top, "stream": 0,
                "time_us": 2},
               {"action": "free_completed", "addr": top, "size": top, "stream": 0,
                "time_us": top // 1000},
               {"action": "oom", "device_free": top, "size": top, "stream": 0, "time_us": 3}]
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [entries]}))
    assert cli_status("report", str(path), "-o", str(tmp_path / "r.html")) == 0
    assert cli_status("heatmap", str(path), "-o", str(tmp_path / "h.html")) == 0
    assert os.path.getsize(tmp_path / "r.html") > 0
    assert figures.memory(gpudiag.load(path)) is not None  # the curves, not an overflow
