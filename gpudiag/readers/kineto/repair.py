"""Repairing the one kind of invalid JSON that Kineto itself writes: bare quotes in names.

torch.profiler with `with_stack=True` names Python events `file(line): function` without
escaping them, so a function whose name holds a quote (Cython functions of pyarrow, code
made by `exec`) makes the whole trace invalid JSON. Kineto writes each key of an event on
its own line, so the value of a `"name"` line can be re-escaped without parsing the file:
only lines with a quote inside the value change, every other byte stays as it was.

    fixed, lines = escape_bare_quotes(data)
"""

from __future__ import annotations

import re

#: a pretty-printed `"name": "..."` line whose value holds a bare `"`
_BARE_QUOTE_NAME = re.compile(rb'(?m)^([ \t]*"name": ")((?:[^"\n\\]|\\.)*"[^\n]*)(",?\r?)$')
_UNESCAPED_QUOTE = re.compile(rb'(?<!\\)"')


def escape_bare_quotes(data: bytes) -> tuple[bytes, int]:
    """`data` with the bare quotes of its name lines escaped, and how many lines changed."""
    repaired = 0

    def escape(match: re.Match[bytes]) -> bytes:
        nonlocal repaired
        repaired += 1
        return match.group(1) + _UNESCAPED_QUOTE.sub(rb'\\"', match.group(2)) + match.group(3)

    fixed = _BARE_QUOTE_NAME.sub(escape, data)
    return (fixed, repaired) if repaired else (data, 0)
