"""scripts/gpu_checks.py judges a GPU validation run without a GPU.

The OUTDIRs here are built from real `gpudiag analyze --json` output (the example trace,
whose top finding is a planted `.item()` sync, and a real allocator snapshot with a
fragmentation finding), and from copies of that output with the waterfall rewritten, so
the pass/fail logic is checked on the shape the CLI really prints.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, fixture

spec = importlib.util.spec_from_file_location("gpu_checks", ROOT / "scripts" / "gpu_checks.py")
assert spec is not None and spec.loader is not None
gpu_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_checks)

EXAMPLE = ROOT / "examples" / "traces" / "train_loop_sync.pt.trace.json.gz"
SNAPSHOT = "memsnap/cs336_medium_ctx1024_training_18gb_inactive.pickle"


def analyze_json(path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(path), "--json",
                           "--top", "50"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def sync_run() -> dict[str, Any]:
    """Real analyze output: sync_stall 57% at aten::item is the top finding."""
    return analyze_json(EXAMPLE)


@pytest.fixture(scope="module")
def frag_run() -> tuple[dict[str, Any], dict[str, Any]]:
    """Real analyze output and extract tables of a fragmented allocator snapshot."""
    path = fixture(SNAPSHOT)
    return analyze_json(path), gpu_checks.extract([str(path)], None)


def rewrite(base: dict[str, Any], lost_ns: dict[str, int], top: str) -> dict[str, Any]:
    """`base` with its waterfall replaced by `lost_ns` (device 0) and `top` ranked first."""
    out = copy.deepcopy(base)
    total = sum(lost_ns.values())
    dx = out["diagnosis"]
    dx["losses"] = [{"rank": None, "device": 0, "cause": c, "lost_ns": v, "share": v / total}
                    for c, v in lost_ns.items()]
    template = dx["findings"][0]
    dx["findings"] = [dict(template, cause=c, lost_ns=v, share=v / total, where=f"{c} site")
                      for c, v in sorted(lost_ns.items(), key=lambda kv: -kv[1])
                      if c != "useful"]
    dx["findings"].sort(key=lambda f: f["cause"] != top)
    return out


def ncu_tables(grid: int, sm: float, occupancy: float) -> dict[str, Any]:
    """extract output of an ncu report holding one gpudiag_small_grid kernel."""
    record = {"name": "gpudiag_small_grid", "grid_size": grid, "block_size": 32,
              "duration_ns": 2000, "sm_throughput_pct": sm,
              "achieved_occupancy_pct": occupancy, "theoretical_occupancy_pct": 50.0,
              "waves_per_sm": grid / (132 * 32)}
    return {"tables": {"kernel_metrics": {"rows": 1, "records": [record]}}}


def workload(name: str, **numbers: Any) -> str:
    return "some log line\n" + json.dumps({"example": name, **numbers}) + "\n"


ARTIFACTS = ("ncu/small_grids_1.ncu-rep", "ncu/small_grids_1.html", "ncu/small_grids_32.ncu-rep",
             "ncu/small_grids_32.html", "runs/sync_in_loop-report/report.html",
             "compare/grad.html")


def build_outdir(tmp: Path, runs: dict[str, dict[str, Any]]) -> Path:
    """runs: name -> {"analyze": dict, "workload": str, "tables": dict} (each optional);
    plus the report files gpu_validate.sh writes (a few bytes each)."""
    for sub in ("analyze", "tables", "workload"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    for artifact in ARTIFACTS:
        (tmp / artifact).parent.mkdir(parents=True, exist_ok=True)
        (tmp / artifact).write_text("x")
    for name, parts in runs.items():
        if "analyze" in parts:
            (tmp / "analyze" / f"{name}.json").write_text(json.dumps(parts["analyze"]))
        if "tables" in parts:
            (tmp / "tables" / f"{name}.json").write_text(json.dumps(parts["tables"]))
        if "workload" in parts:
            (tmp / "workload" / f"{name}.out").write_text(parts["workload"])
    return tmp


def good_runs(sync_run: dict[str, Any], frag: tuple[dict[str, Any], dict[str, Any]],
              backends: tuple[str, ...] = ("cupti", "torch")) -> dict[str, dict[str, Any]]:
    """Every workload of gpu_validate.sh, each pointing the expected way."""
    frag_analyze, frag_tables = frag
    expandable_tables = copy.deepcopy(frag_tables)
    for row in expandable_tables["fragmentation_final"]:
        row["fragmentation"] = 0.05  # what an expandable segment leaves: little split
    runs: dict[str, dict[str, Any]] = {
        "frag_snapshot": {"analyze": frag_analyze, "tables": frag_tables, "workload": workload(
            "fragmentation", reserved_over_allocated=1.9)},
        "frag_snapshot_expandable": {
            "analyze": dict(frag_analyze, diagnosis=dict(frag_analyze["diagnosis"],
                                                          findings=[])),
            "tables": expandable_tables,
            "workload": workload("fragmentation", reserved_over_allocated=1.05)},
        "ncu_small_grids_1": {"tables": ncu_tables(1024, sm=61.5, occupancy=45.0)},
        "ncu_small_grids_32": {"tables": ncu_tables(32, sm=3.1, occupancy=1.6)},
        "grad_fp32": {"workload": workload("grad_accumulation", samples_per_s=1.0e5,
                                           peak_memory_bytes=3 << 30)},
        "grad_bf16x4": {"workload": workload("grad_accumulation", samples_per_s=3.0e5,
                                             peak_memory_bytes=1 << 30)},
    }
    sampled = copy.deepcopy(sync_run)
    sampled["rows"]["samples"] = 40  # the NVML sampler's rows (the example trace has none)
    for b in backends:
        runs[f"sync_in_loop-{b}"] = {"analyze": sampled, "workload": workload(
            "sync_in_loop", steps_per_s=150.0)}
        runs[f"sync_in_loop_fixed-{b}"] = {"analyze": rewrite(
            sync_run, {"useful": 9_000_000, "sync_stall": 100_000, "launch_bound": 900_000},
            top="launch_bound"), "workload": workload("sync_in_loop", steps_per_s=240.0)}
        for n, small, launch in ((1, 400_000, 100_000), (32, 3_000_000, 6_000_000)):
            runs[f"small_grids_{n}-{b}"] = {"analyze": rewrite(
                sync_run, {"useful": 1_000_000, "small_grid": small, "launch_bound": launch},
                top="launch_bound" if n == 32 else "small_grid"),
                "workload": workload("small_grids", per_pattern_us=3.0 * n)}
    return runs


def run_check(outdir: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = gpu_checks.main(["check", str(outdir), *extra])
    return code, json.loads((outdir / "validation.json").read_text())


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in result["checks"]}


def test_every_planted_cause_on_top_passes(tmp_path: Path, sync_run: dict[str, Any],
                                           frag_run: Any) -> None:
    code, result = run_check(build_outdir(tmp_path, good_runs(sync_run, frag_run)))
    assert code == 0
    assert result["passed"] is True
    assert result["required_failed"] == []
    assert result["failed"] == []
    checks = by_name(result)
    top = checks["top finding of sync_in_loop-cupti"]
    assert (top["value"], top["required"], top["passed"]) == ("sync_stall", True, True)
    assert checks["top finding of frag_snapshot"]["value"] == "fragmentation"
    share = checks["sync_stall share in sync_in_loop-torch"]["value"]
    assert share == pytest.approx(0.5722, abs=1e-3)  # the example trace's real share
    assert checks["sync_stall share in sync_in_loop_fixed-torch"]["value"] == \
        pytest.approx(0.01)
    assert checks["small_grid loss of small_grids_32-torch over small_grids_1-torch"][
        "value"] == pytest.approx(7.5)
    assert checks["peak memory of bf16 x 4 over fp32"]["value"] == pytest.approx(1 / 3)
    assert checks["fragmentation ratio without minus with expandable segments"]["value"] == \
        pytest.approx(0.985 - 0.05, abs=0.01)
    assert checks["sm_throughput_pct of 1 x <<<1024,32>>> over 32 x <<<32,32>>> (ncu)"][
        "value"] == pytest.approx(61.5 / 3.1)
    assert checks["runs/sync_in_loop-report/report.html written"]["passed"] is True


def test_sync_stall_not_on_top_fails_and_names_the_workload(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    runs = good_runs(sync_run, frag_run)
    runs["sync_in_loop-torch"]["analyze"] = rewrite(
        sync_run, {"useful": 1_000_000, "sync_stall": 3_000_000, "small_grid": 5_000_000},
        top="small_grid")
    code, result = run_check(build_outdir(tmp_path, runs))
    assert code == 1
    assert result["required_failed"] == ["top finding of sync_in_loop-torch"]
    check = by_name(result)["top finding of sync_in_loop-torch"]
    assert (check["value"], check["passed"]) == ("small_grid", False)
    assert by_name(result)["top finding of sync_in_loop-cupti"]["passed"] is True


def test_a_missing_run_fails_the_planted_check(tmp_path: Path, sync_run: dict[str, Any],
                                               frag_run: Any) -> None:
    runs = good_runs(sync_run, frag_run)
    del runs["sync_in_loop-cupti"]
    code, result = run_check(build_outdir(tmp_path, runs))
    assert code == 1
    check = by_name(result)["top finding of sync_in_loop-cupti"]
    assert (check["value"], check["passed"], check["detail"]) == (None, None, "run missing")
    assert "top finding of sync_in_loop-cupti" in result["unmeasured"]


def test_a_wrong_direction_is_recorded_and_fails_only_with_strict(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    runs = good_runs(sync_run, frag_run, backends=("torch",))
    runs["sync_in_loop_fixed-torch"]["analyze"] = rewrite(
        sync_run, {"useful": 9_000_000, "sync_stall": 500_000, "launch_bound": 500_000},
        top="launch_bound")
    outdir = build_outdir(tmp_path, runs)
    code, result = run_check(outdir, "--backends", "torch")
    assert code == 0
    assert result["failed"] == ["sync_stall share in sync_in_loop_fixed-torch"]
    assert by_name(result)["sync_stall share in sync_in_loop_fixed-torch"]["value"] == \
        pytest.approx(0.05)
    assert gpu_checks.main(["check", str(outdir), "--backends", "torch", "--strict"]) == 1


def test_small_grids_32_may_top_with_launch_bound_but_not_copy(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    runs = good_runs(sync_run, frag_run, backends=("torch",))
    runs["small_grids_32-torch"]["analyze"] = rewrite(
        sync_run, {"useful": 1_000_000, "copy": 9_000_000, "small_grid": 2_000_000},
        top="copy")
    code, result = run_check(build_outdir(tmp_path, runs), "--backends", "torch")
    assert code == 1
    check = by_name(result)["top finding of small_grids_32-torch"]
    assert check["expected"] == "in ['launch_bound', 'small_grid']"
    assert check["value"] == "copy"


def test_fragmentation_found_with_expandable_segments_is_a_failed_direction(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    runs = good_runs(sync_run, frag_run)
    runs["frag_snapshot_expandable"]["analyze"] = frag_run[0]
    code, result = run_check(build_outdir(tmp_path, runs))
    assert code == 0  # not a planted-cause failure, a direction that went wrong
    check = by_name(result)["causes found with expandable segments"]
    assert (check["value"], check["passed"]) == ("fragmentation", False)


def test_extract_keeps_the_final_fragmentation_of_the_snapshot(frag_run: Any) -> None:
    _, tables = frag_run
    final = tables["fragmentation_final"]
    assert len(final) == 1
    assert final[0]["fragmentation"] == pytest.approx(0.985, abs=0.01)  # "0.99" in evidence
    assert final[0]["reserved_bytes"] > final[0]["allocated_bytes"]
    assert tables["tables"]["fragmentation"]["rows"] > 10_000
    assert tables["window"] is None


def test_failed_steps_become_failed_checks_naming_their_log(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    outdir = build_outdir(tmp_path, good_runs(sync_run, frag_run))
    (outdir / "steps.jsonl").write_text(
        json.dumps({"name": "sync_in_loop-torch", "rc": 0, "seconds": 9.5, "cmd": "x"}) + "\n"
        + json.dumps({"name": "ncu-small_grids_1", "rc": 127, "seconds": 0.1, "cmd": "y"})
        + "\n")
    code, result = run_check(outdir)
    assert code == 0
    check = by_name(result)["step ncu-small_grids_1 exit status"]
    assert (check["value"], check["passed"], check["detail"]) == (
        127, False, "log-ncu-small_grids_1.txt")
    assert len(result["steps"]) == 2


def test_run_numbers_accepts_the_summary_nested_or_at_the_top(
        sync_run: dict[str, Any]) -> None:
    flat = gpu_checks.run_numbers(sync_run)
    nested = gpu_checks.run_numbers({"summary": {k: v for k, v in sync_run.items()
                                                 if k != "diagnosis"},
                                     "diagnosis": sync_run["diagnosis"]})
    assert flat == nested
    assert flat["rows"]["syncs"] == 8
    assert flat["top_finding"]["where"] == "aten::item"
    assert sum(flat["shares"].values()) == pytest.approx(1.0)
    assert flat["window_ns"] == 14_791_000


def test_workload_line_is_the_last_example_json_line(tmp_path: Path) -> None:
    out = tmp_path / "w.out"
    out.write_text('{"example": "a", "n": 1}\nnoise {\n{"not": "an example"}\n'
                   '{"example": "a", "n": 2}\ntrailing text\n')
    assert gpu_checks.workload_line(out) == {"example": "a", "n": 2}
    assert gpu_checks.workload_line(tmp_path / "missing.out") is None


def test_overhead_and_compare_numbers_are_carried_into_the_json(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    outdir = build_outdir(tmp_path, good_runs(sync_run, frag_run))
    overhead = {"variants": {"bare": {"median": 200.0, "overhead_pct": 0.0},
                             "torch": {"median": 160.0, "overhead_pct": 25.0}}}
    (outdir / "overhead.json").write_text(json.dumps(overhead))
    (outdir / "compare-grad.json").write_text(json.dumps({"summary": [
        {"metric": "peak_reserved_bytes", "grad_fp32-torch": 3.0e9,
         "grad_bf16x4-torch": 1.0e9, "rel:grad_bf16x4-torch": -0.667}]}))
    _, result = run_check(outdir)
    assert result["overhead"] == overhead
    assert result["compare_grad"]["peak_reserved_bytes"]["grad_bf16x4-torch"] == 1.0e9
    published = result["small_grids_vs_published"]
    assert published["published"]["total_latency_us"] == {"1x": 2.1, "32x": 57.6}
    assert published["gpudiag"]["small_grids_32-torch"]["per_pattern_us"] == 96.0


def test_nccl_times_are_paired_by_size_with_the_cuda_event_medians(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    """Real collective_stats (extract of a Kineto NCCL fixture) against planted event times:
    the largest all_reduce (31502336 B, mean 3693.785 µs) is compared."""
    tables = gpu_checks.extract([str(fixture(
        "kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz"))], None)
    runs = good_runs(sync_run, frag_run, backends=("torch",))
    runs["nccl-torch"] = {"tables": tables, "workload": workload("nccl_allreduce", all_reduce=[
        {"bytes": 8196000, "median_us": 3900.0}, {"bytes": 31502336, "median_us": 1500.0}])}
    _, result = run_check(build_outdir(tmp_path, runs), "--backends", "torch")
    assert result["nccl_vs_cuda_events"]["nccl-torch"] == [
        {"bytes": 8196000, "events_median_us": 3900.0,
         "gpudiag_mean_us": pytest.approx(3940.3207, rel=1e-6)},
        {"bytes": 31502336, "events_median_us": 1500.0,
         "gpudiag_mean_us": pytest.approx(3693.785, rel=1e-6)}]
    check = by_name(result)["all_reduce time of gpudiag over CUDA events, largest size, "
                            "nccl-torch"]
    assert check["value"] == pytest.approx(3693.785 / 1500.0)
    assert check["passed"] is False  # 2.46x: outside the factor of 2
    assert check["detail"] == "31502336 bytes"


def test_ncu_numbers_of_the_small_grid_kernels_are_compared(
        tmp_path: Path, sync_run: dict[str, Any], frag_run: Any) -> None:
    """The real extract shape of an ncu report (kernel names renamed to ours): achieved
    occupancy is compared over the gpudiag_small_grid kernels only, and missing files fail."""
    real = gpu_checks.extract([str(fixture(
        "ncu/rtx4090_smem_square_9kernels_smallgrid.ncu-rep"))], None)
    records = real["tables"]["kernel_metrics"]["records"]
    records[0]["name"] = "gpudiag_small_grid"  # achieved occupancy 62.7376957494
    runs = good_runs(sync_run, frag_run, backends=("torch",))
    runs["ncu_small_grids_32"]["tables"] = real
    outdir = build_outdir(tmp_path, runs)
    (outdir / "ncu" / "small_grids_32.html").unlink()
    _, result = run_check(outdir, "--backends", "torch")
    checks = by_name(result)
    occupancy = checks["achieved_occupancy_pct of 1 x <<<1024,32>>> over 32 x <<<32,32>>> (ncu)"]
    assert occupancy["value"] == pytest.approx(45.0 / 62.7376957494)
    assert occupancy["passed"] is False
    sm = checks["sm_throughput_pct of 1 x <<<1024,32>>> over 32 x <<<32,32>>> (ncu)"]
    assert (sm["value"], sm["passed"]) == (None, None)  # this report has no SM throughput
    assert checks["ncu/small_grids_32.html written"]["passed"] is False
    assert checks["ncu/small_grids_1.html written"]["passed"] is True
    ours = result["small_grids_vs_published"]["gpudiag"]["ncu_small_grids_32"]
    assert ours == [{"grid_size": 1, "block_size": 1024, "duration_ns": records[0][
        "duration_ns"], "sm_throughput_pct": None,
        "achieved_occupancy_pct": pytest.approx(62.7376957494),
        "theoretical_occupancy_pct": records[0]["theoretical_occupancy_pct"],
        "waves_per_sm": records[0]["waves_per_sm"]}]


def test_the_predicted_saving_is_checked_against_the_measured_one(tmp_path: Path) -> None:
    """compare-<pair>-<backend>.json as `gpudiag compare --json` writes it: the planted
    sync loop and its fix give a ratio of 1.0 (within 20%: passes); a pair not run is
    unmeasured, never a pass."""
    from gpudiag.analyzers.compare import compare
    from tests.test_savings import sync_loop

    found = compare([sync_loop(), sync_loop(synced=False)], ["sync_in_loop-torch",
                                                            "sync_in_loop_fixed-torch"])
    (tmp_path / "compare-sync-torch.json").write_text(json.dumps(found.to_dict()))
    numbers, checks = gpu_checks.saving_checks(tmp_path, ["torch"])
    assert numbers["sync-torch"]["ratio"] == pytest.approx(1.0)
    assert sorted(line.split(" at ")[0] for line in numbers["sync-torch"]["fixed"]) == [
        "host_python_overhead", "sync_stall"]
    verdict = {check["name"]: check["passed"] for check in checks}
    assert verdict == {"predicted vs measured saving of sync-torch": True,
                       "predicted vs measured saving of small_grids-torch": None}
