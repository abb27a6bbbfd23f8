"""Decoding Chrome-trace JSON (Kineto, JAX Perfetto) into columns, fast.

msgspec decodes straight into typed structs holding only the fields gpudiag uses; everything
else in an event (input shapes, strides, ...) is skipped by the C decoder without building
Python objects, and each event's `args` object is kept as raw bytes until a reader decodes
the args of the events it needs (`ArgDecoder`). Numeric fields are declared
`float | str | None` with a NaN default, so a column of them becomes a float64 array in one C
call; strings (ROCm writes streams as '0x0') and nulls take a slower, still vectorized, path.
Columns are pulled with `map(attrgetter(...))` and args decoded with `map(decoder.decode, ...)`,
both of which run in C: no Python-level loop body runs per event.
"""

from __future__ import annotations

from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes

NAN = float("nan")
Num = float | str | None  # a JSON number, or a string / null that the slow path parses
EMPTY = msgspec.Raw(b"{}")


class Event(msgspec.Struct, gc=False):
    """One trace event. `args` stays raw JSON: a reader decodes it only for the events it
    uses, with a small struct of just the keys it needs (decoding every event's args into one
    wide struct took twice as long as the whole rest of the parse)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Num = NAN
    dur: Num = 0.0
    args: msgspec.Raw = EMPTY


class Document(msgspec.Struct, gc=False):
    traceEvents: list[Event] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    displayTimeUnit: Any = None
    traceName: Any = None


_DECODER = msgspec.json.Decoder(Document | list[Event])


def decode(path: Path) -> Document:
    """Parse a whole Chrome-trace JSON file (plain or gzipped) into a Document.

    Readers of large traces stream them instead (gpudiag.readers.chrome.stream); this is
    for the JAX Perfetto form, which the XSpace reader needs whole.
    """
    raw = read_bytes(path)
    try:
        doc = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise not_a_trace(path, exc) from exc
    except msgspec.DecodeError as exc:
        raise invalid_json(path, exc) from exc
    except RecursionError:
        raise too_deep(path) from None
    if isinstance(doc, list):
        doc = Document(traceEvents=doc)
    if doc.traceEvents is None:
        raise no_events(path)
    return doc


def not_a_trace(path: Path, exc: Exception) -> InputError:
    """JSON whose shape is not a Chrome trace (msgspec.ValidationError)."""
    return InputError(path, f"is JSON but not a Chrome/Kineto trace ({exc})",
                      "expected an object with 'traceEvents' from torch.profiler or jax.profiler")


class InvalidJSONError(InputError):
    """A Chrome trace that is not JSON (`truncated`: JSON cut short, the file ends early).

    Its own class so a reader can react to it (the Kineto reader repairs the bare quotes
    Kineto leaves in names) without reading the message's text."""

    def __init__(self, path: str | Path | None, problem: str, *, truncated: bool) -> None:
        super().__init__(path, problem, "the profiler may not have finished writing it")
        self.truncated = truncated

    def __reduce__(self) -> Any:
        return _invalid_json, (self.path, self.problem, self.truncated)


def _invalid_json(path: str | None, problem: str, truncated: bool) -> InvalidJSONError:
    """An InvalidJSONError rebuilt from its parts (unpickled in a job's coordinator)."""
    return InvalidJSONError(path, problem, truncated=truncated)


def invalid_json(path: Path, exc: Exception) -> InvalidJSONError:
    """Text that is not JSON, or JSON cut short (msgspec.DecodeError)."""
    truncated = "truncated" in str(exc)  # msgspec says so only in its message
    problem = "is truncated JSON" if truncated else f"is not valid JSON ({exc})"
    return InvalidJSONError(path, problem, truncated=truncated)


def too_deep(path: Path) -> InputError:
    """Arrays or objects nested past Python's recursion limit (about 1,000 levels)."""
    return InputError(path, "nests JSON arrays or objects too deeply (over about 1,000 levels;"
                      " real traces nest a few)", "the file is damaged or not a profile")


def no_events(path: Path) -> InputError:
    return InputError(
        path, "is JSON but not a trace (no 'traceEvents' list)",
        "pass the file torch.profiler's export_chrome_trace / tensorboard_trace_handler wrote",
    )


def column(events: list[Any], field: str) -> list[Any]:
    """One field of every event, pulled in C (`field` may be dotted: 'args.device')."""
    return list(map(attrgetter(field), events))


def floats(values: list[Any]) -> np.ndarray:
    """float64 array; strings are parsed (decimal or '0x..' hex), anything else is NaN."""
    try:
        arr = np.array(values, dtype=np.float64)
        if arr.ndim == 1:
            return arr
    except (TypeError, ValueError):
        pass
    series = pd.Series(values, dtype=object)
    out = pd.to_numeric(series, errors="coerce").astype("float64")
    unparsed = out.isna() & series.notna()
    if unparsed.any():  # rare: only the odd values take the per-value path
        out[unparsed] = pd.to_numeric(series[unparsed].map(_hex_int), errors="coerce")
    return out.to_numpy()


