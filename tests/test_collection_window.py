"""The collection window of `gpudiag profile` (by steps after a warm-up, or by time), and the
main-thread calls that let a timer stop the torch profiler on the program's thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

from gpudiag.profiler import inproc
from gpudiag.profiler.collection_window import DEFAULT_STEPS, DEFAULT_WARMUP_STEPS, Window


def _window(settings: dict[str, Any]) -> tuple[Window, list[str]]:
    edges: list[str] = []
    return Window(settings, edges.append), edges


def _steps(window: Window, n: int, source: str = "marker") -> None:
    for _ in range(n):
        window.step(source)


def test_default_records_from_start_then_restarts_after_warm_up_and_stops_after_n() -> None:
    window, edges = _window({})
    window.begin()
    assert edges == ["resume"] and window.state == "provisional"  # a program without steps
    _steps(window, DEFAULT_WARMUP_STEPS, "optimizer")
    assert edges == ["resume"]
    window.step("optimizer")  # warm-up step W+1 opens: drop the start-up, record from here
    assert edges == ["resume", "restart"] and window.state == "open"
    _steps(window, DEFAULT_STEPS - 1, "optimizer")
    assert edges[-1] == "restart"
    window.step("optimizer")  # step W+N+1 opens: N steps were recorded
    assert edges == ["resume", "restart", "pause"] and window.done
    _steps(window, 5, "optimizer")
    assert len(edges) == 3  # a closed window never reopens
    info = window.info()
    assert info["closed_by"] == "steps" and info["step_source"] == "optimizer"
    assert info["recorded"] == "window"


def test_markers_win_over_the_optimizer_hook() -> None:
    window, edges = _window({"steps": 2, "warmup_steps": 0})
    window.begin()
    window.step("optimizer")
    assert window.step_source == "optimizer" and edges == ["resume", "restart"]
    window.step("marker")  # the program marks its steps: counting starts again with them
    assert window.step_source == "marker" and window.steps_seen == 1
    window.step("optimizer")
    window.step("optimizer")
    assert window.steps_seen == 1  # the hook no longer counts
    _steps(window, 2)
    assert edges[-1] == "pause" and window.closed_by == "steps"


def test_a_program_without_steps_keeps_a_time_bounded_start() -> None:
    window, edges = _window({"startup_limit_s": 0.1})
    window.begin()
    time.sleep(0.25)
    assert edges == ["resume", "pause"] and window.state == "capped"
    info = window.info()
    assert info["recorded"] == "provisional" and info["step_source"] is None
    _steps(window, DEFAULT_WARMUP_STEPS + 1)  # steps after all (a long start-up): record them
    assert edges == ["resume", "pause", "restart"] and window.on


def test_steps_all_and_time_windows_ignore_steps() -> None:
    window, edges = _window({"steps": "all"})
    window.begin()
    _steps(window, 100)
    assert edges == ["resume"] and window.info()["mode"] == "time"
    window, edges = _window({"delay_s": 0.1, "duration_s": 0.1})
    window.begin()
    assert edges == []
    time.sleep(0.15)
    assert edges == ["resume"]
    time.sleep(0.2)
    assert edges == ["resume", "pause"] and window.closed_by == "duration"


def test_steps_before_the_delay_do_not_count() -> None:
    window, edges = _window({"steps": 1, "warmup_steps": 0, "delay_s": 0.1})
    window.begin()
    window.step("marker")
    assert edges == [] and window.steps_seen == 0
    time.sleep(0.15)
    assert edges == ["resume"]
    window.step("marker")
    assert edges == ["resume", "restart"]


def test_duration_with_steps_bounds_the_step_window() -> None:
    window, edges = _window({"steps": 1000, "warmup_steps": 1, "duration_s": 0.1})
    window.begin()
    _steps(window, 2)
    assert edges == ["resume", "restart"]
    time.sleep(0.2)
    assert edges[-1] == "pause" and window.closed_by == "duration"


def test_main_thread_call_runs_on_the_main_thread_from_a_timer() -> None:
    ran: list[str] = []
    queued: list[bool] = []
    timer = threading.Timer(0.05, lambda: queued.append(inproc.main_thread_call(
        lambda: ran.append(threading.current_thread().name))))
    timer.start()
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        sum(range(1000))  # bytecode: the pending call runs between two of them
    assert queued == [True] and ran == [threading.main_thread().name]


def test_a_failing_main_thread_call_never_raises_into_the_program() -> None:
    def broken() -> None:
        raise RuntimeError("gpudiag bug")

    threading.Thread(target=inproc.main_thread_call, args=(broken,)).start()
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:  # would raise here if the error leaked
        sum(range(1000))


def test_a_call_asked_for_while_one_runs_under_a_profile_hook_never_spins() -> None:
    """CPython 3.11 spins forever when a pending call is added while one runs and the
    running one enters a Python function under a profile hook (torch.profiler with_stack):
    `gpudiag profile --delay` hung so at the window's start. Run in a child, time-bounded."""
    code = textwrap.dedent("""
        import sys, threading, time
        from gpudiag.profiler import inproc
        ran = []

        def inner():
            return 1

        def first():
            asker = threading.Thread(target=inproc.main_thread_call,
                                     args=(lambda: ran.append("second"),))
            asker.start(); asker.join()  # asked for while this call runs
            sys.setprofile(lambda *args: None)
            inner()  # a Python function entered under the hook
            sys.setprofile(None)
            ran.append("first")

        inproc.main_thread_call(first)
        deadline = time.monotonic() + 5
        while len(ran) < 2 and time.monotonic() < deadline:
            sum(range(100))
        print(ran)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['first', 'second']"
