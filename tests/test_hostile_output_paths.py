"""Hostile file names and output paths: input and output names that are not UTF-8 (a
Linux name is bytes; Python spells `\\xff` as the lone surrogate `\\udcff`), and `-o` paths
where a folder, a file, nothing or no permission is in the way. Every command writes its
output (the name shown as `\\xff`) or ends in one line naming the path, exit status 2.

Traces are built here; the names come from `os.fsdecode` of bytes, as click passes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.reports.export import write_chrome_trace, write_tables
from tests.builders import KinetoTrace
from tests.conftest import cli_status, refused_in_one_line, subject_to_file_modes

BAD = os.fsdecode(b"r\xff\xfe")  # 'r\udcff\udcfe'
SHOWN = "r\\xff\\xfe"


def _kineto(path: Path) -> Path:
    kt = KinetoTrace()
    kt.op("forward", ts=10, dur=30)
    kt.kernel("gemm", ts=20, dur=5, correlation=kt.launch(ts=11))
    kt.cuda_sync("stream", ts=22, dur=20, correlation=kt.launch(ts=21))
    return kt.write(path)


def _ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    status = cli_status(*args)
    out, err = capsys.readouterr()
    assert status == 0, err
    return (out + err).replace("\n", "")  # a long temporary path wraps at the terminal width


def test_input_and_output_names_that_are_not_utf8(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _kineto(tmp_path / f"{BAD}.json")
    folder = tmp_path / f"dir{BAD}"
    folder.mkdir()
    _kineto(folder / f"rank0{BAD}.json")
    assert SHOWN in _ok(capsys, "analyze", str(path))
    assert json.loads(_ok(capsys, "analyze", "--json", str(path)))
    for source in (path, folder):
        page = tmp_path / f"page{BAD}.html"
        said = _ok(capsys, "report", str(source), "-o", str(page))
        assert f"wrote {tmp_path}/page{SHOWN}.html" in said and "\udcff" not in said
        assert SHOWN in page.read_text(encoding="utf-8")  # the source, named visibly
    perfetto = tmp_path / f"t{BAD}.json"
    _ok(capsys, "export", str(path), "-o", str(perfetto))
    header = json.loads(perfetto.read_bytes())["otherData"]["gpudiag"]
    assert header["sources"][0]["path"].endswith(f"{SHOWN}.json")
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"{fmt}{BAD}"
        _ok(capsys, "export", str(path), "--format", fmt, "-o", str(out))
        assert (out / f"kernels.{fmt}").is_file()
    with (tmp_path / f"parquet{BAD}" / "kernels.parquet").open("rb") as handle:
        assert list(pd.read_parquet(handle)["name"]) == ["gemm"]
    _ok(capsys, "heatmap", str(path), "-o", str(tmp_path / f"h{BAD}.html"))


def test_meta_json_strings_that_escape_lone_surrogates(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    saved = tmp_path / "saved"
    gpudiag.load(_kineto(tmp_path / "t.json")).save(saved)
    meta = json.loads((saved / "meta.json").read_text())
    meta["trace_name"] = "run\udcff"
    meta["sources"][0]["path"] = "/data/r\udcff.json"
    (saved / "meta.json").write_text(json.dumps(meta))  # ensure_ascii: "\\udcff"
    assert gpudiag.load(saved).meta["trace_name"] == "run\\xff"
    page = tmp_path / "r.html"
    _ok(capsys, "report", str(saved), "-o", str(page))
    assert "/data/r\\xff.json" in page.read_text(encoding="utf-8")
    _ok(capsys, "export", str(saved), "-o", str(tmp_path / "t.json.gz"))


# -- output paths -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, make, said", [
    ("perfetto", "folder", "is a folder, not a file"),
    ("chrome", "folder", "is a folder, not a file"),
    ("csv", "file", "exists and is not a folder"),
    ("parquet", "file", "exists and is not a folder"),
    ("perfetto", "missing parent", "its folder"),
    ("perfetto", "file parent", "part of its path is a file"),
    ("parquet", "file parent", "part of its path is a file"),
    ("csv", "table is a folder", "kernels.csv: is a folder, not a file"),
])
def test_export_outputs_in_the_way_are_one_line(fmt: str, make: str, said: str,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _kineto(tmp_path / "t.json")
    out = tmp_path / "out"
    if make == "folder":
        out.mkdir()
    elif make == "file":
        out.write_text("keep")
    elif make == "missing parent":
        out = tmp_path / "nowhere" / "t.json"
    elif make == "file parent":
        (tmp_path / "afile").write_text("keep")
        out = tmp_path / "afile" / "out"
    elif make == "table is a folder":
        (out / "kernels.csv").mkdir(parents=True)
    err = refused_in_one_line(capsys, "export", str(path), "--format", fmt, "-o", str(out))
    assert said in err and str(tmp_path) in err
    if make == "file":
        assert out.read_text() == "keep"


def test_a_csv_folder_is_made_with_its_parents(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _kineto(tmp_path / "t.json")
    _ok(capsys, "export", str(path), "--format", "csv", "-o", str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b" / "kernels.csv").is_file()


@pytest.mark.parametrize("target", ["/proc/version", "/dev/full", "/proc/gpudiag-out.json"])
def test_an_output_that_cannot_take_bytes_is_one_line(target: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """Places nothing can be written, as root too: /proc refuses new files and bytes
    (EIO), /dev/full has no space."""
    path = _kineto(tmp_path / "t.json")
    for args in (["export", str(path), "-o", target],
                 ["report", str(path), "-o", target]):
        assert f"{target}: cannot be written" in refused_in_one_line(capsys, *args)


def test_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    """Run subject to file modes (as root too: `subject_to_file_modes`)."""
    path = _kineto(tmp_path / "t.json")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    for args in (["export", str(path), "-o", str(locked / "t.json")],
                 ["export", str(path), "--format", "csv", "-o", str(locked / "csv")],
                 ["report", str(path), "-o", str(locked / "r.html")]):
        done = subprocess.run([*subject_to_file_modes(), sys.executable, "-m", "gpudiag",
                               *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Permission denied" in done.stderr and "internal error" not in done.stderr
    assert not any(locked.iterdir())


def test_the_library_raises_input_errors_for_outputs(tmp_path: Path) -> None:
    trace = gpudiag.load(_kineto(tmp_path / "t.json"))
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match="exists and is not a folder"):
        write_tables(trace, tmp_path / "afile")
    with pytest.raises(InputError, match="is a folder, not a file"):
        write_chrome_trace(trace, tmp_path)
