"""Exports: the normalized trace (and its diagnosis) as a Chrome/Perfetto trace or as tables.

`write_chrome_trace` writes the events `chrome_events` builds, for ui.perfetto.dev: every
event of the Trace on its track, and per device the idle time tiled by cause with the
advice of the finding it belongs to, and the top findings where they happen. It streams:
chunks of rows are encoded by msgspec and written as they come, so memory stays that of one
chunk. `write_tables` writes any table (and the diagnosis' tables) as CSV or Parquet.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.reports.chrome_events import (
    CHUNK_ROWS,
    ENCODER,
    Plan,
    annotated_gaps,
    base_time_ns,
    events,
    header,
)
from gpudiag.reports.safe_text import csv_cell
from gpudiag.trace import Trace, write_parquet

if TYPE_CHECKING:
    from gpudiag.analyzers.diagnosis import Diagnosis

__all__ = ["annotated_gaps", "chrome_trace_chunks", "to_chrome_trace", "write_chrome_trace",
           "write_tables"]


def chrome_trace_chunks(trace: Trace, dx: Diagnosis | None = None, *,
                        top: int = 10, chunk_rows: int = CHUNK_ROWS) -> Iterator[bytes]:
    """The Chrome trace JSON as byte pieces, one per chunk of `chunk_rows` rows.

        with open("trace.json", "wb") as f:
            for piece in chrome_trace_chunks(trace, dx):
                f.write(piece)

    What `write_chrome_trace` writes; for a caller streaming elsewhere (stdout, a socket).
    """
    plan = Plan(base_time_ns(trace), top, chunk_rows)
    yield ENCODER.encode(header(trace, dx, plan))[:-1] + b',"traceEvents":['
    first = True
    for chunk in events(trace, dx, plan):
        if chunk:
            body = ENCODER.encode(chunk)[1:-1]
            yield body if first else b"," + body
            first = False
    yield b"]}"


def to_chrome_trace(trace: Trace, dx: Diagnosis | None = None, *,
                    top: int = 10) -> dict[str, Any]:
    """The Chrome/Perfetto trace as a dict (`traceEvents` plus gpudiag's header).

        doc = to_chrome_trace(trace, gpudiag.diagnose(trace))
        [e for e in doc["traceEvents"] if e.get("cat") == "gpudiag.idle"][:3]
        json.dump(doc, open("trace.json", "w"))

    `dx` adds the idle-cause and findings tracks, read from the Diagnosis (its gap pieces
    and their call sites); `top` findings are marked. Holds every event in
    memory as plain dicts: for big traces use `write_chrome_trace`, which streams.
    """
    doc = b"".join(chrome_trace_chunks(trace, dx, top=top))
    return dict(msgspec.json.decode(doc))  # exactly what the file would hold


def write_chrome_trace(trace: Trace, path: str | Path, dx: Diagnosis | None = None, *,
                       top: int = 10, chunk_rows: int = CHUNK_ROWS) -> Path:
    """Write the Chrome/Perfetto trace to `path` (gzip when it ends in `.gz`), streaming.

        dx = gpudiag.diagnose(trace)
        write_chrome_trace(trace, "run.json.gz", dx)   # open in ui.perfetto.dev
        write_chrome_trace(trace, "events.json")       # the events alone

    Memory stays that of `chunk_rows` events whatever the trace's size.
    """
    out = Path(path)
    pieces = chrome_trace_chunks(trace, dx, top=top, chunk_rows=chunk_rows)
    try:
        with (gzip.open(out, "wb", compresslevel=6) if out.name.endswith(".gz")
              else out.open("wb")) as stream:
            for piece in pieces:
                stream.write(piece)
    except OSError as exc:
        raise InputError(out, f"cannot write the trace ({exc.strerror or exc})",
                         "choose a writable output path with free space") from exc
    return out


def write_tables(trace: Trace, out_dir: str | Path, fmt: str = "csv",
                 tables: Sequence[str] | None = None, dx: Diagnosis | None = None, *,
                 events: bool = True) -> dict[str, Path]:
    """Write each table to `out_dir/<table>.<fmt>` (`csv` or `parquet`); returns the paths.

        write_tables(trace, "out/")                              # the 11 trace tables
        write_tables(trace, "out/", "parquet", dx=gpudiag.diagnose(trace))
        write_tables(trace, "out/", tables=["kernels", "findings"], dx=dx)

    With `dx`, also `losses`, `findings`, `idle_gaps` (annotated pieces), `by_step` when
    computed, and the detail tables. CSV writes categoricals as their strings and NA as an
    empty field, rows end in CRLF, and a text cell that a spreadsheet would run as a
    formula (starting with = + - @ TAB or CR, as a hostile kernel name may) gets a leading
    `'`; Parquet keeps the dtypes and the text as it is (object columns as strings, which
    Arrow needs). `events=False`: the diagnosis' tables only (a job diagnosed rank by rank,
    whose events stayed with its ranks).
    """
    if fmt not in ("csv", "parquet"):
        raise InputError(None, f"unknown table format {fmt!r}", "use csv or parquet")
    frames = _export_tables(trace, dx, events)
    names = list(frames) if tables is None else list(tables)
    unknown = [n for n in names if n not in frames]
    if unknown:
        raise InputError(None, f"no table {', '.join(map(repr, unknown))}",
                         f"choose from {', '.join(frames)}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names:
        frame, path = frames[name](), root / f"{name}.{fmt}"
        if fmt == "csv":
            # CRLF rows (RFC 4180): the csv writer then quotes a field holding CR or LF
            _spreadsheet_safe(frame).to_csv(path, index=False, lineterminator="\r\n")
        else:
            objects = [c for c in frame.columns if frame[c].dtype == object]
            write_parquet(frame.astype(dict.fromkeys(objects, "string")), path)
        written[name] = path
    return written


def _spreadsheet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every text cell through `csv_cell` (per distinct value of a category)."""
    out = frame
    for col in frame.columns:
        column = frame[col]
        if isinstance(column.dtype, pd.CategoricalDtype):
            if any(csv_cell(c) != c for c in column.cat.categories):  # CSV holds text anyway
                out = out.assign(**{col: column.astype(object).map(
                    csv_cell, na_action="ignore")})
        elif column.dtype == object or pd.api.types.is_string_dtype(column.dtype):
            out = out.assign(**{col: column.map(csv_cell, na_action="ignore")})
    return out


def _export_tables(trace: Trace, dx: Diagnosis | None, events: bool = True) -> dict[str, Any]:
    """Table name -> a function computing it (so unselected tables cost nothing)."""
    frames: dict[str, Any] = {name: (lambda f=f: f) for name, f in trace.tables().items()} \
        if events else {}
    if dx is not None:
        frames["losses"] = lambda: dx.losses
        frames["findings"] = lambda: dx.findings
        if dx.timeline is not None:
            frames["idle_gaps"] = lambda: annotated_gaps(dx)
        if dx.by_step is not None:
            frames["by_step"] = lambda: dx.by_step
        if dx.steps is not None and "steps" not in frames:
            frames["steps"] = lambda: dx.steps
        frames.update({name: (lambda f=f: f) for name, f in dx.tables.items()})
    return frames
