"""Injection through every text surface: kernel, op and NVTX-style names that close a
script, carry an `onerror`, look like a template, hold control characters, a right-to-left
override or a line separator, start like a spreadsheet formula, or run to a megabyte. The
report and heatmap pages and the terminal show them as inert, visible text of bounded
size; the Perfetto trace keeps them whole as printable JSON strings; CSV keeps them as they
were, a formula made text with a leading `'`. The trace is built here.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.builders import KinetoTrace
from tests.conftest import cli_status

LONG = "L" * 1_000_000
NAMES = ["</script><script>alert(1)</script>", '<img src=x onerror="alert(2)">',
         "{{7*7}}${7*7}", "ctl\x00\x01\x1b[31m\x07\x7f\x9b", "rtl\u202egpj.exe",
         "=HYPERLINK(\"http://evil.example\")", "line\u2028sep", LONG]
#: characters that must never reach a page or a terminal as themselves
RAW = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kt = KinetoTrace()
    for i, name in enumerate(NAMES):
        ts = 10.0 + 100 * i
        kt.annotation(name, ts=ts, dur=60)
        kt.op(name, ts=ts, dur=30)
        kt.kernel(name, ts=ts + 10, dur=5, correlation=kt.launch(ts=ts + 1))
        kt.cuda_sync("stream", ts=ts + 12, dur=20, correlation=kt.launch(ts=ts + 11))
    return kt.write(tmp_path_factory.mktemp("hostile") / "t.json")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    status = cli_status(*args)
    out, err = capsys.readouterr()
    assert status == 0, err
    return out + err


@pytest.mark.parametrize("command", ["report", "heatmap"])
def test_pages_show_hostile_names_as_bounded_inert_text(
        command: str, hostile: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.html"
    _run(capsys, command, str(hostile), "-o", str(page), "--cdn")  # no plotly.js inlined
    text = page.read_text(encoding="utf-8")
    assert len(text) < 2_000_000  # a 1 MB name is cut to 4 KB wherever it is shown
    assert "<img" not in text and "alert(1)</script>" not in text
    assert text.count("<script") == text.count("</script>")  # only the page's own
    assert not RAW.findall(text)
    if command == "report":
        assert "\\x1b[31m" in text and "\\u202e" in text and "{{7*7}}" in text
        assert "more characters)" in text


def test_the_terminal_shows_hostile_names_as_bounded_text(
        hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    said = _run(capsys, "analyze", str(hostile))
    assert len(said) < 200_000 and not RAW.findall(said.replace("\n", ""))


def test_perfetto_keeps_names_whole_and_printable(hostile: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    _run(capsys, "export", str(hostile), "-o", str(out))
    raw = out.read_text(encoding="utf-8")
    assert not RAW.findall(raw)  # JSON escapes C0; the rest are shown as \\xNN / \\uNNNN
    names = {e["name"] for e in json.loads(raw)["traceEvents"] if e.get("cat") == "kernel"}
    assert {"ctl\\x00\\x01\\x1b[31m\\x07\\x7f\\x9b", "rtl\\u202egpj.exe", "line\\u2028sep",
            LONG, NAMES[0], NAMES[1]} <= names


def test_csv_keeps_names_and_makes_formulas_text(hostile: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "csv"
    _run(capsys, "export", str(hostile), "--format", "csv", "-o", str(out))
    limit = csv.field_size_limit(2 * len(LONG))  # the 1 MB name is one field
    try:
        with (out / "kernels.csv").open(newline="", encoding="utf-8") as handle:
            names = [row["name"] for row in csv.DictReader(handle)]
    finally:
        csv.field_size_limit(limit)
    expected = ["'" + n if n.startswith("=") else n for n in NAMES]
    assert names == expected
