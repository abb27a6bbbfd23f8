"""The process's signal wakeup fd: gpudiag's pipe, passed on to a program that sets its own.

Loaded by path by the bootstrap, inside the user's process: stdlib only.

CPython's C signal handler writes the number of each signal it catches to one *wakeup fd*
per process, at once, whatever the main thread is doing. gpudiag reads it on a thread of its
own (`sigterm.py`: a SIGTERM the main thread cannot see, and the receipts that keep the
session from forwarding a signal twice). A program that sets a wakeup fd of its own (asyncio's
loop does, trio does) replaced gpudiag's, and at its loop's close set none back: from then
on a SIGTERM that needed the thread was ignored, and the session forwarded signals the
program had already had.

So gpudiag's pipe stays, and stands in for the program's: `signal.set_wakeup_fd` is wrapped,
the program's fd is remembered (and returned, as the program expects), and the reading
thread writes every byte it reads on to it. The program's loop wakes as before, after one
thread hop.

A forked child inherits the wakeup fd, and keeps it until gpudiag's fork hook gives it one of
its own. A SIGTERM that reaches the child before that (a fork Pool's `terminate()` landing on
a worker still starting) was read by the parent's thread as the parent's own: the parent
ended, exit status 143. So on Linux the "pipe" is a datagram socket pair whose reading end
gets each writer's pid (`SO_PASSCRED`): bytes another process wrote are still passed on to
the program's fd, as CPython would, but gpudiag acts only on its own process's signals.

    pipe = WakeupPipe(lambda data: print(list(data)))
    pipe.install()          # False when a wakeup fd was set already (then it is left alone)
"""

from __future__ import annotations

import contextlib
import operator
import os
import signal
import socket
import struct
import threading
from collections.abc import Callable


class WakeupPipe:
    """gpudiag's wakeup pipe and its reading thread; `on_signals(data)` gets each read."""

    def __init__(self, on_signals: Callable[[bytes], None]) -> None:
        self.on_signals = on_signals
        self.pipe: tuple[int, int] | None = None  # (read end, write end)
        self.program_fd = -1  # the wakeup fd the program set, to pass the bytes on to
        self._original = signal.set_wakeup_fd

    def install(self) -> bool:
        """Set the pipe, unless a wakeup fd is set already; wrap `signal.set_wakeup_fd`."""
        try:
            read_end, write_end = _pipe()  # close-on-exec: a program's children never see it
            os.set_blocking(write_end, False)
            previous = self._original(write_end, warn_on_full_buffer=False)
        except (OSError, ValueError):
            return False
        if previous != -1:  # someone's already: leave it, and ours is not needed
            self._original(previous)
            os.close(read_end)
            os.close(write_end)
            return False
        self.pipe = (read_end, write_end)
        signal.set_wakeup_fd = self.set_wakeup_fd
        threading.Thread(target=self._read, args=(read_end,), name="gpudiag-sigterm",
                         daemon=True).start()
        return True

    def set_wakeup_fd(self, fd: int, /, *, warn_on_full_buffer: bool = True) -> int:
        """`signal.set_wakeup_fd` as the program sees it: the same checks and return value;
        its fd gets every byte gpudiag's pipe gets (`warn_on_full_buffer` is not kept: a
        full buffer drops the byte silently)."""
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("set_wakeup_fd only works in main thread of the main interpreter")
        fd = operator.index(fd)
        if fd != -1:
            os.fstat(fd)  # OSError for a bad fd, as the original
            if os.get_blocking(fd):
                raise ValueError(f"the fd {fd} must be in non-blocking mode")
        previous, self.program_fd = self.program_fd, fd
        return previous

    def _read(self, read_end: int) -> None:
        receive = _reader(read_end)
        while True:
            try:
                data, writer = receive()
            except OSError:
                return  # closed: a forked child made a pipe of its own
            if not data:
                return
            fd = self.program_fd
            if fd != -1:
                with contextlib.suppress(OSError):  # full or closed: dropped, as CPython does
                    os.write(fd, data)
            if writer not in (None, os.getpid()):
                continue  # a forked child's signal, before it had a pipe of its own
            with contextlib.suppress(Exception):  # never a thread traceback in its stderr
                self.on_signals(data)

    def after_fork(self) -> None:
        """In a forked child: a pipe of its own (the parent's thread would otherwise read the
        child's signals as its own); the program's fd is kept."""
        inherited, self.pipe = self.pipe, None
        if inherited is None:
            return
        try:
            current = self._original(-1)
        except ValueError:  # not the main thread (never on CPython 3.10+): leave it set
            return
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        if current != inherited[1]:  # set by C code since: keep it
            self._original(current)
            return
        self.install()  # the program's fd is kept: the child's bytes go on to it


#: the `struct ucred` an SCM_CREDENTIALS message carries: pid, uid, gid
_UCRED = struct.Struct("iii")


def _pipe() -> tuple[int, int]:
    """(read end, write end): a datagram socket pair whose reader learns each writer's pid
    where the platform has it (Linux), else a plain pipe."""
    if not hasattr(socket, "SO_PASSCRED"):
        return os.pipe()
    reading, writing = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        reading.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    except OSError:
        reading.close()
        writing.close()
        return os.pipe()
    return reading.detach(), writing.detach()


def _reader(read_end: int) -> Callable[[], tuple[bytes, int | None]]:
    """A function that waits for the next bytes and says which process wrote them (None
    when the end cannot tell: a pipe)."""
    try:
        sock = socket.socket(fileno=read_end)
    except OSError:  # not a socket: a plain pipe
        return lambda: (os.read(read_end, 512), None)
    space = socket.CMSG_SPACE(_UCRED.size)

    def receive() -> tuple[bytes, int | None]:
        data, ancillary, _flags, _address = sock.recvmsg(512, space)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                return data, _UCRED.unpack(payload[:_UCRED.size])[0]
        return data, None

    return receive
