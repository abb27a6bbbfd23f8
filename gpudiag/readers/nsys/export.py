"""Turning an Nsight Systems report (`.nsys-rep`, `.qdrep`) into the SQLite export we read.

The report format is NVIDIA's and only `nsys` decodes it, so gpudiag runs
`nsys export --type sqlite` (the schema of its output is handled in `nsys_schema`). An export
beside the report that is at least as new as the report is reused: exporting a large report
takes minutes. The export is written only into a private folder gpudiag made (see
`exported`), never through a path found in the report's folder. Without `nsys`, nothing is
guessed: the error says how to export, and names an export found beside the report (its age
alone does not prove it is of this report).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudiag.errors import CollectorError, InputError

EXPORT_TIMEOUT_S = 3600
VERSION_TIMEOUT_S = 60
_VERSION = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*)")


@contextmanager
def exported(report: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The SQLite export of `report`, and what to record about it in the trace's meta.

    nsys never writes to a path a stranger could have planted: it exports into a fresh
    private folder (`tempfile.mkdtemp`, mode 0700) inside the report's folder, and the
    export is then renamed to `<stem>.sqlite` beside the report. A rename replaces a
    directory entry and never writes through a symlink, and it is done only where that name
    is free or a regular file; a symlink or anything else there is left alone and the export
    is read from the private folder and removed. When the report's folder is not writable the
    private folder is made in the system's temporary folder and removed after reading.
    """
    beside = report.with_suffix(".sqlite")
    nsys = shutil.which("nsys")
    if nsys is None:
        raise _without_nsys(report, beside)
    info: dict[str, Any] = {"nsys_cli_version": nsys_version(nsys)}
    if _up_to_date(beside, report):
        yield beside, {**info, "export": str(beside)}
        return
    folder = report.parent if writable(report.parent) else None
    tmp = Path(tempfile.mkdtemp(prefix=".gpudiag-nsys-", dir=folder))
    try:
        out = _export(nsys, report, tmp / beside.name)
        if folder is not None and _replaceable(beside):
            os.replace(out, beside)
            out, info = beside, {**info, "export": str(beside)}
        yield out, info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replaceable(path: Path) -> bool:
    """True where `path` is free or a regular file (not a symlink, folder, FIFO...)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _without_nsys(report: Path, beside: Path) -> InputError:
    """What to do without nsys; an export beside the report may be from another run, so it
    is suggested, not read."""
    fix = (f"run `nsys export --type sqlite -o {report.stem}.sqlite {report}` and read the "
           ".sqlite, or install Nsight Systems and put nsys on PATH")
    if beside.is_file():
        fix += f"; if {beside} is the export of this report, read that file instead"
    return InputError(report, "is an Nsight Systems report; gpudiag reads its SQLite export, "
                      "and nsys (which writes it) is not on PATH", fix)


def writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK)


def _up_to_date(export: Path, report: Path) -> bool:
    """A regular file (a symlink is not followed) at least as new as the report."""
    try:
        found = os.lstat(export)
        return stat.S_ISREG(found.st_mode) and found.st_mtime >= report.stat().st_mtime
    except OSError:
        return False


def nsys_version(nsys: str) -> str:
    """`nsys --version` as 'YYYY.N.N...', checking that the nsys found is Nsight Systems."""
    result = _run([nsys, "--version"], VERSION_TIMEOUT_S, "nsys --version")
    match = _VERSION.search(result.stdout or "")
    if result.returncode != 0 or match is None:
        raise CollectorError(
            f"{nsys} --version did not report an Nsight Systems version "
            f"(exit status {result.returncode}: {_tail(result)}); "
            "check that this nsys is NVIDIA Nsight Systems"
        )
    return match.group(1)


def _export(nsys: str, report: Path, out: Path) -> Path:
    """Run `nsys export` of `report` into `out` and return `out`."""
    command = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
               "--output", str(out), str(report)]
    result = _run(command, EXPORT_TIMEOUT_S, f"nsys export of {report}")
    if result.returncode != 0 or not out.is_file():
        raise CollectorError(
            f"{report}: nsys export failed (exit status {result.returncode}: {_tail(result)}); "
            f"run '{' '.join(command)}' to see why, or open the report in Nsight Systems"
        )
    return out


def _run(command: list[str], timeout: int, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise CollectorError(
            f"{what} did not finish in {timeout} s; run it by hand and read the .sqlite it "
            "writes"
        ) from exc
    except OSError as exc:
        raise CollectorError(f"{what} could not start ({exc}); check the nsys install") from exc


def _tail(result: subprocess.CompletedProcess[str], lines: int = 4, chars: int = 400) -> str:
    """The last lines nsys wrote to stderr (stdout when stderr is empty), on one line."""
    text = (result.stderr or "").strip() or (result.stdout or "").strip()
    tail = " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())
    return (tail[-chars:] if len(tail) > chars else tail) or "no output"
