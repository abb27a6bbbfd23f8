"""The shape of a saved trace's meta.json: every key gpudiag reads, with the JSON it holds.

`Trace.load_dir` checks a meta.json against `META` before anything reads it, so a tampered
or damaged file (a list where a dict belongs, a rank of 10**30, a warning count that is
text) is one InputError naming the key, never a TypeError deep in an analyzer or report.
Keys not listed are kept and never read. Shapes are small predicates built from:

    INT, STR, BOOL, SCALAR, ANY     an int64 (never a bool), a string, a bool, any JSON scalar
    opt(x), list_of(x), map_of(x)   None or x; a list of x; an object whose values are x
    record({key: x})                an object whose listed keys (when present) are x
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Shape = Callable[[Any], str | None]  # None when the value fits, else what is wrong

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return "is not an integer"
    return None if _INT64[0] <= value <= _INT64[1] else "is out of the int64 range"


def _str(value: Any) -> str | None:
    return None if isinstance(value, str) else "is not a string"


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "is not true or false"


def _scalar(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool):
        return _int(value)
    return None if value is None or isinstance(value, str | bool | float) else "is not a scalar"


def _any(value: Any) -> str | None:
    return None


INT: Shape = _int
STR: Shape = _str
BOOL: Shape = _bool
SCALAR: Shape = _scalar
ANY: Shape = _any


def opt(shape: Shape) -> Shape:
    return lambda value: None if value is None else shape(value)


def either(*shapes: Shape) -> Shape:
    def check(value: Any) -> str | None:
        found = [shape(value) for shape in shapes]
        return None if None in found else found[0]
    return check


def list_of(shape: Shape) -> Shape:
    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return "is not a list"
        for i, item in enumerate(value):
            problem = shape(item)
            if problem is not None:
                return f"[{i}] {problem}"
        return None
    return check


def map_of(shape: Shape) -> Shape:
    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "is not an object"
        for key, item in value.items():
            problem = shape(item)
            if problem is not None:
                return f"[{key!r}] {problem}"
        return None
    return check


def record(fields: Mapping[str, Shape]) -> Shape:
    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return "is not an object"
        for key, shape in fields.items():
            if key in value:
                problem = shape(value[key])
                if problem is not None:
                    return f".{key} {problem}"
        return None
    return check


COMMAND = opt(either(STR, list_of(SCALAR)))
#: `process.role` values of processes that serve a training process rather than train
#: (`profiler/process_facts.py` sets them): left out of the training loop's host numbers
HELPER_ROLES = ("dataloader worker", "compile worker")


def helper_pids(meta: Mapping[str, Any]) -> set[int]:
    """The pids of a trace's helper processes (a merged run's `processes`, or a single
    process's `process`)."""
    processes = list(meta.get("processes") or [])
    if isinstance(meta.get("process"), dict):
        processes.append(meta["process"])
    return {int(process["pid"]) for process in processes
            if process.get("role") in HELPER_ROLES and process.get("pid") is not None}


PROCESS = record({
    "pid": opt(INT), "host": opt(STR), "rank": opt(INT), "world_size": opt(INT),
    "collectors": list_of(STR), "data": BOOL, "gpudiag_thread_ids": list_of(INT),
    "start_ns": opt(INT), "end_ns": opt(INT), "command": COMMAND, "notes": list_of(STR),
    "exception": opt(STR), "ended_by": opt(STR), "role": opt(STR), "crash": opt(STR),
})

#: a run directory's own meta.json (`gpudiag profile`'s session), also kept as meta["run"]
RUN = record({"command": COMMAND, "options": opt(record({"backend": opt(STR)})),
              "not_collected": list_of(STR), "watchdog": list_of(map_of(ANY)),
              "backend": opt(STR), "exit_code": opt(INT), "signal": opt(INT)})

#: every meta.json key that gpudiag reads, and what it must hold
META: dict[str, Shape] = {
    "sources": list_of(record({"path": opt(STR), "format": opt(STR), "bytes": opt(INT)})),
    "warnings": map_of(INT),
    "timeline": BOOL,
    "rank": opt(INT), "world_size": opt(INT), "ranks": list_of(INT),
    "vendor": opt(STR), "framework": opt(STR), "backend": opt(STR), "trace_name": opt(STR),
    "started_at": opt(STR),
    "format": opt(STR), "tool_versions": map_of(SCALAR),
    "skipped": list_of(STR), "unreadable": list_of(STR), "not_collected": list_of(STR),
    "hosts": list_of(STR), "command": COMMAND,
    "process": PROCESS, "processes": list_of(PROCESS),
    "run": RUN,
    "ncu_rules": list_of(map_of(ANY)), "ncu_report_messages": list_of(ANY),
    "nvml": map_of(ANY), "allocator_settings": ANY, "external": map_of(ANY),
}


def first_problem(meta: Mapping[str, Any]) -> str | None:
    """'<key><where> <what is wrong>' for the first key of `meta` that breaks `META`."""
    for key, shape in META.items():
        if key in meta:
            problem = shape(meta[key])
            if problem is not None:
                return f"{key}{'' if problem[0] in '.[' else ' '}{problem}"
    return None
