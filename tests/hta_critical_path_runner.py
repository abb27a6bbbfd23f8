"""Run Holistic Trace Analysis's critical path analysis on Kineto traces and write it as JSON.

A test compares gpudiag's own critical path with HTA's; HTA pins its own pandas (its critical
path needs pandas 2: under pandas 3 it fails with "Cannot specify both 'axis' and
'index'/'columns'"), so it runs in a venv of its own, through this script:

    python tests/hta_critical_path_runner.py OUT.json TRACE [TRACE ...]
        [--annotation NAME] [--instance N] [--exact] [--timeout SECONDS]

Only the standard library and HTA are imported. Each trace is copied unchanged into a folder
of its own and analysed in a child process of its own (the same script with --worker), so a
trace that takes HTA longer than --timeout (default 300 s) is recorded as an error and the
run goes on. The copy leaves out the `stream` arg of host events (HTA would take such an op
for GPU work; see `_copy_without_host_streams`). HTA runs as `TraceAnalysis(trace_dir=...)`
builds it, last-ProfilerStep filter included unless --no-step-filter (the number of events
it dropped is recorded), and
`critical_path_analysis(rank=<the trace's only rank>, annotation=..., instance_id=...)`;
annotation "" (the default) is the whole trace.

Units. HTA keeps Kineto's µs. Where a trace's `ts` are all integers HTA keeps int µs. Where any
is fractional (ns-resolution Kineto), HTA by default rounds every event inward to whole µs
(ts up, ts+dur down, dur = the difference, which can reach -1 for a sub-µs event); with
--exact (HTA_DISABLE_NS_ROUNDING=1) it keeps float µs. Either way HTA then shifts `ts` so the
trace starts at 0, but not its `end` column. Every time written here is HTA's µs value times
1000, rounded to an integer number of ns, on HTA's shifted clock; add `ts_offset_ns` to get
the trace file's own clock. `window` is what HTA logged as its window, unchanged: for the
whole trace its end comes from the unshifted `end` column, so it lies `ts_offset_ns` late.

Per trace, under its file name in "traces": {"error": "..."} (what HTA raised, or the error
it logged when it returned None or False), or length_ns (the path's summed edge weights),
window, edges (the path in order: type, weight_ns, src and dst nodes, attributed event),
breakdown (HTA's bound_by -> summed ns), graph (node and edge counts of the whole graph,
edges by type), and what HTA warned about while building it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from decimal import Decimal, InvalidOperation
from itertools import pairwise
from pathlib import Path
from typing import Any

WINDOW_MESSAGE = re.compile(r"Looking up events within the window \((\S+), (\S+)\)")


def main(argv: list[str]) -> None:
    options = _parse_arguments(argv)
    if options.worker:
        result = _analyze_in_this_process(Path(options.traces[0]), options)
        Path(options.out).write_text(json.dumps(result))
        return
    results: dict[str, Any] = {
        "hta_version": _version("HolisticTraceAnalysis"),
        "pandas_version": _version("pandas"),
        "networkx_version": _version("networkx"),
        "rounding": "exact" if options.exact else "rounded",
        "step_filter": not options.no_step_filter,
        "annotation": options.annotation,
        "instance": options.instance,
        "timeout_s": options.timeout,
        "traces": {},
    }
    for trace in map(Path, options.traces):
        result = _analyze_in_child_process(trace, argv, options.timeout)
        results["traces"][trace.name] = result
        print(f"{trace.name}: {_summary(result)}", file=sys.stderr)
    Path(options.out).write_text(json.dumps(results))


def _parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("traces", nargs="+", help="Kineto trace files (.json or .json.gz)")
    parser.add_argument("--annotation", default="",
                        help="HTA's annotation: events in its instance's span ('' = all)")
    parser.add_argument("--instance", type=int, default=None,
                        help="which instance of the annotation (HTA's instance_id)")
    parser.add_argument("--exact", action="store_true",
                        help="HTA_DISABLE_NS_ROUNDING=1: keep HTA's float µs")
    parser.add_argument("--no-step-filter", action="store_true",
                        help="switch off HTA's last-ProfilerStep filter (as "
                             "hta_oracle_runner.py does: gpudiag analyzes every event)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds HTA may take per trace")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _analyze_in_child_process(trace: Path, argv: list[str], timeout: float) -> dict[str, Any]:
    """Run this script with --worker on one trace; a timeout or crash becomes the error."""
    passed_on = _options_without_paths(argv)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, __file__, str(out), str(trace), *passed_on, "--worker"]
        started = time.perf_counter()
        try:
            finished = subprocess.run(command, capture_output=True, text=True,
                                      timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"HTA took longer than {timeout:g} s; stopped"}
        if finished.returncode != 0 or not out.exists():
            last_lines = " | ".join(finished.stderr.strip().splitlines()[-3:])
            return {"error": f"worker exited with {finished.returncode}: {last_lines}"}
        result = json.loads(out.read_text())
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _options_without_paths(argv: list[str]) -> list[str]:
    """The optional arguments of argv, which the worker takes as they are."""
    options = _parse_arguments(argv)
    passed_on = ["--annotation", options.annotation, "--timeout", str(options.timeout)]
    if options.instance is not None:
        passed_on += ["--instance", str(options.instance)]
    if options.exact:
        passed_on.append("--exact")
    if options.no_step_filter:
        passed_on.append("--no-step-filter")
    return passed_on


def _analyze_in_this_process(trace: Path, options: argparse.Namespace) -> dict[str, Any]:
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1" if options.exact else "0"
    warnings.simplefilter("ignore")
    records = _capture_logs()
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    step_filter = _count_step_filter_drops(Trace, switched_off=options.no_step_filter)
    with tempfile.TemporaryDirectory() as folder:
        host_streams = _copy_without_host_streams(trace, Path(folder) / trace.name)
        try:
            analysis = TraceAnalysis(trace_dir=folder)
            ranks = list(analysis.t.traces)
            if len(ranks) != 1:
                return {"error": f"HTA found ranks {ranks}, expected one"}
            outcome = analysis.critical_path_analysis(
                rank=ranks[0], annotation=options.annotation, instance_id=options.instance)
        except Exception as exc:  # HTA's own failure is a result: the test reports it
            return {"error": _error_line(_exception_line(exc), records)}
        if not outcome:
            return {"error": _error_line("critical_path_analysis returned None", records)}
        graph, succeeded = outcome
        if not succeeded:
            return {"error": _error_line("critical_path_analysis returned False", records)}
        try:
            return {"rank": int(ranks[0]), **_describe(analysis.t, graph, records),
                    "step_filter_dropped_events": step_filter["dropped"],
                    "host_stream_args_removed": host_streams}
        except Exception as exc:  # e.g. get_critical_path_breakdown failing
            return {"error": _error_line(_exception_line(exc), records)}


#: Kineto categories of work on a GPU stream (a `stream` arg there is the stream it ran on)
GPU_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset",
                  "cuda_sync"}


def _copy_without_host_streams(source: Path, target: Path) -> int:
    """Copy the trace, minus the `stream` arg of host events (torch.compile's triton launch
    ops carry one, and HTA then takes the op for GPU work and leaves it out of its thread's
    call stack, as tests/hta_oracle_runner.py explains); how many were removed."""
    opener: Any = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt") as stream:
        document = json.load(stream)
    events = document["traceEvents"] if isinstance(document, dict) else document
    removed = 0
    for event in events:
        args = event.get("args") if isinstance(event, dict) else None
        if (isinstance(args, dict) and event.get("cat") not in GPU_CATEGORIES
                and "stream" in args):
            del args["stream"]
            removed += 1
    if not removed:
        shutil.copy(source, target)
        return 0
    with opener(target, "wt") as stream:
        json.dump(document, stream)
    return removed


def _capture_logs() -> list[logging.LogRecord]:
    """HTA's log records from now on, kept instead of printed ("hta" logger and root)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    hta_logger = logging.getLogger("hta")
    hta_logger.handlers = [handler]
    hta_logger.setLevel(logging.INFO)
    hta_logger.propagate = False
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    return records


