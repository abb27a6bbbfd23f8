"""nccl-tests logs with odd numbers: NaN, inf, negative, huge and `N/A` values, lines with
a column missing or cut short, a header alone, binary garbage after the header. Each is
read with the odd lines or measurements counted in meta warnings (the rest analyzed), or,
with nothing left to read, one line naming the file; `analyze` and `report` never raise
an internal error. The logs are the real fixture's header plus rows written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.readers import nccl_tests
from tests.conftest import cli_status, fixture

ROW = ("{s:>12} {c:>12}   float     sum {t1:>8} {a1:>7} {b1:>7}    N/A "
       "{t2:>8} {a2:>7} {b2:>7}    N/A\n")


def _row(s: str = "1024", t1: str = "36.07", t2: str = "35.77", a1: str = "0.03",
         b1: str = "0.05") -> str:
    return ROW.format(s=s, c="256", t1=t1, a1=a1, b1=b1, t2=t2, a2="0.03", b2="0.05")


GOOD = _row("2048", "40.0", "41.0") + _row("4096", "50.0", "52.0")


@pytest.fixture(scope="module")
def header() -> str:
    text = fixture("nccl/a100x8_allreduce_superbench.log").read_text()
    return text.split("hostname:")[0]  # the banner, devices and column heads


def _log(tmp_path: Path, header: str, body: str | bytes) -> Path:
    path = tmp_path / "odd_allreduce.log"
    path.write_bytes(header.encode() + (body if isinstance(body, bytes) else body.encode()))
    return path


def _analyzed(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["analyze", str(path)], ["report", str(path), "-o", str(tmp_path / "r.html")]):
        assert cli_status(*args) == 0, capsys.readouterr().err


@pytest.mark.parametrize("odd, kind", [
    (_row(t1="nan"), nccl_tests.BAD_TIMES), (_row(t1="NaN", t2="-nan"), nccl_tests.BAD_TIMES),
    (_row(t1="inf"), nccl_tests.BAD_TIMES), (_row(t1="-36.07"), nccl_tests.BAD_TIMES),
    (_row(t1="1e300"), nccl_tests.BAD_TIMES), (_row(t1="9" * 40), nccl_tests.BAD_TIMES),
    (_row(t1="N/A"), nccl_tests.BAD_TIMES),
    (_row(s="-1024"), nccl_tests.UNREAD_LINES), (_row(s="9" * 30), nccl_tests.BAD_SIZES),
    (_row(s=str(2**63)), nccl_tests.BAD_SIZES),
    ("        1024   256   float  sum  36.07  0.03\n", nccl_tests.UNREAD_LINES),
])
def test_odd_numbers_are_dropped_counted_and_the_rest_analyzed(
        odd: str, kind: str, header: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path, header, odd + GOOD)
    trace = gpudiag.load(path)
    good = trace.collectives.iloc[-4:]
    assert good["bytes"].tolist() == [2048, 2048, 4096, 4096]
    assert (good["end_ns"] - good["start_ns"]).tolist() == [40_000, 41_000, 50_000, 52_000]
    assert trace.meta["warnings"][kind] >= 1
    assert (trace.collectives["end_ns"] >= trace.collectives["start_ns"]).all()
    _analyzed(path, tmp_path, capsys)


def test_one_bad_time_keeps_the_other_measurement_of_its_line(header: str,
                                                              tmp_path: Path) -> None:
    trace = gpudiag.load(_log(tmp_path, header, _row(t1="N/A", t2="35.0") + GOOD))
    first = trace.collectives.iloc[0]
    assert (first["bytes"], first["end_ns"] - first["start_ns"]) == (1024, 35_000)
    assert str(first["name"]) == "all_reduce in-place"
    assert trace.meta["warnings"] == {nccl_tests.BAD_TIMES: 1}


def test_a_truncated_last_line_and_binary_garbage_are_counted(
        header: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = GOOD.encode() + b"\x00\xff\xfe\x89PNG\r\n" * 200 + b"        8192   2048   float  su"
    path = _log(tmp_path, header, body)
    trace = gpudiag.load(path)
    assert len(trace.collectives) == 4
    assert trace.meta["warnings"] == {nccl_tests.UNREAD_LINES: 1}
    _analyzed(path, tmp_path, capsys)


@pytest.mark.parametrize("body", ["", _row(t1="N/A", t2="N/A"),
                                  bytes(range(256)) * 50])
def test_a_log_with_nothing_left_to_read_is_one_line(
        body: str | bytes, header: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path, header, body)
    with pytest.raises(InputError, match="without any result rows"):
        gpudiag.load(path)
    assert cli_status("analyze", str(path)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{path}: " in err


def test_a_real_log_is_analyzed_from_the_command_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """The collectives alone are something to analyze: the real log, read by the checked
    parser, still reports."""
    path = fixture("nccl/a100x8_allreduce_superbench.log")
    _analyzed(path, tmp_path, capsys)
    assert "collective" in (tmp_path / "r.html").read_text(encoding="utf-8").lower()
