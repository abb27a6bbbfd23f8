"""Planted problem: memory the CUDA caching allocator holds but cannot use (fragmentation).

What is planted: `--blocks` pairs of tensors of two interleaved sizes, 4 MiB and 6 MiB on
CUDA, are allocated; the allocator packs such 1-10 MiB requests into shared 20 MiB
segments, two pairs each. Then every 4 MiB tensor is freed, out of allocation order,
leaving 4 MiB holes between live 6 MiB tensors, and `torch.cuda.empty_cache()` is called,
as code trying to give memory back does: it only returns wholly free segments, so the
holes stay reserved. Each of the `--steps` training steps then allocates 5 MiB
activations, which fit in no hole, so the allocator reserves new segments beside 1.25 GiB
of stranded free memory.

What gpudiag should report: a `fragmentation` finding (stranded free bytes beside blocks in
use, fragmentation ratio = 1 - largest free block / free bytes near 1), from the memory
snapshot (`--snapshot PATH`) or the torch backend's memory collection, with the advice
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

The fix: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (empty_cache then unmaps the
holes, whole 2 MiB pages here, and new requests grow one segment), or allocate long-lived
tensors first and keep sizes uniform. With it, reserved / allocated and the fragmentation
ratio both drop.

    python examples/fragmentation.py --device cuda --snapshot frag.pickle
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python examples/fragmentation.py
    python -m gpudiag analyze frag.pickle

On CPU there is no caching allocator: the same allocations run (with smaller sizes) as a
smoke test and the memory numbers in the JSON line are null. Prints one JSON line on stdout
at the end: reserved and allocated bytes, their ratio, and torch's own counters of inactive
split bytes. Runs without gpudiag installed (the markers become no-ops).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import _example
import torch

MIB = 1 << 20
#: (freed size, kept size, step activation size, pairs) per device; CPU only smoke-tests
SIZES = {"cuda": (4 * MIB, 6 * MIB, 5 * MIB, 320),
         "cpu": (64 * 1024, 96 * 1024, 80 * 1024, 50)}


def tensor(nbytes: int, device: torch.device) -> torch.Tensor:
    """A float32 tensor of `nbytes`, written once so the memory is really used."""
    return torch.empty(nbytes // 4, device=device).fill_(1.0)


def fragment(pairs: int, freed: int, kept: int, device: torch.device) -> list[torch.Tensor]:
    """Interleave two sizes, then free every larger one in reverse order: holes between
    live blocks. Returns the live tensors (they must outlive the steps)."""
    big, small = [], []
    for _ in range(pairs):
        big.append(tensor(freed, device))
        small.append(tensor(kept, device))
    while big:
        del big[-1]  # out of allocation order: the newest hole first
    if device.type == "cuda":
        torch.cuda.empty_cache()  # returns wholly free segments only, not the holes
    return small


def memory_numbers(device: torch.device) -> dict[str, Any]:
    """Reserved / allocated and torch's fragmentation counters (null on CPU)."""
    if device.type != "cuda":
        return {"reserved_bytes": None, "allocated_bytes": None,
                "reserved_over_allocated": None, "inactive_split_bytes": None,
                "peak_reserved_bytes": None, "segments": None}
    stats = torch.cuda.memory_stats()
    reserved = torch.cuda.memory_reserved()
    allocated = torch.cuda.memory_allocated()
    return {"reserved_bytes": reserved, "allocated_bytes": allocated,
            "reserved_over_allocated": round(reserved / allocated, 4) if allocated else None,
            "inactive_split_bytes": stats.get("inactive_split_bytes.all.current"),
            "peak_reserved_bytes": stats.get("reserved_bytes.all.peak"),
            "segments": stats.get("segment.all.current")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = _example.pick_device(args.device, "fragmentation")
    freed, kept, activation, pairs = SIZES[device.type]
    pairs = args.blocks or pairs
    if args.snapshot and device.type == "cuda":
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=200_000)
    with _example.region("fragment"):
        live = fragment(pairs, freed, kept, device)
    for _ in range(args.steps):
        _example.step()
        with _example.region("activations"):
            acts = [tensor(activation, device) for _ in range(args.activations)]
            total = sum(a.sum() for a in acts)
            del acts, total
    numbers = memory_numbers(device)
    if args.snapshot and device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(args.snapshot)
    del live
    return {"example": "fragmentation", "device": device.type, "pairs": pairs,
            "freed_block_bytes": freed, "kept_block_bytes": kept,
            "activation_bytes": activation, "steps": args.steps,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "snapshot": args.snapshot if device.type == "cuda" else None, **numbers}


def parser() -> argparse.ArgumentParser:
    p = _example.base_parser(__doc__, default_steps=20)
    p.add_argument("--blocks", type=int, help="pairs of interleaved tensors (default by device)")
    p.add_argument("--activations", type=int, default=8, help="5 MiB tensors per step")
    p.add_argument("--snapshot", help="CUDA: record allocator history, dump a snapshot here")
    return p


if __name__ == "__main__":
    _example.cli(run, parser())
