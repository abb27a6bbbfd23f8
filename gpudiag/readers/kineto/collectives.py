"""Collectives in Kineto traces: which op, how many bytes, which communicator, in what order.

NCCL: one row per NCCL kernel. Newer PyTorch writes the collective's arguments on the kernel
itself ('Collective name', 'In msg nelems', 'dtype', 'Process Group Name', ...). Older traces
do not; there the kernel's launch call is found inside an `nccl:<op>` annotation (same
thread, enclosing in time) whose 'Input Dims' and 'Input type' give the size, and failing
that the op and element type are read from the kernel name
(`ncclKernel_AllReduce_RING_LL_Sum_float`).

Other backends (gloo, on CPU or GPU) launch no kernel: their rows come from host events, one
per torch.distributed call (`host_collectives`).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudiag.intervals import nesting_depth
from gpudiag.readers.chrome.structs import integers, objects
from gpudiag.schema import TABLES, text_category

if TYPE_CHECKING:
    from gpudiag.readers.kineto.events import Events
    from gpudiag.readers.kineto.reader import Calls

#: the collectives table's columns, by name
COLUMNS = {col.name: col for col in TABLES["collectives"].columns}
#: normalized collective name fragment -> op, tried in this order
OPS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("barrier", "barrier"),
    ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
#: element sizes of torch dtype names (as Kineto writes them: torch names, C++ type names in
#: 'Input type') and NCCL kernel-name suffixes
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2,
    "double": 8, "float64": 8, "int": 4, "int32": 4, "int32t": 4, "uint32t": 4,
    "long": 8, "int64": 8, "int64t": 8, "uint64t": 8, "short": 2, "int16": 2,
    "byte": 1, "uint8": 1, "uint8t": 1, "char": 1, "int8": 1, "int8t": 1, "bool": 1,
    "unsignedchar": 1, "signedchar": 1, "c10bfloat16": 2, "c10half": 2, "float8e4m3fn": 1,
    "float8e5m2": 1, "fp8e4m3": 1, "fp8e5m2": 1, "complexfloat": 8, "complexdouble": 16,
    "longint": 8, "shortint": 2, "unsignedint": 4, "unsignedshort": 2, "unsignedshortint": 2,
    "unsignedlong": 8, "unsignedlongint": 8, "c10float8e4m3fn": 1, "c10float8e5m2": 1,
    "c10complexfloat": 8, "c10complexdouble": 16, "c10complexc10half": 4,
}


def normalize(text: object) -> str:
    """'_allgather_base' -> 'allgatherbase': lower case, letters and digits only."""
    return _NOT_ALNUM.sub("", str(text).lower())


def op_of(text: pd.Series) -> pd.Series:
    """Map collective names ('_allgather_base', 'nccl:all_reduce', kernel names) to ops
    (None: not a collective name), matching each distinct name once."""
    return pd.Series(_ops(text.to_numpy(dtype=object)), index=text.index, dtype=object)


def _op(norm: str) -> str | None:
    return next((name for fragment, name in OPS if fragment in norm), None)


def collectives(
    ev: Events, kernels: pd.DataFrame, kernel_idx: np.ndarray, calls: Calls
) -> pd.DataFrame | None:
    """The collectives table: one row per NCCL kernel of `kernels` and one per host-side
    collective call that launched none (`host_collectives`). `kernel_idx` are the event
    rows of `kernels`, in the same order; `calls` finds each kernel's launch call.

    `seq` counts each (pid, comm)'s rows in start order. When both kinds are present, it
    counts them in the order the host issued them (a kernel's launch call, a host call's
    start): a gloo call and an NCCL kernel of one process group do not run in program order.
    """
    nccl = _nccl_rows(ev, kernels, kernel_idx, calls)
    correlation = None if nccl is None else nccl.pop("_correlation")
    launches = (pd.DataFrame() if correlation is None else
                pd.DataFrame({column: calls.lookup(correlation, column)
                              for column in ("pid", "tid", "start_ns")}))
    host = host_collectives(ev, launches)
    if nccl is None and host is None:
        return None  # an empty collectives table
    if host is None:  # NCCL only (most traces): columns reordered, never a frame until done
        assert nccl is not None
        nccl.pop("_issue_ns")
        order = np.argsort(nccl["start_ns"], kind="stable")
        rows = {name: values[order] for name, values in nccl.items()}
        rows["seq"] = pd.array(group_counts(rows["pid"], rows["comm"]), dtype="Int64")
        for column in ("op", "dtype", "comm", "name"):
            rows[column] = text_category(rows[column], COLUMNS[column])
        return pd.DataFrame(rows)
    parts = [pd.DataFrame(nccl)] if nccl is not None else []
    out = pd.concat([*parts, host], ignore_index=True).sort_values("_issue_ns", kind="stable")
    out = with_seq(out.drop(columns="_issue_ns"))
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def with_seq(rows: pd.DataFrame) -> pd.DataFrame:
    """`seq`: the rows of each (pid, comm) counted in their present order."""
    rows["seq"] = pd.array(group_counts(rows["pid"].array, rows["comm"].to_numpy(object)),
                           dtype="Int64")
    return rows


def group_counts(pid: Any, comm: np.ndarray) -> np.ndarray:
    """Each row's count among the earlier rows of its (pid, comm), missing values a group
    of their own (pandas' `groupby(dropna=False).cumcount()`, without building a frame)."""
    pid_code, _ = pd.factorize(pid, use_na_sentinel=False)
    comm_code, comms = pd.factorize(comm, use_na_sentinel=False)
    group = pid_code.astype(np.int64) * max(len(comms), 1) + comm_code
    order = np.argsort(group, kind="stable")
    ordered = group[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]] if len(ordered) else np.zeros(0, bool)
    position = np.arange(len(group))
    counts = np.empty(len(group), dtype=np.int64)
    counts[order] = position - np.maximum.accumulate(np.where(first, position, 0))
    return counts


