"""The host-side step breakdown: exact category times on a synthetic loop, self times,
CPU memory, findings and their advice per framework, and the CLI on runs without GPU
activity (the real CPU recordings in tests/data, and `gpudiag profile` end to end)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

import gpudiag
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.analyzers.findings import HOST_CAUSES
from gpudiag.analyzers.frameworks import framework as framework_of_trace
from gpudiag.analyzers.host import steps as host_steps
from gpudiag.cli import _require_events, cli
from gpudiag.errors import InputError
from gpudiag.trace import Trace
from tests.conftest import DATA, ROOT, fixture, framework


def r(name: str, start: int, end: int, source: str = "torch_op", tid: int = 1
      ) -> dict[str, Any]:
    return {"pid": 10, "tid": tid, "start_ns": start, "end_ns": end, "name": name,
            "source": source}


def loop(steps: int = 4, **meta: Any) -> Trace:
    """A training loop of `steps` iterations 1000 ns apart, iteration k at b = 1000 (k + 1):
    data [b, b+100), forward [b+150, b+350) (linear with an addmm inside), backward on
    autograd's thread [b+400, b+700), loss.item() [b+700, b+720), optimizer [b+750, b+900)
    (an add_ inside), Python in between. Step 1 runs 1000-1900, then 1000 ns each."""
    rows = []
    for k in range(steps):
        b = 1000 * (k + 1)
        rows += [r("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", b, b + 100,
                   "annotation"),
                 r("aten::linear", b + 150, b + 350), r("aten::addmm", b + 160, b + 340),
                 r("autograd::engine::evaluate_function: AddmmBackward0", b + 400, b + 700,
                   tid=2),
                 r("aten::item", b + 700, b + 720),
                 r("Optimizer.step#SGD.step", b + 750, b + 900, "annotation"),
                 r("aten::add_", b + 760, b + 860)]
    memory = pd.DataFrame({"pid": 10, "device": -1, "ts_ns": [1050, 2050, 3050],
                           "action": "alloc", "bytes": 1, "total_allocated_bytes":
                           [3000, 5000, 4000]})
    return Trace(meta=meta or None, ranges=pd.DataFrame(rows), memory=memory)


def test_categories_partition_each_step_exactly() -> None:
    by_step = host_steps.host_by_step(loop())
    assert by_step["step"].tolist() == ["step 1", "step 2", "step 3", "step 4"]
    assert by_step["dur_ns"].tolist() == [900, 1000, 1000, 1000]
    first, later = by_step.iloc[0], by_step.iloc[1]
    expected = {"data_loading": 100, "forward": 200, "backward": 300, "other_ops": 20,
                "optimizer": 150, "compile": 0, "ops": 0}
    for category, ns in expected.items():
        assert first[f"{category}_ns"] == ns and later[f"{category}_ns"] == ns, category
    # Python: the gaps between ops, and the end of the previous iteration in steps 2+
    assert first["python_ns"] == 130 and later["python_ns"] == 230
    cats = [f"{c}_ns" for c in host_steps.CATEGORIES]
    assert (by_step[cats].sum(axis=1) == by_step["dur_ns"]).all()


def test_breakdown_top_ops_and_cpu_memory() -> None:
    t = loop()
    shares = host_steps.host_breakdown(t).set_index("category")["share"]
    assert shares["data_loading"] == pytest.approx(400 / 3900)
    assert shares["python"] == pytest.approx(820 / 3900)
    assert shares.sum() == pytest.approx(1.0)
    ops = host_steps.host_top_ops(t).set_index("name")
    assert ops.loc["autograd::engine::evaluate_function: AddmmBackward0", "self_ns"] == 1200
    assert ops.loc["aten::addmm", "self_ns"] == 720
    assert ops.loc["aten::linear", "self_ns"] == 80  # 200 minus its addmm, 4 times
    assert ops.loc["aten::linear", "calls"] == 4
    memory = host_steps.host_memory(t).iloc[0]
    assert memory["peak_bytes"] == 5000 and memory["peak_step"] == "step 2"
    assert host_steps.host_by_step(t)["cpu_peak_bytes"].tolist()[:3] == [3000, 5000, 4000]


def test_findings_carry_share_of_step_time_and_torch_advice() -> None:
    found = host_steps.findings(loop()).set_index("cause")
    assert set(found.index) == {"host_data_loading", "host_python_overhead",
                                "host_optimizer", "host_op"}
    assert found.loc["host_data_loading", "lost_ns"] == 400
    assert found.loc["host_data_loading", "share"] == pytest.approx(400 / 3900)
    assert "num_workers" in found.loc["host_data_loading", "advice"]
    assert found.loc["host_optimizer", "where"] == "Optimizer.step#SGD.step"
    assert "foreach=True" in found.loc["host_optimizer", "advice"]
    assert found.loc["host_op", "where"].startswith("autograd::engine")


def test_a_jax_trace_gets_jax_advice() -> None:
    t = loop(format="xplane")
    assert framework_of_trace(t) == "jax"
    found = host_steps.findings(t).set_index("cause")
    assert "jax" in found.loc["host_python_overhead", "advice"]
    assert "DataLoader(" not in found.loc["host_data_loading", "advice"]


def test_warmup_steps_are_reported_apart() -> None:
    t = loop(steps=6)
    t.ranges = pd.concat([t.ranges, pd.DataFrame([r("aten::setup", 0, 1000)])],
                         ignore_index=True)
    by_step = host_steps.host_by_step(t)
    assert by_step["warmup"].tolist() == [True] + [False] * 5  # 1900 ns vs 1000
    breakdown = host_steps.host_breakdown(t).set_index("category")
    assert breakdown.loc["data_loading", "time_ns"] == 500
    assert breakdown.loc["data_loading", "warmup_ns"] == 100
    assert breakdown.loc["forward", "warmup_ns"] == 200 + 1000  # the setup op is forward


def test_without_steps_the_profiled_span_is_one_step() -> None:
    t = Trace(ranges=pd.DataFrame([r("aten::a", 0, 100), r("aten::b", 150, 200)]))
    by_step = host_steps.host_by_step(t)
    assert by_step["step"].tolist() == [host_steps.WHOLE]
    assert by_step.iloc[0][["forward_ns", "python_ns"]].tolist() == [150, 50]


def test_steps_outside_the_profiled_window_do_not_count() -> None:
    t = loop()
    marks = pd.DataFrame([r(f"step {k}", 1000 * k, 1000 * (k + 1), "step") for k in range(8)])
    # markers for the whole run, in gpudiag's domain (what `gpudiag profile` writes)
    t.ranges = pd.concat([t.ranges, marks.assign(domain="gpudiag")], ignore_index=True)
    by_step = host_steps.host_by_step(t)
    assert by_step["profiled"].tolist() == [False] + [True] * 4 + [False] * 3
    assert by_step.loc[~by_step["profiled"], "python_ns"].eq(0).all()
    assert host_steps.host_breakdown(t)["steps"].iloc[0] == 4


def test_steps_none_of_which_was_profiled_give_an_empty_breakdown() -> None:
    """Step markers for a stretch of the run the framework did not record (or a window
    that holds only such steps): no step counts, so the breakdown is empty, not an error."""
    t = loop(steps=1)
    marks = pd.DataFrame([r(f"step {k}", 10_000 * k, 10_000 * k + 5_000, "step")
                          for k in range(2, 5)]).assign(domain="gpudiag")
    t.ranges = pd.concat([t.ranges, marks], ignore_index=True)
    assert not host_steps.host_by_step(t)["profiled"].any()
    empty = host_steps.host_breakdown(t)
    assert empty.empty and list(empty.columns) == [
        "rank", "pid", "category", "time_ns", "share", "per_step_ns", "warmup_ns", "steps"]
    diagnose(t, window=(20_000, 45_000))  # the whole pipeline, on such a window


def test_diagnose_registers_the_analyzer_and_reports_its_tables() -> None:
    dx = diagnose(loop(), steps=True)
    assert {"host_breakdown", "host_by_step", "host_top_ops", "host_memory"} <= set(dx.tables)
    assert dx.findings["cause"].isin(HOST_CAUSES).all()
    data = dx.to_dict()
    assert data["steps"]["method"] == "optimizer_step" and data["steps"]["count"] == 4
    assert len(data["host"]["by_step"]) == 4
    assert any(n.startswith("steps: 4 (torch optimizer steps") for n in dx.notes)
    json.dumps(data, default=str)


def test_a_trace_with_nothing_to_analyze_gets_its_frameworks_advice() -> None:
    with pytest.raises(InputError, match=r"jax\.profiler\.trace"):
        _require_events(Trace(meta={"format": "xplane"}), (Path("run"),))
    with pytest.raises(InputError, match=r"torch\.profiler\.profile"):
        _require_events(Trace(meta={"format": "kineto"}), (Path("run"),))


def test_a_real_gpu_run_with_num_workers_0_is_found_data_bound() -> None:
    """Kineto's tb_plugin sample 'resnet50_num_workers_0' (2021 schema: ProfilerStep#N and
    the DataLoader are torch ops, autograd nodes are bare `...Backward` names on their own
    thread): data loading is the largest host category, as the sample was made to show."""
    t = gpudiag.load(fixture("kineto/v100_resnet50_legacy2021_schema.pt.trace.json.gz"))
    by_step = host_steps.host_by_step(t)
    assert by_step["step"].tolist() == [f"ProfilerStep#{k}" for k in range(5, 11)]
    assert (by_step["backward_ns"] > 0).all() and (by_step["forward_ns"] > 0).all()
    shares = host_steps.host_breakdown(t).set_index("category")["share"]
    assert shares.idxmax() == "data_loading" and 0.3 < shares["data_loading"] < 0.5
    found = diagnose(t).findings
    host = found[found["cause"].isin(HOST_CAUSES)]
    assert host["cause"].iloc[0] == "host_data_loading"
    assert "num_workers" in host["advice"].iloc[0]
    assert "host_op" not in set(host["cause"])  # the DataLoader op is not reported twice


# -- the CLI on the real CPU recordings -----------------------------------------------------


def test_analyze_a_cpu_torch_trace_shows_steps_and_host_findings() -> None:
    path = DATA / "torch_cpu_train.pt.trace.json.gz"
    out = CliRunner().invoke(cli, ["analyze", str(path), "--steps", "--json"])
    assert out.exit_code == 0, out.output
    dx = json.loads(out.output)["diagnosis"]
    assert dx["steps"]["method"] == "optimizer_step" and dx["steps"]["count"] == 6
    assert len(dx["host"]["by_step"]) == 6
    assert dx["findings"] and all(f["cause"] in HOST_CAUSES for f in dx["findings"])
    text = CliRunner().invoke(cli, ["analyze", str(path), "--steps"])
    assert text.exit_code == 0 and "No findings." not in text.output
    assert "Host time by step" in text.output and "CPU tensor memory peak" in text.output


def test_analyze_report_and_compare_a_cpu_jax_trace(tmp_path: Path) -> None:
    path = DATA / "jax_cpu_train.xplane.pb.gz"
    out = CliRunner().invoke(cli, ["analyze", str(path), "--json"])
    assert out.exit_code == 0, out.output
    steps = json.loads(out.output)["diagnosis"]["steps"]
    assert steps["method"] == "jit_function" and steps["warmup"] >= 1
    page = tmp_path / "jax.html"
    assert CliRunner().invoke(cli, ["report", str(path), "-o", str(page)]).exit_code == 0
    assert page.stat().st_size > 0
    torch_path = DATA / "torch_cpu_train.pt.trace.json.gz"
    cmp = CliRunner().invoke(cli, ["compare", str(torch_path), str(path), "--json"])
    assert cmp.exit_code == 0, cmp.output
    summary = {row["metric"]: row for row in json.loads(cmp.output)["summary"]}
    assert summary["step_time_ns"]["jax_cpu_train"] == pytest.approx(
        steps["median_ns"], rel=1e-9)
    assert summary["process_time_ns"]["torch_cpu_train"] > 0
    assert summary["peak_cpu_bytes"]["torch_cpu_train"] > 0
    assert summary["peak_cpu_bytes"]["jax_cpu_train"] is None  # XSpace on CPU: no allocator


# -- gpudiag profile end to end, on real unmodified programs --------------------------------


def _profile(tmp_path: Path, backend: str, *program: str) -> Path:
    run = tmp_path / backend
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--backend", backend,
                           "-o", str(run), "--", sys.executable, *program],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "No findings." not in done.stderr
    return run


def _analyze(run: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(run), "--steps",
                           "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    diagnosis: dict[str, Any] = json.loads(done.stdout)["diagnosis"]
    return diagnosis


def test_profile_runs_of_cpu_programs_analyze_and_compare(tmp_path: Path) -> None:
    framework("torch")
    framework("jax")
    torch_run = _profile(tmp_path, "torch", "tests/programs/torch_cpu_train.py", "1",
                         "--batches", "5")
    jax_run = _profile(tmp_path, "jax", "tests/programs/jax_cpu_train.py", "12")
    torch_dx, jax_dx = _analyze(torch_run), _analyze(jax_run)
    # the profiler's own optimizer-step hook marks steps from one optimizer step to the
    # next (4 of 5 optimizer steps); without it they are detected (5)
    assert torch_dx["steps"]["method"] in ("markers", "optimizer_step")
    assert torch_dx["steps"]["count"] >= 4
    assert jax_dx["steps"]["method"] in ("markers", "jit_function")
    assert jax_dx["steps"]["count"] >= 12
    assert torch_dx["host"]["breakdown"] and jax_dx["host"]["breakdown"]
    done = subprocess.run([sys.executable, "-m", "gpudiag", "compare", str(torch_run),
                           str(torch_run), "--json"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    summary = {row["metric"]: row for row in json.loads(done.stdout)["summary"]}
    for metric in ("process_time_ns", "step_time_ns", "peak_cpu_bytes"):
        assert summary[metric]["torch#1"] is not None, metric


def test_python_off_a_cpu_is_not_python_overhead() -> None:
    """gpudiag's step markers carry the training thread's CPU time (`cpu_time`). Here each
    1000 ns step ran 850 ns on a CPU: 150 ns off it, of which the 100 ns data-loading wait;
    the other 50 ns fell between ops, where the host breakdown saw Python. That part is
    `python_off_cpu_ns`, and the Python finding is the rest (a busy machine's descheduled
    time read as "Python between ops", the issue's 98.9% on a loaded 2-core machine)."""
    t = loop()
    marks = pd.DataFrame([r(f"step {k}", 1000 * (k + 1), 1000 * (k + 2), "step")
                          for k in range(4)]).assign(domain="gpudiag", cpu_time=850)
    t.ranges = pd.concat([t.ranges, marks], ignore_index=True)
    by_step = host_steps.host_by_step(t)
    assert by_step["cpu_time"].tolist() == [850] * 4
    assert (by_step["python_off_cpu_ns"] == 50).all()
    steady = by_step[by_step["profiled"] & ~by_step["warmup"]]
    python = host_steps.findings(t, min_share=0.0).set_index("cause").loc["host_python_overhead"]
    assert python["lost_ns"] == int(steady["python_ns"].sum()) - 50 * len(steady)
    unmeasured = host_steps.host_by_step(loop())
    assert unmeasured["cpu_time"].isna().all() and (unmeasured["python_off_cpu_ns"] == 0).all()


def test_a_thread_blocked_between_ops_is_off_a_cpu_not_python(tmp_path: Path) -> None:
    """Read against the run: each iteration trains a 256x256 linear layer (~2 ms on CPU)
    then sleeps 50 ms between ops (the stand-in for a busy machine's descheduling, or I/O).
    The breakdown used to say "Python between ops" for the 50 ms and advise torch.compile;
    the thread's CPU time (gpudiag's step ranges) shows it was off a CPU: `host_off_cpu`
    comes first, in the loop, and no Python finding claims the 50 ms."""
    framework("torch")
    script = tmp_path / "blocked.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        model = torch.nn.Linear(256, 256)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 256)
        for _ in range(16):
            loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
            time.sleep(0.05)
    """))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--no-report",
                           "--steps", "8", "-o", str(run), "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    dx = gpudiag.diagnose(gpudiag.load(run))
    steady = dx.tables["host_by_step"].query("profiled and not warmup")
    assert steady["cpu_time"].notna().all()
    assert (steady["python_off_cpu_ns"] >= 45_000_000).all(), steady  # the 50 ms sleep
    first = dx.findings.iloc[0]
    assert first["cause"] == "host_off_cpu", dx.findings[["cause", "share"]]
    # the user frame of the gaps: the loop body (python_where names the line before a C call
    # such as the sleep, not the call itself)
    assert "blocked.py:" in str(first["where"]) and "taskset" in str(first["advice"])
    python = dx.findings[dx.findings["cause"] == "host_python_overhead"]
    assert (python["lost_ns"] < first["lost_ns"] / 4).all()
