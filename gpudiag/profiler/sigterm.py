"""A SIGTERM that would kill a profiled program outright first gets the final flush.

Loaded by path by the bootstrap, inside the user's process: stdlib only.

Only when the program left SIGTERM at its default (death without atexit): then the handler
flushes, restores the default and re-sends the signal, so the process still dies of SIGTERM
as it would without gpudiag. A program (or launcher) that installs its own handler later
simply replaces this one.

A Python signal handler runs wherever the main thread next checks for signals, and that can
be inside torch.profiler's own profile callback (`with_stack`: the callback takes the repr
of a C function it sees for the first time, and `PyObject_Repr` checks for signals). Stopping
the profiler there waits forever for the callback it interrupted: a spawn Pool's `terminate()`
hung on such a worker. So while a profile function is set, the first SIGTERM only marks the
flush as asked for, and a thread of ours asks the main thread for it at its next bytecode
(`inproc.main_thread_call`) once the handler has returned: a pending call queued from the
handler itself runs at the handler's own next bytecode, still inside the callback.

A Python handler also never runs while the main thread is blocked in a system call that the
signal did not interrupt: CPython's C handler only notes the signal, and the main thread
checks for it when the call returns. That happens when the kernel delivered SIGTERM to
another thread, and when it arrived just before the call blocked: a fork Pool's worker then
waited forever on its task queue's lock while the Pool joined it (seen under load, once in
~50 runs). So the C handler also writes each signal's number to a pipe of ours
(`signal.set_wakeup_fd`, unless the program has set one), a thread reads it, and after a
SIGTERM it sends the signal again to the main thread every `RESEND_S` until the flush has
begun: a signal sent to the main thread interrupts its call, and the handler then runs from
the interrupted call, not from a callback, so it flushes at once.

A handler that interrupted gpudiag's own segment write on the main thread (a Pool's
`terminate()` landing while a worker writes a start-up segment) cannot flush there: the
write's lock is its own thread's. It asks the collector to call it back once the write is
done (`collector.postpone`), and returns; the interrupted write finishes, then the flush
runs and the process dies of SIGTERM. Giving the segment up instead lost its ops.

Whatever the flush meets, the process still ends: the first SIGTERM arms faulthandler's
deadline (`FLUSH_DEADLINE_S`), a C thread that needs no GIL. Past it, every thread's Python
stack goes to stderr and the process exits (status 1), so a pool joining its terminated
workers never waits forever on gpudiag's flush.

A program may set a wakeup fd of its own (asyncio's loop does, and sets none back when it
closes): `wakeup.py` keeps gpudiag's pipe and passes the bytes on to the program's (a program
that had used asyncio once ignored SIGTERM). The handler, once it ran, also starts the thread
that asks for the flush itself, not relying on the pipe.

The reading thread also leaves a *receipt* for each SIGINT and SIGTERM the process got
(`<run>/signals/<pid>-<signum>-<time_ns>`): the session forwards a signal it got to the
command only when no profiled process got the same one at the same time (a `kill` of the
process group, `timeout`, Slurm and systemd signal them all: forwarding again made the
program's handler run twice).

`held_signals()`: while the final flush runs on the main thread, the program's own SIGINT and
SIGTERM handlers wait, and run once it is written. A handler that raised there (a second
Ctrl-C, a forwarded copy) stopped the flush half-way, lost the torch profile and crashed the
process at exit.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpudiag.profiler.wakeup import WakeupPipe

#: how long a flush asked of the main thread may wait before the signal is sent again
RESEND_S = 0.5
#: how long a flush begun by SIGTERM may take before the process is ended without it
FLUSH_DEADLINE_S = 120.0
#: how often the thread that escalates looks again while the flush has not begun
POLL_S = 0.01
#: the signals the session forwards, and so the ones a receipt is left for
FORWARDED: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
_handlers: list[Any] = []  # the handlers gpudiag installed (never held by held_signals)


class Collector(Protocol):
    """The part of the bootstrap's HostCollector this handler uses."""

    @property
    def stopping(self) -> bool: ...

    def stop(self, from_signal: bool = False) -> None: ...

    def postpone(self, function: Callable[[], None]) -> bool: ...