def _nccl_rows(
    events: Events, kernels: pd.DataFrame, kernel_idx: np.ndarray, calls: Calls
) -> dict[str, Any] | None:
    """The NCCL kernels' collectives columns (no seq yet, in kernel order), with
    `_correlation` and `_issue_ns` (the launch call's start, else the kernel's) for
    `collectives`. A trace holds a few NCCL kernels per step: the columns are arrays, and
    each distinct kernel name is read once, in plain Python."""
    names = kernels["name"].array
    categories = [str(name) for name in names.categories]
    codes = np.asarray(names.codes)
    is_nccl = np.array([_NCCL.search(name) is not None for name in categories] + [False])[codes]
    if not is_nccl.any():
        return None
    rows = np.flatnonzero(is_nccl)
    codes = codes[rows]
    kernel_names = np.array(categories, dtype=object)[codes]
    stream = kernels["stream"].array[rows]
    correlation = kernels["correlation"].array[rows]
    args = events.args(kernel_idx[rows])
    info = {
        "collective": objects(args.values("collective")),
        "in_nelems": _whole(args.floats("in_nelems")),
        "out_nelems": _whole(args.floats("out_nelems")),
        "dtype": objects(args.values("dtype")),
    }
    _fill_from_annotation(info, correlation, events, calls)
    per_name = {code: _kernel_name_fields(categories[code]) for code in np.unique(codes)}
    ops = _ops(info["collective"])
    missing = pd.isna(ops)
    ops[missing] = np.array([per_name[code][0] for code in codes[missing]], dtype=object)
    dtype = info["dtype"]
    unknown = pd.isna(dtype)
    dtype[unknown] = np.array([per_name[code][1] for code in codes[unknown]], dtype=object)
    size = np.array([np.nan if _missing(name) else DTYPE_BYTES.get(normalize(name), np.nan)
                     for name in dtype], dtype=np.float64)
    nelems = np.where(ops != "all_gather", info["in_nelems"], info["out_nelems"])
    comm = objects(args.values("pg_name"))
    unnamed = pd.isna(comm) & ~pd.isna(stream)
    comm[unnamed] = ["stream " + str(value) for value in stream[unnamed]]
    start = kernels["start_ns"].to_numpy(np.int64)[rows]
    issue = calls.start_of(correlation, otherwise=start)
    ops[pd.isna(ops)] = "other"
    return {
        "pid": kernels["pid"].array[rows], "device": kernels["device"].array[rows],
        "stream": stream, "start_ns": start,
        "end_ns": kernels["end_ns"].to_numpy(np.int64)[rows],
        "op": ops,
        "bytes": integers(np.round(nelems * size)).array,
        "dtype": dtype,
        "group_size": args.num("group_size").array,
        "comm": comm,
        "kernel_id": kernels["kernel_id"].array[rows].astype("Int64"),
        "name": kernel_names,
        "_correlation": correlation,
        "_issue_ns": issue,
    }


