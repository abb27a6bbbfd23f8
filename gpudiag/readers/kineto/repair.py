"""Repairing the invalid JSON that Kineto itself writes: bare quotes in names, and names
that are not valid text.

torch.profiler with `with_stack=True` names Python events `file(line): function` without
escaping them, so a function whose name holds a quote (Cython functions of pyarrow, code
made by `exec`) makes the whole trace invalid JSON. Kineto writes each key of an event on
its own line, so the value of a `"name"` line can be re-escaped without parsing the file:
only lines with a quote inside the value change, every other byte stays as it was.

Kineto copies names (kernel names, NVTX ranges, `record_function` labels, file paths) into
the JSON as the program gave them, without checking that they are UTF-8, and escapes a
lone UTF-16 surrogate as `\\udcff` if a name holds one. Neither is valid JSON text (msgspec
refuses the whole file at the first); each such byte sequence or escape becomes U+FFFD, the
rest of the name and of the file stays as it was.

    fixed, counts = repair(data)   # counts: what was repaired, by kind (none: empty)
"""

from __future__ import annotations

import codecs
import re

QUOTES = "event names with unescaped quotes repaired (Kineto writes them so)"
NOT_UTF8 = "bytes that are not UTF-8 read as U+FFFD"
SURROGATES = "escaped lone surrogates (\\udXXX) read as U+FFFD"

#: a pretty-printed `"name": "..."` line whose value holds a bare `"`
_BARE_QUOTE_NAME = re.compile(rb'(?m)^([ \t]*"name": ")((?:[^"\n\\]|\\.)*"[^\n]*)(",?\r?)$')
_UNESCAPED_QUOTE = re.compile(rb'(?<!\\)"')
#: an escaped backslash (skipped whole, so `\\\\udcff` stays text), a surrogate pair, or a
#: surrogate escape on its own
_SURROGATE_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_REPLACEMENT = "\ufffd".encode()
#: bytes decoded at a time when invalid UTF-8 is replaced (memory stays a few of these)
_BLOCK = 1 << 20


def repair(data: bytes) -> tuple[bytes, dict[str, int]]:
    """`data` with every repair applied, and the count of each kind made (empty: none)."""
    counts = {}
    for kind, fix in ((NOT_UTF8, valid_utf8), (SURROGATES, no_lone_surrogates),
                      (QUOTES, escape_bare_quotes)):
        data, count = fix(data)
        if count:
            counts[kind] = count
    return data, counts


def escape_bare_quotes(data: bytes) -> tuple[bytes, int]:
    """`data` with the bare quotes of its name lines escaped, and how many lines changed."""
    repaired = 0

    def escape(match: re.Match[bytes]) -> bytes:
        nonlocal repaired
        repaired += 1
        return match.group(1) + _UNESCAPED_QUOTE.sub(rb'\\"', match.group(2)) + match.group(3)

    fixed = _BARE_QUOTE_NAME.sub(escape, data)
    return (fixed, repaired) if repaired else (data, 0)


def valid_utf8(data: bytes) -> tuple[bytes, int]:
    """`data` with each run of bytes that are not UTF-8 replaced by U+FFFD, and how many
    runs were (a block at a time: a 256 MB trace is never one str)."""
    try:
        data.decode("utf-8")
        return data, 0
    except UnicodeDecodeError:
        pass
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out, replaced = bytearray(), 0
    for start in range(0, len(data), _BLOCK):
        block = data[start:start + _BLOCK]
        last = start + _BLOCK >= len(data)
        text = decoder.decode(block, final=last).encode("utf-8")
        replaced += text.count(_REPLACEMENT) - block.count(_REPLACEMENT)
        out += text
    return bytes(out), max(replaced, 1)


def no_lone_surrogates(data: bytes) -> tuple[bytes, int]:
    """`data` with each `\\uXXXX` escape of a lone surrogate (one not in a high-low pair)
    written as `\\ufffd`, and how many were."""
    replaced = 0

    def fix(match: re.Match[bytes]) -> bytes:
        nonlocal replaced
        token = match.group()
        if token == b"\\\\" or len(token) == 12:  # an escaped backslash, a valid pair
            return token
        replaced += 1
        return b"\\ufffd"

    fixed = _SURROGATE_ESCAPE.sub(fix, data)
    return (fixed, replaced) if replaced else (data, 0)
