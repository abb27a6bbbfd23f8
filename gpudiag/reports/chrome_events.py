"""The events of a Chrome/Perfetto trace: the Trace's rows and the diagnosis, on tracks.

`reports/export.py` writes them. The trace lets a user *see* what `diagnose` found: every
event of the Trace on its own track (kernels and copies per `(rank, device, stream)`, API
calls, ranges and syncs per host thread, collectives beside their stream) and, per device, a
"gpudiag: idle causes" track whose slices tile the device's idle time by cause, with the rule
that decided it and the advice of the finding it belongs to, plus a "gpudiag: findings" track
marking where the top findings happen. Open the file in ui.perfetto.dev (or
chrome://tracing).

Times: the Trace Event Format wants microseconds. Epoch nanoseconds (~1.7e18) as µs floats
would keep only a quarter of a µs, so `ts` is relative to `baseTimeNanoseconds` (the first
event, floored to a whole µs; Kineto writes the same key), which keeps ns exact.

Events are built a chunk of rows at a time from column lists (no per-row DataFrame access)
and encoded by msgspec, so writing 10 million events needs the memory of one chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.reports.safe_text import per_value, printable
from gpudiag.trace import Trace

if TYPE_CHECKING:
    from gpudiag.analyzers.diagnosis import Diagnosis

#: rows turned into events at a time: bounds a write's memory (~1.6 kB per event in flight,
#: ~80 MB; 1M kernels take ~1 s either way)
CHUNK_ROWS = 50_000
IDLE_TRACK = "gpudiag: idle causes"
FINDINGS_TRACK = "gpudiag: findings"
PATH_TRACK = "gpudiag: critical path"
#: advice for an idle piece that no finding names (by cause)
DEFAULT_ADVICE = {"sync_stall": "sync_device", "launch_bound": "launch_bound",
                  "host_bound": "host_bound", "copy": "copy_sync"}
#: which table goes on which kind of track, with its category and extra args columns
SLICES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("kernels", "gpu", "kernel", ("kernel_id", "correlation", "external_id", "grid_x", "grid_y",
                                  "grid_z", "block_x", "block_y", "block_z",
                                  "regs_per_thread", "smem_bytes")),
    ("copies", "gpu", "gpu_memcpy", ("bytes", "src_mem", "dst_mem", "correlation", "external_id")),
    ("collectives", "gpu", "collective", ("name", "bytes", "dtype", "group_size", "comm", "seq",
                                          "kernel_id")),
    ("ranges", "gpu", "gpu_annotation", ("source", "domain", "external_id")),
    ("api", "host", "cuda_runtime", ("kind", "correlation", "external_id")),
    ("ranges", "host", "range", ("source", "depth", "domain", "external_id")),
    ("syncs", "host", "sync", ("device", "stream", "event_id", "correlation")),
)
#: slices per finding on the findings track (its largest pieces): keeps the file small
MAX_MARKS = 1000


@dataclass(frozen=True)
class Plan:
    """What one export needs everywhere: time origin, how many findings, chunk size."""

    base: int
    top: int = 10
    chunk_rows: int = CHUNK_ROWS


def _encode_hook(obj: Any) -> Any:
    """numpy scalars and other odd values that reach the encoder (e.g. in meta)."""
    return obj.item() if isinstance(obj, np.generic) else str(obj)


ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook)


# -- tracks --------------------------------------------------------------------------------


@dataclass
class _Tracks:
    """Chrome pids/tids for gpudiag's tracks. Chrome wants small ints and names them with
    'M' events; sources' pids and tids can collide across ranks, so every track gets a
    synthetic id and its real name. New tracks queue their 'M' events in `pending`."""

    pids: dict[tuple[str, int, int], int] = field(default_factory=dict)
    tids: dict[tuple[int, str, int], int] = field(default_factory=dict)
    pending: list[dict[str, Any]] = field(default_factory=list)

    def assign(self, side: str, lane: str, rank: np.ndarray, owner: np.ndarray,
               sub: np.ndarray) -> tuple[list[int], list[int]]:
        """pid and tid per row: `side` 'gpu' (owner = device) or 'host' (owner = pid);
        `lane` the kind of track, `sub` the stream or thread id."""
        keys = pd.DataFrame({"r": rank, "o": owner, "s": sub})
        group = keys.groupby(["r", "o", "s"], sort=False).ngroup().to_numpy()
        firsts = keys.drop_duplicates()  # same order as ngroup(sort=False)
        ids = [self._track(side, lane, r, o, s) for r, o, s in  # one per track
               zip(*(firsts[c].tolist() for c in "ros"), strict=True)]
        pid = np.array([p for p, _ in ids], dtype=np.int64)[group]
        tid = np.array([t for _, t in ids], dtype=np.int64)[group]
        return pid.tolist(), tid.tolist()

    def _track(self, side: str, lane: str, rank: int, owner: int, sub: int) -> tuple[int, int]:
        pkey = (side, rank, owner)
        if pkey not in self.pids:
            pid = self.pids[pkey] = len(self.pids) + 1
            who = {"gpu": f"device {owner}", "path": PATH_TRACK}.get(side,
                                                                      f"host pid {owner}")
            name = who if rank < 0 else f"rank {rank} / {who}"
            self._meta(pid, 0, "process_name", name)
            self._meta(pid, 0, "process_sort_index", pid)
        pid = self.pids[pkey]
        tkey = (pid, lane, sub)
        if tkey not in self.tids:
            tid = self.tids[tkey] = len(self.tids) + 1
            self._meta(pid, tid, "thread_name", _lane_name(lane, sub))
            self._meta(pid, tid, "thread_sort_index", tid)
        return pid, self.tids[tkey]

    def _meta(self, pid: int, tid: int, kind: str, value: str | int) -> None:
        key = "sort_index" if kind.endswith("sort_index") else "name"
        self.pending.append({"ph": "M", "name": kind, "pid": pid, "tid": tid,
                             "args": {key: value}})

    def take(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out


def _lane_name(lane: str, sub: int) -> str:
    named = {"idle": IDLE_TRACK, "findings": FINDINGS_TRACK, "critical path": PATH_TRACK}
    if lane in named:
        return named[lane]
    if lane == "thread":
        return f"thread {sub}"
    return f"{lane} {sub}" if lane != "stream" else f"stream {sub}"


# -- events --------------------------------------------------------------------------------


def _values(series: pd.Series) -> list[Any]:
    """Plain Python values of a column (None for NA), as msgspec encodes them."""
    return series.to_numpy(dtype=object, na_value=None).tolist()


def _ints(series: pd.Series) -> np.ndarray:
    return series.to_numpy(np.int64, na_value=-1)


def _args(part: pd.DataFrame, columns: Sequence[str]) -> Iterator[Any]:
    """One args object per row, leaving out columns that are NA in the whole chunk; a
    msgspec struct without GC tracking (a dict per row made the collector run ~50 times
    per million events and doubled the write time)."""
    cols = tuple(c for c in columns if c in part and part[c].notna().any())
    if cols not in _ARGS:
        _ARGS[cols] = msgspec.defstruct("Args", [(c, Any) for c in cols], gc=False)
    return map(_ARGS[cols], *(_values(part[c]) for c in cols)) if cols else repeat(
        _ARGS[cols](), len(part))


_ARGS: dict[tuple[str, ...], type[msgspec.Struct]] = {}


class _Slice(msgspec.Struct, gc=False):
    """A complete ('X') event: name, category, start and duration in µs, track, args."""

    ph: str
    cat: str
    name: Any
    ts: float
    dur: float
    pid: int
    tid: int
    args: Any


def _event_names(table: str, frame: pd.DataFrame) -> pd.Series:
    """The slice name of each row, mapped over a categorical's categories, not its rows."""
    if table == "copies":
        return frame["kind"].cat.rename_categories(
            lambda k: "Memset" if k == "memset" else f"Memcpy {k}")
    if table == "syncs":
        return frame["kind"].cat.rename_categories(lambda k: f"sync ({k})")
    if table == "collectives":
        return frame["op"]
    return frame["name"]


