"""A job's `--window`: resolved from what each rank holds, before the analysis reads them.

`START:END` counts from the job's first GPU event (else its first event of any kind); a
name is the span of every rank's ranges of that name (exactly, else as a regular
expression), or, named by no range, of the detected steps of that name: what
`diagnosis.bounds_of` gives on the merged trace. The map (`edges_of`) reads a file and
sends its `Edges`, a few numbers and names; `resolve` makes the job's bounds from them. The
analysis then reads each file a second time (workers keep nothing between passes): a
window on a job costs one more read of it, the price of never holding the job in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.analyzers import window as window_mod
from gpudiag.analyzers.steps.training import training_steps
from gpudiag.readers.sources import read_file

Span = tuple[int, int]


@dataclass(frozen=True)
class Edges:
    """One file's share of the window: its GPU window, the span of all its events (None
    without any), and the spans `spec` names in it (see `window.named_spans`; `step`:
    detected steps of that name) with some of its range names for the error message."""

    gpu: Span | None = None
    span: Span | None = None
    exact: Span | None = None
    matched: Span | None = None
    step: Span | None = None
    shown: dict[str, list[str]] = field(default_factory=dict)


def edges_of(job: tuple[str, str]) -> Edges:
    """The `Edges` of file `job[0]` for window spec `job[1]` (runs on a worker)."""
    unit, spec = job
    trace = read_file(Path(unit))
    has_events = any(len(getattr(trace, name)) for name in window_mod.INTERVAL_TABLES)
    span = window_mod.edges(trace) if has_events else None
    if window_mod.is_span(spec):
        return Edges(gpu=trace.gpu_window_ns(), span=span)
    exact, matched = window_mod.named_spans(trace.ranges, spec)
    step = None
    if exact is None:
        steps = training_steps(trace)
        named = steps[steps["step"].astype(str) == spec]
        if len(named):
            step = int(named["start_ns"].min()), int(named["end_ns"].max())
    return Edges(gpu=trace.gpu_window_ns(), span=span, exact=exact, matched=matched,
                 step=step, shown=window_mod.shown_names(trace.ranges))


def resolve(edges: list[Edges], spec: str) -> Span:
    """The job's absolute bounds for `spec` from its files' `Edges`; the merged trace's
    InputError when the window misses the job or names nothing in it."""
    if window_mod.is_span(spec):
        first = _union([e.gpu for e in edges]) or _union([e.span for e in edges]) or (0, 0)
        return window_mod.span_bounds(spec, *first)
    exact = _union([e.exact for e in edges])
    if exact is None:  # a name no range has: a detected step's, as `bounds_of` does
        step = _union([e.step for e in edges])
        if step is not None:
            return step
    found = exact or _union([e.matched for e in edges])
    if found is None:
        shown = {source: sorted({name for e in edges for name in e.shown.get(source, [])})
                 for source in window_mod.SHOWN_SOURCES}
        raise window_mod.no_range(spec, shown)
    return found


def _union(spans: list[Span | None]) -> Span | None:
    known = [span for span in spans if span is not None]
    return (min(s[0] for s in known), max(s[1] for s in known)) if known else None