def _count_step_filter_drops(trace_class: Any, *, switched_off: bool) -> dict[str, int]:
    """Wrap HTA's last-ProfilerStep filter, unchanged, to count the events it drops (or,
    `switched_off`, replace it with nothing)."""
    counts = {"dropped": 0}
    original = trace_class._filter_irrelevant_gpu_kernels
    if switched_off:
        trace_class._filter_irrelevant_gpu_kernels = lambda self, *args, **kwargs: None
        return counts

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = sum(len(frame) for frame in self.traces.values())
        returned = original(self, *args, **kwargs)
        counts["dropped"] = before - sum(len(frame) for frame in self.traces.values())
        return returned

    trace_class._filter_irrelevant_gpu_kernels = counting
    return counts


def _exception_line(exc: Exception) -> str:
    """The exception, and the file and line that raised it (HTA's asserts are often bare)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":") + where


def _error_line(what: str, records: list[logging.LogRecord]) -> str:
    """One line: what went wrong, then the errors HTA logged on the way."""
    logged = [record.getMessage().strip() for record in records
              if record.levelno >= logging.ERROR]
    return " | ".join([what, *logged[:5]]).replace("\n", " ")


def _describe(trace: Any, graph: Any, records: list[logging.LogRecord]) -> dict[str, Any]:
    frame = graph.trace_df
    symbols: list[str] = trace.symbol_table.get_sym_table()
    pairs = list(pairwise(graph.critical_path_nodes))
    edges = [_describe_edge(graph, frame, symbols, source, target)
             for source, target in pairs]
    length = sum(_decimal(graph.edges[source, target]["weight"]) or Decimal(0)
                 for source, target in pairs)
    return {
        "length_ns": _nanoseconds(length),
        "window": _logged_window(records),
        "ts_offset_ns": _nanoseconds(trace.min_ts),
        "edges": edges,
        "breakdown": _breakdown(graph),
        "graph": {
            "nodes": graph.number_of_nodes(),
            "edges": graph.number_of_edges(),
            "edge_types": dict(Counter(
                data["object"].type.value for _, _, data in graph.edges(data=True))),
        },
        "warnings": _warnings(records),
    }


def _describe_edge(graph: Any, frame: Any, symbols: list[str], source: int,
                   target: int) -> dict[str, Any]:
    data = graph.edges[source, target]
    attributed = graph.get_event_attribution_for_edge(data["object"])
    return {
        "type": data["object"].type.value,
        # "weight", not the CPEdge's own: HTA's graph check zeroes weights of -1 there
        "weight_ns": _nanoseconds(data["weight"]),
        "src": _describe_node(graph.node_list[source], frame, symbols),
        "dst": _describe_node(graph.node_list[target], frame, symbols),
        "attributed": (None if attributed is None or attributed < 0
                       else _describe_event(int(attributed), frame, symbols)),
    }


def _describe_node(node: Any, frame: Any, symbols: list[str]) -> dict[str, Any]:
    return {"ts_ns": _nanoseconds(node.ts), "is_start": bool(node.is_start),
            "event": _describe_event(int(node.ev_idx), frame, symbols)}


def _describe_event(index: int, frame: Any, symbols: list[str]) -> dict[str, Any]:
    row = frame.loc[index]
    correlation = _integer(row.get("correlation"))
    return {
        "name": symbols[int(row["name"])],
        "cat": symbols[int(row["cat"])],
        "ts_ns": _nanoseconds(row["ts"]),
        "dur_ns": _nanoseconds(row["dur"]),
        "pid": _identifier(row["pid"]),
        "tid": _identifier(row["tid"]),
        "stream": _integer(row["stream"]),
        "correlation": None if correlation is None or correlation < 0 else correlation,
        "index": index,
    }


def _breakdown(graph: Any) -> dict[str, int]:
    frame = graph.get_critical_path_breakdown()
    totals: dict[str, float] = {}
    for bound_by, duration in zip(frame["bound_by"], frame["duration"], strict=True):
        totals[str(bound_by)] = totals.get(str(bound_by), 0.0) + float(duration)
    return {bound_by: _nanoseconds(total) for bound_by, total in totals.items()}


def _logged_window(records: list[logging.LogRecord]) -> list[int | None] | None:
    """The window as HTA logged it, in ns; None where HTA's value was not a number."""
    for record in records:
        match = WINDOW_MESSAGE.search(record.getMessage())
        if match:
            return [_nanoseconds(text) for text in match.groups()]
    return None


