"""What one timed collective's row says, and rows -> the `collectives` table -> a chunk.

    call = Call.of("all_reduce", torch.distributed.all_reduce)  # where its message is
    size = nbytes_of(tensors_of(call.kind, tensor))                  # nccl-tests' S, in bytes
    write_chunk(out_dir, "chunk-000001", os.getpid(), rows, meta)

The per-call facts of the `nccl` plugin (`nccl_timing`): which torch.distributed functions
are timed and as which op, how the message size, dtype, group and async Works are read from
a call's arguments and result, the row layout, and writing rows as a Trace chunk. Kept
apart from the wrappers' threading and CUDA-event logic: this part keeps no collector state,
needs no torch, and loads pandas only when a table is built (the plugin runs in every
process).
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from gpudiag.collectors.nccl.clock import Anchor

#: call name -> (op, the parameter holding the message, how its size S is read (nccl-tests'
#: S: all_gather output bytes, reduce_scatter and all_to_all input bytes, others the tensor))
CALLS: dict[str, tuple[str, str, str]] = {
    "all_reduce": ("all_reduce", "tensor", "tensor"),
    "all_gather": ("all_gather", "tensor_list", "list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "tensor"),
    "all_gather_single": ("all_gather", "output_tensor", "tensor"),
    "_all_gather_base": ("all_gather", "output_tensor", "tensor"),
    "reduce_scatter": ("reduce_scatter", "input_list", "list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "tensor"),
    "reduce_scatter_single": ("reduce_scatter", "input", "tensor"),
    "_reduce_scatter_base": ("reduce_scatter", "input", "tensor"),
    "broadcast": ("broadcast", "tensor", "tensor"),
    "reduce": ("reduce", "tensor", "tensor"),
    "all_to_all": ("all_to_all", "input_tensor_list", "list"),
    "all_to_all_single": ("all_to_all", "input", "tensor"),
    "barrier": ("barrier", "", "none"),
    "send": ("send", "tensor", "tensor"),
    "recv": ("recv", "tensor", "tensor"),
    "isend": ("send", "tensor", "tensor"),
    "irecv": ("recv", "tensor", "tensor"),
    "batch_isend_irecv": ("send_recv", "p2p_op_list", "p2p"),
}
#: one collective as kept until it is written (the `collectives` columns, less pid and kernel_id)
ROW_FIELDS = ("rank", "device", "stream", "start_ns", "end_ns", "op", "bytes", "dtype",
              "group_size", "comm", "seq", "name")
_ROW_DTYPES = {"rank": "Int64", "device": "Int64", "stream": "Int64", "start_ns": "int64",
               "end_ns": "int64", "bytes": "Int64", "group_size": "Int64", "seq": "Int64"}

Row = tuple[Any, ...]


#: set on every wrapper gpudiag puts in place, so none is wrapped twice
MARK = "_gpudiag_nccl_timing"
W_CAPTURE = "nccl timing: collectives inside a CUDA graph capture (not timed)"
W_REPATCHED = "nccl timing: wrappers replaced by other code (left in place at unpatch)"


@dataclass(frozen=True)
class Call:
    """Where a wrapped function keeps its message and group (positions read once)."""

    name: str
    op: str
    kind: str
    arg: tuple[int, str] | None
    group: tuple[int, str] | None

    @classmethod
    def of(cls, name: str, original: Callable[..., Any]) -> Call:
        operation, param, kind = CALLS[name]
        names = list(inspect.signature(original).parameters)

        def where(parameter: str) -> tuple[int, str] | None:
            return (names.index(parameter), parameter) if parameter in names else None

        return cls(name, operation, kind, where(param) if param else None, where("group"))


@dataclass(eq=False)
class Token:
    """One outermost call being timed: what its row will say, and its clocks."""

    call: Call
    rank: int | None
    comm: str
    group_size: int | None
    seq: int
    nbytes: int | None
    dtype: str | None
    device: int | None = None
    stream: int | None = None
    t0_ns: int = 0
    start: Any = None
    anchor: Anchor | None = None
    ends: list[Any] = field(default_factory=list)  # events (GPU) or time_ns (host)
    expected: int = 1

    def row(self, start_ns: int, end_ns: int) -> Row:
        return (self.rank, self.device, self.stream, start_ns, end_ns, self.call.op,
                self.nbytes, self.dtype, self.group_size, self.comm, self.seq, self.call.name)


def collectives_table(rows: Sequence[Row], pid: int) -> pd.DataFrame:
    """Rows (in `ROW_FIELDS` order) as the schema's `collectives` table, sorted by start.

        table = collectives_table([(0, None, None, 10, 20, "all_reduce", 64, "float32", 2,
                                    "0", 0, "all_reduce")], pid=42)
        table.loc[0, "bytes"]   # 64
    """
    import pandas as pd

    from gpudiag.schema import TABLES

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in ROW_FIELDS]
    data: dict[str, Any] = {"pid": pd.array([pid] * len(rows), dtype="Int64")}
    for name, values in zip(ROW_FIELDS, columns, strict=True):
        data[name] = pd.array(list(values), dtype=_ROW_DTYPES.get(name, "object"))
    frame = pd.DataFrame(data).sort_values("start_ns", kind="stable", ignore_index=True)
    return TABLES["collectives"].conform(frame)


def write_chunk(out_dir: Path, name: str, pid: int, rows: Sequence[Row],
                meta: dict[str, Any]) -> None:
    """`rows` as the Trace directory `out_dir/name`: saved to a hidden temp dir, then renamed
    whole, so a reader (or a merge after a kill) never sees half a chunk.

        write_chunk(Path("run/procs/host-42/nccl"), "chunk-000001", 42, rows, {"rank": 0})
        Trace.load_dir(Path("run/procs/host-42/nccl/chunk-000001")).collectives
    """
    from gpudiag.trace import Trace

    tmp = out_dir / f".{name}.{pid}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    Trace(collectives=collectives_table(rows, pid), meta=meta).save(tmp)
    os.replace(tmp, out_dir / name)


def import_writer() -> None:
    """Import what writing a chunk needs now, not first at interpreter shutdown (refused)."""
    import pyarrow.parquet  # noqa: F401 -- loaded lazily by pandas.to_parquet otherwise

    import gpudiag.trace  # noqa: F401 -- pandas and the schema


def call_arg(args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[int, str] | None) -> Any:
    if where is None:
        return None
    index, name = where
    return args[index] if index < len(args) else kwargs.get(name)


def comm_of(group: Any, c10d: Any) -> tuple[str, int | None]:
    """Process-group name ('0' for the default group, as Kineto's pg_name) and size."""
    name = getattr(group, "group_name", None)
    if not name:
        name = c10d._get_process_group_name(group)
    return str(name), int(group.size())


def tensors_of(kind: str, value: Any) -> list[Any]:
    if value is None or kind == "none":
        return []
    if kind == "tensor":
        return [value]
    if kind == "p2p":  # S of a send/recv batch: the bytes sent (received when it only receives)
        sent = [p2p.tensor for p2p in value if "send" in getattr(p2p.op, "__name__", "")]
        return sent or [p2p.tensor for p2p in value]
    return list(value)


def nbytes_of(tensors: list[Any]) -> int:
    return sum(int(tensor.numel()) * int(tensor.element_size()) for tensor in tensors)


def dtype_of(tensors: list[Any]) -> str | None:
    return str(tensors[0].dtype).removeprefix("torch.") if tensors else None


def works_of(result: Any) -> list[Any]:
    """The async Work objects a call returned (none for a synchronous call)."""
    if result is None:
        return []
    items = result if isinstance(result, list | tuple) else [result]
    return [work for work in items if hasattr(work, "get_future")]
