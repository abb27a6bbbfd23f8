"""`gpudiag.analyzers.compare`: runs side by side, relative budgets, and the terminal rendering.

The synthetic pair plants exact answers (times in µs, U ns each): run A runs three 100 µs
steps back to back; run B's steps take 110 µs because after each kernel the host blocks
in cudaStreamSynchronize and launches the next kernel only after it returns, leaving the
GPU idle 10 µs between steps (sync_stall).
"""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from rich.console import Console

import gpudiag
from gpudiag.analyzers.compare import Comparison, compare, parse_fail_on, regressions, versus
from gpudiag.errors import InputError
from gpudiag.reports.terminal.compare import print_comparison
from gpudiag.trace import Trace
from tests.builders import api_call, kernel, sync, trace
from tests.conftest import fixture

U = 1_000  # ns per µs
T0 = 1_000  # µs: first step start


def _steps(starts: list[int], length: int) -> pd.DataFrame:
    return pd.DataFrame([{"pid": 100, "tid": 100, "start_ns": s * U, "end_ns": (s + length) * U,
                          "name": f"ProfilerStep#{i}", "source": "step", "depth": 0}
                         for i, s in enumerate(starts)])


def _run(step_us: int, *, stall: bool, name: str = "gemm") -> Trace:
    """Three steps of `step_us`, one 100 µs kernel each; `stall`: a blocking stream sync
    after each kernel, so the GPU waits for the host between steps."""
    kernels, api, syncs = [], [], []
    starts = [T0 + i * step_us for i in range(3)]
    for corr, s in enumerate(starts, 1):
        api.append(api_call((s - 5) * U, (s - 2) * U, correlation=corr))
        kernels.append(kernel(s * U, (s + 100) * U, name, correlation=corr))
        if stall:
            c = 100 + corr
            api.append(api_call((s + 5) * U, (s + 101) * U, "cudaStreamSynchronize",
                                correlation=c))
            syncs.append({**sync((s + 5) * U, (s + 101) * U), "correlation": c})
    return trace(kernels=kernels, api=api, syncs=syncs or None,
                 ranges=_steps(starts, step_us))


@pytest.fixture(scope="module")
def pair() -> Comparison:
    return compare([_run(100, stall=False), _run(110, stall=True)], ["A", "B"], step_size=32)


def test_planted_pair_has_exact_deltas(pair: Comparison) -> None:
    s = pair.summary
    assert s.loc["step_time_ns", "A"] == 100 * U and s.loc["step_time_ns", "B"] == 110 * U
    assert s.loc["step_time_ns", "delta:B"] == 10 * U
    assert s.loc["step_time_ns", "rel:B"] == pytest.approx(0.1)
    assert s.loc["wall_time_ns", "A"] == 300 * U and s.loc["wall_time_ns", "B"] == 320 * U
    assert s.loc["samples_per_s", "A"] == pytest.approx(32 / 100e-6)
    assert s.loc["samples_per_s", "rel:B"] == pytest.approx(100 / 110 - 1)
    assert s.loc["kernel_time_ns", "delta:B"] == 0
    assert pair.losses.loc["sync_stall", "A"] == 0
    assert pair.losses.loc["sync_stall", "B"] == 20 * U           # two 10 µs gaps
    assert pair.losses.loc["useful", "delta:B"] == 0
    assert pair.shares.loc["sync_stall", "B"] == pytest.approx(20 / 320)
    assert pair.shares.loc["sync_stall", "pp:B"] == pytest.approx(6.25)
    assert pair.shares["A"].sum() == pytest.approx(1.0)


def test_planted_pair_counts_syncs_and_matches_kernels(pair: Comparison) -> None:
    kinds = pair.syncs.index.get_level_values("kind")
    assert len(kinds) and set(kinds) <= {"stream"}
    counts = pair.syncs.xs("count", level="quantity")
    assert counts["A"].sum() == 0 and counts["B"].sum() == 3
    assert pair.kernels.loc["gemm", ["A", "B", "count:A", "count:B"]].tolist() == \
        [300 * U, 300 * U, 3, 3]
    assert pair.collectives.empty


def test_budgets_fire_on_the_planted_regressions(pair: Comparison) -> None:
    lines = regressions(pair, parse_fail_on("step_time>+5%,sync_stall>+2pp"))
    assert len(lines) == 2
    assert lines[0].startswith("B: step_time>+5% broken") and "+10.00%" in lines[0]
    assert "'A'" in lines[0]
    assert lines[1].startswith("B: sync_stall>+2pp broken") and "+6.25pp" in lines[1]
    assert regressions(pair, parse_fail_on("step_time>+20%,sync_stall>+7pp")) == []
    assert regressions(pair, parse_fail_on("step_time>+10%")) == []   # exactly 10%: holds
    assert len(regressions(pair, parse_fail_on("samples_per_s<-5%"))) == 1
    assert regressions(pair, parse_fail_on("useful<-10pp,wall_time>+7%")) == []
    assert len(regressions(pair, parse_fail_on("sync_stall>+50%"))) == 1  # 0 -> 20 µs: inf


def test_every_later_run_is_checked_against_the_first() -> None:
    base, slow = _run(100, stall=False), _run(110, stall=True)
    cmp = compare([base, base, slow], ["A", "A2", "B"])
    assert list(cmp.summary.columns) == ["A", "A2", "B", "delta:A2", "rel:A2", "delta:B",
                                         "rel:B"]
    lines = regressions(cmp, parse_fail_on("step_time>+5%"))
    assert len(lines) == 1 and lines[0].startswith("B:")


