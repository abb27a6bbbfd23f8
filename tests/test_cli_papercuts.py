"""Small things a newcomer trips over, one test each: the example generator's --help, heatmap
of several files and its title, what doctor says is here, export's folders, findings that
cost no measured time, torch's own log lines, CPU memory per process, TensorFlow's advice."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from gpudiag.cli import cli
from gpudiag.reports.terminal.steps import print_steps
from tests.conftest import fixture, framework

ROOT = Path(__file__).resolve().parents[1]
WIDE = {"COLUMNS": "250"}


def test_make_example_trace_help_writes_nothing(tmp_path: Path) -> None:
    tracked = ROOT / "examples/traces/train_loop_sync.pt.trace.json.gz"
    before = tracked.read_bytes()
    script = str(ROOT / "examples/make_example_trace.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--output" in done.stdout
    assert tracked.read_bytes() == before
    out = tmp_path / "mine.json.gz"
    done = subprocess.run([sys.executable, script, "-o", str(out)], capture_output=True,
                          timeout=60)
    assert done.returncode == 0 and tracked.read_bytes() == before
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(before)  # same events


def test_heatmap_of_two_ranks_merges_them_and_names_the_files(tmp_path: Path) -> None:
    ranks = [str(fixture(f"kineto/world128_sampled_rank{r}.json.gz")) for r in (0, 1)]
    page = tmp_path / "heat.html"
    done = CliRunner().invoke(cli, ["heatmap", *ranks, "-o", str(page), "--cdn"])
    assert done.exit_code == 0, done.output
    text = page.read_text(encoding="utf-8")
    assert ("<title>gpudiag heatmap: world128_sampled_rank0.json.gz, "
            "world128_sampled_rank1.json.gz</title>") in text
    assert "Collective wait per rank" in text  # two ranks merged: their waits side by side


def test_heatmap_title_names_the_gpu(tmp_path: Path) -> None:
    report = str(fixture("ncu/a10g_esmm_4kernels_default.ncu-rep"))
    page = tmp_path / "heat.html"
    assert CliRunner().invoke(cli, ["heatmap", report, "-o", str(page), "--cdn"]).exit_code == 0
    assert ("<title>gpudiag heatmap: a10g_esmm_4kernels_default.ncu-rep (NVIDIA A10G)"
            "</title>") in page.read_text(encoding="utf-8")


def test_doctor_says_what_is_here_not_only_what_is_missing() -> None:
    done = CliRunner(env=WIDE).invoke(cli, ["doctor"])
    assert done.exit_code == 0, done.output
    assert "ncu reader" in done.output  # reading .ncu-rep needs ncu-report, not ncu
    assert "Collects here:" in done.output and "Reads here:" in done.output
    assert "Nsight Compute reports (.ncu-rep)" in done.output  # the dev extra has the reader
    if "torch" in sys.modules or _installed("torch"):
        assert "torch ops and host steps" in done.output


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_export_csv_and_parquet_go_to_folders_of_their_own(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    example = str(ROOT / "examples/traces/train_loop_sync.pt.trace.json.gz")
    for fmt in ("csv", "parquet"):
        done = CliRunner().invoke(cli, ["export", example, "--format", fmt])
        assert done.exit_code == 0, done.output
    csv = {p.suffix for p in (tmp_path / "gpudiag-tables-csv").iterdir()}
    parquet = {p.suffix for p in (tmp_path / "gpudiag-tables-parquet").iterdir()}
    assert csv == {".csv"} and parquet == {".parquet"}


def test_findings_that_cost_no_measured_time_have_no_column_of_dashes(tmp_path: Path) -> None:
    """An Nsight Compute report of one laptop kernel: ncu measures where it falls short
    (achieved vs theoretical occupancy), not GPU time lost, so no 'lost' column of '-'."""
    report = str(fixture("ncu/rtx3050laptop_filter_nvtx.ncu-rep"))
    done = CliRunner(env=WIDE).invoke(cli, ["analyze", report])
    assert done.exit_code == 0, done.output
    header = next(line for line in done.output.splitlines() if "cause" in line)
    assert "lost" not in header and "Findings, by GPU time lost" not in done.output
    page = tmp_path / "r.html"
    assert CliRunner().invoke(cli, ["report", report, "-o", str(page), "--cdn"]).exit_code == 0
    text = page.read_text(encoding="utf-8")
    assert "<h2>Findings</h2>" in text and 'scope="col" class="num">lost' not in text
    assert ">lost</th>" not in text


def test_torch_profiler_lines_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """torch 2.13's Kineto prints 'USDT: ... profiler_start' / 'profiler_stop' to the
    program's stderr at every segment; gpudiag's segments must not add lines to the
    program's output (a KINETO_LOG_LEVEL the user sets is kept)."""
    framework("torch")
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import torch
        x = torch.randn(32, 32)
        for _ in range(3):
            y = (x @ x).sum().item()
        print("program done")
    """))
    cmd = [sys.executable, "-m", "gpudiag", "profile", "-o", str(tmp_path / "run"), "--",
           sys.executable, str(script)]
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    assert "program done" in done.stdout
    assert "USDT:" not in done.stdout + done.stderr
    assert "profiler_start" not in done.stdout + done.stderr


def test_cpu_memory_peaks_of_several_processes_name_them() -> None:
    rows = [{"rank": 0, "pid": 11, "peak_bytes": 2 << 20, "peak_step": "step 3"},
            {"rank": 1, "pid": 12, "peak_bytes": 5 << 20, "peak_step": "step 1"}]
    console = Console(record=True, width=120)
    print_steps({"host": {"memory": rows}}, console)
    text = console.export_text()
    assert "CPU tensor memory peak (profiler), per process" in " ".join(text.split())
    assert text.index("r1 pid 12") < text.index("r0 pid 11")  # the largest first
    assert text.count("CPU tensor memory peak") == 1
    console = Console(record=True, width=120)
    print_steps({"host": {"memory": rows[:1]}}, console)
    assert "CPU tensor memory peak (profiler): 2 MiB (in step 3)" in console.export_text()


def test_a_tensorflow_xspace_gets_tensorflow_advice() -> None:
    """xprof's demo XSpace was written by TensorFlow (its device planes have 'TensorFlow
    Ops' lines and tf.data iterator threads): its findings speak tf.function and tf.data,
    never jax.jit, lax.scan or torch.compile."""
    path = str(fixture("jax/tf_gpu_multiworker_8gpu.xplane.pb"))
    data = json.loads(CliRunner().invoke(cli, ["analyze", path, "--json"]).output)
    host = [f for f in data["diagnosis"]["findings"] if f["cause"].startswith("host_")]
    assert host, [f["cause"] for f in data["diagnosis"]["findings"]]
    words = [f["advice"] for f in data["diagnosis"]["findings"]]
    assert not [text for text in words if "jax" in text or "torch" in text], words
    assert any("tf.function" in text for text in words)
    jax = json.loads(CliRunner().invoke(cli, ["analyze", str(ROOT / "tests/data/"
                                                              "jax_cpu_train.xplane.pb.gz"),
                                              "--json"]).output)
    assert not any("tf.function" in f["advice"] for f in jax["diagnosis"]["findings"]
                   if f["cause"].startswith("host_"))


def test_a_reader_that_stops_early_costs_neither_the_page_nor_the_status(tmp_path: Path) -> None:
    """`gpudiag compare A B -o diff.html | head` used to raise BrokenPipeError at the first
    print after head exited: no page, status 1. The pipe here has no reader from the start
    (the hardest case); the page is still written and the status is the comparison's own."""
    trace = str(ROOT / "examples/traces/train_loop_sync.pt.trace.json.gz")
    page = tmp_path / "diff.html"
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpudiag", "compare", trace, trace, "-o", str(page), "--cdn"],
            stdout=writer, stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(writer)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr
    assert "<html" in page.read_text(encoding="utf-8").lower()


def test_an_ascii_terminal_gets_escapes_not_a_traceback() -> None:
    """A µ in a duration on a terminal that only writes ASCII is written as an escape."""
    trace = str(ROOT / "examples/traces/train_loop_sync.pt.trace.json.gz")
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", trace],
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "ascii", **WIDE})
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert done.stdout.isascii()
