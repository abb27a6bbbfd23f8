"""The `gpudiag profile -- CMD` session: run directory, injected bootstrap, child, merge.

    result = run(["python", "train.py"], options=ProfileOptions())
    trace = merge_run(result.run_dir)        # every process's output as one Trace (gather.py)
    sys.exit(result.exit_code)

The session only wires: it never collects in its own process (the NVML sampler joins later).
Every Python process CMD starts imports `<run>/bootstrap/sitecustomize.py` (PYTHONPATH),
which chains to the user's own sitecustomize and starts the collectors of
`gpudiag.profiler.bootstrap`; each writes `<run>/procs/<host>-<pid>[-rank<R>]/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpudiag.collectors import external
from gpudiag.errors import CollectorError, InputError
from gpudiag.profiler import bootstrap, procdir
from gpudiag.profiler.backends import Plan
from gpudiag.profiler.forwarding import RECEIPTS, forward_signals
from gpudiag.profiler.notes import run_notes
from gpudiag.profiler.watchdog import DEFAULT_GRACE_S, Watchdog
from gpudiag.readers.run_dir import compress_segments, merge_run
from gpudiag.trace import Trace, is_trace_dir

#: the default parent of run directories, relative to the working directory
RUNS_DIR = Path("gpudiag-runs")
#: a run directory's file system must have this much free before anything runs
MIN_FREE_BYTES = 256 * 2**20

SITECUSTOMIZE = '''\
"""Written by gpudiag profile: chain to the user's sitecustomize, then start collectors."""
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

_rest = list(_sys.path)
while True:  # the user's own sitecustomize: never a gpudiag one (`gpudiag profile` nested)
    _spec = _m.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is None or _spec.origin is None or not _os.path.isfile(_spec.origin):
        break
    with open(_spec.origin, "rb") as _file:
        if not _file.read(80).startswith(b'"""Written by gpudiag profile'):
            break
    _here = _os.path.abspath(_os.path.dirname(_spec.origin))
    _kept = [p for p in _rest if _os.path.abspath(p or ".") != _here]
    _spec, _rest = None, _kept if len(_kept) < len(_rest) else []
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)  # the user's own: its errors are the user's, as without us
_before = set(_sys.modules)  # what the interpreter and the user's sitecustomize imported
try:
    _spec = _u.spec_from_file_location("gpudiag.profiler.bootstrap", {bootstrap!r})
    _boot = _u.module_from_spec(_spec)
    _sys.modules[_spec.name] = _boot  # so `gpudiag.profiler.bootstrap` is this instance
    _spec.loader.exec_module(_boot)
    _boot.start_from_env()
    _boot.release_shadowed(_before)
except Exception as _exc:  # never break the user's program
    _sys.modules.pop("gpudiag.profiler.bootstrap", None)
    _sys.stderr.write("gpudiag: bootstrap not started: %r\\n" % (_exc,))
