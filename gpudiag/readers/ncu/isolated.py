"""Reading an Nsight Compute report in a child process, so a crash in ncu_report is one line.

ncu_report is native code: a single flipped byte in a `.ncu-rep` can make it abort (SIGABRT,
exit 134, nothing printed by Python), and a damaged report can make it loop or raise from deep
inside the SWIG layer. So `gpudiag.readers.ncu.reader.read` runs the whole read in a fresh Python
(`python -m gpudiag.readers.ncu.isolated REPORT OUT [METRICS_JSON]`), which writes the
Trace's tables as Parquet and its meta as JSON (no pickle crosses the boundary) or, for an
error, `error.json`. The parent reads that back (not through `Trace.load_dir`, whose checks
are for folders a user hands us); a child killed by a signal, one that runs past
`GPUDIAG_NCU_SECONDS` (default 600 s), or one that fails in a way we did not foresee becomes
an InputError naming the report. The cost is one interpreter start plus importing pandas and
ncu_report in the child, and a Parquet round trip (measured in docs/formats.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag.errors import CollectorError, InputError, MissingDependencyError
from gpudiag.readers.files import budget, open_regular
from gpudiag.readers.ncu.native import native_lines
from gpudiag.trace import Trace

PURPOSE = "Reading an Nsight Compute report"
DEFAULT_SECONDS = 600
SECONDS_ENV = "GPUDIAG_NCU_SECONDS"
DAMAGED = ("the report is damaged or not one this ncu_report can read: copy it again or re-run "
           "ncu (gpudiag read it in a child process, so nothing else was affected)")
ERROR_FILE = "error.json"
#: Python 3.11's -P: no script or working folder at the front of sys.path
SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()
NATIVE_LOG = "native.log"
#: the module the child process runs
CHILD = "gpudiag.readers.ncu.child"


def read_isolated(path: Path, metrics: Iterable[str] | None = None) -> Trace:
    """`ncu.read_in_process(path, metrics)` run in a child process; InputError on a crash."""
    if not _installed("ncu_report"):
        raise MissingDependencyError("ncu_report", "ncu", PURPOSE)
    _regular(path)
    out = Path(tempfile.mkdtemp(prefix="gpudiag-ncu-"))
    try:
        # -P and cwd=out: the child imports nothing from the folder gpudiag was started in
        # (a stranger's folder could hold an ncu_report.py or pandas.py)
        command = [sys.executable, *SAFE_PATH, "-m", CHILD, str(Path(path).absolute()),
                   str(out)]
        if metrics is not None:
            command.append(json.dumps(sorted(metrics)))
        done = _run(path, command, out)
        if done.returncode == 0 and (out / "meta.json").is_file():
            return _load(out)
        raise _failure(path, done, out / ERROR_FILE)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _regular(path: Path) -> None:
    """InputError unless `path` is a regular file (a FIFO would hang the child until its
    time budget); a missing file is left to ncu_report, which says so."""
    try:
        open_regular(Path(path)).close()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from exc


def _installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it here (the child will)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules without a spec
        return module in sys.modules and sys.modules[module] is not None


def _load(out: Path) -> Trace:
    """The parent's half: the Trace the child saved (our own files, in our own folder)."""
    saved = json.loads((out / "meta.json").read_text())
    tables = {name: pd.read_parquet(out / f"{name}.parquet") for name in saved["tables"]}
    return Trace(meta=saved["meta"], **tables)


def _run(path: Path, command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    seconds = _seconds()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        part for part in (str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH"))
        if part)}
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace",
                              timeout=seconds, check=False, env=env, stdin=subprocess.DEVNULL,
                              cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise InputError(path, f"was not read by ncu_report within {seconds} s",
                         f"if the report is genuine and large, raise {SECONDS_ENV}=<seconds>; "
                         + DAMAGED) from exc
    except OSError as exc:
        raise CollectorError(f"could not start a Python child to read {path} ({exc})") from exc


def _seconds() -> int:
    return budget(SECONDS_ENV, DEFAULT_SECONDS)


def _failure(path: Path, done: subprocess.CompletedProcess[str], error_file: Path) -> Exception:
    """The exception for a child that did not write a trace."""
    last = _last_line(_native_messages(error_file.parent) or done.stderr)
    if done.returncode < 0:
        name = _signal_name(-done.returncode)
        said = f": {last}" if last else ""
        return InputError(path, f"made ncu_report crash ({name}) while reading it{said}",
                          DAMAGED)
    try:
        error = json.loads(error_file.read_text())
    except (OSError, ValueError):
        error = {"type": "unexpected", "name": f"exit status {done.returncode}",
                 "message": last or "no message"}
    return _rebuilt(path, error)


def _native_messages(out: Path) -> str:
    """What ncu_report wrote to fd 2 in the child, without absl's prefixes."""
    log = out / NATIVE_LOG
    return "\n".join(native_lines(log.read_bytes())) if log.is_file() else ""


def _rebuilt(path: Path, error: dict[str, Any]) -> Exception:
    kind = error.get("type")
    if kind == "InputError":
        said = error.get("path")
        where = path if said in (None, str(path), str(Path(path).absolute())) else said
        return InputError(where, str(error.get("problem")),
                          str(error.get("fix") or ""))
    if kind == "MissingDependencyError":
        return MissingDependencyError("ncu_report", "ncu", PURPOSE)
    if kind in ("CollectorError", "GpudiagError"):
        return CollectorError(str(error.get("message")))
    exc = InputError(path, f"made ncu_report fail while reading it ({error.get('name')}: "
                     f"{_short(str(error.get('message')))})", DAMAGED)
    exc.__cause__ = RuntimeError("in the child process:\n" + str(error.get("traceback", "")))
    return exc


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return _short(lines[-1]) if lines else ""


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


