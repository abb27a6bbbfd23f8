"""`gpudiag compare` keys NCCL kernels by what they do, not by their signature, which NCCL
changed in 2.19 (`ncclKernel_<op>_<algo>_<proto>_<redop>_<type>(ncclWorkElem)` became
`ncclDevKernel_<op>_<redop>_<type>_<algo>_<proto>(ncclDevComm*, unsigned long, ncclWork*)`)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpudiag.analyzers.compare import compare
from gpudiag.analyzers.run_facts import kernel_key
from gpudiag.trace import Trace
from tests.builders import kernel, trace

OLD = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
NEW = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
U = 1_000


def _run(nccl_name: str, nccl_us: int) -> Trace:
    return trace(kernels=[kernel(0, 100 * U, "gemm"),
                          kernel(200 * U, (200 + nccl_us) * U, nccl_name)])


def test_one_allreduce_kernel_keeps_one_row_across_nccl_versions() -> None:
    cmp = compare([_run(OLD, 50), _run(NEW, 80)], ["before", "after"])
    k = cmp.kernels
    assert list(k.index) == ["nccl AllReduce RING LL Sum f32", "gemm"]
    row = k.loc["nccl AllReduce RING LL Sum f32"]
    assert (row["before"], row["after"], row["delta:after"]) == (50 * U, 80 * U, 30 * U)
    assert (row["count:before"], row["count:after"]) == (1, 1)
    assert not any("share no kernel names" in n for n in cmp.notes)


@pytest.mark.parametrize(("name", "key"), [
    (OLD, "nccl AllReduce RING LL Sum f32"),
    (NEW, "nccl AllReduce RING LL Sum f32"),
    ("ncclKernel_AllReduce_TREE_LL128_Sum___nv_bfloat16(ncclWorkElem)",
     "nccl AllReduce TREE LL128 Sum bf16"),
    ("ncclDevKernel_AllReduce_Sum_bf16_TREE_LL128(ncclDevComm*, unsigned long, ncclWork*)",
     "nccl AllReduce TREE LL128 Sum bf16"),
    ("ncclDevKernel_ReduceScatter_Sum_f16_NVLS_SIMPLE(x)",
     "nccl ReduceScatter NVLS SIMPLE Sum f16"),
    ("ncclKernel_ReduceScatter_COLLNET_DIRECT_SIMPLE_Sum_half(x)",
     "nccl ReduceScatter COLLNET_DIRECT SIMPLE Sum f16"),
    # all_gather and broadcast kernels do not depend on a type: older NCCL named Sum_int8_t
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "nccl AllGather RING LL"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "nccl AllGather RING LL"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "nccl Broadcast RING LL"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     "nccl SendRecv"),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "nccl SendRecv"),
])
def test_nccl_kernel_names_of_both_generations_have_one_key(name: str, key: str) -> None:
    assert kernel_key(pd.Series([name])).tolist() == [key]


def test_other_kernels_and_unparsed_nccl_names_keep_their_name() -> None:
    names = ["ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "gemm",
             "void at::native::vectorized_elementwise_kernel<4>(int)"]
    assert kernel_key(pd.Series(names, dtype="category")).tolist() == names
