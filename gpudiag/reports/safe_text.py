"""Text from a profile made safe for the place it is shown: a terminal, a plotly label, a
spreadsheet cell.

Kernel names, file names, range names and everything in a saved trace's meta.json come
from the input, which may be hostile. Every string of data a report shows goes through one
of these functions, chosen by where it lands:

    terminal(name)     rich markup: control characters made visible, markup escaped
    printable(name)    plain text (click.echo): control characters made visible
    plotly_label(name) plotly's label HTML: & < > escaped (plotly renders <a>, <b>, <br>)
    csv_cell(name)     a CSV cell: a leading = + - @ TAB or CR made text with a quote
    without_surrogates(meta)  a file or command name that is not UTF-8, written `\\xe9`
"""

from __future__ import annotations

import html
import re
from typing import Any

from rich.markup import escape

#: C0 and C1 control characters, DEL, and the Unicode controls that reorder or break lines
#: (bidi overrides and isolates, line and paragraph separators): none prints as itself
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

#: first characters a spreadsheet reads as the start of a formula (or, TAB/CR, as a cell
#: break that a formula can follow)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any) -> str:
    """`value` as text with every control character written as a visible escape
    (ESC becomes the four characters `\\x1b`), so nothing in it can drive a terminal."""
    return _CONTROL.sub(_visible, str(value))


def terminal(value: Any) -> str:
    """`value` ready to go into rich markup: printable, and `[...]` shown as written
    (rich would otherwise read `[link=...]` as a live hyperlink)."""
    return escape(printable(value))


def plotly_label(value: Any) -> str:
    """`value` ready for a plotly hover text, title, tick or legend label: plotly renders a
    subset of HTML there (`<a href>`, `<b>`, `<br>`), so & < > are escaped (plotly shows
    the entities as the characters). Control characters are made visible too."""
    return html.escape(printable(value), quote=False)


def csv_cell(value: Any) -> Any:
    """A string that a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, TAB, CR first)
    gets a leading `'`, as spreadsheet-safe exporters do; anything else is returned as is."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def without_surrogates(value: Any) -> Any:
    """`value` (a string, or a meta dict/list of them) with every byte of a name that is not
    UTF-8 written as an escape: a folder or argument named in latin-1 reaches Python as lone
    surrogates (`caf\\udce9`), which neither pyarrow's strings nor a UTF-8 page can hold
    (the report failed on them). Returns `value` itself when nothing needed it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate no file system byte made
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
            return raw.decode("utf-8", "backslashreplace")
        return value
    if isinstance(value, dict):
        items = {key: without_surrogates(item) for key, item in value.items()}
        changed = any(items[key] is not item for key, item in value.items())
        return items if changed else value
    if isinstance(value, list | tuple):
        parts = [without_surrogates(item) for item in value]
        changed = any(new is not old for new, old in zip(parts, value, strict=True))
        return type(value)(parts) if changed else value
    return value
