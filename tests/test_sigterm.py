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

        def postpone(self, function):
            return False  # no segment write under way

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
    elif sys.argv[1] == "elsewhere":  # the kernel hands the signal to another thread
        kick = lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        threading.Timer(0.1, kick).start()
        sent += 0.1
        os.read(os.pipe()[0], 1)  # never interrupted: only the C handler on the timer ran
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


def test_a_signal_another_thread_took_still_reaches_the_blocked_main_thread() -> None:
    """The C handler ran on the thread the kernel chose, and the main thread, blocked in
    `read`, never checked for it: the Python handler never ran (a fork Pool's worker waited
    forever on its queue's lock). The wakeup pipe's reader sends it to the main thread."""
    rc, (where, after, _) = _run("elsewhere")
    assert rc == -signal.SIGTERM and where == "handler"
    assert 0.4 <= float(after) < 5


FORKED = textwrap.dedent("""
    import os, signal, sys, threading, time
    from gpudiag.profiler import inproc, sigterm

    class Collector:
        stopping = False

        def postpone(self, function):
            return False  # no segment write under way

        def stop(self, from_signal=False):
            self.stopping = True
            print("stopped", "child" if os.getpid() != parent else "parent", flush=True)

    parent = os.getpid()
    collector = Collector()
    if sys.argv[1] == "early":  # runs in the child before gpudiag's own fork hook
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
    sigterm.flush_on_sigterm(collector, inproc.main_thread_call)
    child = os.fork()
    if child == 0:
        kick = lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        threading.Timer(0.1, kick).start()
        os.read(os.pipe()[0], 1)
    _, status = os.waitpid(child, 0)
    time.sleep(2 * sigterm.RESEND_S)
    print("child", os.waitstatus_to_exitcode(status), "parent", collector.stopping, flush=True)
""")


@pytest.mark.parametrize("when", ["later", "early"])
def test_a_forked_child_watches_its_own_signals_and_not_its_parents(when: str) -> None:
    """A forked child inherits the wakeup fd: unless it makes a pipe of its own, its
    SIGTERM is read by the parent's thread, which then ends the parent, and the child
    waits forever. `early`: the SIGTERM reaches the child before gpudiag's fork hook gave it
    a pipe of its own (a fork Pool's `terminate()` on a worker still starting: the parent
    died of it, exit status 143, in CI); the parent's thread sees the child wrote it."""
    done = subprocess.run([sys.executable, "-c", FORKED, when], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["stopped child", "child -15 parent False"]


def test_a_wakeup_fd_of_the_program_is_left_in_place() -> None:
    code = textwrap.dedent("""
        import os, signal
        from gpudiag.profiler import inproc, sigterm

        class Collector:
            stopping = False

            def postpone(self, function):
                return False  # no segment write under way

            def stop(self, from_signal=False):
                pass

        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end)
        sigterm.flush_on_sigterm(Collector(), inproc.main_thread_call)
        print(signal.set_wakeup_fd(-1) == write_end)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
