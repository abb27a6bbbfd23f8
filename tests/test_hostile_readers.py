"""Hostile input for the pickle, nsys and ncu readers: every one a one-line InputError, fast,
without running code, writing through a planted symlink or hanging (issue 12)."""

from __future__ import annotations

import copyreg
import io
import json
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.readers.files import read_bytes, read_head
from gpudiag.readers.ncu import reader as ncu
from gpudiag.readers.ncu.metrics import MetricRows
from gpudiag.readers.nsys import export as nsys_export
from gpudiag.readers.nsys import reader as nsys
from gpudiag.readers.nsys import schema as nsys_schema
from gpudiag.readers.torch_memory import reader as torch_memory
from gpudiag.readers.torch_memory.unpickler import load_plain
from tests.builders import KinetoTrace
from tests.conftest import fixture
from tests.test_ncu import KINDS, FakeAction, FakeMetric
from tests.test_nsys import export_2023

# -- torch memory snapshots ----------------------------------------------------------------

CALLS: list[object] = []
EXT_CODE = 0xF1  # an EXT1 code no stdlib module registers


def record_call(*args: object) -> str:
    """Stands in for os.system: what a crafted extension pickle would call."""
    CALLS.append(args)
    return "called"


def _extension_pickle() -> bytes:
    """PROTO 2; EXT1 code; ('echo pwned',) ; REDUCE; STOP: calls the registered callable."""
    return b"\x80\x02\x82" + bytes([EXT_CODE]) + b"X\x0a\x00\x00\x00echo pwned\x85R."


@pytest.fixture
def cached_extension():
    """`record_call` registered as an extension and already resolved (cached) in-process."""
    copyreg.add_extension(__name__, "record_call", EXT_CODE)
    try:
        assert pickle.loads(_extension_pickle()) == "called"  # fills copyreg's cache
        assert copyreg._extension_cache  # the state the hole needs
        CALLS.clear()
        yield
    finally:
        copyreg.remove_extension(__name__, "record_call", EXT_CODE)
        CALLS.clear()


def test_cached_extension_opcode_is_refused_without_calling(
        tmp_path: Path, cached_extension: None) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_extension_pickle())
    with pytest.raises(InputError, match="extension code 241") as info:
        load_plain(path)
    assert not CALLS and str(path) in str(info.value) and "\n" not in str(info.value)


def test_registered_but_uncached_extension_is_refused_by_find_class(tmp_path: Path) -> None:
    copyreg.add_extension(__name__, "record_call", EXT_CODE)
    try:
        path = tmp_path / "snapshot.pickle"
        path.write_bytes(_extension_pickle())
        with pytest.raises(InputError, match="carries code"):
            load_plain(path)
        assert not CALLS
    finally:
        copyreg.remove_extension(__name__, "record_call", EXT_CODE)


def _shared_snapshot(k: int) -> bytes:
    """k segments that are one segment of k blocks that are one block: k*k blocks, O(k) bytes."""
    block = {"size": 512, "state": "active_allocated", "address": 0}
    segment = {"blocks": [block] * k, "segment_type": "large", "address": 0}
    return pickle.dumps({"segments": [segment] * k, "device_traces": []}, protocol=4)


def test_shared_references_are_bounded_by_the_row_budget(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_shared_snapshot(40_000))  # 1.6e9 blocks, as in the issue
    assert path.stat().st_size < 200_000
    start = time.perf_counter()
    with pytest.raises(InputError, match="GPUDIAG_MAX_SNAPSHOT_ROWS") as info:
        torch_memory.read_snapshot(path)
    assert time.perf_counter() - start < 5
    assert "10,000,000" in str(info.value) and "max_rows" in str(info.value)


def test_row_budget_is_raised_by_keyword_or_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_shared_snapshot(30))  # 900 blocks
    assert len(torch_memory.read_snapshot(path).memory_blocks) == 900
    with pytest.raises(InputError, match="more than 100 "):
        torch_memory.read_snapshot(path, max_rows=100)
    monkeypatch.setenv("GPUDIAG_MAX_SNAPSHOT_ROWS", "100")
    with pytest.raises(InputError, match="more than 100 "):
        torch_memory.read_snapshot(path)
    assert len(torch_memory.read_snapshot(path, max_rows=900).memory_blocks) == 900


# -- files that are not regular files --------------------------------------------------------


