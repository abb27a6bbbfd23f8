"""Hostile run and saved-trace directories: reading never writes outside gpudiag's own cache,
and a tampered directory is one line and exit status 2, never an internal error.

Every input is built here: a run directory as `gpudiag profile` leaves it (run meta.json,
one process with a CUPTI chunk, no merged trace), and a saved trace whose meta.json and
Parquet files are then replaced value by value.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.readers import run_dir as gather
from gpudiag.schema import TABLE_NAMES, TABLES
from gpudiag.trace_meta import META
from tests.builders import kernel, sync, trace
from tests.conftest import cli_status, subject_to_file_modes


def _run_dir(root: Path) -> Path:
    """An unmerged run directory: the session's meta.json and one process with kernels."""
    run = root / "run"
    proc = run / "procs" / "h-7-rank0"
    proc.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"command": ["python", "train.py"],
                                               "options": {"backend": "cupti"}}))
    gpudiag.Trace(meta={"rank": 0, "process": {"pid": 7, "host": "h", "collectors": [
        "host", "cupti"]}}).save(proc)
    trace(kernels=[kernel(1_000, 2_000), kernel(3_000, 4_000)]).save(proc / "cupti" / "chunk-0")
    return run


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_symlinked_trace_in_a_run_directory_is_never_written_through(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run / "trace").symlink_to(outside, target_is_directory=True)
    for _ in range(2):
        loaded = gpudiag.load(run)
        assert len(loaded.kernels) == 2
        assert _files(outside) == []  # nothing written through the link
    assert (run / "trace").is_symlink()
    assert any("not saved" in kind for kind in loaded.meta["warnings"])


def test_a_symlinked_trace_file_inside_the_cache_is_not_followed(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (run / "trace").mkdir()
    (run / "trace" / "kernels.parquet").symlink_to(victim)  # not a file save wrote
    assert len(gpudiag.load(run).kernels) == 2
    assert victim.read_text() == "keep"


def test_an_unmerged_run_directory_is_cached_once_in_a_real_directory(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    assert len(gpudiag.load(run).kernels) == 2
    cache = run / "trace"
    assert cache.is_dir() and not cache.is_symlink()
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["meta.json", *(f"{n}.parquet" for n in TABLE_NAMES)])
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert len(gpudiag.load(run).kernels) == 2  # read from the cache


def test_a_read_only_run_directory_is_read_in_memory(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_dir(tmp_path)
    before = _files(run)

    def read_only(*args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(gather.tempfile, "mkdtemp", read_only)  # as root chmod cannot
    loaded = gpudiag.load(run)
    assert len(loaded.kernels) == 2 and _files(run) == before


def test_a_chmod_read_only_run_directory_is_read(tmp_path: Path) -> None:
    """Read subject to file modes (as root too: `subject_to_file_modes`)."""
    run = _run_dir(tmp_path)
    run.chmod(0o555)
    try:
        done = subprocess.run(
            [*subject_to_file_modes(), sys.executable, "-c",
             "import sys, gpudiag; print(len(gpudiag.load(sys.argv[1]).kernels))", str(run)],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr
        assert not (run / "trace").exists()
    finally:
        run.chmod(0o755)


# -- tampered saved traces --------------------------------------------------------------


def _saved(root: Path) -> Path:
    out = root / "saved"
    meta = {"rank": 0, "world_size": 2, "vendor": "nvidia", "backend": "cupti",
            "command": ["python", "train.py"], "tool_versions": {"cupti": "12"},
            "processes": [{"pid": 7, "host": "h", "rank": 0, "collectors": ["host"],
                           "start_ns": 0, "end_ns": 10_000}],
            "run": {"command": ["python", "train.py"], "options": {"backend": "cupti"}},
            "sources": [{"path": "rank0.json", "format": "kineto", "bytes": 10}],
            "warnings": {"kernels with negative duration clipped": 1}, "ranks": [0],
            "hosts": ["h"], "skipped": [], "unreadable": [], "trace_name": "t"}
    trace(kernels=[kernel(1_000, 2_000), kernel(5_000, 6_000)],
          syncs=[sync(2_100, 4_900)], meta=meta).save(out)
    return out




JUNK: list[Any] = [None, 7, -1.5, "x", True, [], {}, [1, "a", None], {"a": [1]}, 10**30,
                   [{"a": 1}]]


@pytest.mark.parametrize("key", sorted(META))
def test_junk_meta_values_are_one_line_errors(key: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    base = json.loads((saved / "meta.json").read_text())
    for value in JUNK:
        (saved / "meta.json").write_text(json.dumps({**base, key: value}))
        for args in (["analyze", str(saved)], ["report", str(saved), "-o",
                                                 str(tmp_path / "r.html")]):
            status = cli_status(*args)
            err = capsys.readouterr().err
            assert status in (0, 2), f"{key}={value!r}: {err}"
            if status == 2:
                assert len(err.strip().splitlines()) == 1 and "meta.json" in err


@pytest.mark.parametrize("document", ["[" * 100_000 + "]" * 100_000,
                                      '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_a_meta_json_nested_100000_deep_is_refused_in_one_line(
        document: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    (saved / "meta.json").write_text(document)
    with pytest.raises(InputError, match="nested deeper"):
        gpudiag.load(saved)
    assert cli_status("analyze", str(saved)) == 2
    assert "nested deeper" in capsys.readouterr().err


def test_bad_format_version_and_constants_are_one_line(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    base = json.loads((saved / "meta.json").read_text())
    for version in ("2", [], None, 1.5):
        (saved / "meta.json").write_text(json.dumps({**base, "gpudiag_format_version": version}))
        with pytest.raises(InputError, match="format"):
            gpudiag.load(saved)
    (saved / "meta.json").write_text(json.dumps(base)[:-1] + ', "x": NaN}')
    with pytest.raises(InputError, match=r"unreadable meta\.json"):
        gpudiag.load(saved)


def _other_schemas(name: str) -> dict[str, pd.DataFrame]:
    """Parquet tables that another program (or a hand) could leave under our file names."""
    good = TABLES[name].empty()
    cols = TABLES[name].names
    int_col = next((c.name for c in TABLES[name].columns if c.dtype == "int64"), cols[0])
    return {
        "another program's columns": pd.DataFrame({"foo": [1, 2], "bar": ["a", "b"]}),
        "a column missing": pd.DataFrame({c: good[c] for c in cols[1:]}),
        "text where numbers belong": pd.DataFrame({int_col: ["not", "numbers"]}),
        "floats with NaN for a required int": pd.DataFrame({int_col: [1.0, float("nan")]}),
        "an undeclared column": good.assign(extra=pd.Series(dtype="float64")),
        "no columns": pd.DataFrame(index=range(3)),
    }


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_parquet_tables_of_another_schema_are_one_line_errors(
        table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    for why, frame in _other_schemas(table).items():
        frame.to_parquet(saved / f"{table}.parquet", index=False)
        try:
            gpudiag.load(saved)
        except InputError as exc:
            assert f"{table}.parquet" in str(exc), why
        status = cli_status("analyze", str(saved))
        err = capsys.readouterr().err
        assert status in (0, 2), f"{table}, {why}: {err}"


def test_rows_that_end_before_they_start_are_refused(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    kernels = pd.read_parquet(saved / "kernels.parquet")
    kernels["end_ns"] = kernels["start_ns"] - 1
    kernels.to_parquet(saved / "kernels.parquet", index=False)
    with pytest.raises(InputError, match=r"kernels\.parquet.*end before they start"):
        gpudiag.load(saved)
