"""When the in-process collectors record: the collection window of `gpudiag profile`.

Stdlib only, loaded by path next to `bootstrap.py` (as `inproc.py` is). Two kinds of window:

- **By steps** (the default, and `--steps N`): recording starts when the plugins start, as a
  *provisional* part that only matters if the program never shows a step. A step is a
  `gpudiag.step()` marker or, without markers, the end of an optimizer step (the torch
  plugin's hook; markers win once one is seen). When warm-up step W+1 opens (`--warmup-steps`,
  default 3: compile, cuDNN autotune, allocator growth), the provisional part is dropped and
  steps W+1 .. W+N are recorded; the window closes when step W+N+1 opens. A provisional part
  stops growing after `startup_limit_s` (a long start-up, or a program without steps: then
  that first part is what the run keeps, and the session says no step was found).
- **By time** (`--steps all`, or `--delay` / `--duration` without `--steps`): open after the
  delay, closed after the duration or at exit.

`listener(edge)` gets "resume", "pause" or "restart" (drop the provisional part, then
resume), from whichever thread crossed the edge (a timer thread for time edges, the
program's thread for step edges); plugins that must act on one thread defer it themselves.

    window = Window({"steps": 20}, print)
    window.begin(); window.step("marker")      # "resume", then nothing until step 4 opens
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

#: steps recorded by default, after the warm-up
DEFAULT_STEPS = 20
#: leading steps left out by default (their time is in the host step ranges, not the profile)
DEFAULT_WARMUP_STEPS = 3
#: the provisional part (before warm-up ends) is closed after this long
DEFAULT_STARTUP_LIMIT_S = 30.0


class Window:
    """The collection window of one process; `info()` is what its meta records."""

    def __init__(self, settings: dict[str, Any], listener: Callable[[str], None]) -> None:
        self.delay_s = float(settings.get("delay_s") or 0.0)
        self.duration_s = settings.get("duration_s")
        steps = settings.get("steps")
        self.by_time = steps == "all" or (steps is None and (self.delay_s > 0
                                                            or self.duration_s is not None))
        self.steps = None if self.by_time else int(steps or DEFAULT_STEPS)
        warmup = settings.get("warmup_steps")
        self.warmup = DEFAULT_WARMUP_STEPS if warmup is None else int(warmup)
        self.startup_limit_s = float(settings.get("startup_limit_s") or DEFAULT_STARTUP_LIMIT_S)
        self.listener = listener
        self.start_s = time.monotonic()
        self.state = "waiting"  # -> provisional | capped | open -> closed
        self.steps_seen = 0
        self.step_source: str | None = None
        self.closed_by: str | None = None
        self.opened_ns: int | None = None
        self._lock = threading.RLock()
        self._timers: list[threading.Timer] = []

    @property
    def on(self) -> bool:
        return self.state in ("provisional", "open")

    @property
    def done(self) -> bool:
        return self.state == "closed"

    def begin(self) -> None:
        """Open now, or arm the delay timer."""
        if self.delay_s > 0:
            self._after(self.delay_s, self._delay_over)
        else:
            self._delay_over()

    def _delay_over(self) -> None:
        with self._lock:
            if self.state != "waiting":
                return
            if self.by_time:
                self._open("open", "resume")
            else:
                self._open("provisional", "resume")
                self._after(self.startup_limit_s, self._startup_over)

    def _startup_over(self) -> None:
        with self._lock:
            if self.state == "provisional":
                self.state = "capped"
                self.listener("pause")

    def step(self, source: str) -> None:
        """A step opened (`source`: "marker" for gpudiag.step(), "optimizer" for the hook)."""
        with self._lock:
            if source != self.step_source:
                if self.step_source == "marker":
                    return  # the program marks its steps: the optimizer hook is not needed
                self.step_source, self.steps_seen = source, 0
            if self.state == "waiting" or self.done:
                return  # before --delay, or after the window: not counted
            self.steps_seen += 1
            if self.by_time or self.steps is None:
                return
            if self.steps_seen == self.warmup + 1:
                self._open("open", "restart")
            elif self.steps_seen == self.warmup + self.steps + 1:
                self.close("steps")

    def _open(self, state: str, edge: str) -> None:
        self.state = state
        self.opened_ns = time.time_ns()
        if state == "open" and self.duration_s is not None:
            self._after(float(self.duration_s), lambda: self.close("duration"))
        self.listener(edge)

    def close(self, reason: str) -> None:
        """Close for good (steps done, duration over); a closed window never reopens."""
        with self._lock:
            if self.done:
                return
            was_on = self.on
            self.state, self.closed_by = "closed", reason
            if was_on:
                self.listener("pause")

    def info(self) -> dict[str, Any]:
        """What the window did, for the process meta (the session's notes read it)."""
        mode = "time" if self.by_time else "steps"
        found = self.steps_seen > 0
        return {
            "mode": mode, "steps": self.steps, "warmup_steps": self.warmup,
            "delay_s": self.delay_s, "duration_s": self.duration_s,
            "startup_limit_s": self.startup_limit_s, "state": self.state,
            "steps_seen": self.steps_seen, "step_source": self.step_source if found else None,
            "closed_by": self.closed_by,
            "recorded": ("provisional" if mode == "steps" and self.state in ("provisional",
                                                                               "capped")
                         else "window"),
        }

    def _after(self, seconds: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        timer.name = "gpudiag-window"
        timer.start()
        self._timers.append(timer)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (a parent's timer may have held it at the fork)
        and no timers (they do not survive a fork)."""
        self._lock = threading.RLock()
        self._timers = []

    def threads(self) -> list[threading.Thread]:
        """The window's timer threads (gpudiag's own: the merge leaves their events out)."""
        return list(self._timers)

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()
