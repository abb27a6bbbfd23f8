"""diagnose() end to end: the waterfall invariant on every real fixture, the Diagnosis
shape, windows and steps, and the CLI gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import gpudiag
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.analyzers.findings import COLUMNS, HOST_CAUSES, LOSS_CAUSES, OTHER_CAUSES
from gpudiag.cli import cli
from tests.builders import api_call, kernel, trace
from tests.conftest import fixture
from tests.test_all_fixtures import LOADABLE

U = 1_000


def _windows(t: gpudiag.Trace) -> dict[tuple[int, int], int]:
    """Each device's window computed independently: last end - first start."""
    events = pd.concat([t.kernels[["rank", "device", "start_ns", "end_ns"]],
                        t.copies[["rank", "device", "start_ns", "end_ns"]]])
    events = events.fillna({"rank": -1, "device": -1})
    g = events.groupby(["rank", "device"])
    return {(int(r), int(d)): int(v) for (r, d), v in (g["end_ns"].max()
                                                       - g["start_ns"].min()).items()}


@pytest.mark.parametrize("name", LOADABLE)
def test_waterfall_covers_every_device_window_exactly(name: str) -> None:
    t = gpudiag.load(fixture(name))
    dx = diagnose(t)
    assert list(dx.findings.columns) == list(COLUMNS)
    assert set(dx.findings["cause"]) <= set(LOSS_CAUSES) | set(OTHER_CAUSES)
    # ranked by expected saving, then those without one (GPU time by lost time, then host
    # time); warm-up ones last, in the same order among themselves
    warm = dx.findings["evidence"].str.startswith("warm-up:").fillna(False).to_numpy(bool)
    saved = dx.findings["saving_ns"].notna().to_numpy(bool)
    host = dx.findings["cause"].isin(HOST_CAUSES).to_numpy(bool)
    group = np.where(saved, 0, np.where(host, 2, 1)) + 3 * warm
    assert (np.diff(group) >= 0).all()
    for g in range(6):
        column = "saving_ns" if g % 3 == 0 else "lost_ns"
        assert dx.findings.loc[group == g, column].is_monotonic_decreasing
    assert (dx.findings["advice"].str.len() > 0).all()
    json.dumps(dx.to_dict(), default=str)
    if dx.losses.empty:
        assert dx.notes, "a trace without a waterfall must say why"
        return
    assert (dx.losses["lost_ns"] >= 0).all()
    per_device = dx.losses.fillna({"rank": -1}).groupby(["rank", "device"])
    assert {(int(r), int(d)): int(v) for (r, d), v in per_device["lost_ns"].sum().items()} \
        == _windows(t)
    assert np.allclose(per_device["share"].sum(), 1.0)
    assert set(dx.losses["cause"]) == set(LOSS_CAUSES)


def test_findings_share_is_of_the_analyzed_gpu_time() -> None:
    t = gpudiag.load(fixture("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz"))
    dx = diagnose(t)
    total = dx.losses["lost_ns"].sum()
    first = dx.findings.iloc[0]
    assert first["share"] == pytest.approx(first["lost_ns"] / total)


def test_window_by_step_name_and_per_step_waterfall() -> None:
    t = gpudiag.load(fixture("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz"))
    steps = t.ranges[t.ranges["source"] == "step"]
    assert len(steps) >= 2
    name = str(steps["name"].iloc[1])
    dx = diagnose(t, window=name)
    assert dx.window_ns == (int(steps["start_ns"].iloc[1]), int(steps["end_ns"].iloc[1]))
    whole = diagnose(t, steps=True)
    assert whole.by_step is not None
    per_step = whole.by_step.groupby("step")["lost_ns"].sum()
    bounds = whole.by_step.drop_duplicates("step").set_index("step")
    assert (per_step == (bounds["end_ns"].clip(*whole.timeline.windows[(0, 0)])
                         - bounds["start_ns"].clip(*whole.timeline.windows[(0, 0)]))).all()


def test_repr_html_escapes_kernel_names() -> None:
    t = trace(kernels=[kernel(0, 10 * U, "<script>alert(1)</script>", correlation=1),
                       kernel(500 * U, 510 * U, "<script>alert(1)</script>", correlation=2)],
              api=[api_call(0, 1, correlation=1), api_call(495 * U, 496 * U, correlation=2)])
    page = diagnose(t)._repr_html_()
    assert "<script>" not in page