def _kineto_bytes() -> bytes:
    kt = KinetoTrace()
    kt.kernel("k", ts=20, dur=5, correlation=kt.launch(ts=10))
    return json.dumps(kt.document()).encode()


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _with_deadline(call: Callable[[], object], seconds: float = 10) -> object:
    """Run `call` in a thread and fail (instead of hanging the suite) past `seconds`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_given_as_the_profile_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "trace.json")
    with pytest.raises(InputError, match=r"is not a regular file \(a FIFO\)") as info:
        _with_deadline(lambda: gpudiag.load(fifo))
    assert str(fifo) in str(info.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["meta.json", "rank1.pt.trace.json"])
def test_fifo_inside_a_profile_folder_is_skipped_with_a_reason(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0.pt.trace.json").write_bytes(_kineto_bytes())
    _fifo(folder / name)
    trace = _with_deadline(lambda: gpudiag.load(folder))
    assert len(trace.kernels) == 1  # type: ignore[attr-defined]
    skipped = trace.meta["skipped"]  # type: ignore[attr-defined]
    assert any(name in s and "not a regular file (a FIFO)" in s for s in skipped)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_on_the_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "snapshot.pickle")
    result = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(fifo)],
                            capture_output=True, text=True, timeout=60, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "not a regular file (a FIFO)" in lines[0] and str(fifo) in lines[0]


def test_special_files_are_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not a regular file \(a directory\)"):
        read_head(tmp_path)
    if Path("/dev/zero").exists():  # endless: read_bytes would never finish
        with pytest.raises(InputError, match="character device"):
            read_bytes(Path("/dev/zero"))


# -- nsys reports: export never writes through a planted path --------------------------------

FAKE_NSYS = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "NVIDIA Nsight Systems version 2024.5.1"; exit 0; fi
out=""; prev=""
for arg in "$@"; do
  if [ "$prev" = "--output" ]; then out="$arg"; fi
  prev="$arg"
done
echo "$out" >> "$FAKE_NSYS_LOG"
printf 'written by nsys export' > "$out"
"""


@pytest.fixture
def writing_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `nsys` on PATH that writes a few bytes to its --output; returns its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(FAKE_NSYS)
    (bin_dir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "nsys.log"))
    return tmp_path / "nsys.log"


def test_nsys_export_never_writes_through_a_planted_symlink(
        tmp_path: Path, writing_nsys: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "evil.nsys-rep").write_bytes(b"not really a report")
    (folder / "evil.sqlite").symlink_to(victim)
    with pytest.raises(InputError, match=r"not an Nsight Systems export|damaged"):
        nsys.read_report(folder / "evil.nsys-rep")
    assert victim.read_text() == "precious"
    assert (folder / "evil.sqlite").is_symlink()  # left alone, not replaced
    out = Path(writing_nsys.read_text().split()[0])
    assert out != folder / "evil.sqlite" and not out.parent.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["evil.nsys-rep", "evil.sqlite"]


