"""Collective timing on one process: torch.distributed all_reduce with a world of size 1.

What is planted: nothing wrong. Each step all_reduces tensors of a few sizes (`--sizes`, in
bytes) in a process group of world size 1 (NCCL on a GPU, gloo on CPU), initialized through
a file store in a temporary directory, so no launcher or network is needed. On CUDA each
all_reduce is timed with CUDA events, read once after the loop.

What gpudiag should report: one collective per all_reduce in the trace (`rows.collectives`
of `gpudiag analyze --json`), with sizes and times that agree with the CUDA-event times
printed here, algbw/busbw in the collective table; with a single rank there is no peer to
wait for, so `comm_wait` is 0.

The fix: none; this is the harness that checks gpudiag's NCCL timing on real hardware.

    python examples/nccl_allreduce.py --device cuda --steps 20
    python -m gpudiag profile -- python examples/nccl_allreduce.py

Prints one JSON line on stdout at the end: per size the median all_reduce time in µs (CUDA
events on GPU, wall clock on CPU) and the algorithm bandwidth. Runs without gpudiag.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _example
import torch
import torch.distributed as dist

DEFAULT_SIZES = {"cuda": "4096,1048576,67108864", "cpu": "4096,65536,1048576"}


class Clock:
    """Start/stop pairs per size: CUDA events (read after the loop) or wall clock."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.pairs: dict[int, list[list[Any]]] = {}

    def start(self, size: int) -> None:
        mark: Any = torch.cuda.Event(enable_timing=True) if self.cuda else time.perf_counter()
        if self.cuda:
            mark.record()
        self.pairs.setdefault(size, []).append([mark])

    def stop(self, size: int) -> None:
        pair = self.pairs[size][-1]
        if self.cuda:
            pair.append(torch.cuda.Event(enable_timing=True))
            pair[1].record()
        else:
            pair.append(time.perf_counter())

    def medians_us(self, skip: int) -> dict[int, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for size, pairs in self.pairs.items():
            kept = pairs[skip:] or pairs
            times = [a.elapsed_time(b) * 1000.0 if self.cuda else (b - a) * 1e6
                     for a, b in kept]
            out[size] = statistics.median(times)
        return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = _example.pick_device(args.device, "nccl_allreduce")
    backend = "nccl" if device.type == "cuda" else "gloo"
    sizes = [int(s) for s in (args.sizes or DEFAULT_SIZES[device.type]).split(",")]
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(backend, init_method=(Path(tmp) / "store").as_uri(),
                                rank=0, world_size=1)
        try:
            tensors = {n: torch.ones(max(n // 4, 1), device=device) for n in sizes}
            clock = Clock(device.type == "cuda")
            for _ in range(args.steps):
                _example.step()
                for n, t in tensors.items():
                    with _example.region(f"all_reduce {n} B"):
                        clock.start(n)
                        dist.all_reduce(t)
                        clock.stop(n)
            medians = clock.medians_us(skip=min(args.warmup, args.steps // 2))
        finally:
            dist.destroy_process_group()
    rows = [{"bytes": n, "median_us": round(us, 3),
             "algbw_gb_s": round(n / (us * 1e3), 3) if us > 0 else None}
            for n, us in medians.items()]
    return {"example": "nccl_allreduce", "device": device.type, "backend": backend,
            "world_size": 1, "steps": args.steps, "all_reduce": rows}


def parser() -> argparse.ArgumentParser:
    p = _example.base_parser(__doc__, default_steps=20)
    p.add_argument("--sizes", help="comma-separated bytes per all_reduce (default by device)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the medians")
    return p


if __name__ == "__main__":
    _example.cli(run, parser())
