"""Reading input bytes, with every way a file can be damaged turned into an InputError.

A gzipped file is inflated a block at a time and stops at the inflation budget
(`inflation_limit`): a few MB of gzip can hold gigabytes of zeros, which would otherwise be
read whole into memory (a "gzip bomb"). Real profiles compress 10-30x; the budget allows
GPUDIAG_MAX_INFLATION_RATIO (100) times the file's size, and at least
GPUDIAG_MAX_INFLATED_BYTES (256 MiB) whatever the file's size. docs/formats.md lists every
budget on hostile input; `budget`, `inflation_limit` and `open_regular` live in the ground
package `gpudiag.inputs.files` (a saved trace's tables open through them too).
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpudiag.errors import InputError
from gpudiag.inputs.files import budget, inflation_limit, open_regular, size_text

__all__ = ["Inflater", "at_most_files", "budget", "damaged", "decoded_size", "inflation_limit",
           "open_regular", "read_bytes", "read_head", "size_text"]

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 65536
READ_BYTES = 256 << 10
#: inflated bytes handed out per zlib call, so a bomb is caught within one block of its limit
INFLATE_BLOCK = 1 << 20
#: files one folder may hold for `gpudiag.load`; GPUDIAG_MAX_FILES raises it
DEFAULT_MAX_FILES = 5000


def at_most_files(folder: Path, files: Iterable[Path]) -> list[Path]:
    """`files` (found under `folder`) as a list, or InputError past the file-count budget.

    Stops walking at the first file over the budget, so a folder of a million files is
    refused in the time it takes to list the budget's worth.
    """
    limit = budget("GPUDIAG_MAX_FILES", DEFAULT_MAX_FILES)
    out = list(itertools.islice(files, limit + 1))
    if len(out) > limit:
        raise InputError(
            folder, f"holds more than {limit} files (reading each costs about 40 ms)",
            "point at the files you need (or a folder of them), or raise the budget: "
            f"GPUDIAG_MAX_FILES=<count> (default {DEFAULT_MAX_FILES})")
    return out


class Inflater:
    """Inflates the gzip members of a file fed a block at a time, within the budget.

        inflater = Inflater(path, path.stat().st_size)
        for block in blocks:
            for text in inflater.feed(block): ...
        inflater.finish()   # InputError when the stream ends early
    """

    def __init__(self, path: Path, compressed_bytes: int) -> None:
        self.path = path
        self.compressed_bytes = compressed_bytes
        self.limit = inflation_limit(compressed_bytes)
        self.total = 0
        self._zlib = zlib.decompressobj(wbits=31)

    def feed(self, block: bytes) -> Iterator[bytes]:
        data = block
        while True:
            out = self._zlib.decompress(data, INFLATE_BLOCK)
            data = self._zlib.unconsumed_tail
            if out:
                self.total += len(out)
                if self.total > self.limit:
                    raise self._bomb()
                yield out
            if self._zlib.eof:
                rest = self._zlib.unused_data
                if not rest:
                    return
                self._zlib = zlib.decompressobj(wbits=31)  # concatenated gzip members
                data = rest
            elif not data and len(out) < INFLATE_BLOCK:
                return

    def finish(self) -> None:
        if not self._zlib.eof:
            raise InputError(
                self.path, "is a truncated or damaged gzip file (the stream ends early)",
                "copy it again, or re-export it: the end of the file is missing")

    def _bomb(self) -> InputError:
        return InputError(
            self.path,
            f"inflates to more than {size_text(self.limit)} from "
            f"{size_text(self.compressed_bytes)} of gzip (over the inflation budget: a gzip "
            "bomb, or a file of repeated bytes)",
            "if it is a real profile, raise the budget: GPUDIAG_MAX_INFLATION_RATIO=<ratio> "
            "(default 100) or GPUDIAG_MAX_INFLATED_BYTES=<bytes> (default 256 MiB)")


def damaged(path: Path, exc: Exception) -> InputError:
    return InputError(
        path, f"is a truncated or damaged gzip file ({exc})",
        "copy it again, or re-export it: the end of the file is missing",
    )


def read_head(path: Path, size: int = HEAD_BYTES) -> tuple[bytes, bool]:
    """The first `size` bytes of the content (decompressed when gzipped) and whether it was."""
    try:
        with open_regular(path) as handle:
            raw = handle.read(size)
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
    """The whole content, decompressed when gzipped (within the inflation budget)."""
    try:
        with open_regular(path) as handle:
            first = handle.read(2)
            if first != GZIP_MAGIC:
                return first + handle.read()
            inflater = Inflater(path, os.fstat(handle.fileno()).st_size)
            out = bytearray()
            block = first
            while block:
                for text in inflater.feed(block):
                    out += text
                block = handle.read(READ_BYTES)
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc
    except zlib.error as exc:
        raise damaged(path, exc) from exc
    inflater.finish()
    return bytes(out)


def decoded_size(path: Path) -> int:
    """About how many bytes reading the file `path` decodes: a gzip file's uncompressed
    size (its trailer holds it, modulo 4 GiB), else its size; 0 when it cannot be read
    (its reader will say why)."""
    try:
        size = path.stat().st_size
        if size < 18:
            return size
        with path.open("rb") as stream:
            if stream.read(2) != b"\x1f\x8b":
                return size
            stream.seek(-4, os.SEEK_END)
            (inflated,) = struct.unpack("<I", stream.read(4))
    except (OSError, struct.error):
        return 0
    return max(int(inflated), size)  # past 4 GiB the trailer wraps: at least the file
