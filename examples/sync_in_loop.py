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
import contextlib
import importlib
import json
import random
import sys
import time
from typing import Any

import torch


def _import_gpudiag() -> Any:
    """gpudiag when it is importable, else None: the example must also run without it."""
    try:
        return importlib.import_module("gpudiag")
    except ImportError:
        return None


GPUDIAG = _import_gpudiag()


def step() -> None:
    """gpudiag.step() (closes the previous step, opens the next), or nothing."""
    if GPUDIAG is not None:
        GPUDIAG.step()


def region(name: str) -> contextlib.AbstractContextManager[Any]:
    """gpudiag.region(name), or a context that does nothing."""
    return GPUDIAG.region(name) if GPUDIAG is not None else contextlib.nullcontext()


SIZES = {"cuda": {"width": 2048, "batch": 2048, "host_ms": 2.0},
         "cpu": {"width": 128, "batch": 64, "host_ms": 1.0}}


def pick_device(name: str) -> torch.device:
    """`auto` is cuda when torch sees a GPU; asking for cuda without one is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        sys.exit("sync_in_loop: --device cuda, but torch.cuda.is_available() is False")
    return torch.device(name)


def wait_for_batch(ms: float, rng: random.Random) -> float:
    """Stand-in for the host's per-step wait on a data pipeline: `ms` of sleep.

    A sleep, not a Python busy loop: a profiler tracing Python calls (torch's with_stack)
    would record every iteration of a loop. Returns an augmentation scale for the batch.
    """
    time.sleep(ms / 1000.0)
    return 1.0 + 0.01 * (rng.random() - 0.5)


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


def build(width: int, layers: int, device: torch.device) -> torch.nn.Module:
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks[:-1]).to(device)


def train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The training loop; returns the numbers printed as the JSON line."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model = build(args.width, args.layers, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)
    target = torch.zeros(args.batch, args.width, device=device)
    log = LossLog(args.log_every, device)
    losses: list[float] = []
    warmup = min(args.warmup, args.steps // 2)
    start = time.perf_counter()
    for number in range(args.steps):
        if number == warmup:
            start = time.perf_counter()
        step()
        with region("data"):
            scale = wait_for_batch(args.host_ms, rng)
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
            "steps_per_s": round(timed / elapsed, 3) if elapsed > 0 else None,
            "final_loss": losses[-1] if losses else None, "host_ms": args.host_ms,
            "width": args.width, "batch": args.batch, "layers": args.layers}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fixed", action="store_true", help="no per-step sync (the fix)")
    p.add_argument("--log-every", type=int, default=50, help="with --fixed: log interval")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of steps/s")
    p.add_argument("--width", type=int, help="hidden size (default by device)")
    p.add_argument("--batch", type=int, help="batch size (default by device)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--host-ms", type=float, help="host work per step in ms (default by device)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    device = pick_device(args.device)
    for key, value in SIZES[device.type].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    print(json.dumps(train(args, device)), flush=True)


if __name__ == "__main__":
    main()
