"""Hostile Parquet tables and special files in a saved trace directory: column names and
text that are not UTF-8, bytes where text belongs, dictionary bombs, footers that claim
10**18 rows, and FIFOs, devices, link loops and folders where a table or meta.json belongs.
Each is one line (exit status 2) in bounded time and memory, never an internal error, a
hang or a silently empty table.

Every bad file is made here from a tiny saved trace, with pyarrow or by patching bytes.
"""

from __future__ import annotations

import io
import os
import struct
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpudiag
from gpudiag.errors import InputError
from tests.builders import kernel, trace
from tests.conftest import refused_in_one_line


def _saved(root: Path) -> Path:
    out = root / "saved"
    trace(kernels=[kernel(1_000, 2_000, "gemm"), kernel(5_000, 6_000, "relu")]).save(out)
    return out


def _kernels(saved: Path) -> pa.Table:
    return pq.read_table(saved / "kernels.parquet")


def _both_commands(capsys: pytest.CaptureFixture[str], saved: Path, tmp_path: Path) -> str:
    """`analyze` and `report` each end in the same one line; it is returned."""
    said = refused_in_one_line(capsys, "analyze", str(saved))
    assert refused_in_one_line(capsys, "report", str(saved), "-o", str(tmp_path / "r.html")) == said
    return said


# -- text that is not UTF-8 ---------------------------------------------------------------


def test_a_column_name_that_is_not_utf8_is_one_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    table = _kernels(saved)
    names = [b"grid\xff" if name == "grid_x" else name for name in table.column_names]
    schema = pa.schema([pa.field(name, kind) for name, kind in zip(names, table.schema.types,
                                                                     strict=True)])
    pq.write_table(pa.Table.from_arrays(table.columns, schema=schema), saved / "kernels.parquet")
    said = _both_commands(capsys, saved, tmp_path)
    assert "kernels.parquet" in said and "not UTF-8" in said


def test_column_names_patched_to_bytes_that_are_not_utf8_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    file = saved / "kernels.parquet"
    file.write_bytes(file.read_bytes().replace(b"grid_x", b"grid\xff\xfe"))  # every copy
    assert "not UTF-8" in _both_commands(capsys, saved, tmp_path)


def test_a_binary_column_where_text_belongs_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    table = _kernels(saved)
    at = table.column_names.index("name")
    table = table.set_column(at, "name", pa.array([b"k\xff\xfe", b"ok"], pa.binary()))
    pq.write_table(table, saved / "kernels.parquet")
    said = _both_commands(capsys, saved, tmp_path)
    assert "kernels.name holds binary, not text" in said


def test_text_values_that_are_not_utf8_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    file = saved / "kernels.parquet"
    file.write_bytes(file.read_bytes().replace(b"gemm", b"g\xff\xfem"))
    assert "not UTF-8" in _both_commands(capsys, saved, tmp_path)


def test_a_saved_trace_still_round_trips_exactly(tmp_path: Path) -> None:
    """The checked read gives back what `save` wrote: dtypes, nullable ints, categories."""
    original = trace(kernels=[kernel(1_000, 2_000, "gemm", correlation=2**62),
                              kernel(5_000, 6_000, "relu")])
    original.save(tmp_path / "t")
    loaded = gpudiag.Trace.load_dir(tmp_path / "t")
    for name, frame in original.tables().items():
        got = getattr(loaded, name)
        assert list(got.dtypes.astype(str)) == list(frame.dtypes.astype(str)), name
        assert got.astype(object).fillna(-1).equals(frame.astype(object).fillna(-1)), name


# -- bombs ----------------------------------------------------------------------------------


def _dictionary_bomb(saved: Path, rows: int) -> None:
    """kernels.parquet of `rows` kernels whose name is one 1,000-character string: a few
    KB on disk, dictionary-encoded; read as plain strings it is `rows` kB."""
    columns = {}
    for field in _kernels(saved).schema:
        if field.name == "name":
            columns["name"] = pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(rows, dtype=np.int32)), pa.array(["x" * 1000]))
        elif field.name in ("start_ns", "end_ns", "kernel_id"):
            columns[field.name] = pa.array(np.zeros(rows, dtype=np.int64))
    table = pa.table(columns)  # no pandas metadata: it would be read as plain strings
    pq.write_table(table, saved / "kernels.parquet", compression="zstd")


