"""HTML tables for the report: escaped cells, human units, sortable by a click on a header.

Numbers are shown formatted ('1.23 ms', '4.5 GiB') but sorted by their raw value, which each
cell carries in a `data-value` attribute; the sorter (`SORT_JS`, inlined once per page) reads
it, so sorting stays numeric whatever the display unit. Every cell, hover text and header is
escaped with `safe_text.html_text` (control and bidi characters shown, a very long name cut):
kernel names and call sites come straight from the profiled program. A column
can carry a hover text per cell (`titles`: the cell's `title` attribute), so a table shows a
kernel's short name and keeps the full demangled one a mouse-over away.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpudiag.reports.formats import format_bytes, format_ns
from gpudiag.reports.safe_text import html_text, shown

Format = str | Callable[[Any], str]
"""A column format: a name from `FORMATS` ('ns', 'bytes', 'share', ...) or a function."""
_NUM = ' class="num"'


def _share(value: Any) -> str:
    return f"{100 * float(value):.1f}%"


def _pct(value: Any) -> str:
    return f"{float(value):.1f}%"


def _int(value: Any) -> str:
    return f"{int(value):,}"


def _float(value: Any) -> str:
    return f"{float(value):.3g}"


def _gbps(value: Any) -> str:
    return f"{float(value):.3g} GB/s"


def _bytes_per_s(value: Any) -> str:
    return f"{float(value) / 1e9:.3g} GB/s"


FORMATS: dict[str, Callable[[Any], str]] = {
    "ns": lambda v: format_ns(float(v)),
    "bytes": lambda v: format_bytes(int(v)),
    "share": _share,  # a fraction 0..1 shown as a percentage
    "pct": _pct,  # already a percentage (ncu's metrics)
    "int": _int,
    "float": _float,
    "gbps": _gbps,  # GB/s as nccl-tests reports them (1e9 bytes/s)
    "bytes_per_s": _bytes_per_s,
    "text": str,
}


@dataclass(frozen=True, eq=False)
class Table:
    """A DataFrame with its column formats and an optional caption, rendered by `table`."""

    frame: pd.DataFrame
    formats: Mapping[str, Format] | None = None
    caption: str | None = None
    sortable: bool = True
    titles: Mapping[str, Sequence[Any]] | None = None  # column -> hover text per row
    classes: Mapping[str, Sequence[str]] | None = None  # column -> CSS class per row

    def render(self) -> str:
        """The escaped `<table>` markup (see `table`)."""
        return table(self.frame, formats=self.formats, sortable=self.sortable,
                     caption=self.caption, titles=self.titles, classes=self.classes)


def table(df: pd.DataFrame, *, formats: Mapping[str, Format] | None = None,
          sortable: bool = True, caption: str | None = None,
          titles: Mapping[str, Sequence[Any]] | None = None,
          classes: Mapping[str, Sequence[str]] | None = None) -> str:
    """One escaped HTML table; numeric cells keep their raw value for numeric sorting.

        html = table(frame, formats={"dur_ns": "ns", "share": "share"})
        page("Kernels", [Section("Top kernels", table=frame)])  # or embed `html` yourself
        # the header row sorts on click when `sortable` (the default)

    Columns without a format are shown by dtype (integers with thousands separators, floats
    with 3 significant digits, booleans as 'yes'); missing values are empty cells. The index
    is not shown: pass `df.reset_index()` to keep it. `titles`: per column, one hover text
    per row (e.g. `{"kernel": frame_of_full_names}`), escaped like the cells; a missing
    or empty text gives no `title` attribute. `classes`: per column, CSS classes per row
    (`num` right-aligns text as numbers are; `good` / `bad` mark a change's verdict).
    """
    formats = formats or {}
    titles = titles or {}
    columns = [str(c) for c in df.columns]
    unknown = sorted(set(map(str, titles)) - set(columns))
    if unknown:
        raise ValueError(f"titles for unknown column(s) {unknown}; the table has {columns}")
    numeric = [_is_numeric(df[c]) for c in df.columns]
    cls = ' class="sortable"' if sortable else ""
    head = "".join(f'<th scope="col"{_NUM if num else ""}>{breakable(name)}</th>'
                   for name, num in zip(columns, numeric, strict=True))
    classes = classes or {}
    cells = [_column_cells(df[c], formats.get(str(c)), num, titles.get(str(c)),
                           classes.get(str(c)))
             for c, num in zip(df.columns, numeric, strict=True)]
    body = "\n".join("<tr>" + "".join(row) + "</tr>" for row in zip(*cells, strict=True)) \
        if cells else ""
    cap = f"<caption>{html_text(caption)}</caption>" if caption else ""
    return (f"<table{cls}>{cap}<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody></table>")


def _column_cells(column: pd.Series, fmt: Format | None, numeric: bool,
                  titles: Sequence[Any] | None = None,
                  classes: Sequence[str] | None = None) -> list[str]:
    """Every cell of one column as `<td>` markup (a column at a time: one dtype check)."""
    show = _formatter(column, fmt)
    values = column.tolist()
    hover = _per_row(column, "titles", titles, [""] * len(values))
    extra = _per_row(column, "classes", classes, [""] * len(values))
    out = []
    for value, tip, more in zip(values, hover, extra, strict=True):  # a few hundred rows
        missing = _missing(value)
        title = f' title="{html_text(tip)}"' if tip else ""
        if numeric:
            text = "" if missing else html_text(show(value))
            raw = "" if missing else _raw(value)
            kind = html.escape(" ".join(["num", *more.split()]))
            out.append(f'<td class="{kind}" data-value="{raw}"{title}>{text}</td>')
        else:
            text = "" if missing else breakable(show(value))
            kind = f' class="{html.escape(more)}"' if more else ""
            out.append(f"<td{kind}{title}>{text}</td>")
    return out


def _per_row(column: pd.Series, what: str, given: Sequence[Any] | None,
             default: list[str]) -> list[str]:
    """A column's hover texts or classes, one per row ('' for none)."""
    if given is None:
        return default
    out = ["" if _missing(item) else str(item) for item in list(given)]
    if len(out) != len(default):
        raise ValueError(f"column {column.name!r} has {len(default)} rows but "
                         f"{len(out)} {what}")
    return out


LONG_TOKEN = 20
"""Characters past which a token without spaces gets places to wrap (`breakable`)."""
_AFTER_SEPARATOR = re.compile(r"(?<=::)|(?<=[_,/.(<>=\]\-])(?=[^_,/.(<>=\]\-:])"
                              r"|(?<=[a-z])(?=[A-Z])")  # and inside CamelCase


def breakable(text: str) -> str:
    """`text` shown (`safe_text.shown`) and escaped, with `<wbr>` (a place the browser may
    wrap, invisible otherwise) inside tokens longer than LONG_TOKEN: after `::`, `_`, `/`,
    `.`, `,`, brackets, between the words of CamelCase, and every 16 characters where
    there is none of these.

        breakable("aten::max_pool2d_with_indices")  # 'aten::<wbr>max_<wbr>pool2d_<wbr>...'

    A call site or a kernel name is one long word: without these a table grows as wide
    as its longest name (the page scrolls sideways), or breaks short words like
    'host_bound' at any letter when wrapping anywhere is allowed.
    """
    out = []
    for token in _SPACE.split(shown(text)):
        if len(token) <= LONG_TOKEN:
            out.append(html.escape(token))
            continue
        pieces = [chunk for piece in _AFTER_SEPARATOR.split(token)
                  for chunk in _chunks(piece, 16)]
        out.append("<wbr>".join(html.escape(piece) for piece in pieces if piece))
    return "".join(out)


_SPACE = re.compile(r"(\s+)")


def _chunks(piece: str, size: int) -> list[str]:
    return [piece] if len(piece) <= LONG_TOKEN else [
        piece[i:i + size] for i in range(0, len(piece), size)]


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _formatter(column: pd.Series, fmt: Format | None) -> Callable[[Any], str]:
    if callable(fmt):
        return fmt
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown column format {fmt!r}; use one of {sorted(FORMATS)} "
                             "or a function value -> str")
        return FORMATS[fmt]
    if pd.api.types.is_bool_dtype(column.dtype):
        return lambda v: "yes" if v else ""
    if pd.api.types.is_integer_dtype(column.dtype):
        return _int
    if pd.api.types.is_float_dtype(column.dtype):
        return _float
    return str


