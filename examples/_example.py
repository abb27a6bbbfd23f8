"""What every example program shares: gpudiag's markers when available, the device, the flags.

    import _example
    args = _example.base_parser(__doc__, default_steps=20).parse_args()
    device = _example.pick_device(args.device, "my_example")

Why a module of its own: the examples are small programs people read to see a planted
bottleneck, so each should hold only its workload, not another copy of the marker, device and
command-line boilerplate. They stay runnable as `python examples/X.py` (no package, no
install): Python puts the script's folder first on `sys.path`, so `import _example` finds this
file. Without gpudiag importable the markers `step()` and `region()` are no-ops, so the
examples also run where only torch (or jax) is installed. torch is imported inside the
functions that use it (`pick_device`, `mlp`), so jax_train and small_grids with CuPy run
without it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def pick_device(name: str, example: str) -> torch.device:
    """A torch device for `--device`: `auto` is cuda when torch sees a GPU; asking for cuda
    without one exits with a one-line reason naming `example` (status 1)."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{example}: --device cuda, but torch.cuda.is_available() is False")
    return torch.device(name)


def mlp(width: int, layers: int, activation: Callable[[], torch.nn.Module],
        device: torch.device) -> torch.nn.Module:
    """The model of the torch training examples: `layers` Linear(width, width) with an
    `activation()` between each two (none after the last), on `device`."""
    import torch

    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), activation()]
    return torch.nn.Sequential(*blocks[:-1]).to(device)


def base_parser(description: str, default_steps: int) -> argparse.ArgumentParser:
    """A parser with the flags every example takes: `--device cpu|cuda|auto` and `--steps`.

    `description` may be the whole module docstring: its first line is the --help summary.
    """
    p = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--steps", type=int, default=default_steps)
    return p


def readback_parser(description: str, fix: str, warmup: str) -> argparse.ArgumentParser:
    """base_parser plus the flags of the two loss-readback examples, sync_in_loop (torch) and
    jax_train: the same bottleneck in two frameworks, driven the same way. `fix` and `warmup`
    are the help texts of --fixed and --warmup."""
    p = base_parser(description, default_steps=200)
    p.add_argument("--fixed", action="store_true", help=fix)
    p.add_argument("--log-every", type=int, default=50, help="with --fixed: log interval")
    p.add_argument("--warmup", type=int, default=5, help=warmup)
    p.add_argument("--width", type=int, help="hidden size (default by device)")
    p.add_argument("--batch", type=int, help="batch size (default by device)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--host-ms", type=float, help="host work per step in ms (default by device)")
    return p


def readback_numbers(args: argparse.Namespace, timed: int, elapsed: float,
                     losses: list[float]) -> dict[str, Any]:
    """The keys both loss-readback examples end their JSON line with, so their runs compare
    key by key: steps/s over the `timed` steps (`elapsed` s), the last loss read back (None
    with --fixed) and the sizes."""
    return {"steps_per_s": round(timed / elapsed, 3) if elapsed > 0 else None,
            "final_loss": losses[-1] if losses else None, "host_ms": args.host_ms,
            "width": args.width, "batch": args.batch, "layers": args.layers}


def fill_defaults(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """Set each option left at None (`--width`, `--batch`...) to its per-device default."""
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def wait_for_batch(ms: float, rng: random.Random) -> float:
    """Stand-in for the host's per-step wait on a data pipeline: `ms` of sleep.

    A sleep, not a Python busy loop: a profiler tracing Python calls (torch's with_stack)
    would record every iteration of a loop. Returns an augmentation scale for the batch.
    """
    time.sleep(ms / 1000.0)
    return 1.0 + 0.01 * (rng.random() - 0.5)


def cli(run: Callable[[argparse.Namespace], dict[str, Any]],
        parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    """Parse `argv`, run the example and print its result as one JSON line on stdout.

    One JSON line, last on stdout, is what tests/test_examples.py and scripts/gpu_checks.py
    read; logs go to stderr.
    """
    print(json.dumps(run(parser.parse_args(argv))), flush=True)
