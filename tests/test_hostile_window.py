"""Malformed and hostile `--window` patterns: a pattern that does not compile is one line
naming it (exit status 2) for analyze and report, never an internal ArrowInvalid; a
catastrophic-backtracking pattern against 100,000-character range names answers at once
(RE2, once per distinct name). The trace is built here.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from gpudiag.analyzers.window import fullmatch, named_spans
from gpudiag.errors import InputError
from tests.builders import KinetoTrace
from tests.conftest import cli_status

LONG = "a" * 100_000 + "b"


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kt = KinetoTrace()
    for step in range(1, 5):
        ts = 1000.0 * step
        kt.annotation(f"ProfilerStep#{step}", ts=ts, dur=900)
        kt.annotation(LONG if step % 2 else LONG[:-1] + "c", ts=ts + 1, dur=10)
        kt.kernel("gemm", ts=ts + 100, dur=300, correlation=kt.launch(ts=ts + 20))
    return kt.write(tmp_path_factory.mktemp("window") / "t.json")


@pytest.mark.parametrize("spec, said", [
    ("(", "missing )"), ("*", "no argument for repetition operator"), ("[", "missing ]"),
    ("\\", "trailing \\"), ("a{99999999}", "invalid repetition size"),
    ("(?P<x", "invalid named capture group"), ("(?=Profiler)", "invalid perl operator"),
    ("a)|(b", "unexpected )"),
])
def test_a_window_pattern_that_does_not_compile_is_one_line(
        spec: str, said: str, steps: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["analyze", str(steps)], ["report", str(steps), "-o", str(tmp_path / "r.html")]):
        assert cli_status(*args, "--window", spec) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
        assert "--window: no range is named" in err and said in err


def test_backtracking_patterns_against_long_names_answer_at_once(
        steps: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    assert cli_status("analyze", str(steps), "--window", "(a+)+b") == 0
    assert cli_status("analyze", str(steps), "--window", "(a|aa)+$") == 2  # no such name
    assert time.perf_counter() - start < 30
    assert "no range named '(a|aa)+$'" in capsys.readouterr().err


def test_patterns_match_whole_names_once_per_distinct_name() -> None:
    names = pd.Series(["ProfilerStep#1", "ProfilerStep#2", None, "ProfilerStep#12"] * 3,
                      dtype="category")
    assert fullmatch(names, "ProfilerStep#[12]").tolist() == [True, True, False, False] * 3
    assert not fullmatch(names, "Profiler").any()  # the whole name, not a prefix
    ranges = pd.DataFrame({"name": names, "start_ns": range(12), "end_ns": range(1, 13)})
    assert named_spans(ranges, "ProfilerStep#2") == ((1, 10), None)  # exact names first
    assert named_spans(ranges, "ProfilerStep#1.*") == (None, (0, 12))
    with pytest.raises(InputError, match="not a regular expression"):
        named_spans(ranges, "ProfilerStep#(")
