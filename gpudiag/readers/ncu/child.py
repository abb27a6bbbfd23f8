"""The child process of `isolated`: read one report in-process, hand back Parquet + JSON.

    python -P -m gpudiag.readers.ncu.child REPORT OUT [METRICS_JSON]

It saves the Trace under OUT/trace (our own files: the parent reads them without pickle), or
the error as OUT/error.json; a native crash leaves neither, and the parent says so.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from gpudiag.errors import GpudiagError, InputError
from gpudiag.readers.ncu.isolated import ERROR_FILE, NATIVE_LOG
from gpudiag.readers.ncu.native import NATIVE_LOG_ENV
from gpudiag.readers.ncu.reader import read_in_process
from gpudiag.trace import Trace


def _save(trace: Trace, out: Path) -> None:
    """The child's half of the hand-over: one Parquet file per non-empty table, meta.json."""
    names = []
    for name, frame in trace.tables().items():
        if len(frame):
            frame.to_parquet(out / f"{name}.parquet", index=False)
            names.append(name)
    (out / "meta.json").write_text(json.dumps({"meta": trace.meta, "tables": names},
                                              default=str))


def _error_record(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, InputError):
        return {"type": "InputError", "path": exc.path, "problem": exc.problem, "fix": exc.fix}
    if isinstance(exc, GpudiagError):
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": "unexpected", "name": type(exc).__name__, "message": str(exc),
            "traceback": traceback.format_exc()}


def main(argv: list[str]) -> int:
    """The child: read the report, save the trace under OUT/trace or the error as JSON."""
    report, out = Path(argv[0]), Path(argv[1])
    os.environ[NATIVE_LOG_ENV] = str(out / NATIVE_LOG)
    metrics = json.loads(argv[2]) if len(argv) > 2 else None
    try:
        _save(read_in_process(report, metrics), out)
    except Exception as exc:  # every failure goes back to the parent as data
        (out / ERROR_FILE).write_text(json.dumps(_error_record(exc), default=str))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
