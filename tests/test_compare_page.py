"""`gpudiag compare -o diff.html` reads like the terminal: the same tables in the same words
(`reports/compare/text.py` formats both), no column names, raw deltas or scientific
notation, and a figure of each run's waterfall; peak memory rows say what they measure."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import gpudiag
from gpudiag.analyzers.compare import Comparison, compare
from gpudiag.cli import cli
from gpudiag.reports.compare import text as compare_text
from gpudiag.reports.compare.figures import runs_waterfall
from tests.conftest import fixture

ROOT = Path(__file__).resolve().parents[1]

A = "kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz"
B = "kineto/v100_rank1of2_nccl_profile_memory.json.gz"


@pytest.fixture(scope="module")
def a_and_b() -> Comparison:
    """The two fixtures compared once (each diagnosis takes seconds), as the CLI labels them."""
    return compare([gpudiag.load(fixture(A)), gpudiag.load(fixture(B))],
                   [Path(A).name.split(".")[0], Path(B).name.split(".")[0]])


def _cells(page: str) -> list[str]:
    return [html.unescape(re.sub(r"<wbr>|<[^>]+>", "", cell))
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", page, flags=re.S)]


def test_the_page_shows_the_terminals_words(tmp_path: Path, a_and_b: Comparison) -> None:
    page_path = tmp_path / "diff.html"
    done = CliRunner(env={"COLUMNS": "400"}).invoke(
        cli, ["compare", str(fixture(A)), str(fixture(B)), "-o", str(page_path), "--cdn"])
    assert done.exit_code == 0, done.output
    page = page_path.read_text(encoding="utf-8")
    cells = _cells(page)
    for raw in ("wall_time_ns", "delta:", "rel:", "pp:", "peak_reserved_bytes"):
        assert raw not in page, raw
    assert not [cell for cell in cells if re.search(r"\d[eE][+-]\d", cell)]
    cmp = a_and_b
    text = html.unescape(page.replace("<wbr>", ""))
    for table in compare_text.tables(cmp):
        assert table.title in text
        for row in table.rows:
            for cell in row:
                assert cell.text in cells, cell.text  # the page's text is the terminal's
                assert cell.text in done.output.replace("\n", " ") or len(cell.text) > 30
    assert 'class="num bad"' in page or 'class="num good"' in page  # verdicts are marked
    assert page.count('class="plotly-graph-div') == 0  # figures are drawn from JSON
    assert "Where the GPU time went, run by run" in page


def test_the_runs_waterfall_has_a_bar_per_run_with_the_runs_shares(a_and_b: Comparison) -> None:
    cmp = a_and_b
    labels = list(cmp.labels)
    fig = runs_waterfall(cmp)
    assert fig is not None
    useful = next(trace for trace in fig.data if trace.name == "useful")
    assert list(useful.y) == [f"A: {labels[0]}", f"B: {labels[1]}"]
    assert list(useful.x) == [cmp.shares.at["useful", label] for label in labels]
    totals = pd.DataFrame({t.name: list(t.x) for t in fig.data}).sum(axis=1)
    assert ((totals - 1).abs() < 1e-6).all()  # each bar is its run's whole window


def test_a_profile_runs_resident_peak_is_its_own_row() -> None:
    """A `gpudiag profile` run's meta.json holds the program's peak resident set (1 GB in
    the report that prompted this); the profiler's CPU tensor total (1.88 MiB there) is a
    different number and is labelled as what it is."""
    example = ROOT / "examples/traces/train_loop_sync.pt.trace.json.gz"
    a, b = gpudiag.load(example), gpudiag.load(example)
    a.meta["run"] = {"peak_rss_bytes": 1_000_000_000}
    b.meta["run"] = {"peak_rss_bytes": 1_200_000_000}
    cmp = compare([a, b], ["before", "after"])
    assert cmp.summary.at["peak_rss_bytes", "before"] == 1e9
    assert abs(cmp.summary.at["peak_rss_bytes", "rel:after"] - 0.2) < 1e-9
    rows = {row[0].text: row for row in compare_text.summary(cmp).rows}
    assert rows["peak resident memory (program)"][1].text == "954 MiB"
    assert rows["peak resident memory (program)"][3].verdict == -1  # more memory: worse
    assert "peak CPU tensor memory (profiler)" in rows