def test_nsys_export_replaces_a_stale_regular_export_by_rename(
        tmp_path: Path, writing_nsys: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    report = folder / "run.nsys-rep"
    report.write_bytes(b"report")
    stale = folder / "run.sqlite"
    stale.write_text("old")
    os.utime(stale, (report.stat().st_mtime - 60,) * 2)
    linked = tmp_path / "hardlink-to-old"
    os.link(stale, linked)  # a write into the old inode would show here
    with nsys_export.exported(report) as (path, info):
        assert path == stale and path.read_text() == "written by nsys export"
        assert info["export"] == str(stale)
    assert linked.read_text() == "old"
    assert sorted(p.name for p in folder.iterdir()) == ["run.nsys-rep", "run.sqlite"]


# -- nsys exports: views, runaway queries, values of the wrong type ------------------------

K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r"


def _mutated_export(tmp_path: Path, script: str) -> Path:
    path = export_2023(tmp_path / "report.sqlite")
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("script", [
    f'ALTER TABLE {K} RENAME TO k2; CREATE VIEW {K} AS SELECT x AS start, x AS "end" '
    f"FROM ({ENDLESS})",
    f"ALTER TABLE {R} RENAME TO r2; CREATE VIEW {R} AS SELECT a.* FROM r2 a, r2 b, r2 c, r2 d, "
    "r2 e, r2 f, r2 g, r2 h, r2 i, r2 j",
], ids=["endless recursive kernel view", "cross-joined runtime view"])
def test_views_are_not_read_as_tables(tmp_path: Path, script: str) -> None:
    path = _mutated_export(tmp_path, script)
    start = time.perf_counter()
    trace = nsys.read_sqlite(path)
    assert time.perf_counter() - start < 10
    trace.validate()
    assert len(trace.kernels) == 0 if K in script else len(trace.api) == 0


def test_a_query_past_its_time_budget_is_an_input_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDIAG_NSYS_QUERY_SECONDS", "0.3")
    path = export_2023(tmp_path / "report.sqlite")
    start = time.perf_counter()
    with (pytest.raises(InputError, match="GPUDIAG_NSYS_QUERY_SECONDS") as info,
          nsys.open_export(path) as con):
        nsys_schema.Export(con).query(f"SELECT count(*) FROM ({ENDLESS})")
    assert time.perf_counter() - start < 5
    assert "more than 0.3 s" in str(info.value) and str(path) in str(info.value)


TYPE_CONFUSIONS = {
    "text start": f"UPDATE {K} SET start = 'soon' WHERE rowid = 1",
    "blob end": f"UPDATE {K} SET \"end\" = x'0102' WHERE rowid = 1",
    "text grid": f"UPDATE {K} SET gridX = 'wide' WHERE rowid = 1",
    "blob device": f"UPDATE {K} SET deviceId = x'00' WHERE rowid = 1",
    "real past int64": f"UPDATE {K} SET start = 1e300 WHERE rowid = 1",
    "text name ids": f"UPDATE {K} SET demangledName = 'x', shortName = 'y' WHERE rowid = 1",
    "blob correlation": f"UPDATE {R} SET correlationId = x'01' WHERE rowid = 1",
    "text thread id": f"UPDATE {R} SET globalTid = 'main' WHERE rowid = 1",
    "blob string": "UPDATE StringIds SET value = x'ff00', id = 'one' WHERE id = 1",
    "text gpu limits": "UPDATE TARGET_INFO_GPU SET smCount = 'many', computeMajor = x'01'",
}


@pytest.mark.parametrize("case", TYPE_CONFUSIONS)
def test_values_of_the_wrong_type_read_as_missing(tmp_path: Path, case: str) -> None:
    trace = nsys.read_sqlite(_mutated_export(tmp_path, TYPE_CONFUSIONS[case]))
    trace.validate()
    assert len(trace.kernels) >= 1


@pytest.mark.parametrize("offset", range(0, 100, 7))
def test_a_flipped_byte_in_the_header_or_schema_is_one_line(tmp_path: Path, offset: int) -> None:
    path = export_2023(tmp_path / "report.sqlite")
    data = bytearray(path.read_bytes())
    schema = data.index(b"CREATE TABLE")
    for at in (offset, schema + offset * 3):
        flipped = bytearray(data)
        flipped[at] ^= 0x41
        path.write_bytes(bytes(flipped))
        try:
            nsys.read_sqlite(path).validate()
        except InputError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)


# -- ncu reports: ncu_report runs in a child process ----------------------------------------

FAKE_NCU_REPORT = '''"""A stand-in ncu_report whose load_report does what the test names."""
import os, sys, time

class IMetric:
    ValueKind_STRING, ValueKind_UINT32, ValueKind_UINT64 = 1, 2, 3
    ValueKind_FLOAT, ValueKind_DOUBLE = 4, 5

class Context:
    def num_ranges(self):
        raise RuntimeError("std::bad_alloc in RangeImpl")

def load_report(path):
    mode = os.environ["FAKE_NCU_MODE"]
    if mode == "abort":
        os.write(2, b"F0000 protobuf.cc:12] Check failed: size >= 0\\n")
        os.abort()
    if mode == "segv":
        os.kill(os.getpid(), 11)
    if mode == "raise":
        return Context()
    if mode == "hang":
        time.sleep(60)
    return None
'''


