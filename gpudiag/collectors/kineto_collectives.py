"""NCCL collectives in Kineto traces: which op, how many bytes, which communicator.

Newer PyTorch writes the collective's arguments on the NCCL kernel itself ('Collective name',
'In msg nelems', 'dtype', 'Process Group Name', ...). Older traces do not; there the kernel's
launch call is found inside an `nccl:<op>` annotation (same thread, enclosing in time) whose
'Input Dims' and 'Input type' give the size, and failing that the op and element type are
read from the kernel name (`ncclKernel_AllReduce_RING_LL_Sum_float`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudiag.collectors.chrome_json import ArgRows, take
from gpudiag.collectors.kineto_events import AnnotationArgs

if TYPE_CHECKING:
    from gpudiag.collectors.kineto_events import Events

#: normalized collective name fragment -> op, tried in this order
OPS = (
    ("allreduce", "all_reduce"), ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("barrier", "barrier"),
    ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
)
#: element sizes of torch dtype names (as Kineto writes them) and NCCL kernel-name suffixes
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2,
    "double": 8, "float64": 8, "int": 4, "int32": 4, "int32t": 4, "uint32t": 4,
    "long": 8, "int64": 8, "int64t": 8, "uint64t": 8, "short": 2, "int16": 2,
    "byte": 1, "uint8": 1, "uint8t": 1, "char": 1, "int8": 1, "int8t": 1, "bool": 1,
    "unsignedchar": 1, "c10bfloat16": 2, "c10half": 2, "float8e4m3fn": 1, "float8e5m2": 1,
    "fp8e4m3": 1, "fp8e5m2": 1, "complexfloat": 8, "complexdouble": 16,
}


def normalize(text: pd.Series) -> pd.Series:
    return text.astype("string").str.lower().str.replace(r"[^a-z0-9]", "", regex=True)


def op_of(text: pd.Series) -> pd.Series:
    """Map collective names ('_allgather_base', 'nccl:all_reduce', kernel names) to ops,
    matching each distinct name once."""
    codes, uniques = pd.factorize(text.astype(object), use_na_sentinel=True)
    norm = normalize(pd.Series(uniques, dtype=object))
    op = pd.Series(None, index=norm.index, dtype=object)
    for fragment, name in OPS:
        op = op.mask(op.isna() & norm.str.contains(fragment, na=False), name)
    return pd.Series(take(op.to_numpy(), codes), index=text.index, dtype=object)


def collectives(
    ev: Events, kernels: pd.DataFrame, kernel_args: ArgRows, api: pd.DataFrame
) -> pd.DataFrame:
    """One row per NCCL kernel of `kernels`, with op, bytes, dtype, group size and
    communicator. `kernel_args` are the KernelArgs of `kernels`' rows, in the same order;
    `api` is the trace's api table (to find each kernel's launch call)."""
    is_nccl = on_categories(kernels["name"], lambda c: c.str.contains("nccl", case=False))
    k = kernels[is_nccl].reset_index(drop=True)
    k["name"] = k["name"].cat.remove_unused_categories()
    args = ArgRows([a for a, keep in zip(kernel_args.structs, is_nccl, strict=True) if keep])
    info = pd.DataFrame({
        "collective": pd.Series(args.values("collective"), dtype=object),
        "in_nelems": args.num("in_nelems"),
        "out_nelems": args.num("out_nelems"),
        "group_size": args.num("group_size"),
        "dtype": pd.Series(args.values("dtype"), dtype=object),
        "comm": pd.Series(args.values("pg_name"), dtype=object),
    })
    info = _fill_from_annotation(info, k, ev, api)
    kernel_name = pd.Series(on_categories(
        k["name"], lambda c: c.str.extract(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")[0]), dtype=object)
    op = op_of(info["collective"].astype(object)).fillna(op_of(kernel_name.astype(object)))
    dtype = info["dtype"].fillna(_dtype_from_kernel_name(k["name"]))
    size = normalize(dtype.astype(object)).map(DTYPE_BYTES)
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
    info: pd.DataFrame, k: pd.DataFrame, ev: Events, api: pd.DataFrame
) -> pd.DataFrame:
    """Fill missing args from the `nccl:*` annotation around each kernel's launch call."""
    missing = info["collective"].isna() & info["in_nelems"].isna()
    if not missing.any() or k.empty:
        return info
    ann_idx = ev.where("annotation")
    names = pd.Series(ev.name_values(ann_idx), dtype=object).astype(str)
    nccl = names.str.startswith("nccl:").to_numpy()
    if not nccl.any():
        return info
    ann_idx = ann_idx[nccl]
    ann_args = ev.args(ann_idx, AnnotationArgs)
    annotations = pd.DataFrame({
        "pid": ev.pids(ann_idx), "tid": ev.tids(ann_idx),
        "ann_start": ev.start[ann_idx], "ann_end": ev.start[ann_idx] + ev.dur[ann_idx],
        "ann_name": names[nccl].to_numpy(),
        "ann_elems": _elements(ann_args.values("input_dims")),
        "ann_dtype": pd.Series(ann_args.values("input_type"), dtype=object).str[0],
    }).dropna(subset=["pid", "tid"]).sort_values("ann_start")
    launches = _launches_of(k, api)
    if launches.empty or annotations.empty:
        return info
    joined = pd.merge_asof(
        launches.sort_values("launch_start"), annotations, left_on="launch_start",
        right_on="ann_start", by=["pid", "tid"], direction="backward",
    ).set_index("row").reindex(range(len(k)))
    inside = joined["ann_end"] >= joined["launch_start"]
    fill = missing & inside.fillna(False).to_numpy()
    info.loc[fill, "collective"] = joined.loc[fill, "ann_name"].to_numpy()
    info.loc[fill, "in_nelems"] = joined.loc[fill, "ann_elems"].astype("Int64").to_numpy()
    info.loc[fill, "out_nelems"] = info.loc[fill, "in_nelems"]
    info.loc[fill, "dtype"] = joined.loc[fill, "ann_dtype"].to_numpy()
    return info


def _launches_of(k: pd.DataFrame, api: pd.DataFrame) -> pd.DataFrame:
    """Host pid, tid and start of the API call that launched each kernel (by correlation)."""
    calls = api[["correlation", "pid", "tid", "start_ns"]].dropna()
    calls = calls.drop_duplicates("correlation").rename(columns={"start_ns": "launch_start"})
    rows = k[["correlation"]].assign(row=np.arange(len(k)))
    return rows.merge(calls, on="correlation", how="inner").drop(columns="correlation")


def _elements(dims: list[Any]) -> pd.Series:
    """Element count of the first input of each annotation ('Input Dims': [[n, m], ...])."""
    first = pd.Series(dims, dtype=object).str[0]
    valid = first.map(lambda d: isinstance(d, list) and len(d) > 0, na_action="ignore")
    prod = first[valid.fillna(False).astype(bool)].map(lambda d: float(np.prod(d)))
    return prod.reindex(first.index).astype("Float64")
