"""Gathering a run directory: every collector's output in one Trace, and the session's NVML.

The NVML sampler runs against the fake NVML of test_nvml_sampler.py, wired into a real
session, so the path sampler → run dir → merge_run → diagnose → report is the one a GPU
run takes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import gpudiag
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.collectors.nvml import sampler as nvml_sampler
from gpudiag.collectors.nvml.sampler import NvmlSampler
from gpudiag.profiler import session
from gpudiag.profiler.session import ProfileOptions, run
from gpudiag.readers.run_dir import merge_run
from gpudiag.reports.build import report_page
from gpudiag.reports.collected import describe
from tests.builders import kernel, trace
from tests.test_nvml_sampler import UUIDS, FakeGpu, FakeNvml

FAST = ProfileOptions(flush_interval_s=0.2, nvml_interval_s=0.02)


def test_session_samples_the_gpus_while_the_child_runs(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_start(out_dir: Path, interval_s: float, *, env: Any = None,
                   reasons: list[str] | None = None) -> NvmlSampler:
        seen["env"] = env
        source = nvml_sampler.NvmlSource(FakeNvml([FakeGpu(UUIDS[0])], _wall_clock))
        assert source.open(env or {}) is None
        sampler = NvmlSampler(source, out_dir, interval_s)
        sampler.start()
        return sampler

    monkeypatch.setattr(nvml_sampler, "start_sampler", fake_start)
    result = run([sys.executable, "-c", "import time; time.sleep(0.5)"],
                 out_dir=tmp_path / "run", options=FAST)
    assert result.exit_code == 0
    assert seen["env"]["GPUDIAG_RUN_DIR"] == str(result.run_dir)  # the child's view
    trace = merge_run(result.run_dir)
    util = trace.samples[trace.samples["metric"] == "gpu_util"]
    # one sample per interval while the child lived (its start-up included), never more:
    # the bound follows the measured lifetime, so a slow machine does not fail it
    lived = (result.end_ns - result.start_ns) / (FAST.nvml_interval_s or 1) / 1e9
    assert 5 <= len(util) <= lived + 2 and (util["value"] == 97.0).all()
    assert util["ts_ns"].between(result.start_ns - 10**8, result.end_ns + 10**8).all()
    assert "NVML samples" in describe(trace)
    dx = diagnose(trace)
    summary = dx.tables["sample_summary"]
    assert summary["gpu_util_mean_pct"].tolist() == [97.0]
    page = report_page(trace, dx)
    assert "GPU samples (NVML)" in page


def _wall_clock() -> int:
    import time

    return time.time_ns()


def test_nvml_that_cannot_start_is_named_in_the_run_meta(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(out_dir: Path, interval_s: float, *, env: Any = None,
               reasons: list[str] | None = None) -> None:
        assert reasons is not None
        reasons.append("NVML could not start: no NVIDIA driver (test)")

    monkeypatch.setattr(nvml_sampler, "start_sampler", refuse)
    result = run([sys.executable, "-c", "pass"], out_dir=tmp_path / "run", options=FAST)
    meta = json.loads((result.run_dir / "meta.json").read_text())
    assert meta["not_collected"] == ["NVML could not start: no NVIDIA driver (test)"]


def test_nvml_interval_zero_does_not_sample(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_sampler, "start_sampler", lambda *a, **k: pytest.fail("sampled"))
    options = ProfileOptions(flush_interval_s=0.2, nvml_interval_s=None)
    assert run([sys.executable, "-c", "pass"], out_dir=tmp_path / "r", options=options
               ).exit_code == 0


def _proc_dir(run_dir: Path, name: str, rank: int | None) -> Path:
    """A process directory as the bootstrap writes it (meta only: no markers)."""
    proc = run_dir / "procs" / name
    proc.mkdir(parents=True)
    gpudiag.Trace(meta={"rank": rank, "process": {"pid": 7, "host": "h", "collectors": [
        "host", "cupti"]}}).save(proc)
    return proc


def test_plugin_chunks_take_their_process_rank_and_bad_files_are_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    session.make_run_dir(["x"], run_dir)
    session.write_json(run_dir / "meta.json", {"command": ["python", "train.py"],
                                              "options": {"backend": "cupti"}})
    proc = _proc_dir(run_dir, "h-7-rank3", rank=3)
    chunk_trace = trace(kernels=[kernel(1_000, 2_000), kernel(3_000, 4_000)])
    assert chunk_trace.kernels["rank"].isna().all()  # CUPTI rows carry no rank of their own
    chunk_trace.save(proc / "cupti" / "chunk-000000")
    (proc / "torch").mkdir()
    (proc / "torch" / "segment-0001.pt.trace.json").write_text("{not json")
    merged = merge_run(run_dir)
    assert merged.kernels["rank"].tolist() == [3, 3]
    assert merged.meta["backend"] == "cupti" and merged.meta["ranks"] == [3]
    assert len(merged.meta["unreadable"]) == 1
    assert "segment-0001.pt.trace.json" in merged.meta["unreadable"][0]
    assert (run_dir / "trace" / "meta.json").exists()  # saved for analyze/report/compare


def test_a_run_directory_loads_as_its_trace_merging_it_if_needed(tmp_path: Path) -> None:
    result = run([sys.executable, "-c", "import gpudiag; gpudiag.step(); gpudiag.step()"],
                 out_dir=tmp_path / "run", options=ProfileOptions(nvml_interval_s=None))
    assert not (result.run_dir / "trace").exists()  # as if killed before the merge
    loaded = gpudiag.load(result.run_dir)
    assert (result.run_dir / "trace" / "meta.json").exists()
    assert loaded.ranges["name"].astype(str).tolist() == ["step 0", "step 1"]
    again = gpudiag.load(result.run_dir)  # now read as saved
    assert again.row_counts() == loaded.row_counts()


def test_host_markers_are_sealed_in_chunks_and_merge_once(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudiag.profiler import bootstrap

    monkeypatch.setattr(bootstrap, "SEAL_ROWS", 10)
    run_dir = tmp_path / "run"
    session.make_run_dir(["x"], run_dir)
    session.write_json(run_dir / "meta.json", {"command": ["x"]})
    collector = bootstrap.HostCollector(run_dir, 3600.0, ["host"], {})
    collector.dir.mkdir(parents=True)
    for i in range(25):
        collector.add_range(f"r{i}", 1_000 * i, 1_000 * i + 500, "annotation")
        if i % 4 == 3:
            collector.flush()
    collector.flush(final=True)
    chunks = sorted(p.name for p in (collector.dir / "markers").iterdir())
    assert chunks == ["chunk-000001", "chunk-000002"]  # 12 and 12 rows sealed, 1 still open
    assert len(collector.ranges) == 1  # sealed rows left memory
    # a kill between sealing and clearing the tail leaves the last rows twice on disk
    sealed = gpudiag.Trace.load_dir(collector.dir / "markers" / "chunk-000002").ranges
    twice = gpudiag.Trace(ranges=sealed.iloc[-3:]).ranges
    twice.to_parquet(collector.dir / "ranges.parquet", index=False)
    merged = merge_run(run_dir)
    names = merged.ranges.sort_values("start_ns")["name"].astype(str).tolist()
    assert names == [f"r{i}" for i in range(24)]  # r24 was overwritten by the simulated kill
