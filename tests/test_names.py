"""Short display names of C++ kernels."""

from __future__ import annotations

import pandas as pd
import pytest

from gpudiag.names import short_name, short_names

CASES = {
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1>)":
        "vectorized_elementwise_kernel<4, FillFunctor<float>, Array<char*, 1>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
    "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
    "at::native::detail::ClampLimits)::{lambda()#1}, at::detail::Array<char*, 2> >(int)":
        "vectorized_elementwise_kernel<4, launch_clamp_scalar.lambda, Array<char*, 2>>",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false>"
    "(float*, float const*, int, int, int)": "softmax_warp_forward<float, float, float, 8, false>",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)":
        "ncclKernel_AllReduce_RING_LL_Sum_float",
    "cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)": "computeOffsetsKernel",
    "jacobi": "jacobi",
    "Memcpy HtoD (Pageable -> Device)": "Memcpy HtoD (Pageable -> Device)",
    "at::native::foo<(int)3>(x)": "foo<(int)3>",
}


@pytest.mark.parametrize("name", CASES)
def test_short_name_drops_return_type_parameters_and_namespaces(name: str) -> None:
    assert short_name(name) == CASES[name]


def test_short_name_truncates_to_width() -> None:
    assert short_name("k" * 200, width=20) == "k" * 19 + "…"


def test_distinct_names_with_equal_short_forms_stay_distinct() -> None:
    names = pd.Series(["a::k(int)", "b::k(float)", "a::k(int)"])
    assert short_names(names).tolist() == ["k", "k #2", "k"]