def _example(tmp_path: Path) -> Path:
    from tests.builders import KinetoTrace
    kt = KinetoTrace()
    for i in range(5):
        c = kt.launch(ts=i * 1000, dur=5)
        kt.kernel("gemm", ts=i * 1000 + 10, dur=100, correlation=c)
        s = kt.runtime("cudaStreamSynchronize", ts=i * 1000 + 20, dur=95)
        kt.cuda_sync("stream", ts=i * 1000 + 20, dur=95, correlation=s)
    return kt.write(tmp_path / "t.pt.trace.json.gz")


def test_cli_fail_on_gates_a_budget(tmp_path: Path) -> None:
    path = str(_example(tmp_path))
    runner = CliRunner()
    ok = runner.invoke(cli, ["analyze", path, "--fail-on", "sync_stall>99%"])
    assert ok.exit_code == 0, ok.output
    assert "sync_stall" in ok.output
    bad = runner.invoke(cli, ["analyze", path, "--fail-on", "sync_stall>5%,host_bound>1s"])
    assert bad.exit_code == 1
    assert "budget sync_stall>5% exceeded" in bad.output


def test_cli_json_carries_the_diagnosis(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["analyze", str(_example(tmp_path)), "--json", "--steps"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    causes = {r["cause"]: r["lost_ns"] for r in data["diagnosis"]["losses"]}
    assert sum(causes.values()) == data["window"]["duration_ns"]
    found = data["diagnosis"]["findings"]
    savings = [f["saving_ns"] for f in found if f["saving_ns"] is not None]
    assert savings == sorted(savings, reverse=True) and savings  # ranked by expected saving
    by_lost = CliRunner().invoke(cli, ["analyze", str(_example(tmp_path)), "--json",
                                       "--rank-by", "lost"])
    assert json.loads(by_lost.output)["diagnosis"]["findings"][0]["cause"] == "sync_stall"


@pytest.mark.parametrize(("spec", "problem"), [("sync>5%", "cannot read budget"),
                                               ("sync_stall>5", "cannot read budget")])
def test_cli_bad_budget_is_one_line(tmp_path: Path, spec: str, problem: str) -> None:
    from gpudiag.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(_example(tmp_path)), "--fail-on", spec])
    assert exit_info.value.code == 2


def test_cli_unknown_window_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    from gpudiag.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(_example(tmp_path)), "--window", "NoSuchStep"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no range named 'NoSuchStep'" in err[0]


def test_window_waterfall_equals_the_whole_trace_cut_to_it() -> None:
    t = gpudiag.load(fixture("kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz"))
    steps = t.ranges[t.ranges["source"] == "step"]
    lo, hi = int(steps["start_ns"].iloc[1]), int(steps["end_ns"].iloc[1])
    windowed = diagnose(t, window=(lo, hi)).losses
    whole = diagnose(t).timeline
    assert whole is not None
    cut = whole.totals((lo, hi))
    assert windowed["lost_ns"].tolist() == cut["lost_ns"].tolist()


def test_steps_tile_without_holes_or_overlaps() -> None:
    t = gpudiag.load(fixture("kineto/v100_rank1of2_nccl_profile_memory.json.gz"))
    from gpudiag.analyzers.steps.training import step_windows
    w = step_windows(t)
    assert len(w) >= 2
    assert (w["end_ns"].to_numpy()[:-1] == w["start_ns"].to_numpy()[1:]).all()
    dx = diagnose(t, steps=True)
    assert dx.by_step is not None and dx.timeline is not None
    lo, hi = next(iter(dx.timeline.windows.values()))
    inside = (w["end_ns"].clip(lo, hi) - w["start_ns"].clip(lo, hi)).sum()
    assert dx.by_step["lost_ns"].sum() == inside


def test_fail_on_without_a_timeline_is_an_input_error(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from gpudiag.cli import main
    path = fixture("ncu/rtx3050laptop_filter_nvtx.ncu-rep")
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", str(path), "--fail-on", "small_grid>10%"])
    assert exit_info.value.code == 2
    assert "budgets cannot be checked" in capsys.readouterr().err
