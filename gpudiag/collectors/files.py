"""Reading input bytes, with every way a file can be damaged turned into an InputError."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from gpudiag.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 65536


def read_head(path: Path, size: int = HEAD_BYTES) -> tuple[bytes, bool]:
    """The first `size` bytes of the content (decompressed when gzipped) and whether it was."""
    try:
        with path.open("rb") as f:
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
        raw = path.read_bytes()
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
