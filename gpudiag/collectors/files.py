"""Reading input bytes, with every way a file can be damaged turned into an InputError."""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from pathlib import Path
from typing import BinaryIO

from gpudiag.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 65536


#: what `stat` calls each kind of file that is not a regular one
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file, else InputError.

    Opened with O_NONBLOCK and then checked with fstat, so a FIFO without a writer (where a
    plain open() waits forever) or a device is refused on the same file descriptor that
    would be read, with no window to swap the file in between. OSError propagates.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise InputError(path, f"is not a regular file ({kind})",
                             "gpudiag reads only regular files: point at the profile itself")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_head(path: Path, size: int = HEAD_BYTES) -> tuple[bytes, bool]:
    """The first `size` bytes of the content (decompressed when gzipped) and whether it was."""
    try:
        with open_regular(path) as f:
            raw = f.read(size)
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc
    if not raw:
        raise InputError(path, "is empty (0 bytes)", "the profiler did not finish writing it")
    if not raw.startswith(GZIP_MAGIC):
        return raw, False
    try:
        head = zlib.decompressobj(wbits=31).decompress(raw, size)
    except zlib.error as exc:
        raise InputError(path, f"is not a valid gzip file ({exc})") from exc
    if not head:
        raise InputError(path, "is a gzip file with no content")
    return head, True


def read_bytes(path: Path) -> bytes:
    """The whole content, decompressed when gzipped."""
    try:
        with open_regular(path) as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(
            path, f"is a truncated or damaged gzip file ({exc})",
            "copy it again, or re-export it: the end of the file is missing",
        ) from exc
