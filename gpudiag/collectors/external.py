"""`gpudiag profile --backend nsys|ncu`: NVIDIA's own tool around the command, then its report.

    version = preflight("ncu")              # before anything runs: one line saying what is wrong
    argv = wrap_command("ncu", cmd, run_dir, ncu_set="memory", ncu_kernels="gemm|matmul")
    ...                                     # the session runs argv instead of cmd
    trace = load_result("ncu", run_dir)     # gpudiag.load(result_files("ncu", run_dir))

**Where the output goes.** Each tool writes under `<run>/<backend>/`:

- nsys: `report.nsys-rep` and, through `--export=sqlite`, `report.sqlite` (what gpudiag
  reads). nsys prints a handful of lines (collecting, generating, the files written) on the
  terminal the program also writes to. They are let through, not captured: they are few,
  they say where a failed run stopped, and nsys cannot send them elsewhere without the
  program's output going with them. gpudiag parses nothing nsys prints.
- ncu: `report.ncu-rep`; ncu's own lines (`==PROF==` for every kernel and replay pass,
  `==WARNING==`, `==ERROR==`) go to `ncu.log` through ncu's `--log-file`, which moves only
  the tool's output: the program keeps the terminal, without hundreds of `==PROF==` lines
  woven into it, and `result_files` can find ERR_NVGPUCTRPERM (counters refused) or "no
  kernels were profiled" in the log. `tail -f <run>/ncu/ncu.log` follows ncu's progress.

ncu runs through the wrapper scripts beside this module (`ncu_wrappers/{launch,memory,full}.sh`,
also reachable as `scripts/ncu_wrappers/` in a checkout, a symlink), so what gpudiag runs is
one readable command line a user can run by hand. They ship as package data and run through
`bash`, so nothing depends on an installer keeping their executable bit.

**Versions.** Nsight tools number releases YEAR.RELEASE[.UPDATE[.BUILD]]:
`nsys --version` says `NVIDIA Nsight Systems version 2023.1.2.43-32377213v0`, ncu's version
line is `Version 2023.1.1.0 (build 32678585) (public-release)`. `parse_version` takes the first
`20YY.N` that is not part of a longer number and compares (year, release); build numbers
are never dotted years, so they cannot be mistaken for one. The minimum for both tools is
2023.1: the oldest releases whose output the readers are checked against (nsys SQLite export
schema 3.x of 2023.1, `readers/nsys/schema.py`; ncu 2023.1 reports and the section
identifiers the wrappers name).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from gpudiag.collectors import probes
from gpudiag.errors import CollectorError

if TYPE_CHECKING:
    from gpudiag.trace import Trace

BACKENDS = ("nsys", "ncu")
NCU_SETS = ("launch", "memory", "full")
#: oldest (year, release) of each tool gpudiag records with (see the module docstring)
MIN_VERSION: dict[str, tuple[int, int]] = {"nsys": (2023, 1), "ncu": (2023, 1)}
INSTALL_FIX = {
    "nsys": "install Nsight Systems 2023.1 or newer (CUDA toolkit or "
            "https://developer.nvidia.com/nsight-systems) and put nsys on PATH",
    "ncu": "install Nsight Compute 2023.1 or newer (CUDA toolkit or "
           "https://developer.nvidia.com/nsight-compute) and put ncu on PATH",
}
_PURPOSE = {"nsys": "Nsight Systems backend", "ncu": "Nsight Compute backend"}
#: what nsys traces: CUDA API and GPU activity, NVTX ranges (gpudiag steps and regions), and
#: OS runtime calls (not read by gpudiag, but the rows a user expects in the nsys GUI)
NSYS_TRACE = "cuda,nvtx,osrt"
#: the report's name in `<run>/<backend>/` (each tool adds its own extension)
REPORT = "report"
NCU_LOG = "ncu.log"
WRAPPERS = Path(__file__).resolve().with_name("ncu_wrappers")
PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
_VERSION = re.compile(r"(?<![\d.])(20\d\d)\.(\d+)")
_MESSAGE_CHARS = 300


def parse_version(line: str) -> tuple[int, int] | None:
    """(year, release) of an Nsight version line, or None when it names no release."""
    match = _VERSION.search(line)
    return (int(match.group(1)), int(match.group(2))) if match else None


def preflight(backend: str) -> str:
    """Check that `backend`'s tool can record here; return its version line.

        line = preflight("nsys")   # 'NVIDIA Nsight Systems version 2024.5.1.113-...'
        preflight("ncu")           # CollectorError: counters are admin-only and ... (fix)

    Run before the command, so a missing tool, an old one or refused counters cost the
    user nothing: the error is one line with what is wrong and how to fix it.
    """
    _check_backend(backend)
    check = probes.check_tool(backend, _PURPOSE[backend], INSTALL_FIX[backend])
    if not check.available:
        raise CollectorError(f"--backend {backend}: {check.detail}; {check.how_to_get}")
    path = shutil.which(backend) or backend
    line = check.detail.removesuffix(f" ({path})")
    version = parse_version(line)
    if version is None:
        raise CollectorError(
            f"--backend {backend}: `{path} --version` printed {line!r}, which names no "
            f"Nsight release (YEAR.N): is this NVIDIA's {backend}? {INSTALL_FIX[backend]}")
    oldest = MIN_VERSION[backend]
    if version < oldest:
        raise CollectorError(
            f"--backend {backend}: {path} is release {version[0]}.{version[1]}, older than "
            f"{oldest[0]}.{oldest[1]}, the oldest whose output gpudiag reads; "
            f"{INSTALL_FIX[backend]}")
    if backend == "ncu":
        permission = probes.check_ncu_permission()
        if not permission.available:
            raise CollectorError(
                f"--backend ncu: {permission.detail}; {permission.how_to_get}")
    return line


def output_dir(backend: str, run_dir: Path) -> Path:
    """`<run>/<backend>/`: where the tool writes its report (and ncu its log)."""
    _check_backend(backend)
    return Path(run_dir) / backend


def log_file(backend: str, run_dir: Path) -> Path | None:
    """The file the tool's own messages go to (ncu), None when they go to the terminal."""
    return output_dir(backend, run_dir) / NCU_LOG if backend == "ncu" else None


