"""The session's watchdog: a profiled process that stopped making progress is ended, not waited on.

`gpudiag profile` waits for its command; a multi-rank job whose one rank hangs (a deadlock in
teardown, a collective whose peers are gone) would make it wait forever and lose everything.
The watchdog polls the processes that wrote a directory under `<run>/procs/` (this host's)
and declares one *stalled* when

- the command itself has exited and the process is still alive `grace_s` later, or
- it is a rank, another rank of the job has finished, and in the last `grace_s` it used less
  than `MAX_IDLE_CPU` of one core (a deadlocked process uses none; gpudiag's own flush thread
  uses well under that).

A stalled process gets its stacks written into its directory (`stacks.txt`: the Python
stack of every thread through faulthandler, the native ones through gdb when it is installed,
each thread's kernel wait channel always), then SIGTERM and, 5 s later, SIGKILL. What the
others collected is kept; `<run>/watchdog.json` says who was ended and why, and the session
prints it.

    dog = Watchdog(run_dir, grace_s=60)
    returncode = dog.wait(proc)          # instead of proc.wait()
    dog.ended                            # [{"pid", "rank", "reason", "stacks"}]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: seconds a process may make no progress (see the module docstring) before it is ended
DEFAULT_GRACE_S = 60.0
#: below this share of one core over the grace period, a rank makes no progress
MAX_IDLE_CPU = 0.05
POLL_S = 0.5
TERM_WAIT_S = 5.0
#: after the command exits, how long a child it left may take to show up (its bootstrap)
SETTLE_S = 1.0
#: `<host>-<pid>[-rank<R>][.<N>]`: N counts the images of one pid (`os.exec*`, pid reuse)
_DIR = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)(?:-rank(?P<rank>\d+))?(?:\.(?P<image>\d+))?$")


class Watchdog:
    """Waits for the command while watching the processes it profiles (module docstring)."""

    def __init__(self, run_dir: Path, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.run_dir = Path(run_dir)
        self.grace_s = grace_s
        self.host = socket.gethostname()
        self.ended: list[dict[str, Any]] = []
        self._cpu: dict[int, list[tuple[float, float]]] = {}  # pid -> (time, cpu s) samples
        self._gone: set[int] = set()
        self._exited_at: float | None = None
        self._rank_done_at: float | None = None  # when a rank was first seen finished

    def wait(self, proc: subprocess.Popen[bytes],
             on_exit: Callable[[], None] | None = None) -> int:
        """`proc.wait()`, ending stalled processes on the way; the command's return code.
        `on_exit` runs as soon as the command itself exited (before any leftover is seen to)."""
        if self.grace_s <= 0:
            returncode = proc.wait()
            if on_exit is not None:
                on_exit()
            return returncode
        while True:
            try:
                returncode = proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                self._check(command_done=False)
                continue
            if self._exited_at is None:
                self._exited_at = time.monotonic()
                if on_exit is not None:
                    on_exit()
            settled = time.monotonic() - self._exited_at >= SETTLE_S
            if not self._check(command_done=True) and settled:
                self._write()
                return returncode
            time.sleep(POLL_S)

    def _check(self, command_done: bool) -> bool:
        """One poll: end the stalled; True while profiled processes are still alive."""
        now = time.monotonic()
        procs = self._procs()
        alive = {pid: info for pid, info in procs.items() if _alive(pid)}
        self._gone |= set(procs) - set(alive)
        if self._rank_done_at is None and any(
                procs[exited]["rank"] is not None for exited in self._gone if exited in procs):
            self._rank_done_at = now
        after_rank = self._rank_done_at is not None and now - self._rank_done_at >= self.grace_s
        for pid, info in alive.items():
            samples = self._cpu.setdefault(pid, [])
            samples.append((now, _cpu_seconds(pid)))
            reason = None
            if command_done and self._exited_at is not None \
                    and now - self._exited_at >= self.grace_s:
                reason = f"still running {self.grace_s:g} s after the command exited"
            elif info["rank"] is not None and after_rank and self.is_idle(samples, now):
                reason = (f"made no progress for {self.grace_s:g} s (under "
                          f"{MAX_IDLE_CPU:.0%} of a core) after another rank finished")
            if reason is not None:
                self._end(pid, info, reason)
                alive.pop(pid)
                break  # one per poll: the launcher may tear the others down itself
        return bool(alive)

    def is_idle(self, samples: list[tuple[float, float]], now: float) -> bool:
        """Whether the CPU samples span the grace period with less than MAX_IDLE_CPU used."""
        del samples[:-int(self.grace_s / POLL_S) - 4]  # keep what the window needs
        old = [sample for sample in samples if now - sample[0] >= self.grace_s]
        if not old:
            return False
        since, cpu = old[-1]
        return samples[-1][1] - cpu < MAX_IDLE_CPU * (now - since)

    def _procs(self) -> dict[int, dict[str, Any]]:
        """pid -> {dir, rank} of this host's profiled processes that wrote their meta."""
        out: dict[int, dict[str, Any]] = {}
        for path in (self.run_dir / "procs").glob("*"):
            match = _DIR.match(path.name)
            if match is None or match["host"] != self.host or not (path / "meta.json").exists():
                continue
            rank, image = match["rank"], int(match["image"] or 1)
            if out.get(int(match["pid"]), {}).get("image", 0) < image:  # the newest image
                out[int(match["pid"])] = {"dir": path, "rank": int(rank) if rank else None,
                                          "image": image}
        return out

    def _end(self, pid: int, info: dict[str, Any], reason: str) -> None:
        stacks = info["dir"] / "stacks.txt"
        _dump_stacks(pid, info["dir"], stacks)
        how = _terminate(pid)
        self.ended.append({"pid": pid, "rank": info["rank"], "dir": str(info["dir"]),
                           "reason": reason, "stacks": str(stacks), "ended_by": how})
        self._write()

    def _write(self) -> None:
        if self.ended:
            (self.run_dir / "watchdog.json").write_text(json.dumps(self.ended, indent=1))


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process so far (Linux; 0 elsewhere: never idle)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("inf")


