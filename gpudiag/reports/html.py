"""The self-contained HTML page: sections, tables and plotly figures in one file.

Why this shape (pyinstrument's one-file HTML renderer is the model):
- it opens offline: plotly.js is inlined once in the head (or, with `cdn=True`, one pinned
  `<script src>`), and each figure is a JSON blob drawn by one shared loop calling
  `Plotly.newPlot`, so ten figures cost ten JSON blobs, not ten copies of 4.8 MB of JS;
- it is deterministic: ids come from section order (`s1`, `s1-fig1`), nothing reads a clock
  or a random source, so the same input gives byte-identical files (diffable in CI);
- everything from an input is escaped: text with `safe_text.html_text` (control and bidi
  characters made visible, a very long name cut, then `html.escape`), figure JSON with `<`,
  `>` and `&` written as `\\u003c`-style JSON escapes, so a kernel named `</script>...`
  stays data;
- it reads at a glance: tables wrap long cells to fit the page width (no sideways scroll),
  each figure's box is as tall as the figure (no blank band under it), and a section with
  nothing to show (no text, notes, figures or table rows) is left out, heading and all.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gpudiag.reports.html_tables import SORT_JS, Format, Table
from gpudiag.reports.safe_text import html_text

_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}

PLOTLY_CDN = "https://cdn.plot.ly/plotly-{version}.min.js"
"""The pinned CDN address for `cdn=True`: the plotly.js version the installed plotly ships."""


@dataclass(frozen=True, eq=False)
class Section:
    """One titled part of the page: text, notes, figures, then tables, in that order.

    `figures` are `plotly.graph_objects.Figure` objects (anything with `to_json()`);
    `table` with `formats` is the main table, `tables` any further captioned ones.
    """

    title: str
    text: str | None = None
    notes: Sequence[str] = ()
    figures: Sequence[Any] = ()
    table: pd.DataFrame | None = None
    formats: Mapping[str, Format] | None = None
    tables: Sequence[Table] = field(default_factory=tuple)

    def all_tables(self) -> list[Table]:
        """The main table (when given) followed by the captioned ones; tables without rows
        are dropped (a header with nothing under it says nothing)."""
        main = [] if self.table is None else [Table(self.table, self.formats)]
        return [t for t in main + list(self.tables) if len(t.frame)]

    def is_empty(self) -> bool:
        """Nothing to show under the heading: such a section is left off the page."""
        return not (self.text or self.notes or self.figures or self.all_tables())


def page(title: str, sections: Sequence[Section], *, cdn: bool = False,
         generated_for: str | None = None) -> str:
    """The whole HTML document as a string (UTF-8 when written).

        html = page("My run", [Section("Kernels", table=frame, formats={"dur_ns": "ns"})])
        Path("report.html").write_text(html, encoding="utf-8")
        # opens offline; cdn=True swaps the inlined plotly.js for a pinned <script src>

    plotly.js is only added when some section has a figure. `generated_for` is a line shown
    under the title (e.g. the command and the run's own start time): the page never adds a
    time itself, so that output stays byte-identical for the same input. Sections with
    nothing to show are left out (`Section.is_empty`).
    """
    sections = [s for s in sections if not s.is_empty()]
    has_figures = any(s.figures for s in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="gpudiag">',
        f"<title>{html_text(title)}</title>",
        f"<style>{CSS}</style>",
        _plotly_script(cdn) if has_figures else "",
        "</head>",
        "<body>",
        f"<header><h1>{html_text(title)}</h1>",
        f'<p class="for">{html_text(generated_for)}</p>' if generated_for else "",
        "</header>",
        _toc(sections),
        "<main>",
        *(_section(i, s) for i, s in enumerate(sections, 1)),
        "</main>",
        f"<script>{SORT_JS}{_DRAW_JS if has_figures else ''}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def figure_json(fig: Any) -> str:
    """A figure's JSON, safe inside `<script>`: no `<`, `>` or `&` left unescaped.

        text = figure_json(go.Figure(go.Bar(name="</script>", x=[1], y=[2])))
        assert "</" not in text
        json.loads(text)["data"][0]["name"]   # '</script>' again once parsed

    The escapes are JSON's own `\\u003c` forms, so `JSON.parse` gives back the exact strings.
    """
    text = fig.to_json() if hasattr(fig, "to_json") else json.dumps(fig)
    return str(text).translate(_JSON_ESCAPES)


def _plotly_script(cdn: bool) -> str:
    """plotly.js once: inlined (offline) or a pinned CDN address."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if cdn:
        src = PLOTLY_CDN.format(version=get_plotlyjs_version())
        return f'<script src="{html.escape(src)}" charset="utf-8"></script>'
    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def _toc(sections: Sequence[Section]) -> str:
    if not sections:
        return ""
    items = "".join(f'<li><a href="#s{i}">{html_text(s.title)}</a></li>'
                    for i, s in enumerate(sections, 1))
    return f'<nav class="toc"><h2>Contents</h2><ol>{items}</ol></nav>'


def _section(index: int, section: Section) -> str:
    """One `<section id="sN">`: ids derive from the order only, never from the content."""
    sid = f"s{index}"
    parts = [f'<section id="{sid}">', f"<h2>{html_text(section.title)}</h2>"]
    if section.text:
        parts += [f"<p>{_prose(p)}</p>" for p in section.text.split("\n\n") if p]
    if section.notes:
        items = "".join(f"<li>{_prose(n)}</li>" for n in section.notes)
        parts.append(f'<ul class="notes">{items}</ul>')
    for j, fig in enumerate(section.figures, 1):
        fid = f"{sid}-fig{j}"
        parts.append(f'<div class="plot plotly-graph-div" id="{fid}"{_height(fig)}></div>')
        parts.append(f'<script type="application/json" id="{fid}-data">'
                     f"{figure_json(fig)}</script>")
    for tab in section.all_tables():
        parts.append(f'<div class="table-wrap">{tab.render()}</div>')
    parts.append("</section>")
    return "\n".join(parts)


def _prose(text: str) -> str:
    """A paragraph or note of the page's own words (which quote names from the input):
    its line breaks are the page's layout, any other control character is the input's and
    is shown (`html_text`)."""
    return html_text(text.replace("\n", " "))


def _height(fig: Any) -> str:
    """The figure's own height as its box's height, so the box neither leaves a blank band
    under a short figure nor clips a tall one (figures without a height keep the CSS
    minimum, which plotly then fills)."""
    layout = getattr(fig, "layout", None)
    height = getattr(layout, "height", None) if layout is not None else None
    if height is None and isinstance(fig, Mapping):
        height = (fig.get("layout") or {}).get("height")
    if not isinstance(height, int | float):
        return ""
    return f' style="height:{int(height)}px;min-height:0"'


_DRAW_JS = """
document.querySelectorAll("div.plot").forEach(function (div) {
  if (!window.Plotly) {
    div.textContent = "plotly.js did not load (a --cdn report needs the network).";
    return;
  }
  var fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
  Plotly.newPlot(div, fig.data, fig.layout || {}, {responsive: true, displaylogo: false});
});
"""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1280px;padding:0 1.5rem 3rem;color:#1f2328;background:#fff}
h1{font-size:1.6rem;margin:1.2rem 0 .2rem}h2{font-size:1.25rem;margin:2rem 0 .6rem;
border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
p.for{color:#59636e;margin:0 0 1rem}
nav.toc{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.4rem 1rem}
nav.toc h2{border:0;margin:.3rem 0;font-size:1rem}nav.toc ol{margin:.2rem 0;columns:2}
a{color:#0969da}ul.notes{color:#59636e}
div.table-wrap{overflow-x:auto;margin:.6rem 0}
table{border-collapse:collapse;font-size:13px;max-width:100%}caption{text-align:left;
font-weight:600;padding:.3rem 0}
th,td{border:1px solid #d0d7de;padding:.25rem .4rem;vertical-align:top;text-align:left;
overflow-wrap:break-word}
th{background:#f6f8fa;position:sticky;top:0}td{max-width:48rem}
.num{text-align:right;font-variant-numeric:tabular-nums}td.num{white-space:nowrap}
td.good{color:#1a7f37}td.bad{color:#cf222e}
td[title]{text-decoration:underline dotted #8c959f;cursor:help}
table.sortable th{cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:#fafbfc}
div.plot{min-height:360px;margin:.6rem 0}
"""
