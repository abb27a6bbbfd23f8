"""What a job's diagnosis looks like to its user: `report` and `export` with --workers give
what the merged job gives, and at a thousand ranks the terminal, the figures and the page
stay bounded (bins and cut tables, never a row or a legend entry per rank)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

import gpudiag
from gpudiag.analyzers import run_facts
from gpudiag.cli import cli
from gpudiag.reports import figures, figures_ranks, html_ranks
from gpudiag.reports.build import JOB_NOTE, diagnosis_figures
from gpudiag.reports.html_report import report
from gpudiag.reports.terminal import print_diagnosis
from tests.builders import kernel, trace
from tests.test_jobs import KINETO, shifted_job

US = 1_000
RANKS = 1_024
CALLS = 3


@pytest.fixture(scope="module")
def job3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shifted_job(KINETO / "a100_80gb_rank0of16_nccl_streamsync.json.gz", 3,
                       tmp_path_factory.mktemp("job3"), shift_us=250.0)


def test_report_with_workers_holds_the_merged_findings_and_the_straggler_section(
        job3: Path, tmp_path: Path) -> None:
    page = tmp_path / "job.html"
    done = CliRunner().invoke(cli, ["report", "--workers", "2", str(job3), "-o", str(page)])
    assert done.exit_code == 0, done.output
    html = page.read_text(encoding="utf-8").replace("<wbr>", "")  # long names may break
    merged = gpudiag.diagnose(gpudiag.load(job3))
    for finding in merged.findings["where"].head(5):  # the report escapes its text
        assert _escaped(finding) in html
    assert "Stragglers" in html and _escaped(JOB_NOTE) in html
    assert html.count("plotly.js v") <= 1  # plotly inlined once, whatever the figures


def _escaped(text: str) -> str:
    import html

    return html.escape(text, quote=False)


def test_export_with_workers_writes_the_merged_diagnosis_tables(job3: Path,
                                                                  tmp_path: Path) -> None:
    job, merged = tmp_path / "job", tmp_path / "merged"
    for folder, extra in ((job, ["--workers", "1"]), (merged, [])):
        done = CliRunner().invoke(cli, ["export", "--format", "csv", "-o", str(folder),
                                        *extra, str(job3)])
        assert done.exit_code == 0, done.output
    written = {path.name for path in job.iterdir()}
    assert {"findings.csv", "losses.csv", "late_arrivals.csv", "rank_losses.csv"} <= written
    assert "kernels.csv" not in written  # the events stayed with their ranks
    for name in sorted(written):
        pd.testing.assert_frame_equal(pd.read_csv(job / name), pd.read_csv(merged / name),
                                      obj=name)


def test_a_perfetto_export_with_workers_is_one_clear_line(job3: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpudiag", "export", "--format", "perfetto",
                           "--workers", "2", str(job3)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "--format csv/parquet" in done.stderr


def test_run_facts_of_a_job_s_parts_equal_those_of_the_merged_trace(job3: Path) -> None:
    job = gpudiag.diagnose_job(job3, workers=1, rows=False)
    merged, parts = run_facts.of_trace(gpudiag.load(job3)), run_facts.of_parts(
        job.summary_parts, job.meta)
    assert (parts.window_ns, parts.memory) == (merged.window_ns, merged.memory)
    assert parts.process_time_ns == merged.process_time_ns > 0
    pd.testing.assert_frame_equal(parts.kernels, merged.kernels, check_names=False)
    assert parts.kernels["size"].sum() == len(gpudiag.load(job3 / "rank0.json.gz").kernels) * 3


def test_compare_with_workers_prints_the_merged_comparison(job3: Path, tmp_path: Path) -> None:
    later = shifted_job(KINETO / "a100_80gb_rank0of16_nccl_streamsync.json.gz", 3,
                        tmp_path / "later", shift_us=900.0)
    runs = [str(job3), str(later)]
    merged = CliRunner().invoke(cli, ["compare", "--json", *runs])
    job = CliRunner().invoke(cli, ["compare", "--json", "--workers", "2", *runs])
    assert merged.exit_code == job.exit_code == 0, job.output
    assert json.loads(job.stdout) == json.loads(merged.stdout)
    shares = json.loads(job.stdout)["shares"]
    assert any(row.get("pp:later") for row in shares)  # the later run waits more


def big_job() -> gpudiag.Trace:
    """RANKS ranks, one GPU each, CALLS all_reduces each: rank r arrives (r * 7 % 97) us
    late, so every call's last arriver is known; every rank's kernels fill 2 ms."""
    rng = np.random.default_rng(7)
    kernels, calls = [], []
    for rank in range(RANKS):
        late = rank * 7 % 97
        kernels.append(kernel(0, 600 * US, "gemm", device=0, pid=rank, rank=rank, stream=7))
        for seq in range(CALLS):
            start = (700 + seq * 400 + late) * US
            end = (700 + seq * 400 + 100 + 97) * US
            kernels.append(kernel(start, end, "ncclDevKernel_AllReduce_RING_LL", device=0,
                                  pid=rank, rank=rank, stream=9))
            calls.append({"rank": rank, "pid": rank, "device": 0, "stream": 9,
                          "start_ns": start, "end_ns": end, "op": "all_reduce",
                          "bytes": int(rng.integers(1, 4)) << 20, "dtype": "float",
                          "group_size": RANKS, "comm": "0", "seq": seq,
                          "kernel_id": len(kernels) - 1, "name": "ncclDevKernel_AllReduce"})
    return trace(kernels=kernels, collectives=pd.DataFrame(calls), meta={"world_size": RANKS})


@pytest.fixture(scope="module")
def big() -> gpudiag.Diagnosis:
    return gpudiag.diagnose(big_job())


def test_a_thousand_ranks_blame_the_latest_rank_of_every_call(big: gpudiag.Diagnosis) -> None:
    latest = max(range(RANKS), key=lambda r: (r * 7 % 97, -r))  # ties: the lowest rank
    late = big.tables["late_arrivals"]
    assert late[["rank", "last_calls", "op_calls"]].values.tolist() == [
        [latest, CALLS, CALLS]]
    assert len(big.tables["rank_losses"]) == RANKS


def test_a_thousand_ranks_print_a_bounded_terminal_report(big: gpudiag.Diagnosis) -> None:
    console = Console(record=True, width=120, force_terminal=False)
    print_diagnosis(json.loads(json.dumps(big.to_dict(), default=str)), console)
    text = console.export_text()
    assert len(text.splitlines()) < 150  # a job total, ten ranks, late arrivals, findings
    assert "more" in text  # the cut says how many it left out


def test_a_thousand_ranks_draw_bounded_figures(big: gpudiag.Diagnosis) -> None:
    figs = diagnosis_figures(big)
    assert "waterfall" not in figs  # a bar per device would be 1,024 bars
    ranks = figs["rank_causes"]
    useful, lost = ranks.data
    assert len(useful.y) == len(lost.y) == figures_ranks.MAX_ROWS and "1,024 ranks in bins" in (
        ranks.layout.title.text)
    assert not ranks.layout.showlegend
    waits = figures.collective_waits(big)
    assert waits is not None and len(waits.data[0].y) == 64
    # a bin's shares stay shares: weighted by window, they sum to one
    shares = np.hstack([np.asarray(useful.z, dtype=float), np.asarray(lost.z, dtype=float)])
    assert np.allclose(np.nansum(shares, axis=1), 1.0)


def test_useful_time_has_its_own_scale_in_the_rank_heatmap(big: gpudiag.Diagnosis) -> None:
    """A rank that is 95% useful must not look as hot as one that lost 95%: useful is
    drawn on a green scale, the lost causes on a red one."""
    useful, lost = figures_ranks.rank_causes(big).data
    assert list(useful.x) == ["useful"] and "useful" not in list(lost.x)
    assert useful.colorscale != lost.colorscale
    assert useful.colorscale[-1][1].lower() != lost.colorscale[-1][1].lower()


def test_a_thousand_ranks_give_a_page_with_cut_tables(big: gpudiag.Diagnosis) -> None:
    section = html_ranks.stragglers(big, [])
    assert section is not None
    rows = sum(len(table.frame) for table in section.tables)
    assert rows <= 3 * html_ranks.TOP_ROWS
    assert any("of 1,024 rows" in note for note in section.notes)


def test_the_job_report_page_of_a_thousand_ranks_stays_small(big: gpudiag.Diagnosis) -> None:
    html = report(gpudiag.Trace(meta={"world_size": RANKS}), big,
                  figures=diagnosis_figures(big), cdn=True)
    assert len(html) < 2_000_000, len(html)
