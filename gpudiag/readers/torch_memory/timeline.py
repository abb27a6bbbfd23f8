"""PyTorch profiler memory timelines: `profile.export_memory_timeline(path, device)`.

    trace = gpudiag.readers.torch_memory.reader.read_timeline(Path("memory.raw.json.gz"))

Two JSON forms, both written by `torch/profiler/_memory_profiler.py` (MemoryProfileTimeline):

- raw (`export_memory_timeline_raw`, path ending `.raw.json.gz`): `[[ts_ns, action, numbytes,
  category], ...]`. `ts_ns` is nanoseconds, -1 for tensors that existed before profiling;
  `numbytes` is signed (a destroy and the old version of an increment_version are negative).
  Each becomes a `memory` row: bytes = |numbytes|, delta_bytes = numbytes.
- coalesced (`export_memory_timeline`, `.json`): `[times_us, sizes]`, one time per step and
  per step 9 sizes: slot 0 a zero baseline the plot stacks on, then the bytes held by each
  category at that time. Each (time, category) becomes a `samples` row
  `memory.<CATEGORY>` in bytes.

The codes, as verified in torch's source: `Action` is an `enum.auto()` Enum (PREEXISTING 1,
CREATE 2, INCREMENT_VERSION 3, DESTROY 4) exported by `.value`; the category index is the
insertion order of `_CATEGORY_TO_COLORS` (PARAMETER 0, OPTIMIZER_STATE 1, INPUT 2,
TEMPORARY 3, ACTIVATION 4, GRADIENT 5, AUTOGRAD_DETAIL 6, None 7 = unknown). The file does
not say which device it describes, so `device` is NA.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes
from gpudiag.trace import Trace

#: action code - 1 -> action name (torch _memory_profiler.Action values 1..4)
ACTIONS = ("preexisting", "create", "increment_version", "destroy")
#: category code -> name (torch _CATEGORY_TO_INDEX; 7 is the None category)
CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
              "AUTOGRAD_DETAIL", "UNKNOWN")
HOW_TO_EXPORT = (
    "export one with torch.profiler.profile(profile_memory=True, record_shapes=True, "
    "with_stack=True) and prof.export_memory_timeline('memory.raw.json.gz', device='cuda:0')"
)
INT64_MAX = np.iinfo(np.int64).max


def read_timeline(path: Path) -> Trace:
    """Read an `export_memory_timeline` JSON file (raw or coalesced form) into a Trace."""
    doc = _decode(path)
    if not isinstance(doc, list):
        raise _not_timeline(path, "the JSON is not a list")
    meta: dict[str, Any] = {"format": "torch-memory-timeline", "timeline": True}
    if _is_coalesced(doc):
        return Trace(meta={**meta, "form": "coalesced"}, samples=_samples(path, doc))
    memory, warnings = _memory(path, doc)
    trace = Trace(meta={**meta, "form": "raw"}, memory=memory)
    for kind, count in warnings.items():
        trace.warn(kind, count)
    return trace


def _decode(path: Path) -> Any:
    try:
        return msgspec.json.decode(read_bytes(path))
    except msgspec.DecodeError as exc:
        problem = "is truncated JSON" if "truncated" in str(exc) else "is not valid JSON"
        raise InputError(path, problem, "the profiler may not have finished writing it") from exc
    except RecursionError as exc:
        raise _not_timeline(path, "the JSON nests too deep") from exc


def _not_timeline(path: Path, why: str) -> InputError:
    return InputError(path, f"is not a torch memory timeline ({why})", HOW_TO_EXPORT)


def _is_coalesced(doc: list[Any]) -> bool:
    """`[times, sizes]`: sizes is a list of lists; a raw row never holds a list."""
    return (len(doc) == 2 and isinstance(doc[0], list) and isinstance(doc[1], list)
            and (not doc[1] or isinstance(doc[1][0], list)))


def _integers(path: Path, rows: list[Any], ndim: int, what: str) -> np.ndarray:
    """`rows` as an int64 array of `ndim` dimensions, or InputError (ragged, text, nulls)."""
    try:
        arr = np.array(rows)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged or nested rows
        raise _not_timeline(path, f"{what} are ragged or nested") from exc
    if arr.ndim != ndim or arr.size == 0:
        raise _not_timeline(path, f"{what} have the shape {arr.shape}, not {ndim}-D")
    if (arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all()
            and np.abs(arr).max() < 2.0**63):
        arr = arr.astype(np.int64)  # integral floats; past 2**63 the cast would wrap
    if arr.dtype.kind not in "iu" or (arr.dtype.kind == "u" and arr.max() > INT64_MAX):
        raise _not_timeline(path, f"{what} are not all integers")
    return arr.astype(np.int64, copy=False)


def _memory(path: Path, doc: list[Any]) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """The raw form as `memory` columns, vectorized over the whole array."""
    if not doc:
        return None, {}
    rows = _integers(path, doc, 2, "rows")
    if rows.shape[1] != 4:
        raise _not_timeline(path, f"rows have {rows.shape[1]} values, expected 4")
    times, action, numbytes, category = rows.T
    action_code = np.where((action >= 1) & (action <= len(ACTIONS)), action - 1, -1)
    category_code = np.where((category >= 0) & (category < len(CATEGORIES)), category, -1)
    warnings = {
        "timeline rows with an unknown action code kept without an action":
            int((action_code < 0).sum()),
        "timeline rows with an unknown category code kept without a category":
            int((category_code < 0).sum()),
    }
    columns = {
        "ts_ns": np.where(times < 0, -1, times),
        "action": pd.Categorical.from_codes(action_code, categories=list(ACTIONS)),
        "bytes": np.abs(numbytes),
        "delta_bytes": numbytes,
        "category": pd.Categorical.from_codes(category_code, categories=list(CATEGORIES)),
    }
    return columns, warnings


def _samples(path: Path, doc: list[Any]) -> pd.DataFrame | None:
    """The coalesced form as `samples`: one row per (time, category), bytes held."""
    if not doc[0] and not doc[1]:
        return None
    times = _integers(path, doc[0], 1, "times")
    sizes = _integers(path, doc[1], 2, "sizes")
    width = len(CATEGORIES) + 1
    if sizes.shape != (len(times), width):
        raise _not_timeline(
            path, f"sizes have shape {sizes.shape}, expected ({len(times)}, {width})")
    if (np.abs(times) > INT64_MAX // 1000).any():
        raise _not_timeline(path, "times are out of range")
    metrics = [f"memory.{category}" for category in CATEGORIES]
    return pd.DataFrame({
        "ts_ns": np.repeat(np.where(times < 0, -1, times * 1000), len(CATEGORIES)),
        "metric": pd.Categorical.from_codes(
            np.tile(np.arange(len(CATEGORIES)), len(times)), categories=metrics),
        "value": sizes[:, 1:].astype(np.float64).ravel(),
        "unit": pd.Categorical.from_codes(np.zeros(sizes.shape[0] * len(CATEGORIES),
                                                   dtype=np.int64), categories=["bytes"]),
    })
