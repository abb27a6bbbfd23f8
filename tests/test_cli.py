"""The gpudiag command: analyze through click's runner and as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gpudiag.cli import cli
from tests.builders import KinetoTrace
from tests.conftest import ROOT, fixture


def small_trace(tmp_path: Path) -> Path:
    kt = KinetoTrace()
    for i in range(3):
        c = kt.launch(ts=100 * i)
        kt.kernel("void at::native::gemm<float>(float*)", ts=100 * i + 10, dur=50, correlation=c)
    c = kt.launch(ts=400)
    kt.kernel("relu_kernel", ts=410, dur=5, correlation=c)
    return kt.write(tmp_path / "small.pt.trace.json.gz")


def test_analyze_prints_devices_rows_and_top_kernels(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["analyze", str(small_trace(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "NVIDIA H100 80GB HBM3" in result.output
    assert "kernels" in result.output and "Top kernels" in result.output
    assert "gemm<float>" in result.output  # short name: no namespace, no parameters
    assert "\x1b[" not in result.output  # no colors when not a terminal


def test_analyze_json_has_the_same_content(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["analyze", "--json", str(small_trace(tmp_path))])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["rows"]["kernels"] == 4
    top = info["top_kernels"][0]
    assert (top["short_name"], top["count"], top["total_ns"]) == ("gemm<float>", 3, 150_000)
    assert info["window"]["duration_ns"] == 405_000
    assert info["devices"][0]["sm_count"] == 132


def test_analyze_merges_several_ranks() -> None:
    paths = [str(fixture(f"kineto/world128_sampled_rank{r}.json.gz")) for r in (0, 1)]
    result = CliRunner().invoke(cli, ["analyze", "--json", *paths])
    info = json.loads(result.output)
    assert info["ranks"] == [0, 1]
    assert info["rows"]["kernels"] == 1154 + 1104


def test_module_and_console_script_run(tmp_path: Path) -> None:
    path = str(small_trace(tmp_path))
    script = str(Path(sys.executable).parent / "gpudiag")
    for command in ([sys.executable, "-m", "gpudiag"], [script]):
        if not Path(command[0]).exists():
            continue
        out = subprocess.run([*command, "analyze", "--json", path], capture_output=True,
                             text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["rows"]["kernels"] == 4


def test_version_and_help() -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["--version"]).output.startswith("gpudiag, version")
    assert "analyze" in runner.invoke(cli, ["--help"]).output
