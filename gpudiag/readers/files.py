"""Reading input bytes, with every way a file can be damaged turned into an InputError.

A gzipped file is inflated a block at a time and stops at the inflation budget
(`inflation_limit`): a few MB of gzip can hold gigabytes of zeros, which would otherwise be
read whole into memory (a "gzip bomb"). Real profiles compress 10-30x; the budget allows
GPUDIAG_MAX_INFLATION_RATIO (100) times the file's size, and at least
GPUDIAG_MAX_INFLATED_BYTES (256 MiB) whatever the file's size. docs/formats.md lists every
budget on hostile input.
"""

from __future__ import annotations

import itertools
import os
import stat
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from gpudiag.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
HEAD_BYTES = 65536
READ_BYTES = 256 << 10
#: inflated bytes handed out per zlib call, so a bomb is caught within one block of its limit
INFLATE_BLOCK = 1 << 20
DEFAULT_MAX_RATIO = 100
Number = TypeVar("Number", int, float)
DEFAULT_MAX_INFLATED = 256 << 20
#: files one folder may hold for `gpudiag.load`; GPUDIAG_MAX_FILES raises it
DEFAULT_MAX_FILES = 5000


def budget(name: str, default: Number) -> Number:
    """A positive limit from the environment variable `name`, else `default`; of the type
    of `default` (seconds may be fractional, counts are whole). Every reader's budget goes
    through here, so a bad value is the same one line everywhere."""
    raw = os.environ.get(name, "").strip().replace("_", "")
    if not raw:
        return default
    try:
        value = type(default)(float(raw))
    except ValueError:
        kind = "positive integer" if isinstance(default, int) else "positive number"
        raise InputError(None, f"{name}={os.environ[name]!r} is not a number",
                         f"set it to a {kind} (default {default})") from None
    return value if value > 0 else default


def inflation_limit(compressed_bytes: int) -> int:
    """How many bytes a gzip file of `compressed_bytes` may inflate to."""
    ratio = budget("GPUDIAG_MAX_INFLATION_RATIO", DEFAULT_MAX_RATIO)
    floor = budget("GPUDIAG_MAX_INFLATED_BYTES", DEFAULT_MAX_INFLATED)
    return max(ratio * compressed_bytes, floor)


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


def size_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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


#: what `stat` calls each kind of file that is not a regular one
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file, else InputError.

    Opened with O_NONBLOCK and then checked with fstat, so a FIFO without a writer (where a
    plain open() waits forever) or a device is refused on the same file descriptor that
    would be read, with no window to swap the file in between. OSError propagates.
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "a special file")
            raise InputError(path, f"is not a regular file ({kind})",
                             "gpudiag reads only regular files: point at the profile itself")
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


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
