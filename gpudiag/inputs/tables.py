"""A saved trace's Parquet tables, read as what they may be: a stranger's file.

`Trace.save` writes one Parquet file per table; `Trace.load_dir` reads them back through
`read_table_file`, the one place where a Parquet file's footer, column names and types are
decoded. Everything is checked against the declared schema before a row is decoded:

- the file is opened as a regular file (`inputs.files.open_regular`): a FIFO, a device such
  as `/dev/zero`, a directory or a symlink loop named `kernels.parquet` is one line;
- column names must be UTF-8 text naming declared columns, and each column's Arrow type
  must fit its declared dtype (text for a category, numbers for a number): a binary column
  of bytes that are not UTF-8 would otherwise reach the analyzers as `bytes`;
- what the file decodes to is bounded before it is read: every declared column of every
  row the footer claims (the schema gives each one, present or not, once conformed), plus
  the text columns' own bytes, must stay within `inflation_limit` of the file's size (the
  budget gzip files have). A 1 MB file can claim 10**12 rows, or hold a dictionary column
  of millions of rows of one long value: read as plain strings that is gigabytes. Text is
  read dictionary-encoded (one copy of each distinct string), row group by row group, and
  the bytes actually decoded are counted against the same budget as they come;
- the file's own pandas metadata is not used: each column becomes its declared dtype here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from gpudiag.errors import InputError
from gpudiag.inputs.files import inflation_limit, open_regular, size_text
from gpudiag.schema import Column, Table

DAMAGED = "the trace directory is damaged or was not written by gpudiag: re-run or re-save it"
BUDGET = ("if it is a genuine saved trace, raise the budget: "
          "GPUDIAG_MAX_INFLATION_RATIO=<ratio> (default 100) or "
          "GPUDIAG_MAX_INFLATED_BYTES=<bytes> (default 256 MiB)")
#: bytes one row of a declared column takes once conformed (a category: its code)
WIDTH = {"int64": 8, "Int64": 9, "float64": 8, "boolean": 2, "category": 4}


def read_table_file(file: Path, table: Table) -> pd.DataFrame:
    """`file`'s rows as `table`'s columns at their declared dtypes (missing columns left
    out: `Table.conform` adds them); InputError naming the file and the problem."""
    with _opened(file) as handle:
        parquet = _parquet(file, handle)
        fields = _fields(file, parquet, table)
        limit = inflation_limit(_size(handle))
        _check_claims(file, parquet, table, fields, limit)
        arrow = _read(file, handle, parquet, fields, limit)
    return _to_pandas(file, arrow, table)


@contextmanager
def _opened(file: Path) -> Iterator[BinaryIO]:
    try:
        handle = open_regular(file)
    except OSError as exc:
        raise InputError(file, f"cannot be read ({exc.strerror or exc})", DAMAGED) from exc
    with handle:
        yield handle


def _size(handle: BinaryIO) -> int:
    handle.seek(0, 2)
    return handle.tell()


def _parquet(file: Path, handle: BinaryIO) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(handle)
    except UnicodeDecodeError as exc:
        raise _not_utf8(file) from exc
    except Exception as exc:  # pyarrow raises many types for a damaged footer
        raise InputError(file, f"is not a readable Parquet file ({_brief(exc)})",
                         DAMAGED) from exc


def _not_utf8(file: Path) -> InputError:
    return InputError(file, "has column names or metadata that are not UTF-8 text", DAMAGED)


def _brief(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return text if len(text) <= 200 else text[:199] + "…"


def _fields(file: Path, parquet: pq.ParquetFile, table: Table) -> dict[str, pa.DataType]:
    """Column name -> Arrow type, every name declared and every type fitting its dtype."""
    try:
        schema = parquet.schema_arrow
    except UnicodeDecodeError as exc:
        raise _not_utf8(file) from exc
    except Exception as exc:
        raise InputError(file, f"has a Parquet schema Arrow cannot read ({_brief(exc)})",
                         DAMAGED) from exc
    declared = {column.name: column for column in table.columns}
    fields = {field.name: field.type for field in schema}
    unknown = [name for name in fields if name not in declared]
    if unknown or len(fields) != len(schema):
        raise _other_table(file, table, f"columns gpudiag does not declare: {unknown[:5]}"
                           if unknown else "a column name given twice")
    for name, kind in fields.items():
        wanted = _fits(kind, declared[name])
        if wanted:
            raise _other_table(file, table, f"{table.name}.{name} holds {kind}, not {wanted}")
    return fields


def _other_table(file: Path, table: Table, problem: str) -> InputError:
    return InputError(file, f"does not hold gpudiag's {table.name} table ({problem})", DAMAGED)


def _fits(kind: pa.DataType, column: Column) -> str:
    """'' when Arrow type `kind` can hold `column`'s values, else what it should hold."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_null(kind):
        return ""
    if column.dtype == "category":
        return "" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else "text"
    if column.dtype == "boolean":
        return "" if pa.types.is_boolean(kind) else "booleans"
    numeric = pa.types.is_integer(kind) or (column.dtype == "float64"
                                            and pa.types.is_floating(kind))
    return "" if numeric else ("numbers" if column.dtype == "float64" else "integers")


