"""The words of findings: tools named only when their data is there, call sites a user can
act on, no nan."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.diagnosis import diagnose
from gpudiag.analyzers.memory import allocator as memory
from gpudiag.analyzers.memory.sites import site_label
from gpudiag.readers.torch_memory.reader import read_snapshot
from tests.conftest import fixture


def _small_grid_evidence(t: gpudiag.Trace) -> list[str]:
    """The launch analyzer's evidence (ncu's own rule results are kernel_metrics')."""
    found = diagnose(t).findings
    grids = found[(found["cause"] == "small_grid")
                  & found["evidence"].str.contains("block slots")]
    return grids["evidence"].astype(str).tolist()


def test_a_kineto_trace_mentions_no_ncu() -> None:
    evidence = _small_grid_evidence(gpudiag.load(
        fixture("kineto/a100_alexnet_sync_critical_path.json.gz")))
    assert evidence, "the fixture has small-grid and tail findings"
    assert not any("ncu" in e or "Nsight" in e for e in evidence), evidence
    assert any("estimated speedup" in e for e in evidence)


def test_an_nsight_compute_report_names_ncus_rule() -> None:
    evidence = _small_grid_evidence(gpudiag.load(
        fixture("ncu/rtx4090_smem_square_9kernels_smallgrid.ncu-rep")))
    assert evidence and all("ncu Small Grid estimate 99%" in e for e in evidence)


# -- fragmentation sites -----------------------------------------------------------------------

def _frame(filename: str, line: int = 0, name: str = "f") -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


CPP = [_frame("??", 0, "torch::unwind::unwind()"), _frame("CUDACachingAllocator.cpp"),
       _frame("RegisterCUDA_0.cpp"),
       _frame("VariableType_2.cpp", 0, "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::"
              "detail::WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<at::Tensor ("
              "c10::DispatchKeySet, at::Tensor const&), &torch::autograd::VariableType::("
              "anonymous namespace)::new_empty_strided>>>::call(c10::OperatorKernel*)"),
       _frame("accumulate_grad.cpp", 0, "AccumulateGrad_apply_impl")]


@pytest.mark.parametrize(("outer", "site"), [
    ([_frame("<string>", 3, "<module>")], "<string>:3 (<module>)"),          # python -c
    ([_frame("<ipython-input-4-9f>", 2, "step")], "<ipython-input-4-9f>:2 (step)"),
    ([_frame("<eval_with_key>.3", 7, "forward"), _frame("/u/train.py", 9, "main")],
     "/u/train.py:9 (main)"),                                                # fx code: library
    ([_frame("<frozen runpy>", 88, "_run_code")], "<frozen runpy>:88 (_run_code)"),
])
def test_a_python_frame_further_out_wins_over_the_cpp_frames(
        tmp_path: Path, outer: list[dict[str, Any]], site: str) -> None:
    block = {"size": 300, "state": "active_allocated", "address": 1000, "frames": CPP + outer}
    data = {"segments": [{"device": 0, "address": 1000, "total_size": 300, "stream": 0,
                          "segment_type": "large", "blocks": [block]}], "device_traces": [[]]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data))
    assert read_snapshot(path).memory_blocks["site"].tolist() == [site]


def test_site_labels_keep_python_frames_and_shorten_cpp_ones() -> None:
    python = "/home/lin/cs336/assignment2-systems/cs336-basics/cs336_basics/optimizer.py:77 (step)"
    assert site_label(python) == python  # whole: the function name was cut to '(…'
    assert site_label("<string>:3 (<module>)") == "<string>:3 (<module>)"
    cpp = f"VariableType_2.cpp:0 ({CPP[3]['name']})"
    assert site_label(cpp) == "VariableType_2.cpp:0 (new_empty_strided; C++ stack, no Python frame)"


def test_the_fragmentation_finding_names_the_op_of_a_cpp_only_stack() -> None:
    t = gpudiag.load(fixture("memsnap/cs336_medium_ctx1024_training_18gb_inactive.pickle"))
    [where] = memory.findings(t)["where"].tolist()
    # the 18 GB fixture's top stranding blocks are gradients AccumulateGrad allocated on
    # autograd's thread: their stacks hold no Python frame at all
    assert where == "VariableType_2.cpp:0 (new_empty_strided; C++ stack, no Python frame)"


def test_a_fragmentation_ratio_nobody_measured_is_left_out_not_nan() -> None:
    assert memory._ratio(float("nan")) == ""
    assert memory._ratio(pd.NA) == ""
    assert memory._ratio(0.987) == " (fragmentation 0.99)"
