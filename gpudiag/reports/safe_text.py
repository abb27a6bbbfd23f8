"""Text from a profile made safe for the place it is shown: a terminal, an HTML page, a
plotly label, a Perfetto trace, a spreadsheet cell.

Kernel names, file names, range names and everything in a saved trace's meta.json come
from the input, which may be hostile. Every string of data an output holds goes through one
of these functions, chosen by where it lands; all of them start from `printable` (or, for
the exports that keep text as it was, from `gpudiag.text.valid`):

    printable(name)    plain text (click.echo, Perfetto names): valid Unicode (a lone
                       surrogate from a file name becomes `\\xff`), control characters and
                       the bidi / line-separator controls written as visible escapes
    shown(name)        printable, cut to MAX_SHOWN characters (a 1 MB name stays 4 KB)
    terminal(name)     rich markup: shown, and `[...]` markup escaped
    html_text(name)    HTML text or attribute: shown, & < > " ' escaped
    plotly_label(name) plotly's label HTML: shown, & < > escaped (plotly renders <a>, <b>)
    csv_cell(name)     a CSV cell: valid Unicode, a leading = + - @ TAB or CR made text
                       with a quote; otherwise the text as it was

`per_value` applies one of them once per distinct value of a column.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from rich.markup import escape

from gpudiag.inputs.text import valid

#: C0 and C1 control characters, DEL, and the Unicode controls that reorder or break lines
#: (bidi marks, embeddings, overrides and isolates, line and paragraph separators): none
#: prints as itself, and U+202E makes 'gpj.exe' read as 'exe.jpg'
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")

#: first characters a spreadsheet reads as the start of a formula (or, TAB/CR, as a cell
#: break that a formula can follow)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")

#: characters of one value a page or terminal shows; a longer name (a hostile trace can
#: hold a 60 MB one) is cut there, with the count of what was left out
MAX_SHOWN = 4096


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any) -> str:
    """`value` as valid text with every control character written as a visible escape
    (ESC becomes the four characters `\\x1b`, U+202E the six `\\u202e`), so nothing in it
    can drive a terminal or reorder what is around it."""
    return _CONTROL.sub(_visible, valid(str(value)))


def shown(value: Any) -> str:
    """`printable(value)`, cut to MAX_SHOWN characters with a note of how many were left
    out: what a page or a terminal shows of a name (exports keep it whole)."""
    text = printable(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:MAX_SHOWN]}… ({len(text) - MAX_SHOWN:,} more characters)"


def terminal(value: Any) -> str:
    """`value` ready to go into rich markup: shown, and `[...]` shown as written (rich
    would otherwise read `[link=...]` as a live hyperlink)."""
    return escape(shown(value))


def html_text(value: Any) -> str:
    """`value` ready for HTML text or a quoted attribute: shown, then escaped (a kernel
    named `</script>` or `<img onerror=...>` stays text)."""
    return html.escape(shown(value))


def plotly_label(value: Any) -> str:
    """`value` ready for a plotly hover text, title, tick or legend label: plotly renders a
    subset of HTML there (`<a href>`, `<b>`, `<br>`), so & < > are escaped (plotly shows
    the entities as the characters). Shown: control characters visible, cut when long."""
    return html.escape(shown(value), quote=False)


def csv_cell(value: Any) -> Any:
    """A string that a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, TAB, CR first)
    gets a leading `'`, as spreadsheet-safe exporters do; other strings are kept as they
    were (made valid Unicode), anything else is returned as is."""
    if not isinstance(value, str):
        return value
    value = valid(value)
    return "'" + value if value.startswith(_FORMULA_START) else value


def per_value(column: pd.Series, make: Callable[[Any], Any]) -> pd.Series:
    """`column` with `make` applied to each distinct value once (missing values stay
    missing), as an object column: a categorical of a million rows and a thousand names
    costs a thousand calls."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        made = np.array([make(c) for c in column.cat.categories] + [None], dtype=object)
        return pd.Series(made[column.cat.codes.to_numpy()], index=column.index, dtype=object)
    done: dict[Any, Any] = {}

    def once(value: Any) -> Any:
        if value is None:
            return None
        try:
            return done[value] if value in done else done.setdefault(value, make(value))
        except TypeError:  # an unhashable cell (a list): made on its own
            return make(value)

    out = [once(v) for v in column.to_numpy(dtype=object, na_value=None)]
    return pd.Series(out, index=column.index, dtype=object)
