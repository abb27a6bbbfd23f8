"""Planted bottleneck: the same work split into many small launches.

What is planted: 1024 x 32 = 32768 elements are processed either by one launch or by 32
launches over 1024-element slices (`--launches 1|32`), `--repeat` times per step.

- `--impl cupy` (needs a GPU and CuPy): a RawKernel launched with exactly the grids of the
  published comparison, 1 x <<<1024, 32>>> against 32 x <<<32, 32>>> (each thread runs
  `--iters` multiply-adds on its element). That measurement reports about 68% vs 22% SM
  utilization and 2.1 µs vs 57.6 µs total latency.
- `--impl torch` (default; runs on CPU too): `torch.sin` on the whole tensor vs on 32 slices.
  torch picks its own grid and block sizes (on CUDA roughly <<<64, 128>>> for the whole
  tensor and <<<2, 128>>> per slice, depending on the version), so the shapes differ from the
  published ones while the pattern — one launch vs 32 tiny ones — is the same. That is why
  the CuPy variant exists.

What gpudiag should report for `--launches 32`: a larger `small_grid` loss (SM time left
empty by grids far smaller than the GPU) than for `--launches 1`, and `launch_bound` /
`small_grid` as the top finding: 32 launches of a few µs each cost more in launch latency
than the work they do.

The fix: one launch over all the data (`--launches 1`), or fuse the launches (CUDA graphs,
`torch.compile`).

    python examples/small_grids.py --launches 32 --device cuda
    python examples/small_grids.py --impl cupy --launches 1
    python -m gpudiag profile -- python examples/small_grids.py --launches 32

Prints one JSON line on stdout at the end, with `per_pattern_us`: the time of one pattern
(1 or 32 launches) from CUDA events (wall clock on CPU), the "total latency" of the published
comparison. Runs without gpudiag installed (the markers become no-ops).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import _example

BLOCKS, THREADS = 1024, 32  # the whole work: 1024 blocks of 32 threads = 32768 elements
N = BLOCKS * THREADS

KERNEL = r"""
extern "C" __global__ void gpudiag_small_grid(const float* x, float* y, int offset, int n,
                                              int iters) {
    int i = offset + blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < iters; ++k) {
            v = v * 0.999f + 0.001f;
        }
        y[i] = v;
    }
}
"""


def torch_pattern(device_name: str, launches: int) -> tuple[Callable[[], None], Any]:
    """(one pattern, timer) with torch: sin over the tensor in 1 call or in `launches`."""
    import torch

    device = _example.pick_device(device_name, "small_grids")
    x = torch.rand(N, device=device)
    y = torch.empty_like(x)
    width = N // launches
    slices = [(x[i * width:(i + 1) * width], y[i * width:(i + 1) * width])
              for i in range(launches)]

    def pattern() -> None:
        for src, dst in slices:
            torch.sin(src, out=dst)

    return pattern, Timer("cuda" if device.type == "cuda" else "cpu", torch)


def cupy_pattern(device_name: str, launches: int, iters: int) -> tuple[Callable[[], None], Any]:
    """(one pattern, timer) with a CuPy RawKernel at exactly <<<1024/launches, 32>>>."""
    if device_name == "cpu":
        sys.exit("small_grids: --impl cupy needs a GPU; use --impl torch on CPU")
    try:
        import cupy as cp
    except ImportError:
        sys.exit("small_grids: --impl cupy needs CuPy (pip install cupy-cuda13x)")
    kernel = cp.RawKernel(KERNEL, "gpudiag_small_grid")
    x = cp.arange(N, dtype=cp.float32) / N
    y = cp.empty_like(x)
    blocks = BLOCKS // launches
    args = [(x, y, cp.int32(i * blocks * THREADS), cp.int32(N), cp.int32(iters))
            for i in range(launches)]

    def pattern() -> None:
        for a in args:
            kernel((blocks,), (THREADS,), a)

    return pattern, Timer("cupy", cp)


class Timer:
    """Summed ms of stretches of GPU work, from event pairs read once at the end.

    Reading the events only in `total_ms()` keeps host syncs out of the step loop, so the
    profile shows the launch pattern and not a sync of our own. Wall clock on CPU.
    """

    def __init__(self, kind: str, lib: Any) -> None:
        self.kind, self.lib = kind, lib
        self.pairs: list[list[Any]] = []
        self.cpu_ms = 0.0

    def _event(self) -> Any:
        if self.kind == "cuda":
            return self.lib.cuda.Event(enable_timing=True)
        return self.lib.cuda.Event()  # cupy: timing is on by default

    def start(self) -> None:
        if self.kind == "cpu":
            self.pairs.append([time.perf_counter()])
            return
        self.pairs.append([self._event()])
        self.pairs[-1][0].record()

    def stop(self) -> None:
        if self.kind == "cpu":
            self.cpu_ms += (time.perf_counter() - self.pairs.pop()[0]) * 1000.0
            return
        self.pairs[-1].append(self._event())
        self.pairs[-1][1].record()

    def reset(self) -> None:
        self.pairs, self.cpu_ms = [], 0.0

    def total_ms(self) -> float:
        if self.kind == "cpu" or not self.pairs:
            return self.cpu_ms
        self.pairs[-1][1].synchronize()
        if self.kind == "cuda":
            return sum(float(a.elapsed_time(b)) for a, b in self.pairs)
        return sum(float(self.lib.cuda.get_elapsed_time(a, b)) for a, b in self.pairs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.impl == "cupy":
        pattern, timer = cupy_pattern(args.device, args.launches, args.iters)
    else:
        pattern, timer = torch_pattern(args.device, args.launches)
    pattern()  # first call: module load / kernel compile, kept out of every number
    warmup = min(args.warmup, args.steps // 2)
    start = time.perf_counter()
    for number in range(args.steps):
        if number == warmup:
            timer.reset()
            start = time.perf_counter()
        _example.step()
        with _example.region(f"{args.launches}x"):
            timer.start()
            for _ in range(args.repeat):
                pattern()
            timer.stop()
    gpu_ms = timer.total_ms()  # the one wait for the GPU, after the loop
    elapsed = time.perf_counter() - start
    timed = args.steps - warmup
    blocks = BLOCKS // args.launches
    grid = [blocks, THREADS] if args.impl == "cupy" else None
    return {"example": "small_grids", "impl": args.impl, "device": timer.kind.replace(
        "cupy", "cuda"), "launches": args.launches, "grid_block": grid,
            "elements": N, "repeat": args.repeat, "steps": args.steps, "timed_steps": timed,
            "per_pattern_us": round(gpu_ms * 1000.0 / (timed * args.repeat), 3),
            "steps_per_s": round(timed / elapsed, 3) if elapsed > 0 else None}


def parser() -> argparse.ArgumentParser:
    p = _example.base_parser(__doc__, default_steps=20)
    p.add_argument("--impl", choices=("torch", "cupy"), default="torch")
    p.add_argument("--launches", type=int, choices=(1, 32), default=32)
    p.add_argument("--repeat", type=int, default=100, help="patterns per step")
    p.add_argument("--iters", type=int, default=100, help="cupy: multiply-adds per thread")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the numbers")
    return p


if __name__ == "__main__":
    _example.cli(run, parser())