def _check_claims(file: Path, parquet: pq.ParquetFile, table: Table,
                  fields: dict[str, pa.DataType], limit: int) -> None:
    """InputError when what the footer says the file holds decodes past `limit` bytes."""
    meta = parquet.metadata
    groups = [meta.row_group(index) for index in range(meta.num_row_groups)]
    rows = max(meta.num_rows, sum(group.num_rows for group in groups))
    per_row = sum(WIDTH.get(column.dtype, 8) for column in table.columns)
    text = [index for index, name in enumerate(fields) if table.column(name).dtype == "category"]
    text_bytes = sum(group.column(index).total_uncompressed_size
                     for group in groups for index in text)
    claimed = rows * per_row + text_bytes
    if claimed > limit:
        raise _too_big(file, f"claims {rows:,} rows and {size_text(text_bytes)} of text",
                       claimed, limit)


def _too_big(file: Path, what: str, decoded: int, limit: int) -> InputError:
    return InputError(
        file, f"{what}: about {size_text(decoded)} decoded, over the budget of "
        f"{size_text(limit)} for a file of its size (a Parquet bomb, or a table far larger "
        "than gpudiag writes)", BUDGET)


def _read(file: Path, handle: BinaryIO, parquet: pq.ParquetFile,
          fields: dict[str, pa.DataType], limit: int) -> pa.Table:
    """The file's columns, text dictionary-encoded, row group by row group within `limit`
    decoded bytes."""
    text = [name for name, kind in fields.items()
            if pa.types.is_string(kind) or pa.types.is_large_string(kind)]
    names = list(fields)
    pieces: list[pa.Table] = []
    decoded = 0
    try:
        reader = pq.ParquetFile(handle, metadata=parquet.metadata, read_dictionary=text)
        for index in range(parquet.metadata.num_row_groups):
            pieces.append(reader.read_row_group(index, columns=names, use_threads=False))
            decoded += pieces[-1].nbytes
            if decoded > limit:
                raise _too_big(file, "decodes to more than its footer claims", decoded, limit)
        return pa.concat_tables(pieces) if pieces else parquet.schema_arrow.empty_table()
    except InputError:
        raise
    except UnicodeDecodeError as exc:
        raise _not_utf8(file) from exc
    except Exception as exc:  # a damaged page, text that is not UTF-8, a lying footer
        if "utf8" in str(exc).lower().replace("-", ""):
            raise InputError(file, "holds text that is not UTF-8", DAMAGED) from exc
        raise InputError(file, f"is a damaged Parquet file ({_brief(exc)})", DAMAGED) from exc


def _to_pandas(file: Path, arrow: pa.Table, table: Table) -> pd.DataFrame:
    """Each column at its declared dtype (nullable integers and booleans stay exact)."""
    out = {}
    try:
        for name, values in zip(arrow.column_names, arrow.columns, strict=True):
            mapper = _MAPPERS.get(table.column(name).dtype)
            out[name] = values.to_pandas(types_mapper=mapper).reset_index(drop=True)
    except Exception as exc:  # a value past int64 in an integer column, say
        raise InputError(file, f"holds values gpudiag cannot read ({_brief(exc)})",
                         DAMAGED) from exc
    return pd.DataFrame(out, index=pd.RangeIndex(arrow.num_rows))


def _nullable_int(kind: pa.DataType) -> Any:
    return pd.Int64Dtype() if pa.types.is_integer(kind) else None


def _nullable_bool(kind: pa.DataType) -> Any:
    return pd.BooleanDtype() if pa.types.is_boolean(kind) else None


#: int64 columns too: a uint64 past int64 or a missing value is then an error, not a wrap
_MAPPERS: dict[str, Callable[[pa.DataType], Any]] = {
    "int64": _nullable_int, "Int64": _nullable_int, "boolean": _nullable_bool}
