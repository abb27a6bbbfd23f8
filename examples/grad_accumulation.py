"""A trade-off to compare, not a bug: fp32 full batches vs bf16 with gradient accumulation.

What is planted: the same MLP trains on the same global batch (`--batch` samples per
optimizer step) either in fp32 in one pass (`--dtype fp32 --accum 1`) or under bf16 autocast
in `--accum` micro-batches whose gradients are summed before the step (`--dtype bf16
--accum 4`). Accumulation divides the activations held at once by `accum`, and bf16 halves
their size again and runs the matmuls on tensor cores; it launches `accum` times as many
kernels per optimizer step.

What gpudiag should report (`gpudiag compare` of the two runs, `--step-size` = batch): a
much lower peak memory for bf16 x 4 and a higher samples/s, with the waterfall of each run
side by side; no planted finding.

The fix it demonstrates: when activations do not fit, accumulate micro-batches (and use
bf16) instead of shrinking the global batch.

    python examples/grad_accumulation.py --dtype fp32 --accum 1
    python examples/grad_accumulation.py --dtype bf16 --accum 4
    python -m gpudiag compare RUN_FP32 RUN_BF16 --step-size 8192

Prints one JSON line on stdout at the end: samples/s, steps/s and peak memory (CUDA: the
allocator's peak allocated bytes; CPU: the process's peak resident set size, a coarse
stand-in, named in `peak_memory_source`). Runs without gpudiag installed.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time
from typing import Any

import _example
import torch

SIZES = {"cuda": {"width": 2048, "batch": 8192, "layers": 8},
         "cpu": {"width": 128, "batch": 256, "layers": 4}}


def peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(kib) * 1024, "ru_maxrss"


def train(args: argparse.Namespace) -> dict[str, Any]:
    device = _example.pick_device(args.device, "grad_accumulation")
    _example.fill_defaults(args, SIZES[device.type])
    if args.batch % args.accum:
        sys.exit(f"grad_accumulation: --batch {args.batch} is not divisible by "
                 f"--accum {args.accum}")
    torch.manual_seed(0)
    model = _example.mlp(args.width, args.layers, torch.nn.GELU, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)
    micro = args.batch // args.accum
    data = torch.randn(micro, args.width, device=device)
    target = torch.zeros(micro, args.width, device=device)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.dtype == "bf16"
                else contextlib.nullcontext())
    warmup = min(args.warmup, args.steps // 2)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for number in range(args.steps):
        if number == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        _example.step()
        for _ in range(args.accum):
            with _example.region("micro_batch"), autocast:
                loss = torch.nn.functional.mse_loss(model(data), target) / args.accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    timed = args.steps - warmup
    peak, source = peak_memory(device)
    return {"example": "grad_accumulation", "device": device.type, "dtype": args.dtype,
            "accum": args.accum, "batch": args.batch, "micro_batch": micro,
            "steps": args.steps, "timed_steps": timed,
            "steps_per_s": round(timed / elapsed, 3) if elapsed > 0 else None,
            "samples_per_s": round(timed * args.batch / elapsed, 1) if elapsed > 0 else None,
            "peak_memory_bytes": peak, "peak_memory_source": source,
            "width": args.width, "layers": args.layers}


def parser() -> argparse.ArgumentParser:
    p = _example.base_parser(__doc__, default_steps=20)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, help="global batch (default by device)")
    p.add_argument("--width", type=int, help="hidden size (default by device)")
    p.add_argument("--layers", type=int, help="linear layers (default by device)")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the numbers")
    return p


if __name__ == "__main__":
    _example.cli(train, parser())