@pytest.fixture
def fake_ncu_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A report file and, first on the child's PYTHONPATH, a fake ncu_report module."""
    folder = tmp_path / "fake_modules"
    folder.mkdir()
    (folder / "ncu_report.py").write_text(FAKE_NCU_REPORT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    report = tmp_path / "kernels.ncu-rep"
    report.write_bytes(b"NVR\0" + bytes(64))
    return report


@pytest.mark.parametrize(("mode", "said"), [
    ("abort", r"made ncu_report crash \(SIGABRT\) while reading it: .*Check failed"),
    ("segv", r"made ncu_report crash \(SIGSEGV\)"),
    ("raise", r"made ncu_report fail while reading it \(RuntimeError: std::bad_alloc"),
    ("none", "cannot be opened by ncu_report"),
])
def test_a_native_crash_in_ncu_report_is_one_line(
        fake_ncu_report: Path, monkeypatch: pytest.MonkeyPatch, mode: str, said: str) -> None:
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    with pytest.raises(InputError, match=said) as info:
        ncu.read(fake_ncu_report)
    assert info.value.path == str(fake_ncu_report) and info.value.fix
    assert "\n" not in str(info.value)


def test_a_hanging_ncu_report_is_stopped_at_the_budget(
        fake_ncu_report: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("GPUDIAG_NCU_SECONDS", "3")
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"within 3 s.*GPUDIAG_NCU_SECONDS"):
        ncu.read(fake_ncu_report)
    assert time.perf_counter() - start < 30


def test_the_cli_survives_an_aborting_ncu_report(
        fake_ncu_report: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NCU_MODE", "abort")
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(fake_ncu_report)],
                          capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "SIGABRT" in lines[0] and str(fake_ncu_report) in lines[0]


def test_reading_in_a_child_gives_the_same_trace(tmp_path: Path) -> None:
    pytest.importorskip("ncu_report")
    report = fixture("ncu/rtx3050laptop_filter_nvtx.ncu-rep")
    here = ncu.read(report, isolated=False)
    there = ncu.read(report)
    for name, frame in here.tables().items():
        pd.testing.assert_frame_equal(frame, there.tables()[name], check_categorical=False)
    assert there.meta == here.meta


class _GappyAction(FakeAction):
    """An action of a damaged report: it lists a name it then has no metric for."""

    def metric_names(self) -> tuple[str, ...]:
        return (*self.metrics, "ghost__metric.sum")


def test_damaged_metric_names_and_text_are_left_out_or_cleaned() -> None:
    """What three 1-bit flips of a real report gave: a listed metric that metric_by_name
    returns None for, a name SWIG refuses back (non-ASCII), text with lone surrogates."""
    action = _GappyAction({
        "sm__throughput.avg": FakeMetric(12.5, unit="%"),
        "dram__by\udcfftes.sum": FakeMetric(1.0),
        "device__attribute_display_name": FakeMetric("RTX \udcee4090"),
    })
    rows = MetricRows(KINDS)
    rows.add(0, action)
    frame = rows.frame(["k"], [0])
    assert rows.skipped == 2
    assert frame["metric"].tolist() == ["sm__throughput.avg", "device__attribute_display_name"]
    assert frame["text"].tolist()[1] == "RTX \ufffd4090"
    frame.to_parquet(io.BytesIO())  # what the child process hands back must be writable


def test_a_real_report_with_one_flipped_bit_that_aborts_ncu_report(tmp_path: Path) -> None:
    """Bit 2 of byte 9111 of this report makes ncu_report 2026 abort (exit 134 in-process)."""
    pytest.importorskip("ncu_report")
    data = bytearray(fixture("ncu/rtx3050laptop_filter_nvtx.ncu-rep").read_bytes())
    data[9111] ^= 1 << 2
    path = tmp_path / "flipped.ncu-rep"
    path.write_bytes(bytes(data))
    try:
        trace = ncu.read(path)
    except InputError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
    else:  # another ncu_report release may read it: then it must be a valid trace
        trace.validate()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("reader", [nsys.read_sqlite, nsys.read_report, ncu.read,
                                    torch_memory.read_snapshot])
def test_readers_called_directly_refuse_a_fifo(tmp_path: Path, reader: Callable[..., Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    fifo = _fifo(tmp_path / "profile")
    with pytest.raises(InputError, match=r"not a regular file \(a FIFO\)"):
        _with_deadline(lambda: reader(fifo))


def test_the_ncu_child_imports_nothing_from_the_working_folder(
        fake_ncu_report: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's folder holding an ncu_report.py must not be imported by the child."""
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "ncu_report.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\n" + FAKE_NCU_REPORT)
    monkeypatch.chdir(planted)
    monkeypatch.setenv("FAKE_NCU_MODE", "none")
    with pytest.raises(InputError, match="cannot be opened by ncu_report"):
        ncu.read(fake_ncu_report)
    assert not (tmp_path / "ran").exists()
