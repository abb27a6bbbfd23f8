"""Planted bottleneck (JAX): the host reads the loss back in every step.

What is planted: a small MLP trains with a jitted step (`jax.value_and_grad` + SGD), and the
loop calls `loss.block_until_ready()` and `float(loss)` every step. JAX dispatches
asynchronously, so without them the host would queue step N+1 (and its host-side batch
preparation, `--host-ms`) while the device runs step N; with them the device idles while
the host catches up.

What gpudiag should report (`gpudiag profile --backend jax`, or an XSpace from
`jax.profiler`): `sync_stall` / host-side idle between the jitted steps as the top cause,
with the device idle after every readback.

The fix (`--fixed`): keep the loss on the device and read it every `--log-every` steps
(50); the loop then only blocks once at the end.

    python examples/jax_train.py --device cuda --steps 200
    python examples/jax_train.py --device cuda --steps 200 --fixed
    python -m gpudiag profile --backend jax -- python examples/jax_train.py

Prints one JSON line on stdout at the end (`steps_per_s` measured after `--warmup` steps, so
compilation is left out). Needs jax (`pip install jax`; jax[cuda13] for a GPU). Runs without
gpudiag installed (the markers become no-ops).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

import _example

SIZES = {"gpu": {"width": 2048, "batch": 2048, "host_ms": 2.0},
         "cpu": {"width": 128, "batch": 64, "host_ms": 1.0}}


def pick_device(jax: Any, name: str) -> Any:
    """A jax device: `auto` is the first GPU when jax has one, else the CPU."""
    if name in ("cuda", "auto"):
        try:
            return jax.devices("gpu")[0]
        except RuntimeError:
            if name == "cuda":
                sys.exit("jax_train: --device cuda, but jax has no GPU backend "
                         "(pip install 'jax[cuda13]')")
    return jax.devices("cpu")[0]


def make_step(jax: Any, jnp: Any) -> Any:
    def loss_fn(params: list[Any], x: Any) -> Any:
        h = x
        for i, w in enumerate(params):
            h = h @ w
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return jnp.mean(h * h)

    @jax.jit
    def train_step(params: list[Any], x: Any) -> tuple[list[Any], Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return [w - 1e-3 * g for w, g in zip(params, grads, strict=True)], loss

    return train_step


def train(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        sys.exit("jax_train: needs jax (pip install jax)")
    device = pick_device(jax, args.device)
    _example.fill_defaults(args, SIZES[device.platform if device.platform == "cpu" else "gpu"])
    rng = random.Random(0)
    with jax.default_device(device):
        keys = jax.random.split(jax.random.PRNGKey(0), args.layers + 1)
        params = [jax.random.normal(k, (args.width, args.width)) / args.width ** 0.5
                  for k in keys[:-1]]
        base = jax.random.normal(keys[-1], (args.batch, args.width))
        train_step = make_step(jax, jnp)
        warmup = min(args.warmup, args.steps // 2)
        losses: list[float] = []
        start = time.perf_counter()
        for number in range(args.steps):
            if number == warmup:
                jax.block_until_ready(params)
                start = time.perf_counter()
            _example.step()
            with _example.region("data"):
                x = base * _example.wait_for_batch(args.host_ms, rng)
            params, loss = train_step(params, x)
            if not args.fixed:  # the planted bottleneck: a readback every step
                loss.block_until_ready()
                losses.append(float(loss))
            elif number % args.log_every == 0:
                print(f"step {number} loss {float(loss):.5f}", file=sys.stderr)
        jax.block_until_ready(params)
        elapsed = time.perf_counter() - start
    timed = args.steps - warmup
    return {"example": "jax_train", "fixed": bool(args.fixed), "device": device.platform,
            "steps": args.steps, "timed_steps": timed,
            **_example.readback_numbers(args, timed, elapsed, losses)}


if __name__ == "__main__":
    _example.cli(train, _example.readback_parser(
        __doc__, fix="no per-step readback (the fix)", warmup="steps left out (compilation)"))