_NCCL = re.compile("nccl", re.IGNORECASE)
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_KERNEL_DTYPE = re.compile(r"_(?:Sum|Prod|Min|Max|Avg|PreMulSum|SumPostDiv)_(\w+)$")


def _kernel_name_fields(name: str) -> tuple[str | None, str | None]:
    """The op and the element type an NCCL kernel's name spells:
    'ncclKernel_AllReduce_RING_LL_Sum_float(...)' -> ('all_reduce', 'float')."""
    op = _KERNEL_OP.search(name)
    dtype = _KERNEL_DTYPE.search(name.split("(", 1)[0])
    return (_op(normalize(op.group(1))) if op else None, dtype.group(1) if dtype else None)


def _ops(names: np.ndarray) -> np.ndarray:
    """`op_of` for an object array (None where unknown), each distinct name matched once."""
    found: dict[str, str | None] = {}
    out = np.empty(len(names), dtype=object)
    for position, name in enumerate(names):
        if _missing(name):
            continue
        text = str(name)  # what `normalize` reads (and hashable, whatever the JSON held)
        if text not in found:
            found[text] = _op(normalize(text))
        out[position] = found[text]
    return out


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _whole(values: np.ndarray) -> np.ndarray:
    """float64 values that are whole numbers a float holds exactly (NaN otherwise), as
    `integers` reads them."""
    exact = np.isfinite(values) & (values == np.floor(values)) & (np.abs(values) <= 2.0**53)
    return np.where(exact, values, np.nan)


def _fill_from_annotation(info: dict[str, np.ndarray], correlation: Any, events: Events,
                          calls: Calls) -> None:
    """Fill missing args from the `nccl:*` annotation around each kernel's launch call: the
    last such annotation that started on the launching thread before the launch and had not
    ended yet."""
    missing = pd.isna(info["collective"]) & np.isnan(info["in_nelems"])
    if not missing.any():
        return
    ann_idx = events.where("annotation")
    nccl = events.name_test(ann_idx, lambda name: name.startswith("nccl:"))
    if not nccl.any():
        return
    ann_idx = ann_idx[nccl]
    ann_names = np.array([str(name) for name in events.name_values(ann_idx)], dtype=object)
    launch = {col: calls.lookup(correlation, col) for col in ("pid", "tid", "start_ns")}
    hit = Spans(events, ann_idx).enclosing(launch["pid"], launch["tid"], launch["start_ns"])
    fill = missing & (hit >= 0)
    if not fill.any():
        return
    args = events.args(ann_idx[hit[fill]])
    info["collective"][fill] = ann_names[hit[fill]]
    elements = _whole(np.array([_first_shape_elements(dims)
                               for dims in args.values("input_dims")], dtype=np.float64))
    info["in_nelems"][fill] = elements
    # the annotation gives the input only: an all_gather's output (its nccl-tests size)
    # is input x ranks, and the ranks are not recorded here, so it stays unknown
    gather = _ops(ann_names[hit[fill]]) == "all_gather"
    info["out_nelems"][fill] = np.where(gather, np.nan, elements)
    info["dtype"][fill] = objects([_first(types) for types in args.values("input_type")])


def _first_shape_elements(dims: Any) -> float:
    """Element count of an event's first input ('Input Dims': [[n, m], ...]); NaN if none."""
    shape = _first(dims)
    if isinstance(shape, list) and len(shape) > 0:
        return float(np.prod(shape))
    return math.nan


def _first(values: Any) -> Any:
    """The first item of a list (or the first character of a text: pandas' `.str[0]`)."""
    if isinstance(values, dict):
        return values.get(0)
    if isinstance(values, list | tuple | str) and len(values) > 0:
        return values[0]
    return None


