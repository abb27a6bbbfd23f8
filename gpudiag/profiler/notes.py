"""The lines `gpudiag profile` prints after a run: what was not collected and why, what the
collection window caught, which processes lost what, and what gpudiag gave way to.

    notes = run_notes(run_dir, trace.meta, plan, options)   # one line each, for stderr
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.errors import GpudiagError, exhausted

if TYPE_CHECKING:
    from gpudiag.profiler.backends import Plan
    from gpudiag.profiler.session import ProfileOptions


def run_notes(run_dir: Path, meta: dict[str, Any], plan: Plan, options: ProfileOptions
              ) -> list[str]:
    """One line each: what was missing, what failed, what the window caught (`meta`: the
    merged run's)."""
    notes = []
    missing = list(plan.not_collected)
    if not missing:  # without a GPU the plan said it already; else NVML's own reasons
        missing += meta.get("run", {}).get("not_collected", [])
    if missing:
        notes.append("not collected: " + "; ".join(missing)
                     + " (`gpudiag doctor` says how to get them)")
    errors = run_dir / "bootstrap-errors.log"
    if errors.exists() and errors.stat().st_size:
        notes.append(f"collectors reported problems: see {errors}")
    processes = meta.get("processes", [])
    notes += window_notes(processes)
    notes += process_notes(processes)
    notes += _unfinished(processes, meta.get("run", {}).get("watchdog", []))
    kept = {process.get("pid"): process.get("data", False) for process in processes}
    for ended in meta.get("run", {}).get("watchdog", []):
        who = f"rank {ended['rank']}" if ended.get("rank") is not None else "process"
        data = ("its profile was written before it ended" if kept.get(ended["pid"])
                else "its profile is lost")
        notes.append(f"{who} (pid {ended['pid']}) {ended['reason']}: ended with "
                     f"{ended['ended_by']}; {data}, the others' data is kept; its stacks are "
                     f"in {ended['stacks']}")
    started = sorted({collector for process in processes
                      for collector in process.get("collectors", [])} - {"host"})
    if processes and not started and set(plan.collectors) - {"host"}:
        wanted = ", ".join(sorted(set(plan.collectors) - {"host"}))
        notes.append(f"no in-process collector started ({wanted} start when the program "
                     "imports torch / jax / cupy): only host markers were recorded")
    return notes


def _unfinished(processes: list[dict[str, Any]], ended: list[dict[str, Any]]) -> list[str]:
    """Processes that never ran their final flush (SIGKILL, a crash, os._exit) and were not
    ended by the watchdog (which says its own line): what their profiler held is lost."""
    by_watchdog = {record.get("pid") for record in ended}
    lines = []
    for process in processes:
        if process.get("end_ns") is not None or process["pid"] in by_watchdog:
            continue
        plugins = set(process.get("collectors", [])) & {"torch", "jax"}
        crash = process.get("crash")
        if not plugins and crash is None:
            continue
        rank = process.get("rank")
        who = f"rank {rank} (pid {process['pid']})" if rank is not None \
            else f"pid {process['pid']}"
        how = ("ended without its final flush (killed, crashed or os._exit)" if crash is None
               else f"crashed: {crash} (every thread's stack: {process.get('stack_file')})")
        kept = "its earlier segments are kept" if process.get("data") else "nothing of it"
        lost = (f"its {'/'.join(sorted(plugins))} profile since the last written segment is "
                f"lost ({kept}); " if plugins else "")
        lines.append(f"{who} {how}: {lost}its host markers are kept up to its last flush")
    return lines


def window_notes(processes: list[dict[str, Any]]) -> list[str]:
    """What the collection window caught, said once for the processes it was the same in."""
    said: dict[str, list[str]] = {}
    for process in processes:
        window = process.get("window") or {}
        if window.get("mode") != "steps" or not set(process.get("collectors", [])) - {"host"}:
            continue
        rank = process.get("rank", process.get("local_rank"))
        who = f"rank {rank}" if rank is not None else f"pid {process.get('pid')}"
        if window.get("step_source") is None:
            line = (f"no training step found (no optimizer step, no gpudiag.step()): "
                    f"collected the first {window['startup_limit_s']:g} s at most; choose "
                    "another part with --delay/--duration")
        elif window.get("recorded") == "provisional":
            line = (f"the program ran {window['steps_seen']} steps, within the "
                    f"{window['warmup_steps']} warm-up steps: the whole run was collected, "
                    "warm-up included")
        else:
            first = window["warmup_steps"] + 1
            last = min(window["steps_seen"] - 1 if window.get("closed_by") == "steps"
                       else window["steps_seen"], window["warmup_steps"] + window["steps"])
            source = "the optimizer" if window["step_source"] == "optimizer" \
                else "gpudiag.step()"
            line = (f"collected steps {first}-{last} (steps from {source}; "
                    f"{window['warmup_steps']} warm-up steps left out; --steps all for "
                    "the whole run)")
        said.setdefault(line, []).append(who)
    if len(processes) <= 1:
        return list(said)
    return [f"{line} [{', '.join(whos)}]" for line, whos in said.items()]


def process_notes(processes: list[dict[str, Any]]) -> list[str]:
    """What each process's collectors said about it (the program ran a profiler of its own,
    another `gpudiag profile`, a thread gpudiag had to follow), once per line."""
    said: dict[str, list[str]] = {}
    for process in processes:
        rank = process.get("rank", process.get("local_rank"))
        who = f"rank {rank}" if rank is not None else f"pid {process.get('pid')}"
        for line in process.get("notes") or []:
            said.setdefault(str(line), []).append(who)
    return [f"{', '.join(whos)}: {line}" for line, whos in said.items()]


def after_run_failure(run_dir: Path, exit_code: int, error: BaseException) -> str:
    """The one line for a profile that failed after the command ran (its exit status is
    still what `gpudiag profile` exits with): what failed, and what to do."""
    ran = f"the command ran (exit status {exit_code})"
    if not run_dir.exists():
        return (f"{ran} but its run directory {run_dir} was deleted while it ran: nothing "
                "of its profile is left (pass -o RUN_DIR outside what the program removes)")
    limit = exhausted(error)
    if limit is not None:
        return (f"{ran}; its profile in {run_dir} could not be merged or analyzed: {limit} "
                f"(then `gpudiag analyze {run_dir}`)")
    if isinstance(error, OSError):
        return (f"{ran} but its profile could not be written to {run_dir}: "
                f"{error.strerror or error} (free space, or -o on another file system)")
    if isinstance(error, GpudiagError):
        return f"{ran}; its profile in {run_dir} could not be read: {error}"
    return (f"{ran}; gpudiag failed on its profile in {run_dir}: internal error: "
            f"{error.__class__.__name__}: {error} (run with --debug for the traceback, and "
            "please report it)")
