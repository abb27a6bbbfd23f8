"""A tiny jax training loop: a jitted SGD step of a small MLP, run STEPS times. No gpudiag
markers: the steps must be found from the jitted step's executions.

    python tests/programs/jax_cpu_train.py [STEPS]
    python tests/programs/jax_cpu_train.py 20 --trace DIR    # jax.profiler, no Python tracer

`--trace` wraps the whole program (setup and the first call's compile too) in
jax.profiler.trace with the Python tracer off: how tests/data/jax_cpu_train.xplane.pb.gz
was recorded.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import jax
import jax.numpy as jnp


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    h = jax.nn.relu(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


@jax.jit
def train_step(params: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss


def train(steps: int) -> None:
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (32, 64)) * 0.1,
              "w2": jax.random.normal(k2, (64, 1)) * 0.1}
    x = jax.random.normal(k3, (128, 32))
    y = jnp.sum(x, axis=1, keepdims=True)
    loss = None
    for _ in range(steps):
        params, loss = train_step(params, x, y)
    print(f"loss {float(loss):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("steps", type=int, nargs="?", default=20)
    parser.add_argument("--trace", help="record with jax.profiler into this directory")
    parser.add_argument("--perfetto", action="store_true",
                        help="also write the trace-viewer JSON (create_perfetto_trace=True)")
    args = parser.parse_args()
    profiler: Any = contextlib.nullcontext()
    if args.trace:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        profiler = jax.profiler.trace(args.trace, profiler_options=options,
                                      create_perfetto_trace=args.perfetto)
    with profiler:
        train(args.steps)


if __name__ == "__main__":
    main()
