"""SIGINT and SIGTERM sent to `gpudiag profile` reach the command once, not twice.

The command shares the session's process group, so a signal sent to the group (Ctrl-C at
the terminal, `kill -- -PGID`, `timeout`) or to every process of a job (Slurm, systemd)
reaches it directly as well. Forwarding such a signal again ran the program's handler a
second time: a program that exits on the first SIGINT and aborts on the second (as many
do) aborted, and a torch program crashed in the middle of writing its profile.

So a signal is forwarded only when no process of the command got it too:

- SIGINT while the session is the terminal's foreground group: the terminal sent it to
  everyone; never forwarded.
- Otherwise the session waits up to `WAIT_S` for a *receipt* (`<run>/signals/<pid>-<signum>-
  <time_ns>`, left by the bootstrap of any profiled Python process that got the signal at
  about the same time: `sigterm.py`), and forwards only when none came and the command is
  still running. A command that is not Python, or a program that replaced the bootstrap's
  wakeup pipe (asyncio), leaves no receipt: such a signal is forwarded as before.

    with forward_signals(proc, run_dir / RECEIPTS):
        proc.wait()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

#: the run directory's folder of receipts (created by the session, never by a process)
RECEIPTS = "signals"
#: how long the session waits for a receipt before it forwards a signal
WAIT_S = 0.5
#: a receipt this much older than the session's own signal is of another one
EARLIER_S = 0.25


@contextlib.contextmanager
def forward_signals(proc: subprocess.Popen[bytes], receipts: Path) -> Iterator[None]:
    """Pass SIGINT/SIGTERM on to the child while it runs (when it did not get them itself,
    module docstring), then restore the old handlers."""
    def handler(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_delivered():
            return
        got_ns = time.time_ns()
        threading.Thread(target=_forward_unless_received, args=(proc, receipts, signum, got_ns),
                         name="gpudiag-forward", daemon=True).start()

    try:
        old = {signal_number: signal.signal(signal_number, handler)
               for signal_number in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)


def _forward_unless_received(proc: subprocess.Popen[bytes], receipts: Path, signum: int,
                             got_ns: int) -> None:
    """Forward `signum` unless a profiled process left a receipt of it within `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if received(receipts, signum, got_ns - int(EARLIER_S * 1e9)) or proc.poll() is not None:
            return
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        if proc.poll() is None:
            proc.send_signal(signum)


def received(receipts: Path, signum: int, since_ns: int) -> bool:
    """Whether a profiled process left a receipt of `signum` at `since_ns` or later."""
    try:
        names = os.listdir(receipts)
    except OSError:
        return False
    for name in names:
        parts = name.split("-")
        if len(parts) == 3 and parts[1] == str(signum) and parts[2].isdigit() \
                and int(parts[2]) >= since_ns:
            return True
    return False


def _terminal_delivered() -> bool:
    """True when our process group is the terminal's foreground group (Ctrl-C hit it all)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
