"""Nsight Compute reports (.ncu-rep), read with NVIDIA's `ncu_report` package (`gpudiag[ncu]`).

    trace = gpudiag.readers.ncu.reader.read(Path("report.ncu-rep"))
    trace.metrics[trace.metrics["metric"] == "sm__throughput.avg.pct_of_peak_sustained_elapsed"]

One `kernels` row per profiled result (every action of every range), one `metrics` row per
(kernel, metric) in long format, one `devices` row per GPU, and ncu's guided-analysis rule
results in `meta["ncu_rules"]`.

**No timeline.** ncu serializes the application and replays each kernel several times (one
pass per group of counters, caches flushed in between), so a report holds each kernel's
`gpu__time_duration.sum` but not when it ran relative to the others, nor any host activity.
Kernels are placed back to back in report order from 0 ns, so durations and totals are real
and `meta["timeline"]` is False: analyzers of gaps, overlap and idle time must skip this trace.

What ncu_report (2026.3) does not expose, so stays NA: the host process and thread
(`kernels.pid`), CUPTI correlation ids, and the version of ncu that wrote the report
(`IContext.get_version()` is the reading library's version; it goes to `tool_versions`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.optional import require
from gpudiag.readers.ncu.isolated import read_isolated
from gpudiag.readers.ncu.metrics import (
    Action,
    MetricRows,
    ValueKinds,
    axes,
    clean_text,
    device_row,
    devices_frame,
    duration_ns,
    number,
)
from gpudiag.readers.ncu.native import NATIVE_LOG_ENV, NativeStderr
from gpudiag.trace import Trace

#: the name ncu gives the NVTX domain of ranges pushed without a domain
DEFAULT_DOMAIN = "<default domain>"
NO_RESULTS_FIX = (
    "the report is empty, truncated or not an Nsight Compute report: re-run ncu and check "
    "that its kernel filters (-k, -c, --nvtx-include) matched at least one launch"
)
DAMAGED_FIX = "copy the file again or re-run ncu: the end of the report is missing"
SHAPE_FROM_TOTAL = "kernels whose grid or block has only a total size (taken as x, y = z = 1)"
NO_DURATION = "kernels without gpu__time_duration.sum (placed with zero duration)"
SKIPPED_METRICS = "metrics with a damaged name or no value object left out (damaged report)"
NATIVE_MESSAGES = "messages ncu_report printed while opening the report"


def read(path: Path, metrics: Iterable[str] | None = None, *, isolated: bool = True) -> Trace:
    """Read an Nsight Compute report into a Trace (kernels, metrics, devices, rules in meta).

    `metrics`, when given, keeps only those metric names in the `metrics` table; kernels and
    devices are always filled from the launch__* and device__attribute_* metrics.
    The read runs in a child process (`ncu_isolated`) so that ncu_report aborting on a
    damaged report is an InputError; `isolated=False` reads in this process.
    """
    if isolated:
        return read_isolated(path, metrics)
    return read_in_process(path, metrics)


def read_in_process(path: Path, metrics: Iterable[str] | None = None) -> Trace:
    """`read` in this process: a native crash in ncu_report ends this process too."""
    ncu = require("ncu_report", "Reading an Nsight Compute report")
    keep = os.environ.get(NATIVE_LOG_ENV)
    with NativeStderr(Path(keep) if keep else None) as native:
        context = _open(ncu, path, native)
        ranges = int(context.num_ranges())
        actions = _actions(context, ranges, path, native)
    kinds = ValueKinds.of(ncu.IMetric)
    rows = MetricRows(kinds, None if metrics is None else frozenset(metrics))
    notes: Counter[str] = Counter()
    launches = []
    for kernel_id, action in enumerate(actions):
        launches.append(launch(action, kernel_id, kinds, notes))
        rows.add(kernel_id, action)
    notes[SKIPPED_METRICS] += rows.skipped
    kernels = kernels_frame(launches)
    trace = Trace(
        meta=_meta(ncu, context, ranges, _rules(ncu, actions)),
        kernels=kernels,
        metrics=rows.frame([entry["name"] for entry in launches],
                           [entry["device"] for entry in launches]),
        devices=_devices(actions, kernels, kinds),
    )
    notes[NATIVE_MESSAGES] += len(native.messages())
    if native.messages():
        trace.meta["ncu_report_messages"] = native.messages()
    for kind, count in notes.items():
        trace.warn(kind, count)
    return trace


def _detail(native: NativeStderr) -> str:
    messages = native.messages()
    return f" (ncu_report: {messages[0]})" if messages else ""


def _open(ncu: Any, path: Path, native: NativeStderr) -> Any:
    """ncu_report's context for `path`; any failure to open becomes an InputError.

    `load_report` rarely raises on bad input: garbage, an empty file or a truncated header
    give a context with no ranges, a report cut mid-way a last result with no name (both
    caught in `_actions`). It raises FileNotFoundError for a missing file, and we catch the
    rest broadly because the SWIG layer documents no exception types.
    """
    try:
        context = ncu.load_report(str(path))
    except Exception as exc:  # SWIG/C++ errors have no documented types
        raise InputError(
            path, f"cannot be opened by ncu_report ({exc.__class__.__name__}: {exc})",
            "check that it is a complete .ncu-rep written by Nsight Compute",
        ) from exc
    if context is None:
        raise InputError(path, f"cannot be opened by ncu_report{_detail(native)}",
                         NO_RESULTS_FIX)
    return context


def _actions(context: Any, ranges: int, path: Path, native: NativeStderr) -> list[Action]:
    """Every action of every range, in report order; InputError for none or a damaged one."""
    actions: list[Action] = []
    for range_index in range(ranges):
        report_range = context.range_by_idx(range_index)
        for action_index in range(int(report_range.num_actions())):
            action = report_range.action_by_idx(action_index)
            if action is None or action.name() is None:
                raise InputError(
                    path, f"is truncated or damaged: result {action_index} of range "
                    f"{range_index} has no kernel name and no metrics{_detail(native)}",
                    DAMAGED_FIX,
                )
            actions.append(action)
    if not actions:
        raise InputError(
            path, f"holds no profiled kernels ({ranges} ranges){_detail(native)}",
            NO_RESULTS_FIX,
        )
    return actions


def kernel_name(action: Action) -> str:
    """The demangled name (with its parameter list, as Kineto and nsys show kernel names);
    the function name when the demangled one is not available."""
    try:
        name = action.name(action.NameBase_DEMANGLED)
    except (AttributeError, TypeError):  # an older ncu_report without name bases
        name = None
    return clean_text(name or action.name())


def launch(
    action: Action, kernel_id: int, kinds: ValueKinds, notes: Counter[str]
) -> dict[str, Any]:
    """One kernels row (without times) from the launch__* metrics of an action.

    Repairs are counted in `notes`: a grid or block known only by its total size, a kernel
    without a duration.
    """
    grid, grid_total = axes(action, kinds, "launch__grid_dim", "launch__grid_size")
    block, block_total = axes(action, kinds, "launch__block_dim", "launch__block_size")
    static = number(action, "launch__shared_mem_per_block_static", kinds)
    dynamic = number(action, "launch__shared_mem_per_block_dynamic", kinds)
    device = number(action, "launch__device_id", kinds)
    duration = duration_ns(action, kinds)
    notes[SHAPE_FROM_TOTAL] += grid_total or block_total
    notes[NO_DURATION] += duration is None
    return {
        "kernel_id": kernel_id,
        "name": kernel_name(action),
        "device": number(action, "device__attribute_device_index", kinds) if device is None
        else device,
        "stream": number(action, "launch__stream_id", kinds),
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2],
        "regs_per_thread": number(action, "launch__registers_per_thread", kinds),
        "smem_static_bytes": static,
        "smem_dynamic_bytes": dynamic,
        "smem_bytes": static + dynamic if static is not None and dynamic is not None
        else number(action, "launch__shared_mem_per_block", kinds),
        "smem_config_bytes": number(action, "launch__shared_mem_config_size", kinds),
        "duration_ns": duration,
        "nvtx": nvtx_text(action.nvtx_state()),
    }


def kernels_frame(launches: list[dict[str, Any]]) -> pd.DataFrame:
    """The kernels table: launches placed back to back from 0 ns (there is no timeline)."""
    frame = pd.DataFrame(launches)
    duration = frame.pop("duration_ns").fillna(0).to_numpy(dtype=np.int64)
    end = np.cumsum(duration)
    frame["start_ns"] = end - duration
    frame["end_ns"] = end
    return frame


def nvtx_text(state: Any) -> str | None:
    """The NVTX ranges open at launch as text: "outer/inner" in the default domain,
    "domain:outer/inner" in a named one, several domains joined by "; ".

    Push/pop ranges come in stack order (outermost first), then the domain's start/end
    ranges, which do not nest. None when no range was open (or NVTX was not traced).
    """
    if state is None:
        return None
    parts = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        names = [] if domain is None else _range_names(domain)
        if names:
            label = clean_text(domain.name() or "")
            prefix = f"{label}:" if label and label != DEFAULT_DOMAIN else ""
            parts.append(prefix + "/".join(names))
    return "; ".join(parts) or None


def _range_names(domain: Any) -> list[str]:
    pushed = (domain.push_pop_range(index) for index in range(len(domain.push_pop_ranges())))
    names = [pushed_range.name() for pushed_range in pushed if pushed_range is not None]
    names += list(domain.start_end_ranges())
    return [clean_text(name) for name in names if name]


def _devices(actions: list[Action], kernels: pd.DataFrame, kinds: ValueKinds) -> pd.DataFrame:
    """One devices row per device the kernels ran on, from its first kernel's attributes."""
    first = kernels.dropna(subset=["device"]).drop_duplicates("device")
    rows = [device_row(actions[int(kernel_id)], int(device), kinds)
            for kernel_id, device in zip(first["kernel_id"], first["device"], strict=True)]
    return devices_frame(rows)