def _dump_stacks(pid: int, proc_dir: Path, out: Path) -> None:
    """Python stacks (faulthandler in the process), native stacks (gdb), wait channels."""
    parts = [f"gpudiag watchdog: stacks of pid {pid} at {time.strftime('%Y-%m-%dT%H:%M:%S')}"]
    python = _python_stacks(pid, proc_dir)
    parts += ["", "== Python (faulthandler, every thread) ==", python]
    parts += ["", "== threads (kernel wait channel) ==", _wait_channels(pid)]
    parts += ["", "== native (gdb) ==", _native_stacks(pid)]
    with contextlib.suppress(OSError):  # a read-only run directory: the line still says why
        out.write_text("\n".join(parts) + "\n")


def _python_stacks(pid: int, proc_dir: Path) -> str:
    """Ask the process's faulthandler (registered by the bootstrap) for every thread's stack."""
    try:
        meta = json.loads((proc_dir / "meta.json").read_text())
        signum = int(meta["process"]["stack_signal"])
        target = Path(meta["process"]["stack_file"])
    except (OSError, ValueError, KeyError, TypeError):
        return "(not available: the process registered no stack signal)"
    before = target.stat().st_size if target.exists() else 0
    try:
        os.kill(pid, signum)
    except OSError as exc:
        return f"(not available: {exc})"
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if target.exists() and target.stat().st_size > before:
            time.sleep(0.2)  # let it finish the other threads
            return target.read_text(errors="replace")[before:]
    return "(the process did not answer the stack signal in 3 s)"


def _wait_channels(pid: int) -> str:
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda path: int(path.name)):
        try:
            name = (task / "comm").read_text().strip()
            wchan = (task / "wchan").read_text().strip() or "-"
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        lines.append(f"{task.name:>8} {state} {wchan:<28} {name}")
    return "\n".join(lines) or "(not available)"


def _native_stacks(pid: int) -> str:
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(not available: gdb is not installed)"
    try:
        done = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex",
                               "thread apply all bt 40"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(gdb failed: {exc})"
    text = "\n".join(line for line in done.stdout.splitlines()
                     if line.startswith(("Thread ", "#")))
    return text or f"(gdb printed no stack: {done.stderr.strip()[:300]})"


def _terminate(pid: int) -> str:
    """SIGTERM, then SIGKILL after TERM_WAIT_S; the signal that ended it."""
    for signum, wait_s in ((signal.SIGTERM, TERM_WAIT_S), (signal.SIGKILL, TERM_WAIT_S)):
        try:
            os.kill(pid, signum)
        except OSError:
            return "exited"
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return signal.Signals(signum).name
            time.sleep(0.1)
    return "SIGKILL (still not gone)"