def _is_numeric(column: pd.Series) -> bool:
    return bool(pd.api.types.is_numeric_dtype(column.dtype)
                and not pd.api.types.is_bool_dtype(column.dtype))


def _raw(value: Any) -> str:
    """The sort key: an exact, locale-free number (repr of int or float)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    number = float(value)
    return repr(number) if math.isfinite(number) else ""


SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (t) {
  var heads = t.tHead ? Array.from(t.tHead.rows[0].cells) : [];
  heads.forEach(function (th, col) {
    th.tabIndex = 0;
    function sort() {
      var body = t.tBodies[0], rows = Array.from(body.rows);
      var asc = th.getAttribute("aria-sort") !== "ascending";
      heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      function key(r) {
        var c = r.cells[col], v = c.getAttribute("data-value");
        return v === null ? c.textContent : v;
      }
      var num = th.classList.contains("num");
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), d;
        if (x === "" || y === "") { d = (x === "") - (y === ""); return d; }
        if (num) { x = Number(x); y = Number(y); }
        d = num ? (x < y ? -1 : x > y ? 1 : 0) : x.localeCompare(y);
        return asc ? d : -d;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    }
    th.addEventListener("click", sort);
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
  });
});
"""
"""Sorts every `table.sortable` by the clicked column: numeric columns (`th.num`) by their
cells' `data-value`, others by text; empty cells last either way; a second click reverses."""
