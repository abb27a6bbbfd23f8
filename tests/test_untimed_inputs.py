"""Every input the README lists is analyzed, not refused: an nccl-tests log and a torch
memory timeline hold no kernels on a timeline, so their own numbers are the answer (the
bandwidth by message size; the allocator's peaks), in the terminal, --json and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag.cli import cli
from tests.conftest import fixture

WIDE = {"COLUMNS": "200"}


@pytest.mark.parametrize("extra", [[], ["--workers", "1"]])
def test_nccl_tests_log_shows_its_bandwidth_by_size(extra: list[str]) -> None:
    """superbench's 8x A100 all_reduce_perf log: 33 sizes (0 B, then 4 B to 8 GiB), the
    last at 235 GB/s busbw in the log's own table; the terminal lists each size and names
    that peak."""
    log = str(fixture("nccl/a100x8_allreduce_superbench.log"))
    done = CliRunner(env=WIDE).invoke(cli, ["analyze", log, *extra])
    assert done.exit_code == 0, done.output
    assert "Collectives: bandwidth by message size" in done.output
    assert "peak busbw 235 GB/s (all_reduce, 8 GiB)" in done.output
    assert "each message size's mean time, as nccl-tests reports it" in done.output
    assert "replayed one by one" not in done.output  # that is Nsight Compute's reason
    data = json.loads(CliRunner().invoke(cli, ["analyze", log, "--json", *extra]).output)
    sizes = data["diagnosis"]["collectives"]
    assert len(sizes) == 33 and sizes[-1]["bytes"] == 8 * 2**30
    assert round(sizes[-1]["busbw_gbps"]) == 235


def test_memory_timeline_shows_its_peak() -> None:
    """HTA's export_memory_timeline file: allocated memory rises to 2.87 GiB five times
    (one per step); reserved memory is not in that format, so it is '-', not 0."""
    path = str(fixture("memsnap/hta_memory_timeline.raw.json.gz"))
    done = CliRunner(env=WIDE).invoke(cli, ["analyze", path])
    assert done.exit_code == 0, done.output
    assert "Allocator memory per device" in done.output and "2.87 GiB" in done.output
    data = json.loads(CliRunner().invoke(cli, ["analyze", path, "--json"]).output)
    (peak,) = data["diagnosis"]["memory"]
    assert peak["events"] == 16_845 and peak["peak_reserved"] is None
    assert 2.86 * 2**30 < peak["peak_allocated"] < 2.88 * 2**30


@pytest.mark.parametrize("name", ["nccl/a100x8_allreduce_superbench.log",
                                  "memsnap/hta_memory_timeline.raw.json.gz"])
def test_report_of_an_untimed_input_is_written(tmp_path: Path, name: str) -> None:
    page = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["report", str(fixture(name)), "-o", str(page), "--cdn"])
    assert done.exit_code == 0, done.output
    text = page.read_text(encoding="utf-8")
    assert ("Collectives" in text) if name.startswith("nccl") else ("Memory" in text)
