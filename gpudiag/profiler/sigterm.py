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
hung on such a worker. So while a profile function is set, the first SIGTERM only starts a
thread, and that thread asks for the flush at the main thread's next bytecode
(`inproc.main_thread_call`) once the handler has returned: a pending call queued from the
handler itself runs at the handler's own next bytecode, still inside the callback. A main
thread blocked in a system call runs no bytecode; the thread sends the signal again after
`RESEND_S`, and that second handler, run from the interrupted call and not from a callback
(a callback takes microseconds), flushes at once.

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

#: how long the flush asked for at the next bytecode may wait before the signal is sent again
RESEND_S = 0.5
#: how long a flush begun by SIGTERM may take before the process is ended without it
FLUSH_DEADLINE_S = 120.0


class Collector(Protocol):
    """The part of the bootstrap's HostCollector this handler uses."""

    @property
    def stopping(self) -> bool: ...

    def stop(self, from_signal: bool = False) -> None: ...


def flush_on_sigterm(collector: Collector,
                     main_thread_call: Callable[[Callable[[], None]], bool]) -> None:
    """Install the handler (main thread only, and only over SIGTERM's default)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    main = threading.get_ident()  # this is the main thread (checked above)
    state = {"asked": False, "in_handler": False}

    def finish() -> None:
        if collector.stopping:
            return  # the final flush is under way (atexit, or a first SIGTERM): let it end
        collector.stop(from_signal=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def ask_then_send_again() -> None:
        while state["in_handler"]:  # the handler's own bytecode may still be on the stack
            time.sleep(0.001)
        main_thread_call(finish)
        time.sleep(RESEND_S)
        if not collector.stopping:
            signal.pthread_kill(main, signal.SIGTERM)

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        if collector.stopping:
            return
        if not state["asked"]:
            faulthandler.dump_traceback_later(FLUSH_DEADLINE_S, exit=True)
        if sys.getprofile() is None or state["asked"]:
            finish()
            return
        state["asked"] = state["in_handler"] = True
        threading.Thread(target=ask_then_send_again, name="gpudiag-sigterm", daemon=True).start()
        state["in_handler"] = False  # last: no bytecode of this handler checks for calls after it

    signal.signal(signal.SIGTERM, on_sigterm)