def integers(values: list[Any] | np.ndarray) -> pd.Series:
    """Nullable Int64; NaN, non-integral values and values beyond 2**53 (which a float64,
    and so a JSON number, cannot hold exactly) become NA."""
    arr = values if isinstance(values, np.ndarray) and values.dtype.kind == "f" else floats(
        list(values))
    exact = np.isfinite(arr) & (arr == np.floor(arr)) & (np.abs(arr) <= 2.0**53)
    data = np.where(exact, arr, 0).astype(np.int64)
    return pd.Series(pd.arrays.IntegerArray(data, ~exact), copy=False)


def _hex_int(value: Any) -> Any:
    if isinstance(value, str) and value.lower().startswith("0x"):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def codes_of(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Factorize: (int64 codes with -1 for None, object array of the distinct values).

    `dict.fromkeys` + `map(dict.__getitem__)` run in C and beat pandas.factorize on lists of
    fresh Python strings by about 2x; unhashable values (a list where a name should be) fall
    back to their string form.
    """
    try:
        index = dict.fromkeys(values)
    except TypeError:
        return codes_of([value if value is None else str(value) for value in values])
    index.pop(None, None)
    for code, key in enumerate(index):
        index[key] = code
    index[None] = -1
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    del index[None]
    uniques = np.empty(len(index), dtype=object)
    uniques[:] = list(index)
    return codes, uniques


def objects(values: list[Any]) -> np.ndarray:
    """A 1-d object array of `values` as they are (np.array would nest lists into 2-d)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def take(table: Any, codes: np.ndarray, missing: Any = None) -> np.ndarray:
    """`table[codes]`, where code -1 (pandas' "missing" code) gives `missing`."""
    values = np.asarray(table)
    padded = np.empty(len(values) + 1, dtype=object if missing is None else values.dtype)
    padded[:-1] = values
    padded[-1] = missing
    return padded[codes]


def categorical(codes: np.ndarray, uniques: np.ndarray | pd.Index) -> pd.Series:
    """A category Series of string values from factorized codes (no re-hashing), with only
    the categories used, in code order. `uniques` may be the `category_index` of the codes'
    values, built once for the many selections of one table."""
    cats = uniques if isinstance(uniques, pd.Index) else category_index(uniques)
    codes = np.asarray(codes, dtype=np.int64)
    if cats.has_duplicates:  # e.g. 1 and "1" both present: fall back to hashing strings
        return pd.Series(np.where(codes >= 0, np.asarray(cats)[codes], None)).astype("category")
    used = np.unique(codes)
    used = used[used >= 0]
    renumber = np.full(len(cats) + 1, -1, dtype=np.int64)  # the last slot: code -1 stays -1
    renumber[used] = np.arange(len(used))
    return pd.Series(pd.Categorical.from_codes(renumber[codes], categories=cats[used]))


def category_index(uniques: np.ndarray) -> pd.Index:
    """The categories `categorical` reads: each distinct value as its text."""
    return pd.Index([str(unique) for unique in uniques])


def triple(values: list[Any]) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Split [x, y, z] lists (grid, block) into three Int64 columns."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):  # ragged or mixed: some events lack the list
        arr = None
    if arr is not None and arr.ndim == 2 and arr.shape[1] == 3:
        cols = [arr[:, axis] for axis in range(3)]
    elif arr is not None and arr.ndim == 1:  # no event has the list
        cols = [arr, arr, arr]
    else:
        series = pd.Series(values, dtype=object)
        cols = [pd.to_numeric(series.str[axis], errors="coerce").to_numpy(float)
                for axis in range(3)]
    return integers(cols[0]), integers(cols[1]), integers(cols[2])


class ArgDecoder:
    """Decodes the raw `args` of chosen events into a small struct type.

    A type mismatch (a list where a number was expected) falls back to a lenient twin of the
    struct whose fields accept anything; an `args` that is not a JSON object decodes as empty.
    """

    def __init__(self, struct: type[msgspec.Struct]) -> None:
        self.struct = struct
        self.strict = msgspec.json.Decoder(struct)
        fields = [
            (field_info.name, Any,
             msgspec.field(default=_default(field_info), name=field_info.encode_name))
            for field_info in msgspec.structs.fields(struct)
        ]
        self.lenient_type = msgspec.defstruct(f"Lenient{struct.__name__}", fields, gc=False)
        self.lenient = msgspec.json.Decoder(self.lenient_type)

    def decode(self, raws: list[msgspec.Raw]) -> list[Any]:
        try:
            return list(map(self.strict.decode, raws))
        except (msgspec.ValidationError, msgspec.DecodeError):
            return [self._one(raw) for raw in raws]  # odd input only: per event is fine

    def _one(self, raw: msgspec.Raw) -> Any:
        try:
            return self.lenient.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return self.lenient_type()


def _default(field: Any) -> Any:
    return None if field.default is msgspec.NODEFAULT else field.default
