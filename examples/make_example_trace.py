"""Write examples/traces/train_loop_sync.pt.trace.json.gz: a small synthetic PyTorch-profiler
trace of a training loop that syncs every step, for the README's first command.

It is synthetic (no GPU was used), built with the same builder the unit tests use, and shaped
like a real Kineto trace: ProfilerStep annotations, aten ops, cudaLaunchKernel calls with
correlated kernels, a pageable host-to-device batch copy, a `.item()` that blocks in
cudaStreamSynchronize every step, and small elementwise kernels. Real recorded traces live in
tests/data/ (recorded by gpudiag on a GPU) and ../shared/fixtures/.

    python examples/make_example_trace.py            # rewrites the tracked trace
    python examples/make_example_trace.py -o my.json.gz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.builders import KinetoTrace  # noqa: E402

GEMM = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
        "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add"
       "<float>, at::detail::Array<char*, 2> >(int, at::native::CUDAFunctorOnSelf_add<float>, "
       "at::detail::Array<char*, 2>)")
RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
        "at::native::detail::ClampLimits)::{lambda()#1}, at::detail::Array<char*, 2> >(int)")
REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
          "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >"
          "(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
          "unsigned int, float, 4>)")


def step(kt: KinetoTrace, t0: float, number: int) -> float:
    """One training step starting at t0 (µs); returns when the next one starts."""
    kt.annotation(f"ProfilerStep#{number}", ts=t0, dur=1900)
    c = kt.runtime("cudaMemcpyAsync", ts=t0 + 20, dur=180)
    kt.memcpy("HtoD", "Pageable", "Device", ts=t0 + 40, dur=150, correlation=c,
              nbytes=8 << 20, stream=7)
    t, gpu = t0 + 210, t0 + 200
    for layer in range(6):
        kt.op("aten::linear", ts=t, dur=60)
        c = kt.launch(ts=t + 5, dur=8)
        gpu = max(gpu, t + 15)
        kt.kernel(GEMM, ts=gpu, dur=90, correlation=c, grid=(64, 4, 1), block=(256, 1, 1))
        gpu += 92
        for name in (ADD, RELU):
            c = kt.launch(ts=t + 30, dur=6)
            gpu = max(gpu, t + 38)
            kt.kernel(name, ts=gpu, dur=3, correlation=c, grid=(8, 1, 1), block=(128, 1, 1))
            gpu += 4
        t += 70 + 4 * layer
    kt.op("aten::mean", ts=t, dur=20)
    c = kt.launch(ts=t + 5, dur=7)
    kt.kernel(REDUCE, ts=max(gpu, t + 14), dur=6, correlation=c, grid=(1, 1, 1), block=(512, 1, 1))
    kt.op("aten::item", ts=t + 25, dur=max(gpu, t + 14) - t - 5)
    wait = max(gpu, t + 14) + 8 - (t + 30)
    c = kt.runtime("cudaStreamSynchronize", ts=t + 30, dur=wait)
    kt.cuda_sync("Stream Sync", ts=t + 30, dur=wait, correlation=c, stream=7)
    return t0 + 2000


TRACKED = ROOT / "examples" / "traces" / "train_loop_sync.pt.trace.json.gz"


def build() -> KinetoTrace:
    kt = KinetoTrace()
    kt.header["baseTimeNanoseconds"] = 1_767_225_600_000_000_000  # 2026-01-01
    kt.header["traceName"] = "synthetic example: training loop with a sync every step"
    t = 1000.0
    for number in range(1, 9):
        t = step(kt, t, number)
    return kt


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description="Write the synthetic example trace of a "
                                     "training loop that syncs every step.")
    parser.add_argument("-o", "--output", type=Path, default=TRACKED,
                        help="where to write the trace (default: the tracked example, "
                             "examples/traces/train_loop_sync.pt.trace.json.gz)")
    out: Path = parser.parse_args(argv).output
    build().write(out)
    return out


if __name__ == "__main__":
    print(main())