def test_a_dictionary_bomb_is_refused_before_it_is_decoded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDIAG_MAX_INFLATED_BYTES", str(8 << 20))  # a small floor: quick
    saved = _saved(tmp_path)
    _dictionary_bomb(saved, 200_000)  # ~40 MB once conformed, from a few KB
    assert (saved / "kernels.parquet").stat().st_size < 100_000
    start = time.perf_counter()
    said = refused_in_one_line(capsys, "analyze", str(saved))
    assert time.perf_counter() - start < 10
    assert "claims 200,000 rows" in said and "GPUDIAG_MAX_INFLATION_RATIO" in said
    monkeypatch.setenv("GPUDIAG_MAX_INFLATED_BYTES", str(1 << 30))  # the budget is the line
    assert len(gpudiag.load(saved).kernels) == 200_000


def _claiming_rows(rows: int, claimed: int) -> bytes:
    """A Parquet file of `rows` rows whose footer says it has `claimed` (every varint of
    `rows` in the footer patched: the file's, its row group's and its columns' counts)."""
    def varint(n: int) -> bytes:  # thrift compact: zigzag, 7 bits a byte
        z, out = n << 1, bytearray()
        while z >= 0x80:
            out.append(z & 0x7F | 0x80)
            z >>= 7
        return bytes(out + bytes([z]))

    buffer = io.BytesIO()
    pq.write_table(pa.table({"start_ns": np.zeros(rows, dtype=np.int64),
                             "end_ns": np.zeros(rows, dtype=np.int64)}), buffer)
    raw = buffer.getvalue()
    size = struct.unpack("<I", raw[-8:-4])[0]
    footer = raw[-8 - size:-8]
    assert footer.count(varint(rows)) >= 1
    footer = footer.replace(varint(rows), varint(claimed))
    return raw[:-8 - size] + footer + struct.pack("<I", len(footer)) + b"PAR1"


def test_a_footer_that_claims_a_quintillion_rows_is_refused_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    (saved / "kernels.parquet").write_bytes(_claiming_rows(123_457, 2**60))
    assert pq.read_metadata(saved / "kernels.parquet").num_rows == 2**60
    said = _both_commands(capsys, saved, tmp_path)
    assert "claims 1,152,921,504,606,846,976 rows" in said


# -- special files ----------------------------------------------------------------------------


def _replace(saved: Path, name: str, make: str) -> None:
    path = saved / name
    path.unlink()
    if make == "fifo":
        os.mkfifo(path)
    elif make == "folder":
        path.mkdir()
    elif make == "loop":
        path.symlink_to(path)
    elif make == "dev/zero":
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("make, said", [
    ("fifo", "is not a regular file (a FIFO)"),
    ("dev/zero", "is not a regular file (a character device)"),
    ("loop", "Too many levels of symbolic links"),
    ("folder", "is not a regular file (a directory)"),
])
@pytest.mark.parametrize("name", ["kernels.parquet", "meta.json"])
def test_special_files_in_a_saved_trace_are_one_line(
        name: str, make: str, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    _replace(saved, name, make)
    start = time.perf_counter()
    err = _both_commands(capsys, saved, tmp_path)
    assert time.perf_counter() - start < 20  # never waits on the FIFO
    assert f"{saved / name}: " in err and said in err
    with pytest.raises(InputError, match=said.replace("(", r"\(").replace(")", r"\)")):
        gpudiag.load(saved)


def test_a_missing_table_is_still_an_empty_table(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    (saved / "copies.parquet").unlink()
    assert len(gpudiag.load(saved).kernels) == 2 and gpudiag.load(saved).copies.empty


@pytest.mark.parametrize("part, said", [
    ("meta.json", "unreadable run meta.json (is not a regular file (a FIFO))"),
    ("procs/h-7/meta.json", "unreadable meta.json (is not a regular file (a FIFO))"),
    ("procs/h-7/cupti/chunk-0/kernels.parquet", "is not a regular file (a FIFO)"),
])
def test_fifos_in_a_run_directory_are_one_line(part: str, said: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A run directory as `gpudiag profile` leaves it (never merged), a FIFO in one part:
    said of that part, never read as a folder of profiles nor waited on."""
    run = tmp_path / "run"
    proc = run / "procs" / "h-7"
    proc.mkdir(parents=True)
    (run / "meta.json").write_text('{"command": ["python", "t.py"], "options": {}}')
    gpudiag.Trace(meta={"rank": 0, "process": {"pid": 7, "host": "h"}}).save(proc)
    trace(kernels=[kernel(1_000, 2_000)]).save(proc / "cupti" / "chunk-0")
    (run / part).unlink()
    os.mkfifo(run / part)
    err = refused_in_one_line(capsys, "analyze", str(run))
    assert f"{run / part}: {said}" in err
