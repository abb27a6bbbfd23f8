"""Bad input: one line naming the file, the problem and the fix; exit status 2; no traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import gpudiag
from gpudiag.errors import InputError
from tests.builders import KinetoTrace
from tests.conftest import ROOT


def _kineto_bytes() -> bytes:
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel("k", ts=20, dur=5, correlation=c)
    return json.dumps(kt.document()).encode()


CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "empty file": ("empty.json", lambda p: p.write_bytes(b""), "empty"),
    "truncated gzip": ("t.json.gz", lambda p: p.write_bytes(gzip.compress(_kineto_bytes())[:-40]),
                       "truncated"),
    "not gzip after magic": ("bad.gz", lambda p: p.write_bytes(b"\x1f\x8b" + b"\0" * 30),
                             "gzip"),
    "truncated json": ("t.json", lambda p: p.write_bytes(_kineto_bytes()[:-100]), "truncated"),
    "invalid json": ("t.json", lambda p: p.write_bytes(b'{"traceEvents": [{"ph": "X"},, {}]}'),
                     "not valid JSON"),
    "json that is not a trace": ("config.json", lambda p: p.write_text('{"lr": 0.1}'),
                                 "not a trace"),
    "json with wrong event types": ("t.json", lambda p: p.write_text('{"traceEvents": 7}'),
                                    "not a Chrome/Kineto trace"),
    "unknown binary": ("blob.bin", lambda p: p.write_bytes(b"\x00\x01\x02GARBAGE" * 10),
                       "not a profile format"),
    "text file": ("notes.txt", lambda p: p.write_text("hello\nworld\n"), "not a profile format"),
}


@pytest.mark.parametrize("case", CASES)
def test_library_raises_input_error_naming_the_file(case: str, tmp_path: Path) -> None:
    name, make, problem = CASES[case]
    path = tmp_path / name
    make(path)
    with pytest.raises(InputError) as info:
        gpudiag.load(path)
    assert str(path) in str(info.value) and problem in str(info.value)


@pytest.mark.parametrize("case", CASES)
def test_cli_prints_one_line_and_exits_2(case: str, tmp_path: Path) -> None:
    name, make, problem = CASES[case]
    path = tmp_path / name
    make(path)
    result = run_cli("analyze", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("gpudiag: error: ") and str(path) in lines[0] and problem in lines[0]


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        gpudiag.load(tmp_path / "nope.json")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "readme.txt").write_text("not a profile")
    with pytest.raises(InputError, match="no profile gpudiag can read"):
        gpudiag.load(tmp_path / "junk")
    with pytest.raises(InputError, match="no input"):
        gpudiag.load([])


def test_trace_without_gpu_or_host_events_loads_but_analyze_refuses(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.python("train.py(3): <module>", ts=10, dur=5)  # no op: nothing to break down
    path = kt.write(tmp_path / "nothing.json")
    assert not gpudiag.load(path).has_gpu_activity()
    result = run_cli("analyze", str(path))
    assert result.returncode == 2 and "no GPU activity and no host events" in result.stderr
    assert "ProfilerActivity.CUDA" in result.stderr and "Traceback" not in result.stderr


def test_cpu_only_trace_is_analyzed_on_the_host_side(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.op("aten::add", ts=10, dur=5)
    path = kt.write(tmp_path / "cpu_only.json")
    result = run_cli("analyze", str(path))
    assert result.returncode == 0, result.stderr


def test_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    result = run_cli("--debug", "analyze", str(path))
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_a_good_file_among_bad_ones_in_a_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_bytes(b"")
    (tmp_path / "rank0.json").write_bytes(_kineto_bytes())
    trace = gpudiag.load(tmp_path)
    assert len(trace.kernels) == 1
    assert len(trace.meta["skipped"]) == 1 and "empty.json" in trace.meta["skipped"][0]
    assert sum(trace.meta["warnings"].values()) == 1


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
