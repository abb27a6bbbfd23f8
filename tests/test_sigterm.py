"""The bootstrap's SIGTERM handler (`gpudiag/profiler/sigterm.py`): the final flush, then
death by SIGTERM, and never a profiler stopped from inside the handler while a profile
function is set (the handler may be running inside torch.profiler's own callback, where
stopping it never returns: a spawn Pool's `terminate()` hung on such a worker).

Each case runs in a child with a stand-in collector that says where its `stop` ran."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time, traceback
    from gpudiag.profiler import inproc, sigterm

    class Collector:
        stopping = False

        def stop(self, from_signal=False):
            self.stopping = True
            names = [frame.name for frame in traceback.extract_stack()]
            where = "handler" if "on_sigterm" in names else "bytecode"
            print(where, round(time.monotonic() - sent, 1), from_signal, flush=True)

    if sys.argv[1] != "no-hook":
        sys.setprofile(lambda *args: None)  # what torch.profiler's with_stack sets
    sigterm.flush_on_sigterm(Collector(), inproc.main_thread_call)
    sent = time.monotonic()
    if sys.argv[1] == "blocked":  # the main thread in a system call that never returns
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        sent += 0.1
        os.read(os.pipe()[0], 1)
    else:
        os.kill(os.getpid(), signal.SIGTERM)
        while True:
            sum(range(100))
""")


def _run(mode: str) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stdout.split()


@pytest.mark.parametrize("mode", ["no-hook", "busy"])
def test_the_flush_runs_then_the_process_dies_of_sigterm(mode: str) -> None:
    rc, (where, _after, from_signal) = _run(mode)
    assert rc == -signal.SIGTERM and from_signal == "True"
    # with no profile function the handler flushes at once; with one, the main thread's
    # next bytecode does, outside the handler
    assert where == ("handler" if mode == "no-hook" else "bytecode")


def test_a_main_thread_blocked_in_a_system_call_gets_the_signal_again_and_flushes() -> None:
    """No bytecode runs while `read` blocks: the signal sent again after RESEND_S reaches
    the handler from the interrupted call, which is no profile callback."""
    rc, (where, after, _) = _run("blocked")
    assert rc == -signal.SIGTERM and where == "handler"
    assert 0.4 <= float(after) < 5