'''


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """What `gpudiag profile` was asked for; recorded verbatim in `<run>/meta.json`.

    `collectors` are the in-process ones (`host` plus the plugins of `inproc.PLUGINS`);
    `backends.resolve` fills them from `backend`. `nvml_interval_s` None turns NVML off.
    """

    backend: str = "auto"
    collectors: tuple[str, ...] = ("host",)
    flush_interval_s: float = 1.0
    duration_s: float | None = None
    delay_s: float | None = None
    steps: int | str | None = None
    warmup_steps: int | None = None
    nvml_interval_s: float | None = 0.1
    memory: bool = True
    report: bool = True
    ncu_set: str = "launch"
    ncu_kernels: str | None = None
    stall_timeout_s: float = DEFAULT_GRACE_S
    segment_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "collectors": list(self.collectors)}

    def settings(self) -> dict[str, Any]:
        """What the in-process plugins read (GPUDIAG_SETTINGS in the child's environment)."""
        return {
            "backend": self.backend, "flush_interval_s": self.flush_interval_s,
            "delay_s": self.delay_s, "duration_s": self.duration_s, "steps": self.steps,
            "warmup_steps": self.warmup_steps, "memory": self.memory,
            "segment_s": self.segment_s,
        }


@dataclasses.dataclass(frozen=True)
class SessionResult:
    """The outcome of `run`: where the run lives and how the child ended.

    `exit_code` follows the shell convention (128 + signal number for a child killed by a
    signal), so `sys.exit(result.exit_code)` reproduces what the shell would have shown.
    """

    run_dir: Path
    exit_code: int
    signal: int | None
    start_ns: int
    end_ns: int


def run(
    cmd: list[str],
    *,
    out_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    options: ProfileOptions,
    wrap: Callable[[Path, list[str]], list[str]] | None = None,
) -> SessionResult:
    """Run `cmd` with the bootstrap injected, forwarding signals; return its exit status.

    stdin/stdout/stderr are inherited (the child talks to the terminal directly). `env`
    replaces os.environ for the child (the session adds its variables on top). `wrap`
    turns the command into the line that really runs (nsys / ncu around it). The NVML
    sampler runs in this process for the child's lifetime; what it could not sample is
    listed in meta["not_collected"].
    """
    if not cmd:
        raise ValueError("run() needs a command")
    run_dir = make_run_dir(cmd, out_dir)
    if bootstrap.is_active():  # this session runs inside another one's command
        bootstrap.note_process(f"ran `gpudiag profile` itself: its command is profiled in "
                               f"{run_dir} (the innermost session collects it)")
    child_env = child_environment(run_dir, env if env is not None else os.environ, options)
    argv = wrap(run_dir, cmd) if wrap is not None else cmd
    start_ns = time.time_ns()
    meta = run_meta(cmd, options, start_ns)
    if argv is not cmd:
        meta["tool_command"] = argv
    sampler = _start_nvml(run_dir, options, child_env, meta)
    write_json(run_dir / "meta.json", meta)
    try:
        try:
            proc = subprocess.Popen(argv, env=child_env)
        except OSError as exc:
            meta.update(end_ns=time.time_ns(), exit_code=127, error=str(exc))
            with contextlib.suppress(OSError):
                write_json(run_dir / "meta.json", meta)
            raise CommandNotStarted(exc.errno, exc.strerror or str(exc)) from exc
        watchdog = Watchdog(run_dir, options.stall_timeout_s)
        with forward_signals(proc, run_dir / RECEIPTS):
            returncode = watchdog.wait(proc, on_exit=sampler.stop if sampler else None)
        procdir.record_crashes(run_dir)
        if watchdog.ended:
            meta["watchdog"] = watchdog.ended
        meta["peak_rss_bytes"] = _children_peak_rss()
    finally:
        if sampler is not None:
            sampler.stop()  # joins, writes the last chunk, never raises
    end_ns = time.time_ns()
    signum = -returncode if returncode < 0 else None
    exit_code = 128 + signum if signum is not None else returncode
    meta.update(end_ns=end_ns, exit_code=exit_code, signal=signum)
    result = SessionResult(run_dir, exit_code, signum, start_ns, end_ns)
    try:
        write_json(run_dir / "meta.json", meta)
    except OSError as exc:  # the program ran: its exit status must still come back
        raise RunNotWritten(result, exc) from exc
    return result


class CommandNotStarted(OSError):
    """The command could not be started (not found, not executable): nothing ran."""


class RunNotWritten(Exception):
    """The command ran, but gpudiag could not write, merge or analyze its profile (a full
    disk, the run directory deleted while it ran, a memory limit): the command's own exit
    status still comes back, and `error` says what failed (`notes.after_run_failure`)."""

    def __init__(self, result: SessionResult, error: BaseException) -> None:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        super().__init__(f"{result.run_dir}: {reason}")
        self.result = result
        self.error = error


def _start_nvml(run_dir: Path, options: ProfileOptions, child_env: Mapping[str, str],
                meta: dict[str, Any]) -> Any:
    """The NVML sampler for the GPUs the child can see, or None (reason in the meta)."""
    meta["not_collected"] = []
    if not options.nvml_interval_s:
        return None
    from gpudiag.collectors.nvml.sampler import start_sampler

    return start_sampler(run_dir / "nvml", options.nvml_interval_s, env=child_env,
                         reasons=meta["not_collected"])


#: a run with at least this many processes that collected something is analyzed process by
#: process on a local pool (`gpudiag.diagnose_job`), never merged in one process
JOB_PROCESSES = 8


@dataclasses.dataclass
class Gathered:
    """What a profiled run left: the session's result, the lines the user should read, and
    either the merged `trace` or, for a run of many processes, its `job` (a `JobDiagnosis`,
    each process read and analyzed apart, then reduced)."""

    result: SessionResult
    notes: list[str]
    trace: Trace | None = None
    job: Any = None

    def collected(self) -> str:
        """One line on what the run collected (`reports.collected`)."""
        from gpudiag.reports.collected import describe, describe_job

        return describe_job(self.job) if self.job is not None \
            else describe(self.trace or Trace())

    def diagnosis(self) -> Any:
        """The run's Diagnosis: its job's, or the merged trace's (None: nothing collected)."""
        if self.job is not None:
            return self.job
        if self.trace is None or not any(len(table) for table in self.trace.tables().values()):
            return None
        from gpudiag.analyzers.diagnosis import diagnose

        return diagnose(self.trace)


def profile_command(
    cmd: list[str], plan: Plan, options: ProfileOptions, out_dir: Path | None = None,
    progress: Callable[[str], None] | None = None, *, workers: int | None = None,
) -> Gathered:
    """The whole `gpudiag profile` job: run, merge (or analyze process by process), and the
    lines the user should read.

    The notes say what was not collected and why (no GPU, a collector that failed, a
    --steps window that never opened), so an empty report is never a mystery. An external
    tool (nsys, ncu) is checked before anything runs; if it then produced no result, the
    program's exit status still comes back and the note says why. `workers`: analyze the
    run process by process on that many local processes (by default, a run of
    `JOB_PROCESSES` or more processes is, on one worker per core).
    """
    wrap, version = None, None
    notes: list[str] = []
    tool = plan.external
    if tool is not None:
        version = external.preflight(tool)  # CollectorError: one line, nothing has run

        def wrap(run_dir: Path, command: list[str]) -> list[str]:
            return external.wrap_command(tool, command, run_dir, ncu_set=options.ncu_set,
                                         ncu_kernels=options.ncu_kernels)

    result = run(cmd, out_dir=out_dir, options=options, wrap=wrap)
    try:
        if tool is None and (workers is not None or _processes(result.run_dir)
                             >= JOB_PROCESSES):
            return _analyze_by_process(result, plan, options, notes, progress=progress,
                                       workers=workers)
        return _gather(result, plan, options, tool=tool, version=version, notes=notes,
                       progress=progress)
    except Exception as exc:  # the program ran: whatever failed here, its status comes back
        raise RunNotWritten(result, exc) from exc


def _processes(run_dir: Path) -> int:
    """The process directories of a run that hold what a process wrote."""
    return sum(1 for path in (run_dir / "procs").glob("*") if is_trace_dir(path))


def _analyze_by_process(result: SessionResult, plan: Plan, options: ProfileOptions,
                        notes: list[str], *, progress: Callable[[str], None] | None,
                        workers: int | None) -> Gathered:
    """A run of many processes: each read and analyzed apart, then reduced, as `gpudiag
    analyze RUN --workers N` does (no `<run>/trace/` is written: no process holds the run)."""
    from gpudiag.jobs import diagnose_job

    if progress is not None:
        progress(f"analyzing what {_processes(result.run_dir)} processes collected, process "
                 "by process...")
    # a count, never None: the environment the program ran with (DASK_SCHEDULER_ADDRESS)
    # must not send the run, which lies on this machine, to a cluster elsewhere
    job = diagnose_job(result.run_dir, workers=workers or os.cpu_count() or 1, rows=False)
    compress_segments(result.run_dir)
    notes += [f"{path}: could not be read ({error}); the other processes are analyzed"
              for path, error in job.failed]
    return Gathered(result, run_notes(result.run_dir, job.meta, plan, options) + notes,
                    job=job)


def _gather(result: SessionResult, plan: Plan, options: ProfileOptions, *, tool: str | None,
            version: str | None, notes: list[str], progress: Callable[[str], None] | None
            ) -> Gathered:
    """After the run: the external tool's result, the merge, the notes."""
    extra: list[Path] = []
    if tool is not None:
        try:
            extra = external.result_files(tool, result.run_dir)
        except CollectorError as exc:
            notes.append(str(exc))
    if progress is not None:  # a large run takes a while to merge: say what is going on
        procs = sum(1 for path in (result.run_dir / "procs").iterdir() if path.is_dir())
        progress(f"merging what {procs} process{'es' if procs != 1 else ''} collected...")
    trace = merge_run(result.run_dir, extra=extra)
    if tool is not None:
        trace.meta.setdefault("tool_versions", {})[tool] = version
    return Gathered(result, run_notes(result.run_dir, trace.meta, plan, options) + notes,
                    trace=trace)


def make_run_dir(cmd: list[str], out_dir: Path | None) -> Path:
    """Create the run directory; an existing non-empty one is never reused (suffix -2, -3...).

    The default is `gpudiag-runs/<UTC timestamp>-<command basename>/`.
    """
    if out_dir is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out_dir = RUNS_DIR / f"{stamp}-{_command_name(cmd)}"
    candidate, suffix = Path(out_dir), 1
    try:
        while True:
            try:
                candidate.mkdir(parents=True)
                break
            except FileExistsError:
                if candidate.is_dir() and not any(candidate.iterdir()):
                    break
                suffix += 1
                candidate = Path(f"{out_dir}-{suffix}")
        (candidate / "procs").mkdir()
        (candidate / RECEIPTS).mkdir()
        (candidate / bootstrap.ERRORS_LOG).touch()  # processes append, never create it
    except OSError as exc:  # nothing has run yet: one line, not "cannot start CMD"
        raise InputError(candidate, f"cannot be created as the run directory "
                         f"({exc.strerror or exc})", "pass a writable -o RUN_DIR") from exc
    free = shutil.disk_usage(candidate).free
    if free < MIN_FREE_BYTES:
        raise InputError(candidate, f"has {free / 2**20:.0f} MB free; a profile needs at "
                         f"least {MIN_FREE_BYTES // 2**20} MB", "free some space or pass "
                         "-o RUN_DIR on another file system (nothing was run)")
    return candidate.resolve()


def _command_name(cmd: list[str]) -> str:
    """The program the command runs, past wrappers and launchers (`commands.program_name`:
    'train' for `torchrun --standalone ... train.py`, 'pkg.mod' for `python -m pkg.mod`),
    in characters safe for a directory name."""
    from gpudiag.commands import program_name

    name = program_name(cmd) or (Path(cmd[0]).name if cmd else "")
    safe = "".join(char if char.isalnum() or char in "-_." else "_" for char in name)
    return safe[:40] or "cmd"


def child_environment(
    run_dir: Path, base: Mapping[str, str], options: ProfileOptions
) -> dict[str, str]:
    """`base` plus the bootstrap in front of PYTHONPATH and the collectors' settings."""
    boot_dir = run_dir / "bootstrap"
    boot_dir.mkdir(exist_ok=True)
    source = SITECUSTOMIZE.replace("{bootstrap!r}", repr(str(Path(bootstrap.__file__))))
    (boot_dir / "sitecustomize.py").write_text(source)
    env = dict(base)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(boot_dir) + (os.pathsep + path if path else "")
    env[bootstrap.ENV_RUN_DIR] = str(run_dir)
    env[bootstrap.ENV_COLLECTORS] = ",".join(options.collectors)
    env[bootstrap.ENV_FLUSH_INTERVAL] = str(options.flush_interval_s)
    env[bootstrap.ENV_SETTINGS] = json.dumps(options.settings())
    return env


def run_meta(cmd: list[str], options: ProfileOptions, start_ns: int) -> dict[str, Any]:
    """What the run was: command, environment summary, versions, options."""
    from gpudiag import __version__

    return {
        "command": list(cmd), "cwd": os.getcwd(), "start_ns": start_ns, "end_ns": None,
        "exit_code": None, "signal": None, "gpudiag_version": __version__,
        "python": sys.version.split()[0], "python_executable": sys.executable,
        "platform": platform.platform(), "host": platform.node(),
        "options": options.to_dict(),
    }


def _children_peak_rss() -> int | None:
    """The largest peak resident set of a process the session waited for (the command;
    Linux counts its waited-for descendants too): what the program itself needed."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON atomically (temp file + rename): a killed session leaves a whole file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)
