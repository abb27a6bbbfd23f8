"""Restricting a trace to a time window: a time range or the span of named ranges.

`gpudiag analyze --window` and `diagnose(trace, window=...)` accept either
`START:END` with units (`ns`, `us`, `ms`, `s`; a number other than 0 without one is refused,
not read as ns; relative to the first GPU event, an empty side meaning the trace's edge)
or the name of a range (an NVTX range, annotation or step such as `ProfilerStep#3`; a
regular expression matching several spans their union).
Every analyzer then sees a trace whose events are cut to the window, so each one answers
for the window without knowing about it. A `START:END` window that misses the trace's span
entirely is an InputError that names the span: an empty window would only say "No
findings."
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpudiag.analyzers import keys
from gpudiag.analyzers.findings import format_ns
from gpudiag.errors import InputError
from gpudiag.trace import Trace

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_BOUND = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s)?\s*$")

#: tables with start_ns/end_ns intervals; `samples` has instants. The allocator tables stay
#: whole: the fragmentation analysis replays them back from the snapshot at the end.
INTERVAL_TABLES = ("kernels", "copies", "api", "syncs", "ranges", "collectives")


@dataclass(frozen=True)
class Window:
    """What an analysis reads: the whole trace, the bounds analyzed (None: all of it) and
    `trace`, the whole cut to them (`within`: its training steps are the whole trace's,
    cut to the bounds). The analyzers read `trace`; the waterfall's gap rules and the
    replay read `whole`, whose idle gaps' next events are its rows.

        seen = Window(trace, (start_ns, end_ns))
        seen.trace.kernels                      # the kernels overlapping the bounds, cut
        seen.steps                              # the whole trace's steps, cut to them
    """

    whole: Trace
    bounds: tuple[int, int] | None = None
    #: None: cut here (`within`); a job's merged ranks give theirs, each already cut
    trace: Trace = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.trace is None:
            object.__setattr__(self, "trace", self.whole if self.bounds is None
                               else within(self.whole, self.bounds))

    @property
    def steps(self) -> pd.DataFrame:
        """The training steps of the window (`steps.training.training_steps`)."""
        from gpudiag.analyzers.steps.training import training_steps

        return training_steps(self.trace)

    def cut(self, bounds: tuple[int, int]) -> Window:
        """The window of the same whole trace over other bounds (the warm-up steps')."""
        return Window(self.whole, bounds)


def resolve(trace: Trace, spec: str | tuple[int, int]) -> tuple[int, int]:
    """Absolute (start_ns, end_ns) of a window spec (see the module docstring).

        resolve(trace, "100ms:250ms")
        resolve(trace, "ProfilerStep#3")
    """
    if isinstance(spec, tuple):
        return int(spec[0]), int(spec[1])
    if is_span(spec):
        return span_bounds(spec, *edges(trace))
    return _named(trace, spec)


def is_span(spec: str) -> bool:
    """Whether `spec` is `START:END` (with units, either side may be empty), not a name."""
    return ":" in spec and all(_BOUND.match(part) or not part.strip()
                               for part in spec.split(":", 1))


def span_bounds(spec: str, origin: int, last: int) -> tuple[int, int]:
    """A `START:END` spec as absolute bounds, counted from `origin`, the trace's first
    event, `last` its last (`edges`): an InputError when it ends before it starts or
    misses the trace."""
    start_text, end_text = spec.split(":", 1)
    _refuse_bare(spec, start_text, end_text)
    start = origin + _parse(start_text) if start_text.strip() else origin
    end = origin + _parse(end_text) if end_text.strip() else last
    if end <= start:
        raise InputError("--window", f"window '{spec}' ends before it starts",
                         "give START:END with END after START, e.g. 100ms:300ms")
    if last > origin and (start >= last or end <= origin):
        span = format_ns(last - origin)
        raise InputError(
            "--window", f"window '{spec}' lies outside the trace: its events span "
            f"0 ns to {span}, counted from its first GPU event",
            f"give START:END within 0:{span.replace(' ', '').replace(',', '')}, "
            "or a range name")
    return start, end


def _refuse_bare(spec: str, *parts: str) -> None:
    """A number without a unit is ambiguous (`0:1` read as nanoseconds surprised users who
    meant seconds or milliseconds): only 0 may go without one."""
    bare = [part.strip() for part in parts if _is_bare(part)]
    if bare:
        example = ":".join(part.strip() + ("ms" if _is_bare(part) else "") for part in parts)
        raise InputError("--window",
                         f"window '{spec}': a number without a unit ({', '.join(bare)})",
                         f"give a unit (ns, us, ms or s), e.g. {example}")


def _is_bare(part: str) -> bool:
    match = _BOUND.match(part)
    return bool(match) and match is not None and match[2] is None and float(match[1]) != 0


def _parse(text: str) -> int:
    match = _BOUND.match(text)
    assert match is not None  # checked by the caller
    return round(float(match[1]) * _UNITS[match[2] or "ns"])


def edges(trace: Trace) -> tuple[int, int]:
    """(first, last) ns of the trace: its GPU window, else the span of its host intervals
    ((0, 0) without any). `START:END` windows count from the first."""
    window = trace.gpu_window_ns()
    if window is not None:
        return window
    tables = [table for name in INTERVAL_TABLES if len(table := getattr(trace, name))]
    starts = [int(table["start_ns"].min()) for table in tables]
    ends = [int(table["end_ns"].max()) for table in tables]
    return (min(starts), max(ends)) if starts else (0, 0)


def _named(trace: Trace, spec: str) -> tuple[int, int]:
    exact, matched = named_spans(trace.ranges, spec)
    found = exact or matched
    if found is None:
        raise no_range(spec, shown_names(trace.ranges))
    return found


def named_spans(ranges: pd.DataFrame, spec: str
                ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(start, end) of the ranges named exactly `spec`, and of those whose name matches it
    as a regular expression (`fullmatch`, only looked for without an exact one); None where
    none is."""
    names = ranges["name"]
    exact = ranges[(names.astype(str) == spec).to_numpy(bool)]
    if len(exact):
        return (int(exact["start_ns"].min()), int(exact["end_ns"].max())), None
    matched = ranges[fullmatch(names, spec)]
    if matched.empty:
        return None, None
    return None, (int(matched["start_ns"].min()), int(matched["end_ns"].max()))


def fullmatch(names: pd.Series, spec: str) -> np.ndarray:
    """Per row, whether the whole name matches `spec` (False where missing): once per
    distinct name, by RE2 (pyarrow's engine, linear in the text: `(a+)+$` against a
    100,000-character name cannot backtrack for hours as Python's `re` would).
    InputError for a pattern RE2 cannot compile (`(`, `*`, a look-ahead, a repetition
    past 1,000), which would otherwise surface as an internal error."""
    cat = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    texts = pa.array([str(c) for c in cat.cat.categories], type=pa.large_string())
    try:
        pc.match_substring_regex(pa.array([""]), pattern=spec)  # the pattern on its own
        hit = pc.match_substring_regex(texts, pattern=f"^(?:{spec})$")
    except pa.ArrowInvalid as exc:
        reason = str(exc).removeprefix("Invalid regular expression: ")
        raise InputError("--window", f"no range is named {spec!r}, and it is not a regular "
                         f"expression gpudiag can match ({reason})",
                         "give START:END (e.g. 100ms:300ms), a range name, or an RE2 pattern "
                         "(no look-around or back-references), e.g. 'ProfilerStep#[3-5]'"
                         ) from None
    found = np.append(hit.to_numpy(zero_copy_only=False).astype(bool), False)
    return found[cat.cat.codes.to_numpy()]


#: the range sources named when no range has the asked name, steps first (a step is what
#: one usually wants), five names in all
SHOWN_SOURCES = ("step", "nvtx", "annotation")
SHOWN = 5


def shown_names(ranges: pd.DataFrame) -> dict[str, list[str]]:
    """The first `SHOWN` names (sorted) of each of `SHOWN_SOURCES`, for `no_range`."""
    return {source: sorted(set(ranges.loc[ranges["source"] == source, "name"].astype(str)))
            [:SHOWN] for source in SHOWN_SOURCES}


def no_range(spec: str, shown: dict[str, list[str]]) -> InputError:
    """The error for a window naming no range, with some names there are (`shown_names`)."""
    sample = ", ".join([name for source in SHOWN_SOURCES for name in shown.get(source, [])]
                       [:SHOWN])
    return InputError("--window", f"no range named '{spec}' in the trace",
                      f"give START:END (e.g. 100ms:300ms) or a range name"
                      f"{' such as ' + sample if sample else ''}")


def within(trace: Trace, window: tuple[int, int]) -> Trace:
    """A copy of the trace with only what overlaps `[start, end)`, intervals cut to it (API
    calls that launched kept GPU work stay whole: the gap rules need their start). Its
    training steps are those of the whole trace, cut to the window (what `diagnose` of
    the window uses)."""
    start, end = window
    tables: dict[str, pd.DataFrame] = {}
    launched = pd.concat([gpu.loc[(gpu["end_ns"] > start) & (gpu["start_ns"] < end),
                                  ["rank", "pid", "correlation"]]
                          for gpu in (trace.kernels, trace.copies)])
    for name in INTERVAL_TABLES:
        frame = getattr(trace, name)
        inside = (frame["end_ns"] > start) & (frame["start_ns"] < end)
        if name == "api":  # the launch calls of kept GPU work, even from before the window
            inside |= keys.isin([frame["rank"], frame["pid"], frame["correlation"]],
                                [launched["rank"], launched["pid"], launched["correlation"]]
                                ) & frame["correlation"].notna().to_numpy(bool)
        keep = frame[inside].copy()
        if name != "api":
            keep["start_ns"] = np.maximum(keep["start_ns"].to_numpy(np.int64), start)
            keep["end_ns"] = np.minimum(keep["end_ns"].to_numpy(np.int64), end)
        tables[name] = keep
    samples = trace.samples
    tables["samples"] = samples[(samples["ts_ns"] >= start) & (samples["ts_ns"] < end)]
    out = Trace(meta={**trace.meta, "window_ns": [start, end]}, devices=trace.devices,
                memory=trace.memory, memory_blocks=trace.memory_blocks,
                metrics=trace.metrics, **tables)
    from gpudiag.analyzers.steps.detection import restrict

    restrict(trace, window, out)  # its steps are the whole trace's, cut to the window
    return out