def _warnings(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    """HTA's warnings, one entry per source line: how many, and the first message."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for record in records:
        if record.levelno == logging.WARNING:
            where = f"{record.filename}:{record.lineno}"
            counts[where] += 1
            first.setdefault(where, record.getMessage()[:200])
    return [{"where": where, "count": count, "first": first[where]}
            for where, count in counts.most_common()]


def _nanoseconds(microseconds: Any) -> int | None:
    """HTA's µs (int, float, or the text of a logged number) as the nearest whole ns."""
    value = _decimal(microseconds)
    return None if value is None else int((value * 1000).to_integral_value())


def _decimal(value: Any) -> Decimal | None:
    """The exact value of an int, float or number text: int64 µs since the epoch lose
    digits as floats; None for NaN, infinities and what is not a number."""
    try:
        exact = Decimal(value) if isinstance(value, str) else Decimal(operator.index(value))
    except TypeError:
        try:
            exact = Decimal(float(value))
        except (TypeError, ValueError):
            return None
    except InvalidOperation:
        return None
    return exact if exact.is_finite() else None


def _integer(value: Any) -> int | None:
    exact = _decimal(value)
    return None if exact is None else int(exact)


def _identifier(value: Any) -> int | str:
    """pid and tid: ints where HTA holds a whole number, else the string it holds."""
    exact = _decimal(value)
    return int(exact) if exact is not None and exact == int(exact) else str(value)


def _summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"error: {result['error'][:300]}"
    graph = result["graph"]
    return (f"length {result['length_ns'] / 1e9:.6f} s, {len(result['edges'])} path edges, "
            f"graph {graph['nodes']} nodes / {graph['edges']} edges, "
            f"{result['seconds']} s")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main(sys.argv[1:])