def shown_column(column: pd.Series) -> pd.Series:
    """A text column with each distinct value through `safe_text.printable` once (names
    and args from the input: Perfetto draws them as text, where a control or bidi
    character would not show as itself); other columns as they are."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        cats = column.cat.categories
        made = [printable(c) if isinstance(c, str) else c for c in cats]
        if made == list(cats):
            return column
        codes, uniques = pd.factorize(pd.Index(made, dtype=object))  # two may now be one
        old = column.cat.codes.to_numpy()
        return pd.Series(pd.Categorical.from_codes(np.where(old >= 0, codes[old], -1),
                                                   categories=uniques), index=column.index)
    if column.dtype == object or pd.api.types.is_string_dtype(column.dtype):
        return per_value(column, lambda v: printable(v) if isinstance(v, str) else v)
    return column


def shown_tree(value: Any) -> Any:
    """`value` (the header's dicts and lists) with every string through `printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {shown_tree(key): shown_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [shown_tree(item) for item in value]
    return value


def _slices(tracks: _Tracks, frame: pd.DataFrame, names: pd.Series, *, side: str, lane: str,
            cat: str, columns: Sequence[str], plan: Plan) -> Iterator[list[Any]]:
    """'X' events of `frame`, one list per chunk (preceded by new tracks' 'M' events);
    names and text args shown (`shown_column`) once per distinct value."""
    base, size = plan.base, plan.chunk_rows
    names = shown_column(names)
    frame = frame.assign(**{c: shown_column(frame[c]) for c in columns if c in frame})
    for lo in range(0, len(frame), size):
        part = frame.iloc[lo:lo + size]
        owner, sub = ("device", "stream") if side == "gpu" else ("pid", "tid")
        pid, tid = tracks.assign(side, lane, _ints(part["rank"]), _ints(part[owner]),
                                 _ints(part[sub]))
        start = part["start_ns"].to_numpy(np.int64)
        dur = np.maximum(part["end_ns"].to_numpy(np.int64) - start, 0)
        ts = ((start - base) / 1e3).tolist()
        events = map(_Slice, repeat("X"), repeat(cat), _values(names.iloc[lo:lo + size]), ts,
                     (dur / 1e3).tolist(), pid, tid, _args(part, columns))
        yield [*tracks.take(), *events]


def _table_events(trace: Trace, tracks: _Tracks, plan: Plan
                  ) -> Iterator[list[Any]]:
    for table, side, cat, columns in SLICES:
        frame = getattr(trace, table)
        if table == "ranges":  # GPU-side annotations on the device, the rest on host threads
            frame = frame[frame["device"].notna() == (side == "gpu")]
        lane = {"collectives": "collectives stream", "ranges": "annotations stream"}.get(
            table, "stream") if side == "gpu" else "thread"
        yield from _slices(tracks, frame, _event_names(table, frame), side=side, lane=lane,
                           cat=cat, columns=columns, plan=plan)


def base_time_ns(trace: Trace) -> int:
    """The first start of any exported event, floored to a whole µs (0 for no events)."""
    starts = [int(f["start_ns"].min()) for f in (trace.kernels, trace.copies, trace.api,
                                                  trace.syncs, trace.ranges, trace.collectives)
              if len(f)]
    return min(starts) // 1000 * 1000 if starts else 0


# -- the diagnosis -------------------------------------------------------------------------


def annotated_gaps(dx: Diagnosis) -> pd.DataFrame:
    """The diagnosis' idle gap pieces (`dx.gaps`, cut to its window) with `where` (call
    site of host and sync pieces, as the host-gaps and sync analyzers placed them),
    `finding` (1-based rank in `dx.findings` of the finding naming that cause and place,
    NA if none) and `advice` (that finding's, else the advice of the top finding of the
    same cause, else the cause's default). Read from the Diagnosis, nothing found again.

        pieces = annotated_gaps(gpudiag.diagnose(trace))
        pieces.groupby("finding")["end_ns"].count()
        pieces[pieces.cause == "sync_stall"][["where", "advice"]]
    """
    from gpudiag.analyzers.losses.gaps import empty_gaps

    out = (empty_gaps() if dx.gaps is None else dx.gaps).copy()
    out["where"] = pd.array([pd.NA] * len(out), dtype="string")
    placed = dx.tables.get("host_gaps")
    if placed is not None and len(placed):
        out.loc[placed.index, "where"] = placed["where"]
    stalls = (out["cause"] == "sync_stall").to_numpy(bool)
    if stalls.any() and "sync_waits" in dx.tables:
        out.loc[stalls, "where"] = _sync_sites(dx.tables["sync_waits"], out[stalls])
    return _match_findings(out, dx.findings)


def _sync_sites(waits: pd.DataFrame, stalls: pd.DataFrame) -> pd.arrays.StringArray:
    """The call site of the blocking wait that each sync_stall piece followed (the wait is
    keyed by its process and start, as `sync` credits its GPU idle)."""
    waits = waits.drop_duplicates(["pid", "start_ns"])
    index = pd.MultiIndex.from_arrays([_ints(waits["pid"]), _ints(waits["start_ns"])])
    pos = index.get_indexer(pd.MultiIndex.from_arrays(
        [_ints(stalls["pid"]), _ints(stalls["wait_start_ns"])]))
    found = np.where(pos >= 0, waits["where"].to_numpy(object)[np.maximum(pos, 0)], None)
    return pd.array(found, dtype="string")


def _match_findings(pieces: pd.DataFrame, findings: pd.DataFrame) -> pd.DataFrame:
    """`finding` and `advice` of each piece: the finding of the same cause and place, else
    the advice of the top finding of that cause, else the cause's default advice."""
    from gpudiag.analyzers.findings import ADVICE

    ranked = findings.assign(finding=np.arange(1, len(findings) + 1))
    exact = ranked.drop_duplicates(["cause", "where"]).set_index(["cause", "where"])
    keys = pd.MultiIndex.from_arrays([pieces["cause"].fillna(""), pieces["where"].fillna("")])
    pos = exact.index.get_indexer(keys)
    hit, safe = pos >= 0, np.maximum(pos, 0)
    pieces["finding"] = pd.array(np.where(hit, exact["finding"].to_numpy()[safe], None),
                                 dtype="Int64")
    by_cause = ranked.drop_duplicates("cause").set_index("cause")["advice"]
    fallback = pieces["cause"].map(by_cause).fillna(
        pieces["cause"].map({c: ADVICE[k] for c, k in DEFAULT_ADVICE.items()})).fillna("")
    pieces["advice"] = pd.array(np.where(hit, exact["advice"].to_numpy(object)[safe],
                                         fallback.to_numpy(object)), dtype="string")
    return pieces


def _diagnosis_events(trace: Trace, dx: Diagnosis, tracks: _Tracks, plan: Plan
                      ) -> Iterator[list[Any]]:
    """The idle-cause slices, then the top findings where they happen (or, for findings
    with no idle piece to point at, as global instants at the start of the window)."""
    pieces = annotated_gaps(dx).assign(stream=0, host_pid=lambda d: d["pid"],
                                                    host_tid=lambda d: d["tid"])
    yield from _slices(tracks, pieces, pieces["cause"], side="gpu", lane="idle",
                       cat="gpudiag.idle", columns=("rule", "where", "finding", "advice",
                                                    "host_pid", "host_tid"), plan=plan)
    found = dx.findings.head(plan.top).assign(finding=lambda d: np.arange(1, len(d) + 1),
                                         lost_ms=lambda d: d["lost_ns"] / 1e6)
    label = ("#" + found["finding"].astype(str) + " " + found["cause"].astype(str) + ": "
             + found["where"].fillna("").astype(str))
    found = found.assign(label=label).set_index("finding")
    marks = pieces[pieces["finding"].isin(found.index)]
    marks = marks.assign(length=marks["end_ns"] - marks["start_ns"]).sort_values(
        "length", ascending=False, kind="stable").groupby("finding").head(MAX_MARKS)
    marks = marks.join(found[["label", "evidence", "lost_ms", "share"]], on="finding")
    yield from _slices(tracks, marks, marks["label"], side="gpu", lane="findings",
                       cat="gpudiag.finding", columns=("evidence", "advice", "lost_ms", "share",
                                                       "rule"), plan=plan)
    yield from _path_events(dx, tracks, plan)
    alone = found[~found.index.isin(marks["finding"])]
    start = (trace.gpu_window_ns() or (plan.base, 0))[0]
    yield [{"ph": "i", "s": "g", "cat": "gpudiag.finding", "name": n,
            "ts": (start - plan.base) / 1e3,
            "pid": 0, "tid": 0, "args": {"evidence": e, "advice": a, "lost_ms": m}}
           for n, e, a, m in zip(*(_values(alone[c]) for c in ("label", "evidence", "advice",
                                                                "lost_ms")), strict=True)]


def _path_events(dx: Diagnosis, tracks: _Tracks, plan: Plan) -> Iterator[list[Any]]:
    """Each rank's critical path (`Diagnosis.critical_paths`) as a track of its own: one
    slice per edge that holds time, named by where the time went (`bound_by`) and the
    event it belongs to."""
    paths = dx.critical_paths()
    if paths is None:
        return
    paths = paths[(paths["ns"] > 0).to_numpy(bool)]
    if paths.empty:
        return
    names = paths["bound_by"].astype(str) + ": " + paths["name"].fillna("").astype(str)
    rows = paths.assign(pid=-1, tid=0, edge=paths["kind"].astype(str))
    yield from _slices(tracks, rows, names, side="path", lane="critical path",
                       cat="gpudiag.critical_path", columns=("edge", "bound_by", "table",
                                                             "row"), plan=plan)


# -- the whole trace -------------------------------------------------------------


def header(trace: Trace, dx: Diagnosis | None, plan: Plan) -> dict[str, Any]:
    other: dict[str, Any] = {"sources": trace.meta.get("sources", [])}
    if dx is not None:
        other.update(dx.to_dict(plan.top))
    return {"displayTimeUnit": "ns", "baseTimeNanoseconds": plan.base,
            "otherData": {"gpudiag": shown_tree(other)}}


def events(trace: Trace, dx: Diagnosis | None, plan: Plan) -> Iterator[list[Any]]:
    tracks = _Tracks()
    if dx is not None:  # first: their tracks then sit on top of each device
        yield from _diagnosis_events(trace, dx, tracks, plan)
    yield from _table_events(trace, tracks, plan)