def _rules(ncu: Any, actions: list[Action]) -> list[dict[str, Any]]:
    """ncu's rule results (the advice of its Details page), compact and JSON-serializable.

    Message text keeps ncu's link markup (`@section:Id:text@`, `@url:text:href@`).
    """
    msg_types = _enum_names(getattr(ncu, "MsgType", ()))
    speedup_types = _enum_names(getattr(ncu, "SpeedupType", ()))
    rows = []
    for kernel_id, action in enumerate(actions):
        results = getattr(action, "rule_results_as_dicts", None)  # ncu_report >= 2025.1
        for result in results() if results is not None else ():
            rows.append(rule_row(kernel_id, result, msg_types, speedup_types))
    return rows


def rule_row(kernel_id: int, result: dict[str, Any], msg_types: dict[int, str],
             speedup_types: dict[int, str]) -> dict[str, Any]:
    """One rule result from `IAction.rule_results_as_dicts()`; absent parts become None."""
    message = result.get("rule_message") or {}
    speedup = result.get("speedup_estimation") or {}
    return {
        "kernel_id": kernel_id,
        "rule_identifier": result.get("rule_identifier"),
        "name": result.get("name"),
        "section_identifier": result.get("section_identifier"),
        "title": message.get("title") or None,
        "message": message.get("message") or None,
        "type": _label(message.get("type"), msg_types),
        "speedup_type": _label(speedup.get("type"), speedup_types),
        "speedup": None if speedup.get("speedup") is None else float(speedup["speedup"]),
        "focus_metrics": [_focus(metric) for metric in result.get("focus_metrics") or []] or None,
    }


def _focus(metric: dict[str, Any]) -> dict[str, Any]:
    """A rule's focus metric as plain JSON data (the reason the rule fired, in numbers)."""
    value = metric.get("value")
    return {"name": metric.get("name"), "value": None if value is None else float(value),
            "severity": None if metric.get("severity") is None else int(metric["severity"]),
            "info": metric.get("info")}


def _enum_names(enum: Iterable[Any]) -> dict[int, str]:
    return {int(member): str(member.name).lower() for member in enum}


def _label(code: Any, names: dict[int, str]) -> str | None:
    if code is None:
        return None
    return names.get(int(code), str(int(code)))


def _meta(ncu: Any, context: Any, ranges: int, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": "ncu-rep",
        "tool_versions": {"ncu_report": _library_version(ncu, context)},
        "timeline": False,
        "vendor": "nvidia",
        "ranges": ranges,
        "ncu_rules": rules,
    }


def _library_version(ncu: Any, context: Any) -> str | None:
    """The ncu_report version (the report's own ncu version is not exposed by the API)."""
    try:
        return str(context.get_version())
    except AttributeError:
        return getattr(ncu, "__version__", None)
