"""Whether a `gpudiag profile` run failed, and which processes died of what: the first thing
the diagnosis says when it did, before any finding (a crash is the finding).

The session records the command's exit status and signal (`meta["run"]`); each process its
uncaught exception (`profiler/exits.py`) and, at its final flush, `end_ns`. A process without
`end_ns` never finished Python's exit: it was killed (SIGKILL, the OOM killer), crashed
(SIGSEGV) or left through `os._exit`.

    said = outcome(trace.meta)     # None for a run that ended well, or not a profile run
    said["headline"]               # 'The run failed: exit status 1; rank 1 (pid 41) raised ...'
"""

from __future__ import annotations

import signal
from typing import Any

#: processes named one by one in the headline; the rest are counted
NAMED = 4


def outcome(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The run's exit and its dead processes, or None when nothing failed.

    `failed`: the command's exit status was not 0 (or a signal ended it); `processes`: one
    row per process that raised or never finished (pid, rank, how), which alone do not make
    the run failed (a helper killed by its parent is not a failure of the run)."""
    run = meta.get("run") or {}
    exit_code, signum = run.get("exit_code"), run.get("signal")
    died = [row for row in map(_death, meta.get("processes") or []) if row is not None]
    failed = bool(exit_code) or signum is not None
    if not failed and not died:
        return None
    return {"failed": failed, "exit_code": exit_code, "signal": signum,
            "signal_name": _signal_name(signum), "processes": died,
            "headline": _headline(failed, exit_code, signum, died)}


def _death(process: dict[str, Any]) -> dict[str, Any] | None:
    exception = process.get("exception")
    if exception:
        how = f"raised {exception}"
    elif process.get("end_ns") is None:
        how = "ended without exiting Python (killed, crashed or os._exit)"
    else:
        return None
    return {"pid": process.get("pid"), "rank": process.get("rank"), "how": how}


def _signal_name(signum: Any) -> str | None:
    try:
        return signal.Signals(int(signum)).name
    except (TypeError, ValueError):
        return None


def _headline(failed: bool, exit_code: Any, signum: Any, died: list[dict[str, Any]]) -> str:
    parts = []
    if failed:
        name = _signal_name(signum)
        parts.append(f"killed by {name or f'signal {signum}'}" if signum is not None
                     else f"exit status {exit_code}")
    for row in died[:NAMED]:
        who = (f"rank {row['rank']} (pid {row['pid']})" if row["rank"] is not None
               else f"pid {row['pid']}")
        parts.append(f"{who} {row['how']}")
    if len(died) > NAMED:
        parts.append(f"{len(died) - NAMED} more processes as well")
    lead = "The run failed" if failed else "The run ended, but not every process did"
    tail = (": what follows covers what was recorded before" if failed else "")
    return f"{lead}: {'; '.join(parts)}{tail}"
