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


# -- report, heatmap, compare, export ----------------------------------------------------


def test_report_writes_one_offline_page(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(small_trace(tmp_path)), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    assert html.count("* plotly.js v") == 1 and "Findings" in html
    cdn = tmp_path / "c.html"
    assert CliRunner().invoke(cli, ["report", str(small_trace(tmp_path)), "-o", str(cdn),
                                    "--cdn"]).exit_code == 0
    assert cdn.stat().st_size < 200_000 < out.stat().st_size


def test_heatmap_of_an_ncu_report_and_of_a_trace(tmp_path: Path) -> None:
    ncu = fixture("ncu/rtx4090_smem_square_9kernels_smallgrid.ncu-rep")
    out = tmp_path / "h.html"
    result = CliRunner().invoke(cli, ["heatmap", str(ncu), "-o", str(out), "--top", "5",
                                      "--sort", "health"])
    assert result.exit_code == 0, result.output
    assert "Kernel x metric" in out.read_text(encoding="utf-8")
    bad = CliRunner().invoke(cli, ["heatmap", str(ncu), "-o", str(out), "--sort", "nope"])
    assert bad.exit_code != 0
    trace_out = tmp_path / "t.html"
    assert CliRunner().invoke(cli, ["heatmap", str(small_trace(tmp_path)), "-o",
                                    str(trace_out)]).exit_code == 0
    assert "Utilization per stream" in trace_out.read_text(encoding="utf-8")


def test_compare_prints_deltas_and_gates(tmp_path: Path) -> None:
    a = small_trace(tmp_path)
    b = tmp_path / "b" / "small.pt.trace.json.gz"
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    ok = CliRunner().invoke(cli, ["compare", str(a), str(b), "--fail-on", "host_bound>+1pp",
                                  "-o", str(tmp_path / "c.html")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "c.html").exists()
    data = json.loads(CliRunner().invoke(cli, ["compare", str(a), str(b), "--json"]).output)
    assert data["labels"] == ["small#1", "small#2"]
    one = CliRunner().invoke(cli, ["compare", str(a)])
    assert one.exit_code != 0


def test_export_perfetto_and_csv(tmp_path: Path) -> None:
    src = str(small_trace(tmp_path))
    out = tmp_path / "t.json.gz"
    assert CliRunner().invoke(cli, ["export", src, "-o", str(out)]).exit_code == 0
    import gzip
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    assert sum(e.get("cat") == "kernel" for e in events) == 4
    tables = tmp_path / "tables"
    assert CliRunner().invoke(cli, ["export", src, "--format", "csv", "-o", str(tables),
                                    "--tables", "kernels,api"]).exit_code == 0
    assert sorted(p.name for p in tables.iterdir()) == ["api.csv", "kernels.csv"]


def test_profile_runs_the_command_and_merges_its_markers(tmp_path: Path) -> None:
    child = ("import gpudiag, time\n"
             "for i in range(3):\n"
             "    gpudiag.step()\n"
             "    with gpudiag.region('data'):\n"
             "        time.sleep(0.01)\n"
             "gpudiag.end_step()\n"
             "raise SystemExit(4)\n")
    run = tmp_path / "run"
    result = CliRunner().invoke(cli, ["profile", "-o", str(run), "--", sys.executable, "-c",
                                      child])
    assert result.exit_code == 4, result.output  # the child's status
    import gpudiag
    trace = gpudiag.load(run / "trace")
    steps = trace.ranges[trace.ranges["source"] == "step"]
    assert len(steps) == 3 and (trace.ranges["name"] == "data").sum() == 3
    assert json.loads((run / "meta.json").read_text())["exit_code"] == 4


def test_doctor_lists_every_collector() -> None:
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0
    for name in ("NVML", "cupti", "torch", "nsys", "ncu"):
        assert name in result.output


def test_profile_into_an_unwritable_run_dir_is_one_line_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o", "/proc/gpudiag/run",
                           "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpudiag: error: /proc/gpudiag/run: cannot be created as the run directory "
        "(No such file or directory) (pass a writable -o RUN_DIR)"]
    assert not marker.exists()