class Spans:
    """Events `idx` of one group, searchable by (thread, time): which one is open there."""

    def __init__(self, ev: Events, idx: np.ndarray) -> None:
        thread = thread_key(ev.pid[idx], ev.tid[idx])
        start = ev.start[idx]
        self.order = np.lexsort((start, thread))
        self.thread, self.start = thread[self.order], start[self.order]
        self.end = (start + ev.dur[idx])[self.order]

    def enclosing(self, pid: np.ndarray, tid: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Position in `idx` of the last event that started on thread (pid, tid) at or before
        `at` and had not ended by then, or -1."""
        thread = thread_key(pid, tid)
        at = np.asarray(at, dtype=np.float64)
        out = np.full(len(at), -1, dtype=np.int64)
        for key in np.unique(thread[np.isfinite(thread)]):  # a few launching threads
            low = np.searchsorted(self.thread, key, side="left")
            high = np.searchsorted(self.thread, key, side="right")
            rows = np.flatnonzero((thread == key) & np.isfinite(at))
            last = np.searchsorted(self.start[low:high], at[rows], side="right") - 1 + low
            found = (last >= low) & (self.end[np.maximum(last, 0)] >= at[rows])
            out[rows[found]] = self.order[last[found]]
        return out


def thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One float per (pid, tid): what `Spans` searches by."""
    return np.asarray(pid, dtype=np.float64) * 2.0**32 + np.asarray(tid, dtype=np.float64)


# -- calls that launch no kernel (gloo) --------------------------------------------------------

#: torch ops of one torch.distributed call; the outermost on its thread stands for the call.
#: Not `record_param_comms`: inside a call it adds nothing, alone it is a Work's wait.
CALL_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::",
                 "_c10d_functional_autograd::")
#: backend annotations that are a call's own work (on a worker thread, or nested in the call)
WORK_PREFIXES = ("gloo:",)


def host_collectives(ev: Events, nccl_launches: pd.DataFrame) -> pd.DataFrame | None:
    """One row per torch.distributed call that launched no NCCL kernel, with `_issue_ns`
    (the call's start) for `collectives`; None when the trace has none.

    A call is the outermost `c10d::*` / `_c10d_functional::*` op on its thread (one call,
    however many ops and `record_param_comms` it nests). Its time is that of its backend
    work, the `gloo:*` annotations: nested in the call (send/recv, monitored_barrier) or, for
    asynchronous ops, run later on a gloo worker thread. Nothing ties such a work to its
    call, so the works of a process serve its calls first in first out (`fifo`); works
    before the first call (enqueued before the profiler started) are rows of their own.
    - op: from the call's name (gloo runs a reduce_scatter as `gloo:all_reduce`), else
      the work's; name: the work's, or the call's when it ran several or none;
    - bytes: Σ elements x element size of the work's tensor inputs, all_gather's times the
      group size (nccl-tests' S), none for a barrier;
    - comm and group_size: from the header's process groups (`_process_group`).
    Calls that enclose an `nccl:*` annotation or an NCCL kernel's launch are NCCL's: their
    kernels are the rows. A call without a work keeps its own (host) time, unless its
    process ran NCCL, whose calls may lack their kernel in the window.
    """
    call_idx, work_idx = _call_events(ev), _events(ev, "annotation", WORK_PREFIXES)
    if not len(call_idx) and not len(work_idx):
        return None
    nccl_pids, nccl_call = _nccl_marks(ev, call_idx, nccl_launches)
    call_idx = call_idx[~nccl_call]
    if not len(call_idx) and not len(work_idx):
        return None  # NCCL's calls only: the kernels are the rows
    owner = _owners(ev, call_idx, work_idx)
    rows = _rows(ev, call_idx, work_idx, owner)
    rows = rows[rows["has_work"] | ~rows["pid"].isin(nccl_pids)]
    if rows.empty:
        return None
    comm, group_size = _process_group(ev.header.distributedInfo or {})
    nbytes = rows["elements_bytes"].where(rows["op"] != "barrier")
    ranks = np.nan if group_size is None else group_size
    nbytes = nbytes.where(rows["op"] != "all_gather", nbytes * ranks)
    return pd.DataFrame({
        "pid": integers(rows["pid"].to_numpy()), "device": pd.NA, "stream": pd.NA,
        "start_ns": rows["start_ns"].to_numpy(np.int64),
        "end_ns": rows["end_ns"].to_numpy(np.int64), "op": rows["op"].to_numpy(),
        "bytes": integers(nbytes.to_numpy(np.float64)), "dtype": rows["dtype"].to_numpy(),
        "group_size": pd.array([group_size] * len(rows), dtype="Int64"),
        "comm": comm, "kernel_id": pd.NA, "name": rows["name"].to_numpy(),
        "_issue_ns": rows["issue_ns"].to_numpy(np.int64),
    }).astype({"device": "Int64", "stream": "Int64", "kernel_id": "Int64"})