def wrapper_script(ncu_set: str) -> Path:
    """The ncu wrapper script of a set (`launch`, `memory`, `full`)."""
    if ncu_set not in NCU_SETS:
        raise ValueError(f"unknown ncu set {ncu_set!r}: choose one of {', '.join(NCU_SETS)}")
    script = WRAPPERS / f"{ncu_set}.sh"
    if not script.is_file():
        raise CollectorError(f"{script} is missing from this gpudiag install (the ncu wrapper "
                             "scripts are package data): reinstall gpudiag")
    return script


def wrap_command(backend: str, cmd: list[str], run_dir: Path, *, ncu_set: str = "launch",
                 ncu_kernels: str | None = None) -> list[str]:
    """The argv that runs `cmd` under `backend`, writing into `<run>/<backend>/` (created).

        argv = wrap_command("nsys", ["python", "train.py"], run_dir)
        # ['nsys', 'profile', '--trace=cuda,nvtx,osrt', '--export=sqlite', ...,
        #  '--output=<run>/nsys/report', 'python', 'train.py']

    `ncu_kernels` is a regex on kernel function names (ncu `-k regex:`); None or "" profiles
    every kernel. nsys is given long options with `=` (its documented form) and no `--`
    before the program: it stops reading options at the first word that is not one.
    """
    if not cmd:
        raise ValueError("wrap_command() needs a command")
    out = output_dir(backend, run_dir)
    if backend == "nsys":
        argv = ["nsys", "profile", f"--trace={NSYS_TRACE}", "--export=sqlite",
                "--force-overwrite=true", f"--output={out / REPORT}", *cmd]
    else:
        regex = [ncu_kernels] if ncu_kernels else []
        argv = ["bash", str(wrapper_script(ncu_set)), "-l", str(out / NCU_LOG),
                str(out / REPORT), *regex, "--", *cmd]
    out.mkdir(parents=True, exist_ok=True)
    return argv


def result_files(backend: str, run_dir: Path) -> list[Path]:
    """The files gpudiag reads from the tool's run: `.sqlite` (nsys) or `.ncu-rep` (ncu).

    An `.nsys-rep` without its export is exported here (`nsys export --type sqlite`, an
    up-to-date export beside it is reused). No report, or counters refused, is a
    CollectorError of one line that names the tool's log and the fix.
    """
    out = output_dir(backend, run_dir)
    return _ncu_results(out) if backend == "ncu" else _nsys_results(out)


def load_result(backend: str, run_dir: Path) -> Trace:
    """The tool's result as a Trace, with the files read in `meta["external"]`."""
    from gpudiag.readers.sources import load

    files = result_files(backend, run_dir)
    trace = load(files)
    trace.meta["external"] = {"backend": backend, "files": [str(path) for path in files]}
    return trace


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown external backend {backend!r}: choose one of "
                         f"{', '.join(BACKENDS)}")


def _ncu_results(out: Path) -> list[Path]:
    log = out / NCU_LOG
    text = _read_text(log)
    if PERMISSION_ERROR in text:
        raise CollectorError(f"ncu was refused the GPU performance counters "
                             f"({PERMISSION_ERROR} in {log}): {probes.NCU_PERMISSION_FIX}")
    reports = sorted(out.glob("*.ncu-rep"))
    if reports:
        return reports
    if not log.is_file():
        raise CollectorError(f"ncu wrote no report in {out} and no log ({log}): it did not "
                             "start; run the command printed in meta.json by hand to see why")
    raise CollectorError(f"ncu wrote no report in {out}: {_ncu_problem(text)} (log: {log})")


def _ncu_problem(log_text: str) -> str:
    """The most telling line of ncu's log, on one line, with a hint where one is known."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    if any("no kernels were profiled" in line.lower() for line in lines):
        return ("no kernel was profiled: check that --ncu-kernels (ncu -k regex:) matches a "
                "kernel name and that NCU_LAUNCH_SKIP is below the number of launches")
    errors = [line for line in lines if line.startswith("==ERROR==")]
    last = (errors or lines or ["the log is empty"])[-1]
    return last[:_MESSAGE_CHARS]


def _nsys_results(out: Path) -> list[Path]:
    reports = sorted([*out.glob("*.nsys-rep"), *out.glob("*.qdrep")])
    found = {path.resolve() for path in out.glob("*.sqlite")}
    found |= {_nsys_export(report).resolve() for report in reports}
    if not found:
        raise CollectorError(
            f"nsys wrote no report in {out}: its own messages are above, on the terminal "
            f"(nsys does not write a log); `nsys profile -o {out / REPORT} CMD` by hand "
            "shows the same")
    return sorted(found)


def _nsys_export(report: Path) -> Path:
    """The SQLite export beside `report`, made by `nsys export` unless it is up to date."""
    from gpudiag.readers.nsys.export import exported

    with exported(report) as (sqlite, _info):
        if sqlite.parent == report.parent:
            return sqlite
    raise CollectorError(f"{report.parent} is not writable, so the export of {report} could "
                         "not be kept: make the run directory writable and load it again")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
