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

Whatever the flush meets, the process still ends: the first SIGTERM arms faulthandler's
deadline (`FLUSH_DEADLINE_S`), a C thread that needs no GIL. Past it, every thread's Python
stack goes to stderr and the process exits (status 1), so a pool joining its terminated
workers never waits forever on gpudiag's flush.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Protocol

#: how long a flush asked of the main thread may wait before the signal is sent again
RESEND_S = 0.5
#: how long a flush begun by SIGTERM may take before the process is ended without it
FLUSH_DEADLINE_S = 120.0
#: how often the thread that escalates looks again while the flush has not begun
POLL_S = 0.01


class Collector(Protocol):
    """The part of the bootstrap's HostCollector this handler uses."""

    @property
    def stopping(self) -> bool: ...

    def stop(self, from_signal: bool = False) -> None: ...


def flush_on_sigterm(collector: Collector,
                     main_thread_call: Callable[[Callable[[], None]], bool]) -> None:
    """Install the handler (main thread only, and only over SIGTERM's default), and the
    thread that makes sure a SIGTERM reaches it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    guard = _Guard(collector, main_thread_call)
    signal.signal(signal.SIGTERM, guard.on_sigterm)
    guard.watch()
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
        self.wakeup: tuple[int, int] | None = None  # our pipe (read end, write end)

    def ours(self) -> bool:
        """SIGTERM still leads to this handler (the program may have replaced it)."""
        return bool(signal.getsignal(signal.SIGTERM) == self.on_sigterm)

    def finish(self) -> None:
        if self.collector.stopping:
            return  # the final flush is under way (atexit, or a first SIGTERM): let it end
        self.collector.stop(from_signal=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        if self.collector.stopping:
            return
        if not self.asked:
            faulthandler.dump_traceback_later(FLUSH_DEADLINE_S, exit=True)
        if sys.getprofile() is None or self.asked:
            self.finish()
            return
        self.asked = self.in_handler = True
        if self.wakeup is None:  # no pipe, so no watching thread: one of its own escalates
            threading.Thread(target=self.escalate, name="gpudiag-sigterm", daemon=True).start()
        self.in_handler = False  # last: no bytecode of this handler checks for calls after it

    def escalate(self) -> None:
        """Until the flush begins: once the handler asked for it, ask the main thread's next
        bytecode; and every RESEND_S without a flush, send the signal to the main thread."""
        queued = False
        resend_at = time.monotonic() + RESEND_S
        while self.ours() and not self.collector.stopping:
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

    def watch(self) -> None:
        """Have CPython's C handler write each signal's number to our pipe, and read it on a
        daemon thread. Not when a wakeup fd is set already: it stays, and the handler
        starts a thread of its own to escalate (which cannot help when the handler itself
        never runs). A program that sets one later (asyncio, trio) replaces ours the same
        way."""
        try:
            read_end, write_end = os.pipe()  # close-on-exec: a program's children never see it
            os.set_blocking(write_end, False)
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (OSError, ValueError):
            return
        if previous != -1:
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)
            return
        self.wakeup = (read_end, write_end)
        threading.Thread(target=self._read_wakeups, args=(read_end,), name="gpudiag-sigterm",
                         daemon=True).start()

    def _read_wakeups(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 512)
            except OSError:
                return  # closed: a forked child made a pipe of its own
            if not data:
                return
            if signal.SIGTERM in data and self.ours():
                self.escalate()

    def after_fork(self) -> None:
        """In a forked child: nothing asked yet, this thread is its main one, and a pipe of
        its own (the parent's thread would otherwise read the child's signals as its own)."""
        self.main = threading.get_ident()
        self.asked = self.in_handler = False
        inherited, self.wakeup = self.wakeup, None
        if inherited is None:
            return
        try:
            current = signal.set_wakeup_fd(-1)
        except ValueError:  # not the main thread (never on CPython 3.10+): leave it set
            return
        for fd in inherited:
            os.close(fd)
        if current == inherited[1]:
            self.watch()
        else:  # the program's own since: keep it
            signal.set_wakeup_fd(current)
