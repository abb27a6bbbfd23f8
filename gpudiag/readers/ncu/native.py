"""What ncu_report's native code writes to file descriptor 2, kept and read back as lines.

ncu_report prints through absl and straight to fd 2, below Python: `NativeStderr` points fd 2
at a file for the span of a call (in the child process of `isolated`, a file the parent reads
after a crash), and `native_lines` strips absl's preamble and prefixes.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import IO

#: set by the child process (`child.py`): where to keep what ncu_report writes to fd 2
NATIVE_LOG_ENV = "GPUDIAG_NCU_NATIVE_LOG"
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog()"
_ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")


class NativeStderr:
    """Capture what native code writes to file descriptor 2 while a report is opened.

    ncu_report's protobuf parser logs a damaged header straight to stderr (through absl),
    which would break the CLI's one-line errors; captured, the complaint becomes part of
    the InputError (or of `meta["ncu_report_messages"]` when the report still loads).
    The redirection is process-wide, so it spans only the opening of the report; where fd 2
    cannot be duplicated (no console), nothing is captured.
    """

    def __init__(self, keep: Path | None = None) -> None:
        self._keep = keep  # a file to capture into, so a parent can read it after a crash
        self._saved: int | None = None
        self._sink: IO[bytes] | None = None
        self._lines: list[str] = []

    def __enter__(self) -> NativeStderr:
        try:
            self._saved = os.dup(2)
        except OSError:
            return self
        self._sink = self._keep.open("w+b") if self._keep else tempfile.TemporaryFile()
        sys.stderr.flush()
        os.dup2(self._sink.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is None or self._sink is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._lines = self.messages()
        self._sink.close()
        self._saved = self._sink = None

    def messages(self) -> list[str]:
        """The lines written so far, without absl's logging preamble and prefixes."""
        if self._sink is None:
            return self._lines
        self._sink.seek(0)
        return native_lines(self._sink.read())


def native_lines(data: bytes) -> list[str]:
    """Lines native code wrote to stderr, without absl's logging preamble and prefixes."""
    lines = data.decode("utf-8", "replace").splitlines()
    return [_ABSL_PREFIX.sub("", line).strip() for line in lines
            if line.strip() and not line.startswith(_ABSL_PREAMBLE)]
