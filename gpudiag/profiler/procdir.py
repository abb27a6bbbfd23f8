"""A profiled process's own place in the run directory, loaded by path by the bootstrap.

Stdlib only. Its directory `<run>/procs/<host>-<pid>[-rank<R>][.N]` (claimed once per process
image: an `os.exec*` keeps the pid, so the new image writes beside the old one), files
replaced atomically, the Python stacks file the watchdog's signal writes, the run's error
log (appended to, never created: the session makes it), and the exec hook that lets the
final flush run before the image is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

_stack_log: Any = None  # the open file faulthandler writes to (it must stay open)

#: where faulthandler writes every thread's Python stack, asked for or at a crash
STACKS_FILE = "stacks-python.txt"
#: how faulthandler begins the stacks it writes when the process dies of a fatal signal
FATAL_MARK = "Fatal Python error: "
_fatal_state = {"ours": False}  # faulthandler's fatal-signal dump is gpudiag's, not the program's


def env_int(name: str) -> int | None:
    """An integer environment variable (RANK, LOCAL_RANK), None when unset or not one."""
    value = os.environ.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None


def proc_dir_name(pid: int) -> str:
    """`<host>-<pid>`, plus `-rank<R>` from RANK (else LOCAL_RANK) when the launcher set it."""
    rank = env_int("RANK")
    rank = env_int("LOCAL_RANK") if rank is None else rank
    tail = "" if rank is None else f"-rank{rank}"
    return f"{socket.gethostname()}-{pid}{tail}"


def claim_dir(path: Path) -> Path:
    """Create this process's directory, `path` or, when that is taken, `path.2`, `path.3`...

    A process that `os.exec*`s keeps its pid: the new image's bootstrap finds the old one's
    directory (as does a pid the system reused) and writes beside it, never over it. The
    run's `procs/` is not created here: when the program deleted the run, nothing of it is
    made again.
    """
    candidate, number = path, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1
            candidate = path.with_name(f"{path.name}.{number}")


def write_atomic(path: Path, data: bytes) -> None:
    """Write beside `path`, then rename over it: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def register_stack_dump(proc_dir: Path, signum: int) -> str | None:
    """Have signal `signum` write every thread's Python stack to `<proc>/stacks-python.txt`,
    and a fatal signal (SIGSEGV, SIGABRT, SIGBUS...) too: a process that crashed says where.

    faulthandler writes from the signal handler without the GIL, so it answers even a
    process deadlocked on it (the watchdog's case). Only where the signal is free (never
    replacing a handler of the program) and on a platform that has it; None otherwise.
    """
    global _stack_log  # the one open file faulthandler keeps writing to
    if not hasattr(signal, "SIGRTMIN"):
        return None
    try:
        import faulthandler

        if threading.current_thread() is not threading.main_thread() and _stack_log is None:
            return None
        if _stack_log is None and signal.getsignal(signum) not in (signal.SIG_DFL, None):
            return None
        path = proc_dir / STACKS_FILE
        log = path.open("a")
        faulthandler.register(signum, file=log, all_threads=True, chain=False)
        if _fatal_state["ours"] or not faulthandler.is_enabled():  # -X faulthandler: theirs
            faulthandler.enable(file=log, all_threads=True)  # a crash says where (FATAL_MARK)
            _fatal_state["ours"] = True  # a forked child moves it to its own file
        previous, _stack_log = _stack_log, log
        if previous is not None:
            previous.close()  # the parent's, in a forked child
        return str(path)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


def crash_site(proc_dir: Path) -> str | None:
    """`Segmentation fault in step (train.py:41)` when the process died of a fatal signal and
    its faulthandler (`register_stack_dump`) wrote where; else None. The frame is the
    innermost Python one of the thread that crashed."""
    try:
        text = (proc_dir / STACKS_FILE).read_text(errors="replace")
    except OSError:
        return None
    start = text.rfind(FATAL_MARK)
    if start < 0:
        return None
    lines = text[start:].splitlines()
    error = lines[0][len(FATAL_MARK):].strip()
    crashed = [number for number, line in enumerate(lines) if line.startswith("Current thread")]
    frames = [line.strip() for line in lines[crashed[0] + 1:]] if crashed else []
    frame = next((line for line in frames if line.startswith("File ")), "")
    parts = re.match(r'File "(.*)", line (\d+) in (.*)', frame)
    return error if parts is None else f"{error} in {parts[3]} ({parts[1]}:{parts[2]})"


def record_crashes(run_dir: Path) -> None:
    """After the command ended (the session): each process that died of a fatal signal
    gets `crash` (`crash_site`) in its meta.json, which it could not write itself, so every
    later read of the run names the crash. Processes that finished Python are left as
    they are."""
    for meta_path in sorted((run_dir / "procs").glob("*/meta.json")):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            meta = json.loads(meta_path.read_text())
            process = meta.get("process")
            crash = crash_site(meta_path.parent) if isinstance(process, dict) \
                and process.get("end_ns") is None else None
            if crash is not None:
                process["crash"] = crash
                write_atomic(meta_path, json.dumps(meta, indent=1).encode())


#: the run's log of collector problems, made (empty) by whoever made the run directory
ERRORS_LOG = "bootstrap-errors.log"


def note_error(run_dir: Path, exc: BaseException | str) -> None:
    """Append a bootstrap failure to `<run>/bootstrap-errors.log` (the session reports it).

    Never creates it: a program that deletes the run directory made the periodic flush
    fail, whose report made the file again in the middle of the program's `rmtree`, which
    then failed ("Directory not empty") and the program with it.
    """
    text = exc if isinstance(exc, str) else f"{exc.__class__.__name__}: {exc}"
    try:
        log = os.open(run_dir / ERRORS_LOG, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.write(log, f"pid {os.getpid()}: {text}\n".encode())
    os.close(log)


def watch_exec(before: Callable[[Any], None]) -> None:
    """`os.exec*` replaces the process image without atexit: `before(path)` (the final
    flush) runs first.

    Every `os.exec*` function ends in `os.execv` or `os.execve` (looked up in the module
    at each call), so wrapping those two covers them all.
    """
    for name in ("execv", "execve"):
        original = getattr(os, name, None)
        if original is None or getattr(original, "_gpudiag_exec", False):
            continue

        def exec_(path: Any, *args: Any, _original: Any = original) -> Any:
            before(path)
            return _original(path, *args)

        exec_._gpudiag_exec = True  # type: ignore[attr-defined]
        setattr(os, name, exec_)
