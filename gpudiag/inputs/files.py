"""What every reader of a stranger's file shares: opening only regular files, and the
budgets (limits from the environment) that bound what a file can make gpudiag do.

Part of the ground package `inputs`: the readers (`readers/files.py` re-exports these), a
saved trace's meta.json and Parquet tables (`trace.py`, `inputs/tables.py`) all open input
through here.
docs/formats.md lists every budget on hostile input.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, TypeVar

from gpudiag.errors import InputError

Number = TypeVar("Number", int, float)
DEFAULT_MAX_RATIO = 100
DEFAULT_MAX_INFLATED = 256 << 20


def budget(name: str, default: Number) -> Number:
    """A positive limit from the environment variable `name`, else `default`; of the type
    of `default` (seconds may be fractional, counts are whole). Every reader's budget goes
    through here, so a bad value is the same one line everywhere."""
    raw = os.environ.get(name, "").strip().replace("_", "")
    if not raw:
        return default
    try:
        value = type(default)(float(raw))
    except (ValueError, OverflowError):
        kind = "positive integer" if isinstance(default, int) else "positive number"
        raise InputError(None, f"{name}={os.environ[name]!r} is not a number",
                         f"set it to a {kind} (default {default})") from None
    return value if value > 0 else default


def inflation_limit(compressed_bytes: int) -> int:
    """How many bytes a compressed file of `compressed_bytes` may decode to: a gzip
    stream inflated, a Parquet table's columns decoded (GPUDIAG_MAX_INFLATION_RATIO times
    the file, and at least GPUDIAG_MAX_INFLATED_BYTES)."""
    ratio = budget("GPUDIAG_MAX_INFLATION_RATIO", DEFAULT_MAX_RATIO)
    floor = budget("GPUDIAG_MAX_INFLATED_BYTES", DEFAULT_MAX_INFLATED)
    return max(ratio * compressed_bytes, floor)


def size_text(n: float) -> str:
    """A byte count in words for messages: '512 bytes', '4.0 MiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


#: what `stat` calls each kind of file that is not a regular one
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode: int) -> str:
    """What a file of this `st_mode` is, in words ('a FIFO'); 'a regular file' for one."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file, else InputError.

    Opened with O_NONBLOCK and then checked with fstat, so a FIFO without a writer (where a
    plain open() waits forever) or a device is refused on the same file descriptor that
    would be read, with no window to swap the file in between. OSError propagates (a
    missing file, a symlink loop: ELOOP).
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(path, f"is not a regular file ({kind_of(mode)})",
                             "gpudiag reads only regular files: point at the profile itself")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
