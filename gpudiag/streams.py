"""gpudiag's own stdout and stderr, made so that printing never costs the work.

Two ways printing used to end a command half done:
- an encoding that cannot write a character (`PYTHONIOENCODING=ascii`, a latin-1 terminal,
  a file name that is not UTF-8, whose bytes are surrogates in Python): a µ or a name ended
  the command with a traceback. Now such characters are written as escapes (`\\xb5`);
- a reader that stops early (`gpudiag compare A B -o diff.html | head`): the first write
  after `head` exits raised BrokenPipeError, so the page `-o` asked for was never written
  and the command ended with status 1. Now stdout, when it is a pipe, discards what nobody
  reads any more and the command finishes its work and exits as it would have.

    streams.lenient()   # once, before a command prints
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys


class _Discarding(io.RawIOBase):
    """A file descriptor's writes, until its reader goes away: then every write reports
    success and writes nothing (the descriptor stays open; it is not ours)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self.broken = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if not self.broken:
            try:
                return os.write(self._fd, data)
            except BrokenPipeError:
                self.broken = True
        return len(data)

    def close(self) -> None:  # leave the descriptor to the process
        self.broken = True
        super().close()


def lenient() -> None:
    """Make stdout and stderr lenient (see the module docstring)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")
    piped = _pipe_fd(sys.stdout)
    if piped is not None:
        sys.stdout.flush()
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(_Discarding(piped)), encoding=sys.stdout.encoding,
            errors="backslashreplace", line_buffering=True)


def _pipe_fd(stream: object) -> int | None:
    """The descriptor of `stream` when it is a pipe (None for a terminal, a file, or a
    stream without one, such as a test's capture)."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