def _events(events: Events, group: str, prefixes: tuple[str, ...]) -> np.ndarray:
    """Rows of `group` whose name starts with one of `prefixes`, in start order."""
    idx = events.where(group)
    return idx[events.name_test(idx, lambda name: name.startswith(prefixes))]


def _call_events(events: Events) -> np.ndarray:
    """The outermost collective op of each call (waits are not calls), in start order."""
    idx = _events(events, "op", CALL_PREFIXES)
    waits = events.name_test(idx, lambda name: "wait" in name)
    idx = idx[~waits]
    end = events.start[idx] + events.dur[idx]
    return idx[nesting_depth(thread_key(events.pid[idx], events.tid[idx]),
                             events.start[idx], end) == 0]


def _nccl_marks(events: Events, call_idx: np.ndarray,
                launches: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Pids that ran NCCL, and which calls are NCCL's (enclose an `nccl:*` annotation or an
    NCCL kernel's launch)."""
    ann = _events(events, "annotation", ("nccl:",))
    marked = np.zeros(len(call_idx), dtype=bool)
    pids = events.pid[ann]
    if len(call_idx):
        spans = Spans(events, call_idx)
        hits = [spans.enclosing(events.pid[ann], events.tid[ann], events.start[ann])]
        if len(launches):
            hits.append(spans.enclosing(*(launches[column].to_numpy() for column in
                                          ("pid", "tid", "start_ns"))))
        for hit in hits:
            marked[hit[hit >= 0]] = True
    if len(launches):
        pids = np.concatenate([pids, launches["pid"].to_numpy(np.float64)])
    return np.unique(pids[np.isfinite(pids)]), marked


def _owners(events: Events, call_idx: np.ndarray, work_idx: np.ndarray) -> np.ndarray:
    """Position in `call_idx` of each work's call (-1: none); see `host_collectives`."""
    owner = np.full(len(work_idx), -1, dtype=np.int64)
    if not len(call_idx) or not len(work_idx):
        return owner
    owner = Spans(events, call_idx).enclosing(events.pid[work_idx], events.tid[work_idx],
                                          events.start[work_idx])
    free = np.ones(len(call_idx), dtype=bool)
    free[owner[owner >= 0]] = False  # calls with nested works run no asynchronous one
    for pid in np.unique(events.pid[call_idx]):
        calls = np.flatnonzero(free & (events.pid[call_idx] == pid))
        works = np.flatnonzero((owner < 0) & (events.pid[work_idx] == pid))
        if len(calls) and len(works):
            served = fifo(events.start[call_idx[calls]], events.start[work_idx[works]])
            owner[works[served >= 0]] = calls[served[served >= 0]]
    return owner


def fifo(call_start: np.ndarray, work_start: np.ndarray) -> np.ndarray:
    """For works (in start order), the call (position, calls in start order) each serves:
    the first call not yet served that started at or before the work, else the last call
    served; -1 before any call. Vectorized: work j serves call p_j - 1 with
    p_j = min(p_{j-1} + 1, calls started by then), i.e. j + 1 + min(0, cummin(n_k - k - 1)).

        fifo(np.array([10, 20]), np.array([5, 12, 13, 25]))   # [-1, 0, 0, 1]
    """
    started = np.searchsorted(call_start, work_start, side="right")
    ordinal = np.arange(1, len(work_start) + 1)
    return ordinal + np.minimum.accumulate(np.minimum(0, started - ordinal)) - 1


def _rows(events: Events, call_idx: np.ndarray, work_idx: np.ndarray,
          owner: np.ndarray) -> pd.DataFrame:
    """One row per call and per work without one: pid, issue and own times, op, name,
    elements_bytes, dtype, has_work."""
    call_count = len(call_idx)
    key = np.where(owner >= 0, owner, call_count + np.arange(len(work_idx)))  # orphans: own rows
    args = events.args(work_idx)
    work = pd.DataFrame({
        "key": key, "work_start": events.start[work_idx],
        "work_end": events.start[work_idx] + events.dur[work_idx],
        "name": events.name_values(work_idx),
        "elements_bytes": tensor_bytes(args.values("input_dims"), args.values("input_type")),
        "dtype": pd.Series(args.values("input_type"), dtype=object).map(_first_tensor_type),
    }).groupby("key", sort=True).agg(
        work_start=("work_start", "min"), work_end=("work_end", "max"), name=("name", "first"),
        works=("name", "size"), elements_bytes=("elements_bytes", "sum"),
        sized=("elements_bytes", "count"), dtype=("dtype", "first"))
    # the call, or the work
    head = np.concatenate([call_idx, work_idx[key[key >= call_count] - call_count]])
    rows = pd.DataFrame({
        "pid": events.pid[head], "issue_ns": events.start[head], "start_ns": events.start[head],
        "end_ns": events.start[head] + events.dur[head],
        "call": np.concatenate([events.name_values(call_idx),
                                np.full(len(head) - call_count, None)]),
    }, index=np.concatenate([np.arange(call_count), key[key >= call_count]])).join(work)
    rows["has_work"] = rows["works"].notna()
    rows["start_ns"] = rows["work_start"].fillna(rows["start_ns"])
    rows["end_ns"] = rows["work_end"].fillna(rows["end_ns"])
    rows["elements_bytes"] = rows["elements_bytes"].where(rows["sized"] > 0)
    rows["name"] = rows["name"].where(rows["works"] == 1, rows["call"]).fillna(rows["name"])
    rows["op"] = op_of(rows["call"]).fillna(op_of(rows["name"])).fillna("other")
    return rows.reset_index(drop=True)


def tensor_bytes(dims: list[Any], types: list[Any]) -> pd.Series:
    """Σ elements x element size over each event's tensor inputs ('Input Dims' with an
    'Input type' that is an element type; 'Scalar', '' and lists are not); NaN if none.
    One Python step per event: these are the collectives' few, not every op."""
    return pd.Series([_input_bytes(event_dims, event_types)
                      for event_dims, event_types in zip(dims, types, strict=True)],
                     dtype="float64")


def _input_bytes(dims: Any, types: Any) -> float:
    if not isinstance(dims, list) or not isinstance(types, list):
        return math.nan
    sized = [(shape, DTYPE_BYTES.get(normalize(type_name)))
             for shape, type_name in zip(dims, types, strict=False)]
    total = [math.prod(shape) * size for shape, size in sized if size and isinstance(shape, list)]
    return float(sum(total)) if total else math.nan


def _first_tensor_type(types: Any) -> Any:
    if not isinstance(types, list):
        return None
    return next((type_name for type_name in types if DTYPE_BYTES.get(normalize(type_name))), None)


def _process_group(info: dict[str, Any]) -> tuple[str, int | None]:
    """The communicator name and size of the trace's gloo calls, from the header's
    'distributedInfo': its one gloo process group when it has one (else the backend's name,
    calls of several groups counted together), and the size all its gloo groups share."""
    groups = [group for group in info.get("pg_config") or [] if isinstance(group, dict)]
    gloo = [group for group in groups if "gloo" in str(group.get("backend_config", "gloo"))]
    sizes = {group.get("pg_size") for group in gloo}
    size = sizes.pop() if len(sizes) == 1 else None
    name = gloo[0].get("pg_name") if len(gloo) == 1 else None
    backend = info.get("backend")
    fallback = backend if isinstance(backend, str) else "c10d"
    return (str(name) if name is not None else fallback,
            size if isinstance(size, int) and not isinstance(size, bool) else None)
