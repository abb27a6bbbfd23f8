"""Text that is not UTF-8 in the input: kernel, NVTX and table names in an nsys SQLite
export, names in a Kineto trace (raw bytes and escaped lone surrogates), and file and folder
names. Each reads (the bad bytes as U+FFFD, counted in meta warnings; a file name's as a
visible `\\xff`) and every command writes its output, or, where SQLite itself cannot parse
the schema, ends in one line, exit status 2.

The exports are copies of ../shared/fixtures/nsys/rtx3090x4_tensorrt_nvtx.sqlite altered
here; the Kineto traces are built here.
"""

from __future__ import annotations

import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest

import gpudiag
from gpudiag.readers.kineto import repair
from gpudiag.readers.nsys.reader import NOT_UTF8
from tests.builders import KinetoTrace
from tests.conftest import cli_status, fixture

REPLACED = "\ufffd"


def _export(tmp_path: Path, *statements: str) -> Path:
    """A copy of the TensorRT export with `statements` run on it (schema writable)."""
    path = tmp_path / "report.sqlite"
    shutil.copy(fixture("nsys/rtx3090x4_tensorrt_nvtx.sqlite"), path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA writable_schema = ON")
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()
    return path


def _commands(path: Path, tmp_path: Path) -> list[list[str]]:
    return [["analyze", str(path)], ["report", str(path), "-o", str(tmp_path / "r.html")],
            ["export", str(path), "-o", str(tmp_path / "t.json.gz")]]


# -- nsys -----------------------------------------------------------------------------------


def test_nsys_kernel_and_nvtx_names_that_are_not_utf8_read_as_replacement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _export(tmp_path,
                   "UPDATE StringIds SET value = CAST(X'73366d5f78ff6d6d61' AS TEXT) "
                   "WHERE id = 130",  # a kernel's demangled name: s6m_x\xffmma
                   "UPDATE StringIds SET value = CAST(X'6f6e6e783a3aff' AS TEXT) "
                   "WHERE id = 71")  # an NVTX range: onnx::\xff
    trace = gpudiag.load(path)
    assert f"s6m_x{REPLACED}mma" in set(trace.kernels["name"].astype(str))
    assert f"onnx::{REPLACED}" in set(trace.ranges["name"].astype(str))
    assert trace.meta["warnings"][NOT_UTF8] == 2
    for args in _commands(path, tmp_path):
        assert cli_status(*args) == 0, capsys.readouterr().err


def test_nsys_table_and_column_names_that_are_not_utf8_read(tmp_path: Path) -> None:
    path = _export(
        tmp_path,
        "UPDATE sqlite_master SET name = CAST(X'5343484544ff' AS TEXT), "
        "tbl_name = CAST(X'5343484544ff' AS TEXT), "
        "sql = replace(sql, 'SCHED_EVENTS', CAST(X'5343484544ff' AS TEXT)) "
        "WHERE name = 'SCHED_EVENTS'",
        "UPDATE sqlite_master SET sql = replace(sql, 'registersPerThread', "
        "CAST(X'7265676973746572ff' AS TEXT)) WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'")
    trace = gpudiag.load(path)
    assert len(trace.kernels) == 36 and trace.kernels["regs_per_thread"].isna().all()
    assert trace.meta["warnings"][NOT_UTF8] >= 2  # the two names, read where they are listed


def test_nsys_schema_sqlite_cannot_parse_and_names_in_bytes_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite's own error then quotes the name in its bytes, which Python cannot decode."""
    path = _export(
        tmp_path,
        "UPDATE sqlite_master SET name = CAST(X'5343484544ff' AS TEXT), "
        "sql = replace(sql, 'SCHED_EVENTS (', CAST(X'5343484544ff2828' AS TEXT)) "
        "WHERE name = 'SCHED_EVENTS'")
    for args in _commands(path, tmp_path):
        assert cli_status(*args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
        assert "report.sqlite: is a damaged SQLite file" in err and "not UTF-8" in err


# -- Kineto -----------------------------------------------------------------------------------


def _kineto(path: Path, names: list[str]) -> bytes:
    kt = KinetoTrace()
    for i, name in enumerate(names):
        ts = 10.0 + 100 * i
        kt.op(name, ts=ts, dur=30)
        kt.kernel(name, ts=ts + 10, dur=5, correlation=kt.launch(ts=ts + 1))
    return kt.write(path).read_bytes()


@pytest.mark.parametrize("written, read, kind", [
    (b"K\xff\xfeAA", f"K{REPLACED}{REPLACED}AA", repair.NOT_UTF8),
    (b"K\xed\xb3\xbfA", f"K{REPLACED * 3}A", repair.NOT_UTF8),  # a surrogate, UTF-8 encoded
    (b"K\\udcffA", f"K{REPLACED}A", repair.SURROGATES),
    (b"K\\ud800A", f"K{REPLACED}A", repair.SURROGATES),
])
def test_kineto_names_that_are_not_valid_text_are_read_and_counted(
        written: bytes, read: str, kind: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    raw = _kineto(path, ["KAAAA", "KPAIR", "KBACK"])
    path.write_bytes(raw.replace(b"KAAAA", written).replace(b"KPAIR", b"K\\ud83d\\ude00 ok")
                     .replace(b"KBACK", b"K\\\\udcff text"))
    trace = gpudiag.load(path)
    names = list(trace.kernels["name"].astype(str))
    assert names == [read, "K\U0001F600 ok", "K\\udcff text"]  # a pair, an escaped backslash
    assert list(trace.meta["warnings"]) == [kind]
    for args in _commands(path, tmp_path):
        assert cli_status(*args) == 0, capsys.readouterr().err


def test_a_trace_that_is_not_json_for_other_reasons_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(_kineto(path, ["K\xff"])[:-3] + b"\xff,,")
    with pytest.raises(gpudiag.InputError, match=r"not valid JSON|truncated"):
        gpudiag.load(path)


# -- torch memory snapshots -----------------------------------------------------------------


def test_snapshot_frames_with_lone_surrogates_read_as_visible_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A pickle's strings may hold lone surrogates (a file name that was not UTF-8), which
    pandas' string dtype and every writer refuse."""
    frames = [{"filename": "/x/tr\udcffain.py", "line": 3, "name": "fw\udcfed"}]
    block = {"size": 1024, "state": "active_allocated", "address": 0, "frames": frames}
    segment = {"device": 0, "address": 0, "total_size": 4096, "stream": 0,
               "segment_type": "large", "blocks": [block]}
    entries = [{"action": "alloc", "addr": 0, "size": 1024, "stream": 0, "time_us": 1,
                "frames": frames}]
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [entries]}))
    trace = gpudiag.load(path)
    assert set(trace.memory["site"].astype(str)) == {"/x/tr\\xffain.py:3 (fw\\xfed)"}
    for args in (["analyze", str(path)], ["report", str(path), "-o", str(tmp_path / "r.html")],
                 ["export", str(path), "--format", "parquet", "-o", str(tmp_path / "pq")]):
        assert cli_status(*args) == 0, capsys.readouterr().err