def flush_on_sigterm(collector: Collector,
                     main_thread_call: Callable[[Callable[[], None]], bool],
                     receipts: Path | None = None,
                     pipe: type[WakeupPipe] | None = None) -> None:
    """Install the handler (main thread only, and only over SIGTERM's default), and the
    thread that makes sure a SIGTERM reaches it (and leaves receipts in `receipts`).
    `pipe`: the bootstrap's `wakeup.WakeupPipe` (loaded by path); else imported."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    guard = _Guard(collector, main_thread_call)
    guard.receipts = receipts
    signal.signal(signal.SIGTERM, guard.on_sigterm)
    _handlers.append(guard.on_sigterm)
    if pipe is None:
        from gpudiag.profiler.wakeup import WakeupPipe

        pipe = WakeupPipe
    guard.watch(pipe)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=guard.after_fork)


class _Guard:
    """The handler, and the thread that sees every SIGTERM through the wakeup pipe."""

    def __init__(self, collector: Collector,
                 main_thread_call: Callable[[Callable[[], None]], bool]) -> None:
        self.collector = collector
        self.main_thread_call = main_thread_call
        self.main = threading.get_ident()  # the main thread (checked by the caller)
        self.asked = False  # the flush is asked of the main thread's next bytecode
        self.in_handler = False  # the handler's own bytecode may still be on the stack
        self.postponed = False  # the flush waits for the segment write it interrupted
        self.wakeup: WakeupPipe | None = None  # our pipe, when it could be set
        self.receipts: Path | None = None  # where each SIGINT/SIGTERM got leaves a receipt
        self._escalating = threading.Lock()  # one escalation at a time

    def ours(self) -> bool:
        """SIGTERM still leads to this handler (the program may have replaced it)."""
        return bool(signal.getsignal(signal.SIGTERM) == self.on_sigterm)

    def finish(self) -> None:
        if self.collector.stopping or self.postponed:
            return  # the final flush is under way (atexit, or a first SIGTERM): let it end
        if self.collector.postpone(self.finish_postponed):
            self.postponed = True  # the handler interrupted a segment write: end after it
            return
        self.collector.stop(from_signal=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def finish_postponed(self) -> None:
        """The segment write the SIGTERM interrupted is done: flush and end now."""
        self.postponed = False
        self.finish()

    def on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        if self.collector.stopping:
            return
        if not self.asked:
            faulthandler.dump_traceback_later(FLUSH_DEADLINE_S, exit=True)
        if sys.getprofile() is None or self.asked:
            self.finish()
            return
        self.asked = self.in_handler = True
        # Not left to the pipe's thread: the program may have set a wakeup fd of its own
        # since (asyncio), and then that thread never hears of this SIGTERM.
        threading.Thread(target=self.escalate, name="gpudiag-sigterm", daemon=True).start()
        self.in_handler = False  # last: no bytecode of this handler checks for calls after it

    def escalate(self) -> None:
        """Until the flush begins: once the handler asked for it, ask the main thread's next
        bytecode; and every RESEND_S without a flush, send the signal to the main thread.
        One at a time (the handler and the pipe's thread may both start one)."""
        if not self._escalating.acquire(blocking=False):
            return
        try:
            self._escalate()
        finally:
            self._escalating.release()

    def _escalate(self) -> None:
        queued = False
        resend_at = time.monotonic() + RESEND_S
        while self.ours() and not self.collector.stopping and not self.postponed:
            if self.asked and not self.in_handler and not queued:
                queued = True
                self.main_thread_call(self.finish)
                resend_at = time.monotonic() + RESEND_S
            if time.monotonic() >= resend_at:
                resend_at = time.monotonic() + RESEND_S
                try:
                    signal.pthread_kill(self.main, signal.SIGTERM)
                except OSError:
                    return  # the main thread is gone: the interpreter is ending anyway
            time.sleep(POLL_S)

    def watch(self, pipe: type[WakeupPipe]) -> None:
        """Read every signal's number through gpudiag's wakeup pipe (`wakeup.py`, which also
        passes them on to a program that sets a wakeup fd of its own). Not when a wakeup fd
        is set already: it stays, and the handler still escalates by itself (which cannot
        help when the handler itself never runs)."""
        wakeup = pipe(self.on_signals)
        if wakeup.install():
            self.wakeup = wakeup

    def on_signals(self, data: bytes) -> None:
        """Signals the C handler saw: a receipt of each forwarded one, and a SIGTERM the
        handler may never run for is escalated."""
        for signum in {number for number in data if number in FORWARDED}:
            self.leave_receipt(signum)
        if signal.SIGTERM in data and self.ours():
            self.escalate()

    def leave_receipt(self, signum: int) -> None:
        """`<receipts>/<pid>-<signum>-<time_ns>`: the session then knows this process got
        the signal itself and forwards no second one. Never created when the program
        deleted the run (the folder is the session's)."""
        if self.receipts is None:
            return
        name = f"{os.getpid()}-{signum}-{time.time_ns()}"
        with contextlib.suppress(OSError):
            os.close(os.open(self.receipts / name, os.O_CREAT | os.O_WRONLY, 0o644))

    def after_fork(self) -> None:
        """In a forked child: nothing asked yet, this thread is its main one, and a pipe of
        its own (the parent's thread would otherwise read the child's signals as its own)."""
        self.main = threading.get_ident()
        self.asked = self.in_handler = self.postponed = False
        if self.wakeup is not None:
            self.wakeup.after_fork()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """While the block runs (the final flush, on the main thread), the program's own SIGINT
    and SIGTERM handlers wait; each one that arrived runs once after the block, and an
    exception it raises there is dropped (the process is ending: as Python drops one an
    atexit hook raises, without the traceback). The same signal a second time runs the
    program's handler at once: whoever sends it twice wants the program's answer now."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[int, Any] = {}
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if signum in held:
            saved[signum](signum, frame)
        else:
            held.append(signum)

    for number in FORWARDED:
        current = signal.getsignal(number)
        if callable(current) and current not in _handlers:
            saved[number] = current
            signal.signal(number, hold)
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        for number in held:
            with contextlib.suppress(BaseException):
                saved[number](number, None)
