"""The Trace: every source normalized into the same pandas tables.

Readers (gpudiag/readers/) fill a Trace; analyzers only read it. The tables and their
columns are declared in `gpudiag.schema`; a Trace always carries all of them, empty when the
source has none of that kind, so code never checks whether a table exists.

    trace = gpudiag.load("rank0.pt.trace.json.gz")
    trace.kernels.groupby("name", observed=True)["end_ns"].count()
    trace.save("run/")            # Parquet per table + meta.json, lossless
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import pandas as pd

from gpudiag import concat
from gpudiag.errors import InputError, SchemaError
from gpudiag.inputs.files import open_regular
from gpudiag.inputs.tables import read_table_file
from gpudiag.inputs.text import valid_tree
from gpudiag.schema import GPU_TABLES, TABLE_NAMES, TABLES

T = TypeVar("T")

#: marks a directory written by Trace.save
FORMAT_NAME = "gpudiag-trace"
FORMAT_VERSION = 1


class Trace:
    """Normalized profile data: one DataFrame per table of the schema, plus `meta`.

    `meta` is a JSON-serializable dict: `sources` (what was read, with which reader),
    `tool_versions`, `rank`/`world_size` where known, `timeline` (False when times are not a
    real timeline, as in Nsight Compute's serialized replays), `vendor`, and `warnings`
    (repairs of odd input rows, counted by kind, never silent).
    """

    devices: pd.DataFrame
    kernels: pd.DataFrame
    copies: pd.DataFrame
    api: pd.DataFrame
    syncs: pd.DataFrame
    ranges: pd.DataFrame
    collectives: pd.DataFrame
    memory: pd.DataFrame
    memory_blocks: pd.DataFrame
    samples: pd.DataFrame
    metrics: pd.DataFrame

    def __init__(self, meta: Mapping[str, Any] | None = None, **tables: Any) -> None:
        unknown = set(tables) - set(TABLE_NAMES)
        if unknown:
            raise TypeError(f"Trace has no tables {sorted(unknown)}")
        for name in TABLE_NAMES:
            setattr(self, name, tables.get(name))  # __setattr__ conforms
        self.meta: dict[str, Any] = dict(meta or {})
        self.meta.setdefault("sources", [])
        self.meta.setdefault("warnings", {})
        self.meta.setdefault("timeline", True)

    def __setattr__(self, name: str, value: Any) -> None:
        """Assigning a table conforms it to the schema, so a Trace is always valid (and
        forgets what was derived from the old tables)."""
        if name in TABLES:
            value = TABLES[name].conform(value)
            self.__dict__.pop("_derived", None)
            self.__dict__.pop("_seeds", None)
        super().__setattr__(name, value)

    def derived(self, key: str, compute: Callable[[], T]) -> T:
        """`compute()` once per trace: analyzers share derived tables (occupancy, idle gaps,
        launch joins) instead of each recomputing them. Assigning any table resets it;
        callers must not modify what they get back. A `seed` of the key computes it
        instead of `compute`."""
        cache: dict[str, Any] = self.__dict__.setdefault("_derived", {})
        if key not in cache:
            seeded = self.__dict__.get("_seeds", {}).get(key)
            cache[key] = (seeded or compute)()
        return cast(T, cache[key])

    def seed(self, key: str, compute: Callable[[], Any]) -> None:
        """Have `derived(key)` computed by `compute`, when first asked: a window cut from a
        trace takes its steps from the whole trace (`analyzers.window.within`), where a
        few steps alone are too few to find again."""
        self.__dict__.setdefault("_seeds", {})[key] = compute
        self.__dict__.get("_derived", {}).pop(key, None)

    # -- inspection ---------------------------------------------------------------------

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table by name, in schema order."""
        return {name: getattr(self, name) for name in TABLE_NAMES}

    def row_counts(self) -> dict[str, int]:
        return {name: len(frame) for name, frame in self.tables().items()}

    def has_gpu_activity(self) -> bool:
        """True when any table of GPU activity (kernels, copies, syncs, memory...) has rows
        on a GPU: CPU allocator events (device -1) and host-timed collectives (gloo, no
        device) are host activity."""
        for name in GPU_TABLES:
            table = getattr(self, name)
            if not len(table):
                continue
            if "device" not in table.columns or name not in ("memory", "collectives"):
                return True
            if (table["device"] >= 0).any():  # NA skipped; -1 in memory: host memory
                return True
        return False

    def gpu_window_ns(self) -> tuple[int, int] | None:
        """(first start, last end) over kernels and copies, or None without GPU work."""
        frames = [frame for frame in (self.kernels, self.copies) if len(frame)]
        if not frames or not self.meta.get("timeline", True):
            return None
        return (
            int(min(frame["start_ns"].min() for frame in frames)),
            int(max(frame["end_ns"].max() for frame in frames)),
        )

    def fill_rank(self) -> None:
        """Give rows without a rank the trace's own rank (`meta["rank"]`), when it has one."""
        rank = self.meta.get("rank")
        if rank is None:
            return
        for frame in self.tables().values():
            if len(frame) and frame["rank"].isna().any():
                frame["rank"] = frame["rank"].fillna(int(rank))  # same dtype: still conforms

    def warn(self, kind: str, count: int = 1) -> None:
        """Count a repair of odd input (e.g. 'kernels with negative duration clipped')."""
        warn_meta(self.meta, kind, count)

    def validate(self) -> None:
        """Raise SchemaError listing every table that breaks the schema contract."""
        problems = [problem for name, frame in self.tables().items()
                    for problem in TABLES[name].problems(frame)]
        if problems:
            raise SchemaError("; ".join(problems))

    def __repr__(self) -> str:
        counts = ", ".join(f"{name}={rows}" for name, rows in self.row_counts().items() if rows)
        sources = (", ".join(source.get("format", "?") for source in self.meta["sources"])
                   or "no source")
        return f"<Trace from {sources}: {counts or 'empty'}>"

    # -- persistence ----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write one Parquet file per table and meta.json into directory `path`."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        for name, frame in self.tables().items():
            write_parquet(frame, out / f"{name}.parquet")
        meta = {**self.meta, "gpudiag_format": FORMAT_NAME,
                "gpudiag_format_version": FORMAT_VERSION}
        (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        return out

    @classmethod
    def load_dir(cls, path: str | Path) -> Trace:
        """Read a directory written by `save` (or by `gpudiag profile`)."""
        root = Path(path)
        meta = read_meta(root)
        tables = {}
        for name in TABLE_NAMES:
            file = root / f"{name}.parquet"
            if os.path.lexists(file):  # a broken link or a loop is said, not skipped
                tables[name] = _read_table(file, name)
        meta.pop("gpudiag_format", None)
        meta.pop("gpudiag_format_version", None)
        return cls(meta=meta, **tables)


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as Parquet at `path`, through a file Python opened: pyarrow encodes a path
    as UTF-8 and failed on a name that is not (a folder named in latin-1 reaches Python as
    surrogates), where Python's own `open` writes the bytes the file system gave."""
    with open(path, "wb") as handle:
        frame.to_parquet(handle, index=False)


def _read_table(file: Path, name: str) -> pd.DataFrame:
    """One table's Parquet file, held to the schema: a file that is not a regular file, of
    another schema (a column gpudiag does not declare, a missing time, text where numbers
    belong, bytes where text belongs, an unknown enumerated value, rows that end before
    they start) or that decodes past its budget (`inputs.tables`) is the input's fault, said
    in one line, never an error deep in an analyzer."""
    table = TABLES[name]
    raw = read_table_file(file, table)
    try:
        frame = table.conform(raw)
        problems = table.problems(frame)
    except (SchemaError, TypeError, ValueError, OverflowError) as exc:
        problems = [str(exc)]
    if problems:
        said = "; ".join(problems)
        said = said if len(said) <= 300 else said[:299] + "…"
        raise InputError(file, f"does not hold gpudiag's {name} table ({said})",
                         "the trace directory is damaged or was not written by gpudiag: "
                         "re-run or re-save it")
    return frame


#: meta.json is small and flat; anything nested deeper is not ours (and a 100,000-deep
#: document would exhaust Python's recursion in the JSON parser)
MAX_META_DEPTH = 64
MAX_META_BYTES = 256 << 20
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _json_depth(raw: bytes) -> int:
    """How deep `raw`'s arrays and objects nest (strings left out), without parsing it."""
    marks = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    step = (np.isin(marks, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(marks, (ord("]"), ord("}"))))
    return int(np.cumsum(step).max(initial=0))


def warn_meta(meta: dict[str, Any], kind: str, count: int = 1) -> None:
    """`Trace.warn` on a meta of its own (one being built before its Trace is)."""
    if count:
        warnings = meta.setdefault("warnings", {})
        warnings[kind] = int(warnings.get(kind, 0)) + int(count)


def load_json(file: Path) -> Any:
    """meta.json parsed, its strings valid text (`text.valid`: JSON may escape a lone
    surrogate, which no report could write); OSError or ValueError when it is unreadable,
    not a regular file, too big or too deep."""
    with open_regular(file) as handle:
        raw = handle.read(MAX_META_BYTES + 1)
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"larger than {MAX_META_BYTES >> 20} MiB")
    if _json_depth(raw) > MAX_META_DEPTH:
        raise ValueError(f"nested deeper than {MAX_META_DEPTH} levels")
    return valid_tree(json.loads(raw, parse_constant=_no_constant))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_meta(root: Path) -> dict[str, Any]:
    """meta.json of a saved trace, checked for format, version and the shape of every key
    gpudiag reads (`check_meta`)."""
    file = root / "meta.json"
    try:
        meta = load_json(file)
    except InputError as exc:  # not a regular file (a FIFO, a directory)
        raise InputError(file, f"unreadable meta.json ({exc.problem})",
                         "the run directory is damaged") from exc
    except (OSError, ValueError) as exc:
        said = exc.strerror if isinstance(exc, OSError) and exc.strerror else _brief(exc)
        raise InputError(file, f"unreadable meta.json ({said})",
                         "the run directory is damaged") from exc
    if not isinstance(meta, dict) or meta.get("gpudiag_format") != FORMAT_NAME:
        raise InputError(file, "not a gpudiag trace directory (meta.json has no gpudiag format)")
    version = meta.get("gpudiag_format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InputError(file, "meta.json: gpudiag_format_version is not a format number",
                         "the trace directory is damaged: re-run or re-save it")
    if version > FORMAT_VERSION:
        raise InputError(
            file, f"written by a newer gpudiag (format {version})",
            "upgrade gpudiag: pip install -U gpudiag",
        )
    check_meta(meta, file)
    return meta


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return text if len(text) <= 120 else text[:119] + "…"


def check_meta(meta: Mapping[str, Any], file: str | Path | None) -> None:
    """InputError naming the first key of `meta` whose value has a shape gpudiag does not
    write (see `trace_meta.META`); keys gpudiag does not read are kept as they are."""
    from gpudiag.trace_meta import first_problem

    problem = first_problem(meta)
    if problem is not None:
        raise InputError(file, f"meta.json: {problem}",
                         "the trace directory is damaged: re-run or re-save it")


def is_trace_dir(path: Path) -> bool:
    """True for a directory that `Trace.save` wrote: meta.json naming our format, or a
    meta.json that cannot be read (not a regular file, a link loop, damaged) beside our
    Parquet tables: a damaged saved trace, which `load_dir` then refuses in one line rather
    than reading its files as profiles."""
    file = path / "meta.json"
    if not os.path.lexists(file):
        return False
    try:
        meta = load_json(file)
    except (OSError, ValueError, InputError):
        return any(os.path.lexists(path / f"{name}.parquet") for name in TABLE_NAMES)
    return isinstance(meta, dict) and meta.get("gpudiag_format") == FORMAT_NAME


def merge(traces: Iterable[Trace], offsets: Sequence[int] | None = None, *,
          metas: list[dict[str, Any]] | None = None) -> Trace:
    """One Trace from several processes or ranks.

    Rows keep their `pid` and `rank`; a trace whose meta names a rank fills it into rows that
    have none. `kernel_id` is offset so it stays unique (metrics and collectives follow):
    each trace's by the kernels of the traces before it, or by `offsets` (the pieces of a
    job whose files were numbered apart, `jobs`). `metas`: every file's own meta, when
    some of `traces` hold several files read together (the merged meta is theirs).
    """
    traces = list(traces)
    if len(traces) == 1 and not offsets:
        return traces[0]
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLE_NAMES}
    offset = 0
    rules: list[dict[str, Any]] = []  # Nsight Compute rule results name kernels by id too
    for index, trace in enumerate(traces):
        trace.fill_rank()
        if offsets is not None:
            offset = offsets[index]
        for name, frame in trace.tables().items():
            shift = "kernel_id" in frame.columns and len(frame) and offset
            parts[name].append(frame.assign(kernel_id=frame["kernel_id"] + offset) if shift
                               else frame)
        rules += [{**rule, "kernel_id": rule["kernel_id"] + offset}
                  if isinstance(rule.get("kernel_id"), int) else rule
                  for rule in trace.meta.get("ncu_rules") or []]
        if len(trace.kernels):
            offset += int(trace.kernels["kernel_id"].max()) + 1
    tables = {name: concat_tables(frames) for name, frames in parts.items()}
    meta = merge_meta(metas if metas is not None else [member.meta for member in traces])
    if rules:
        meta["ncu_rules"] = rules
    return Trace(meta=meta, **tables)


def concat_tables(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate keeping categories (pandas turns differing categories into object)."""
    nonempty = [frame for frame in frames if len(frame)] or frames[:1]
    joined = concat.same_columns(nonempty)  # one table's frames: column by column
    return joined if joined is not None else pandas_concat(nonempty)


def pandas_concat(nonempty: list[pd.DataFrame]) -> pd.DataFrame:
    """`concat_tables` by `pd.concat` (frames that differ in columns or dtypes)."""
    out = pd.concat(nonempty, ignore_index=True)
    for col in out.columns:
        if isinstance(nonempty[0][col].dtype, pd.CategoricalDtype) and not isinstance(
            out[col].dtype, pd.CategoricalDtype
        ):
            out[col] = out[col].astype("category")
    return out


def merge_meta(metas: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"sources": [], "warnings": {}, "tool_versions": {}}
    ranks = sorted({info["rank"] for info in metas if info.get("rank") is not None})
    for meta in metas:
        merged["sources"] += meta.get("sources", [])
        for kind, count in meta.get("warnings", {}).items():
            merged["warnings"][kind] = merged["warnings"].get(kind, 0) + count
        merged["tool_versions"].update(meta.get("tool_versions", {}))
    merged["timeline"] = all(info.get("timeline", True) for info in metas)
    merged["ranks"] = ranks
    sizes = {info.get("world_size") for info in metas if info.get("world_size") is not None}
    if len(sizes) == 1:
        merged["world_size"] = sizes.pop()
    for key in ("vendor", "framework"):  # kept where the files agree
        values = {info.get(key) for info in metas if info.get(key)}
        if len(values) == 1:
            merged[key] = values.pop()
    return merged
