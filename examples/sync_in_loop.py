"""Planted bottleneck: the host waits for the GPU in every training step.

What is planted: a small MLP trains on batches the host waits for each step (a sleep of
`--host-ms` standing in for a data pipeline), a wait that would normally overlap the GPU's
work on the previous step. The loop calls `torch.cuda.synchronize()` and then reads
`loss.item()` every step, so the GPU drains its queue and sits idle while the host prepares
and launches the next step.

What gpudiag should report: `sync_stall` as the top finding, more than 20% of the GPU
window, at the `.item()` / synchronize call sites in this file, with the advice to move
`.item()` out of the step loop.

The fix (`--fixed`): no synchronize, and the loss is logged every `--log-every` steps (50)
through a non-blocking copy into pinned memory, printed once its CUDA event has completed,
so the host never blocks: sync_stall falls under 2% and steps/s rises. (The simpler
`if step % 50 == 0: print(loss.item())` drains the queue once per 50 steps, about 1/50 of the
planted stall.)

    python examples/sync_in_loop.py --device cuda --steps 200
    python examples/sync_in_loop.py --device cuda --steps 200 --fixed
    python -m gpudiag profile -- python examples/sync_in_loop.py --steps 200

Prints one JSON line on stdout at the end, e.g.
`{"example": "sync_in_loop", "fixed": false, "steps_per_s": 151.2, ...}`; the loss log goes
to stderr. Runs without gpudiag installed (the markers become no-ops).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

import _example
import torch

SIZES = {"cuda": {"width": 2048, "batch": 2048, "host_ms": 2.0},
         "cpu": {"width": 128, "batch": 64, "host_ms": 1.0}}


class LossLog:
    """Logs the loss every `every` steps without blocking the host (the fix).

    On CUDA the scalar is copied into one of a few pinned buffers with non_blocking=True
    and printed once its event has completed; on CPU it is printed directly.
    """

    def __init__(self, every: int, device: torch.device) -> None:
        self.every = every
        self.cuda = device.type == "cuda"
        self.free = [torch.empty((), pin_memory=True) for _ in range(4)] if self.cuda else []
        self.pending: list[tuple[int, torch.Tensor, Any]] = []

    def log(self, number: int, loss: torch.Tensor) -> None:
        self._print_done(block=False)
        if number % self.every:
            return
        if not self.cuda:
            print(f"step {number} loss {loss.item():.5f}", file=sys.stderr)
            return
        if not self.free:  # the GPU is 4 logging intervals behind: wait for the oldest
            self._print_done(block=True, limit=1)
        buffer = self.free.pop()
        buffer.copy_(loss.detach(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((number, buffer, event))

    def _print_done(self, block: bool, limit: int | None = None) -> None:
        """Print the copies whose event completed (`block`: wait for them, up to `limit`).

        Without `block` only `query()` is called, never a synchronize, so the loop holds no
        blocking wait at all.
        """
        while self.pending and (limit is None or limit > 0):
            number, buffer, event = self.pending[0]
            if block:
                event.synchronize()
            elif not event.query():
                return
            self.pending.pop(0)
            print(f"step {number} loss {float(buffer):.5f}", file=sys.stderr)
            self.free.append(buffer)
            limit = None if limit is None else limit - 1

    def close(self) -> None:
        self._print_done(block=True)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The training loop; returns the numbers printed as the JSON line."""
    device = _example.pick_device(args.device, "sync_in_loop")
    _example.fill_defaults(args, SIZES[device.type])
    torch.manual_seed(0)
    rng = random.Random(0)
    model = _example.mlp(args.width, args.layers, torch.nn.ReLU, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)
    target = torch.zeros(args.batch, args.width, device=device)
    log = LossLog(args.log_every, device)
    losses: list[float] = []
    warmup = min(args.warmup, args.steps // 2)
    start = time.perf_counter()
    for number in range(args.steps):
        if number == warmup:
            start = time.perf_counter()
        _example.step()
        with _example.region("data"):
            scale = _example.wait_for_batch(args.host_ms, rng)
            x = torch.randn(args.batch, args.width, device=device) * scale
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.fixed:
            log.log(number, loss)
        else:  # the planted bottleneck: two host syncs per step
            if device.type == "cuda":
                torch.cuda.synchronize()
            losses.append(loss.item())
    if device.type == "cuda":
        torch.cuda.synchronize()  # finish the queued steps before stopping the clock
    elapsed = time.perf_counter() - start
    log.close()
    timed = args.steps - warmup
    return {"example": "sync_in_loop", "fixed": bool(args.fixed), "device": device.type,
            "steps": args.steps, "timed_steps": timed, "elapsed_s": round(elapsed, 6),
            **_example.readback_numbers(args, timed, elapsed, losses)}


if __name__ == "__main__":
    _example.cli(train, _example.readback_parser(
        __doc__, fix="no per-step sync (the fix)", warmup="steps left out of steps/s"))
