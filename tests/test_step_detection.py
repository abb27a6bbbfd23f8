"""Training steps without markers: torch optimizer steps, jax jitted-step executions, a
repeating op sequence; warm-up flags; and what the steps do to findings and windows.

Synthetic traces give exact step edges; the real recordings in tests/data (a CPU torch
loop, a CPU jax loop, no markers) and the shared alexnet fixture (a first iteration that
runs 160 times longer than the second) check the same on real files."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.analyzers.steps.detection import detect_steps
from gpudiag.analyzers.steps.training import flag_warmup, summary, training_steps
from gpudiag.trace import Trace
from tests.conftest import DATA, fixture


def r(name: str, start: int, end: int, source: str = "torch_op", tid: int = 1,
      pid: int | None = 10) -> dict[str, Any]:
    return {"pid": pid, "tid": tid, "start_ns": start, "end_ns": end, "name": name,
            "source": source}


def trace_of(rows: list[dict[str, Any]], **meta: Any) -> Trace:
    return Trace(meta=meta or None, ranges=pd.DataFrame(rows))


def iteration(t0: int, opt: str = "Optimizer.step#SGD.step") -> list[dict[str, Any]]:
    """One torch iteration of 100 ns: data 0-10, forward 10-40, backward 40-70, step 70-90."""
    return [r("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, t0 + 10,
              "annotation"),
            r("aten::linear", t0 + 10, t0 + 40),
            r("autograd::engine::evaluate_function: AddmmBackward0", t0 + 40, t0 + 70),
            r(opt, t0 + 70, t0 + 90, "annotation"),
            r("aten::add_", t0 + 72, t0 + 88)]  # inside the optimizer step


# -- torch optimizer steps ------------------------------------------------------------------


def test_optimizer_steps_run_from_one_step_end_to_the_next() -> None:
    rows = [r("aten::randn", 0, 5)] + [e for k in range(4) for e in iteration(100 + 100 * k)]
    steps = detect_steps(trace_of(rows))
    assert steps["method"].unique().tolist() == ["optimizer_step"]
    # step 1 starts at the first top-level op; step k at the end of optimizer step k-1
    assert steps["start_ns"].tolist() == [0, 190, 290, 390]
    assert steps["end_ns"].tolist() == [190, 290, 390, 490]
    assert steps["step"].tolist() == ["step 1", "step 2", "step 3", "step 4"]
    assert steps["tid"].tolist() == [1] * 4


def test_several_optimizers_count_one_of_them() -> None:
    rows = []
    for k in range(3):  # a GAN-like loop: two optimizers of different classes per iteration
        rows += iteration(100 * k, "Optimizer.step#Adam.step")
        rows.append(r("Optimizer.step#SGD.step", 100 * k + 92, 100 * k + 98, "annotation"))
    steps = detect_steps(trace_of(rows))
    assert len(steps) == 3
    assert steps["end_ns"].tolist()[:2] == [90, 190]
    assert "1 other optimizer not counted" in steps["detail"].iloc[0]


def test_gradient_accumulation_counts_optimizer_steps_not_micro_batches() -> None:
    rows = []
    for k in range(3):
        base = 1000 * k
        for micro in range(4):
            rows += [r("aten::linear", base + 100 * micro, base + 100 * micro + 40),
                     r("autograd::engine::evaluate_function: MmBackward0",
                       base + 100 * micro + 40, base + 100 * micro + 90)]
        rows.append(r("Optimizer.step#AdamW.step", base + 400, base + 450, "annotation"))
    steps = detect_steps(trace_of(rows))
    assert steps["end_ns"].tolist() == [450, 1450, 2450]


def test_step_markers_win_over_detection() -> None:
    rows = [e for k in range(3) for e in iteration(100 * k)]
    rows += [r("ProfilerStep#1", 0, 100, "step"), r("ProfilerStep#2", 100, 200, "step")]
    steps = training_steps(trace_of(rows))
    assert steps["method"].unique().tolist() == ["markers"]
    assert steps["step"].tolist() == ["ProfilerStep#1", "ProfilerStep#2"]


# -- jax jitted steps -----------------------------------------------------------------------


def test_jitted_step_executions_are_the_steps() -> None:
    rows = [r("PjitFunction(_normal)", 0, 500, "host"),  # setup: compiles for long
            r("PjitFunction(add)", 10, 20, "host"),      # traced inside it: not run
            r("PjitFunction(_normal)", 600, 1100, "host")]
    for k in range(5):
        s = 2000 + 1000 * k
        rows += [r("PjitFunction(train_step)", s, s + 300, "host"),
                 r("PjitFunction(train_step)", s + 1, s + 299, "host"),  # xprof's nested twin
                 r("ParseArguments", s + 2, s + 10, "host")]
    rows.append(r("jit_train_step:XLA GPU module", 6200, 6900, "host", tid=7))
    steps = detect_steps(trace_of(rows))
    assert steps["method"].unique().tolist() == ["jit_function"]
    assert steps["start_ns"].tolist() == [2000, 3000, 4000, 5000, 6000]
    # the last step ends with its device module, not its dispatch
    assert steps["end_ns"].tolist() == [3000, 4000, 5000, 6000, 6900]
    assert steps["detail"].iloc[0] == "PjitFunction(train_step), 5 executions"


# -- repeating op sequence ------------------------------------------------------------------


def test_a_repeating_op_sequence_is_cut_into_steps_at_its_first_op() -> None:
    rows = [r("aten::randn", 0, 50), r("aten::uniform_", 50, 60)]
    for k in range(5):  # an inference loop: three ops per step, 100 ns apart
        s = 100 + 100 * k
        rows += [r("aten::conv2d", s, s + 30), r("aten::relu", s + 30, s + 40),
                 r("aten::linear", s + 40, s + 80)]
    rows.append(r("aten::item", 700, 710))
    steps = detect_steps(trace_of(rows))
    assert steps["method"].unique().tolist() == ["repeating_ops"]
    assert steps["start_ns"].tolist() == [100, 200, 300, 400, 500]
    # the last repeat ends with its own last op
    assert steps["end_ns"].tolist() == [200, 300, 400, 500, 580]
    assert "'aten::conv2d' opens each step of 3 ops" in steps["detail"].iloc[0]


def test_set_up_that_repeats_is_not_a_loop() -> None:
    """`fully_shard` set-up views and copies each of 40 parameters (`aten::as_strided_`,
    `aten::copy_`, 40 times): it repeats, but nothing in it computes, so it made 40 steps
    up. Torch ops repeat into steps only when the repeats hold a matmul, convolution,
    attention, backward or launch."""
    rows = []
    for k in range(40):
        s = 100 * k
        rows += [r("aten::as_strided_", s, s + 30), r("aten::copy_", s + 40, s + 90)]
    assert detect_steps(trace_of(rows)).empty
    computing = [dict(row, name="aten::mm") if row["name"] == "aten::copy_" else row
                 for row in rows]
    assert len(detect_steps(trace_of(computing))) >= 39  # the same shape with a matmul


def test_the_pattern_is_found_below_a_wrapping_annotation() -> None:
    rows = [r("[benchmark]", 0, 10_000, "annotation")]
    for k in range(3):
        s = 1000 + 3000 * k
        rows += [r(f"[iteration {k}]", s, s + 2000, "annotation"),
                 r("aten::conv2d", s + 10, s + 900), r("aten::relu", s + 900, s + 1900)]
    steps = detect_steps(trace_of(rows))
    assert steps["start_ns"].tolist() == [1010, 4010, 7010]
    assert steps["end_ns"].tolist()[-1] == 7010 + 1890


def test_no_repeats_no_steps() -> None:
    rows = [r("aten::a", 0, 10), r("aten::b", 10, 20), r("aten::c", 20, 30)]
    assert detect_steps(trace_of(rows)).empty
    assert summary(training_steps(trace_of(rows)))["count"] == 0


def test_steps_are_found_per_process() -> None:
    rows = [e for k in range(3) for e in iteration(100 * k)]
    rows += [dict(e, pid=11) for k in range(4) for e in iteration(100 * k)]
    steps = training_steps(trace_of(rows))
    assert steps.groupby("pid").size().to_dict() == {10: 3, 11: 4}
    assert steps.groupby("pid")["index"].max().to_dict() == {10: 2, 11: 3}


# -- warm-up --------------------------------------------------------------------------------


@pytest.mark.parametrize(("durations", "expected"), [
    ([900, 100, 110, 95, 105, 100], [True, False, False, False, False, False]),
    ([900, 400, 110, 95, 105, 100], [True, True, False, False, False, False]),
    ([100, 100, 110, 95, 105, 100], [False] * 6),
    ([1000, 100], [True, False]),          # two steps: the second is the reference
    ([1000], [False]),                     # one step: nothing to compare with
    ([140, 100, 100, 100], [False] * 4),   # 1.4x: not warm-up (the factor is 1.5)
    ([100, 100, 100, 100, 100, 100, 900], [False] * 7),  # a late slow step is not warm-up
])
def test_warmup_is_a_first_step_longer_than_1_5x_the_median_of_the_rest(
        durations: list[int], expected: list[bool]) -> None:
    assert flag_warmup(durations).tolist() == expected


def test_warmup_steps_are_left_out_of_the_median() -> None:
    rows = [r("aten::setup", 0, 1000)]
    for k in range(6):
        rows += iteration(1000 + 100 * k)
    steps = training_steps(trace_of(rows))
    info = summary(steps)
    assert steps["warmup"].tolist() == [True] + [False] * 5  # step 1 runs 1090 ns
    assert info["median_ns"] == 100 and info["warmup"] == 1 and info["warmup_ns"] == 1090


def test_a_window_on_a_detected_step_keeps_that_step() -> None:
    rows = [e for k in range(5) for e in iteration(100 * k)]
    dx = diagnose(trace_of(rows), window="step 3")
    assert dx.window_ns == (190, 290)
    assert dx.steps is not None and dx.steps["step"].tolist() == ["step 3"]


# -- real recordings ------------------------------------------------------------------------


def test_real_torch_cpu_loop_steps_are_its_optimizer_steps() -> None:
    t = gpudiag.load(DATA / "torch_cpu_train.pt.trace.json.gz")
    steps = training_steps(t)
    assert len(steps) == 6 and set(steps["method"]) == {"optimizer_step"}
    ends = t.ranges.loc[t.ranges["name"] == "Optimizer.step#Adam.step", "end_ns"]
    assert steps["end_ns"].tolist()[:-1] == sorted(ends)[:-1]
    assert steps["warmup"].iloc[0] and not steps["warmup"].iloc[1:].any()


def test_real_jax_cpu_loop_steps_are_its_jitted_step_executions() -> None:
    t = gpudiag.load(DATA / "jax_cpu_train.xplane.pb.gz")
    steps = training_steps(t)
    info = summary(steps)
    assert info["count"] == 20 and info["method"] == "jit_function"
    assert "train_step" in info["detail"]
    assert steps["warmup"].iloc[0]  # the first call compiles: over 1000x the others
    assert steps["dur_ns"].iloc[0] > 1000 * info["median_ns"]


def test_alexnet_first_iteration_is_warmup_and_never_the_top_finding() -> None:
    """HTA's alexnet trace: a warm-up forward of 12.8 s (cuDNN autotuning) and a measured
    one of 78 ms, under PARAM's annotations; its 8.87 s host_bound gap at
    cudnn_convolution is first-iteration warm-up."""
    t = gpudiag.load(fixture("kineto/a100_alexnet_sync_critical_path.json.gz"))
    steps = training_steps(t)
    assert summary(steps)["method"] == "repeating_ops" and len(steps) == 2
    assert steps["warmup"].tolist() == [True, False]
    assert steps["dur_ns"].iloc[0] > 100 * steps["dur_ns"].iloc[1]
    dx = diagnose(t)
    top = dx.findings.iloc[0]
    assert not str(top["evidence"]).startswith("warm-up")
    big = dx.findings[(dx.findings["cause"] == "host_bound")
                      & (dx.findings["where"] == "aten::cudnn_convolution")]
    assert len(big) == 1 and big["lost_ns"].iloc[0] > 8_000_000_000
    assert str(big["evidence"].iloc[0]).startswith("warm-up: 100%")
    assert big.index[0] > dx.findings.index[~dx.findings["evidence"].str.startswith(
        "warm-up")].max()
    assert any("warm-up: step 1" in n for n in dx.notes)


def test_steps_of_a_marked_fixture_are_unchanged() -> None:
    t = gpudiag.load(fixture("kineto/v100_rank1of2_nccl_profile_memory.json.gz"))
    steps = training_steps(t)
    marked = t.ranges[t.ranges["source"] == "step"].sort_values("start_ns")
    assert steps["step"].tolist() == marked["name"].astype(str).tolist()
    assert (steps["end_ns"].to_numpy()[:-1] == marked["start_ns"].to_numpy()[1:]).all()
    assert set(steps["method"]) == {"markers"}
    assert np.all(steps["dur_ns"] > 0)


def test_a_window_cut_in_a_notebook_has_the_steps_diagnose_gives_it() -> None:
    """`window.within` then `training_steps` gave other steps than `diagnose(window=)`: a
    window of one optimizer step holds too few to find again (repeating ops then found two
    'steps' inside it). A cut window now takes the whole trace's steps, cut to it."""
    from gpudiag.analyzers import window

    trace = gpudiag.load(DATA / "torch_cpu_train.pt.trace.json.gz")
    third = training_steps(trace).iloc[2]
    bounds = (int(third["start_ns"]), int(third["end_ns"]))
    cut = training_steps(window.within(trace, bounds))
    assert list(cut["method"]) == ["optimizer_step"]
    pd.testing.assert_frame_equal(cut, diagnose(trace, window=bounds).steps)