def test_frameworks_with_different_kernel_names_still_compare_totals() -> None:
    torch_like = _run(100, stall=False, name="void at::native::gemm_kernel<float>(float*)")
    jax_like = _run(100, stall=False, name="fusion_1")
    jax_like.kernels = jax_like.kernels.assign(end_ns=jax_like.kernels["end_ns"] - 20 * U)
    cmp = compare([torch_like, jax_like], ["torch", "jax"])
    assert cmp.summary.loc["kernel_time_ns", "delta:jax"] == -60 * U
    assert cmp.summary.loc["kernels", "delta:jax"] == 0
    assert cmp.losses.loc["useful", "delta:jax"] == -60 * U
    assert set(cmp.kernels["short_name"]) == {"gemm_kernel<float>", "fusion_1"}
    assert cmp.kernels.loc["fusion_1", "torch"] == 0            # absent: took no time
    assert any("share no kernel names" in n for n in cmp.notes)


def test_a_fixture_compared_with_itself_changes_nothing() -> None:
    t = gpudiag.load(fixture("kineto/v100_rank1of2_nccl_profile_memory.json.gz"))
    cmp = compare([t, t], ["run", "same"], step_size=8)
    assert cmp.summary.loc["peak_reserved_bytes", "run"] > 0
    assert cmp.summary.loc["step_time_ns", "run"] > 0
    for frame in cmp.tables().values():
        changes = frame[[c for c in frame.columns if c.endswith(":same")
                         and not c.startswith("count:")]]
        assert (changes.fillna(0) == 0).all().all()
    everything = ("step_time>+0%,wall_time>+0%,samples_per_s<-0%,peak_memory>+0%,"
                  "peak_allocated>+0%," + ",".join(f"{c}>+0pp,{c}>+0%"
                                                   for c in cmp.losses.index))
    assert regressions(cmp, parse_fail_on(everything)) == []
    json.dumps(cmp.to_dict(), allow_nan=False)


def test_a_budget_that_cannot_be_checked_is_an_input_error() -> None:
    no_steps = _run(100, stall=False)
    no_steps.ranges = None
    cmp = compare([no_steps, no_steps], ["A", "B"])
    assert math.isnan(cmp.summary.loc["step_time_ns", "A"])
    assert any("no step markers" in n for n in cmp.notes)
    with pytest.raises(InputError, match="step markers"):
        regressions(cmp, parse_fail_on("step_time>+5%"))
    with pytest.raises(InputError, match="memory"):
        regressions(cmp, parse_fail_on("peak_memory>+5%"))
    with pytest.raises(InputError, match="step-size"):
        regressions(cmp, parse_fail_on("samples_per_s<-5%"))


@pytest.mark.parametrize("spec", ["step_time>5", "speed>+5%", "step_time>+5pp",
                                  "step_time>-5%", "samples_per_s<+5%", "step_time=5%",
                                  "sync_stall>+2pp,,oops"])
def test_bad_specs_are_one_line_input_errors(spec: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_fail_on(spec)
    message = str(caught.value)
    assert message.startswith("--fail-on: cannot read budget '") and "\n" not in message
    assert "METRIC>+N%" in message


def test_specs_read_with_spaces_and_defaults() -> None:
    budgets = parse_fail_on(" step_time > +5% , samples_per_s<5%, sync_stall>2pp,")
    assert [str(b) for b in budgets] == ["step_time>+5%", "samples_per_s<-5%",
                                         "sync_stall>+2pp"]
    assert parse_fail_on("") == []


def test_versus_says_inf_when_the_baseline_had_none() -> None:
    out = versus(pd.DataFrame({"a": [0.0, 0.0, 4.0], "b": [3.0, 0.0, 2.0]}), ["a", "b"])
    assert out["rel:b"].tolist() == [math.inf, 0.0, -0.5]
    assert out["delta:b"].tolist() == [3.0, 0.0, -2.0]


def test_compare_rejects_caller_mistakes() -> None:
    t = _run(100, stall=False)
    with pytest.raises(ValueError, match="two or more"):
        compare([t], ["A"])
    with pytest.raises(ValueError, match="distinct"):
        compare([t, t], ["A", "A"])


def test_to_dict_is_plain_json(pair: Comparison) -> None:
    data = json.loads(json.dumps(pair.to_dict(), allow_nan=False))
    assert data["baseline"] == "A" and data["labels"] == ["A", "B"]
    step = next(r for r in data["summary"] if r["metric"] == "step_time_ns")
    assert step["delta:B"] == 10 * U
    stall = next(r for r in data["losses"] if r["cause"] == "sync_stall")
    assert stall["rel:B"] is None                               # inf has no JSON form
    assert {"kind", "quantity", "A", "B"} <= set(data["syncs"][0])


def test_terminal_rendering_has_every_section_and_no_color_off_a_terminal(
        pair: Comparison) -> None:
    out = io.StringIO()
    print_comparison(pair, Console(file=out, width=160))
    text = out.getvalue()
    assert "\x1b[" not in text
    for expected in ("step time (median, after warm-up)", "B vs A", "+10 µs (+10.0%)", "sync_stall",
                     "+6.2 pp", "Sync points per kind", "gemm"):
        assert expected in text, expected
