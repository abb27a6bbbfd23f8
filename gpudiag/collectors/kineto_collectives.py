"""NCCL collectives in Kineto traces: which op, how many bytes, which communicator.

Newer PyTorch writes the collective's arguments on the NCCL kernel itself ('Collective name',
'In msg nelems', 'dtype', 'Process Group Name', ...). Older traces do not; there the kernel's
launch call is found inside an `nccl:<op>` annotation (same thread, enclosing in time) whose
'Input Dims' and 'Input type' give the size, and failing that the op and element type are
read from the kernel name (`ncclKernel_AllReduce_RING_LL_Sum_float`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudiag.collectors.chrome_json import integers, take

if TYPE_CHECKING:
    from gpudiag.collectors.kineto import Calls
    from gpudiag.collectors.kineto_events import Events

#: normalized collective name fragment -> op, tried in this order
OPS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("barrier", "barrier"),
    ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
#: element sizes of torch dtype names (as Kineto writes them) and NCCL kernel-name suffixes
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2,
    "double": 8, "float64": 8, "int": 4, "int32": 4, "int32t": 4, "uint32t": 4,
    "long": 8, "int64": 8, "int64t": 8, "uint64t": 8, "short": 2, "int16": 2,
    "byte": 1, "uint8": 1, "uint8t": 1, "char": 1, "int8": 1, "int8t": 1, "bool": 1,
    "unsignedchar": 1, "signedchar": 1, "c10bfloat16": 2, "c10half": 2, "float8e4m3fn": 1,
    "float8e5m2": 1, "fp8e4m3": 1, "fp8e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}


def normalize(text: object) -> str:
    """'_allgather_base' -> 'allgatherbase': lower case, letters and digits only."""
    return _NOT_ALNUM.sub("", str(text).lower())


def op_of(text: pd.Series) -> pd.Series:
    """Map collective names ('_allgather_base', 'nccl:all_reduce', kernel names) to ops,
    matching each distinct name once (a handful per trace: plain Python is fastest)."""
    codes, uniques = pd.factorize(text.astype(object), use_na_sentinel=True)
    ops = [_op(normalize(u)) for u in uniques]
    return pd.Series(take(np.array(ops, dtype=object), codes), index=text.index, dtype=object)


def _op(norm: str) -> str | None:
    return next((name for fragment, name in OPS if fragment in norm), None)


def collectives(
    ev: Events, kernels: pd.DataFrame, kernel_idx: np.ndarray, calls: Calls
) -> pd.DataFrame | None:
    """One row per NCCL kernel of `kernels`, with op, bytes, dtype, group size and
    communicator. `kernel_idx` are the event rows of `kernels`, in the same order; `calls`
    finds each kernel's launch call."""
    is_nccl = on_categories(kernels["name"], lambda c: c.str.contains("nccl", case=False))
    if not is_nccl.any():
        return None  # an empty collectives table
    k = kernels[is_nccl].reset_index(drop=True)
    k["name"] = k["name"].cat.remove_unused_categories()
    args = ev.args(kernel_idx[is_nccl])
    info = pd.DataFrame({
        "collective": pd.Series(args.values("collective"), dtype=object),
        "in_nelems": args.num("in_nelems"),
        "out_nelems": args.num("out_nelems"),
        "group_size": args.num("group_size"),
        "dtype": pd.Series(args.values("dtype"), dtype=object),
        "comm": pd.Series(args.values("pg_name"), dtype=object),
    })
    info = _fill_from_annotation(info, k, ev, calls)
    kernel_name = pd.Series(on_categories(
        k["name"], lambda c: c.str.extract(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")[0]), dtype=object)
    op = op_of(info["collective"].astype(object)).fillna(op_of(kernel_name.astype(object)))
    dtype = info["dtype"].fillna(_dtype_from_kernel_name(k["name"]))
    size = dtype.astype(object).map(lambda d: DTYPE_BYTES.get(normalize(d)), na_action="ignore")
    nelems = info["in_nelems"].where(op != "all_gather", info["out_nelems"])
    comm = info["comm"].astype(object).fillna("stream " + k["stream"].astype("string"))
    out = pd.DataFrame({
        "pid": k["pid"], "device": k["device"], "stream": k["stream"],
        "start_ns": k["start_ns"], "end_ns": k["end_ns"],
        "op": op.fillna("other").to_numpy(),
        "bytes": (nelems.astype("Float64") * size.astype("Float64")).round().astype("Int64"),
        "dtype": dtype.to_numpy(),
        "group_size": info["group_size"],
        "comm": comm.to_numpy(),
        "kernel_id": k["kernel_id"].astype("Int64"),
        "name": k["name"].to_numpy(),
    })
    out = out.sort_values("start_ns", kind="stable").reset_index(drop=True)
    out["seq"] = out.groupby(["pid", "comm"], dropna=False, sort=False).cumcount().astype("Int64")
    return out


def on_categories(names: pd.Series, func: Callable[[pd.Series], pd.Series]) -> np.ndarray:
    """Apply a string function to each distinct category once, then spread to the rows."""
    cats = pd.Series(names.cat.categories, dtype=object)
    result = func(cats).to_numpy(dtype=object)
    out = take(result, names.cat.codes.to_numpy())
    if all(isinstance(v, bool | np.bool_) for v in result):
        return np.where(pd.isna(out), False, out).astype(bool)
    return out


def _dtype_from_kernel_name(names: pd.Series) -> pd.Series:
    """'ncclKernel_AllReduce_RING_LL_Sum_float(...)' -> 'float'."""
    pattern = r"_(?:Sum|Prod|Min|Max|Avg|PreMulSum|SumPostDiv)_(\w+)$"
    return pd.Series(on_categories(
        names, lambda c: c.str.split("(", n=1).str[0].str.extract(pattern)[0]), dtype=object)


def _fill_from_annotation(
    info: pd.DataFrame, k: pd.DataFrame, ev: Events, calls: Calls
) -> pd.DataFrame:
    """Fill missing args from the `nccl:*` annotation around each kernel's launch call: the
    last such annotation that started on the launching thread before the launch and had not
    ended yet."""
    missing = (info["collective"].isna() & info["in_nelems"].isna()).to_numpy()
    ann_idx = ev.where("annotation")
    names = pd.Series(ev.name_values(ann_idx), dtype=object).astype(str)
    nccl = names.str.startswith("nccl:").to_numpy()
    if not missing.any() or not nccl.any():
        return info
    ann_idx = ann_idx[nccl]
    ann = _Annotations(ev, ann_idx, names[nccl].to_numpy())
    launch = {col: calls.lookup(k["correlation"], col) for col in ("pid", "tid", "start_ns")}
    hit = ann.enclosing(launch["pid"], launch["tid"], launch["start_ns"])
    fill = missing & (hit >= 0)
    if fill.any():
        rows = hit[fill]
        info.loc[fill, "collective"] = ann.names[rows]
        info.loc[fill, "in_nelems"] = integers(ann.elements[rows]).to_numpy()
        # the annotation gives the input only: an all_gather's output (its nccl-tests size)
        # is input x ranks, and the ranks are not recorded here, so it stays unknown
        gather = (op_of(pd.Series(ann.names[rows])) == "all_gather").to_numpy()
        info.loc[fill, "out_nelems"] = info.loc[fill, "in_nelems"].where(~gather)
        info.loc[fill, "dtype"] = ann.dtypes[rows]
    return info


class _Annotations:
    """`nccl:*` annotations sorted by (thread, start), searchable per launch."""

    def __init__(self, ev: Events, idx: np.ndarray, names: np.ndarray) -> None:
        args = ev.args(idx)
        thread = ev.pid[idx] * 2.0**32 + ev.tid[idx]
        order = np.lexsort((ev.start[idx], thread))
        self.thread, self.start = thread[order], ev.start[idx][order]
        self.end = (ev.start[idx] + ev.dur[idx])[order]
        self.names = names[order]
        self.elements = _elements(args.values("input_dims")).to_numpy(
            dtype=np.float64, na_value=np.nan)[order]
        self.dtypes = pd.Series(args.values("input_type"), dtype=object).str[0].to_numpy()[order]

    def enclosing(self, pid: np.ndarray, tid: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Index of the annotation open at `at` on thread (pid, tid), or -1."""
        thread = pid * 2.0**32 + tid
        out = np.full(len(at), -1, dtype=np.int64)
        for t in np.unique(thread[np.isfinite(thread)]):  # a few launching threads
            lo = np.searchsorted(self.thread, t, side="left")
            hi = np.searchsorted(self.thread, t, side="right")
            rows = np.flatnonzero(thread == t)
            last = np.searchsorted(self.start[lo:hi], at[rows], side="right") - 1 + lo
            ok = (last >= lo) & (self.end[np.maximum(last, 0)] >= at[rows])
            out[rows[ok]] = last[ok]
        return out


def _elements(dims: list[Any]) -> pd.Series:
    """Element count of the first input of each annotation ('Input Dims': [[n, m], ...])."""
    first = pd.Series(dims, dtype=object).str[0]
    valid = first.map(lambda d: isinstance(d, list) and len(d) > 0, na_action="ignore")
    prod = first[valid.fillna(False).astype(bool)].map(lambda d: float(np.prod(d)))
    return prod.reindex(first.index).astype("Float64")
