"""Text that is valid Unicode, whatever the input spelled it with.

Two kinds of text reach gpudiag without a reader decoding it from bytes. File names: Linux
names are bytes, and Python spells a byte that is not UTF-8 as a lone surrogate
(`os.fsdecode(b"\\xff") == "\\udcff"`). JSON strings: `"\\udcff"` is a legal JSON escape of a
lone surrogate, and `json.loads` keeps it (meta.json of a saved trace, a run directory's
meta.json). A pickle's strings too may hold them. A lone surrogate cannot be encoded as
UTF-8, so writing one to an HTML page, a Parquet file, a JSON export or a pandas string
column raises deep inside that writer.

`valid` writes each lone surrogate as a visible escape instead (`\\xff` for a byte the file
system gave, `\\udNNN` for any other), so a name still says what it was and every output can
encode it. Readers that decode bytes themselves replace undecodable bytes with U+FFFD
(`errors="replace"`) and count them; this module is for the text no reader decoded.

    valid("tr\\udcffce.json")   # 'tr\\\\xffce.json'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

#: UTF-16 surrogate code points: never valid on their own in a str that will be encoded
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte the file system gave
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def valid(value: str) -> str:
    """`value` with each lone surrogate written as a visible escape (see the module
    docstring); `value` itself when it has none (the common case costs one search)."""
    return _SURROGATE.sub(_escape, value) if _SURROGATE.search(value) else value


def valid_tree(value: Any) -> Any:
    """`value` (parsed JSON, a meta dict) with `valid` applied to every string in it, keys
    too; other values are returned as they are."""
    if isinstance(value, str):
        return valid(value)
    if isinstance(value, dict):
        return {valid_tree(key): valid_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(valid_tree(item) for item in value)
    return value


def valid_categorical(values: Sequence[Any] | np.ndarray) -> pd.Categorical:
    """`pd.Categorical(values)` (objects: text, None) with its text `valid`, judged once per
    distinct value: pandas' string dtype refuses a lone surrogate outright."""
    array = np.asarray(values, dtype=object)
    codes, uniques = pd.factorize(array)
    made = np.array([valid(u) if isinstance(u, str) else u for u in uniques], dtype=object)
    if all(a is b for a, b in zip(made, uniques, strict=True)):
        return pd.Categorical(array)
    return pd.Categorical(np.where(codes >= 0, made[np.maximum(codes, 0)], None))
