"""The words of the host-side findings: evidence from the numbers, advice per framework.

One action per cause, in the framework that made the trace (a jax or TensorFlow user gets
no DataLoader advice); `None` framework gets the torch wording, the common case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudiag.analyzers.findings import format_ns

#: cause -> framework -> advice
ADVICE: Mapping[str, Mapping[str, str]] = {
    "host_data_loading": {
        "tensorflow": "build the input as a tf.data pipeline with .map(..., num_parallel_calls="
                      "tf.data.AUTOTUNE) and .prefetch(tf.data.AUTOTUNE), so the next batch "
                      "is ready while this step runs",
        "torch": "load batches in the background: DataLoader(num_workers=4 or more, "
                 "persistent_workers=True, prefetch_factor=2, pin_memory=True when training "
                 "on a GPU), and move per-sample Python work (decoding, transforms) into the "
                 "workers or onto whole batches",
        "jax": "prefetch the input pipeline off the training thread (a background thread or "
               "a tf.data / grain pipeline with prefetch) and jax.device_put the next batch "
               "while this step runs",
    },
    "host_python_overhead": {
        "tensorflow": "the step spends this time in Python (eager ops): wrap the step in "
                      "tf.function (jit_compile=True compiles it with XLA) and keep per-step "
                      "host reads (.numpy(), float(loss)) out of the loop",
        "torch": "the step spends this time in Python outside torch ops: move per-step "
                 "logging, metrics and .item()/.cpu() reads out of the loop (every N steps), "
                 "vectorize per-element Python, and torch.compile the model to cut per-op "
                 "dispatch",
        "jax": "the step spends this time in Python around the jitted call: keep the loop "
               "body inside jit (jax.lax.scan over several steps), avoid per-step host reads "
               "(float(loss), np.asarray) and Python-side batch preparation",
    },
    "host_off_cpu": {
        "tensorflow": "the training thread was off a CPU between ops: on a shared machine "
                      "other processes took its cores (check the load; pin the job with "
                      "taskset or numactl; fewer tf.data or intra-op threads than cores), "
                      "else it blocked outside any op (file or network I/O, a sleep, a "
                      "lock): move that work off the training thread",
        "torch": "the training thread was off a CPU between ops: on a shared machine other "
                 "processes took its cores (check the load; pin the job with taskset or "
                 "numactl; keep DataLoader workers plus torch.get_num_threads() within the "
                 "cores), else it blocked outside any op (file or network I/O, a sleep, a "
                 "lock): move that work off the training thread",
        "jax": "the training thread was off a CPU between ops: on a shared machine other "
               "processes took its cores (check the load; pin the job with taskset or "
               "numactl), else it blocked outside any op (file or network I/O, a sleep, a "
               "lock): move that work off the training thread",
    },
    "host_optimizer": {
        "tensorflow": "run the optimizer inside the tf.function step (apply_gradients there), "
                      "not eagerly, so the update is one graph",
        "torch": "use the multi-tensor or fused optimizer (torch.optim.AdamW(..., "
                 "foreach=True), or fused=True on CUDA) and zero_grad(set_to_none=True); "
                 "many small parameter tensors make the per-parameter loop expensive",
        "jax": "fuse the update into the jitted step (optax inside the jit) instead of "
               "updating parameters in Python",
    },
    "host_compile": {
        "tensorflow": "the step retraces after warm-up: give tf.function an input_signature "
                      "(or reduce_retracing=True) and keep shapes and dtypes fixed (pad the "
                      "last batch, drop_remainder=True)",
        "torch": "the step recompiles after warm-up: keep input shapes and dtypes fixed "
                 "(pad the last batch, drop_last=True) or mark dynamic dimensions "
                 "(torch._dynamo.mark_dynamic); TORCH_LOGS=recompiles says why",
        "jax": "the step recompiles after warm-up: keep shapes, dtypes and static arguments "
               "fixed between calls (pad the last batch); jax.config.update("
               "'jax_log_compiles', True) says which call recompiles",
    },
    "host_op": {
        "tensorflow": "most of the step is this op's host time: on a CPU run that is the "
                      "computation (check the intra-op threads); on a GPU run, its dispatch "
                      "(tf.function with jit_compile=True fuses ops into fewer launches)",
        "torch": "most of the step is this op's own host time: on a CPU run that is the "
                 "model's compute (check torch.get_num_threads() against the cores, try "
                 "channels_last, bf16 autocast or torch.compile); on a GPU run, its launch "
                 "and dispatch overhead (fewer, larger ops: torch.compile or CUDA graphs)",
        "jax": "most of the step is this event's host time: if it is the computation on a "
               "CPU backend, make the jitted function cheaper or run it on the accelerator; "
               "if it is dispatch, jit a larger part of the loop",
    },
}

_WHAT = {"host_data_loading": "data loading", "host_python_overhead":
         "Python outside framework ops", "host_optimizer": "the optimizer (step, zero_grad)",
         "host_compile": "compilation",
         "host_off_cpu": "time off a CPU between ops (descheduled or blocked)"}


def advice(cause: str, framework: str | None) -> str:
    """The action for a host cause, in the words of the framework ('torch' by default)."""
    by_framework = ADVICE[cause]
    return by_framework.get(framework or "torch", by_framework["torch"])


def evidence(cause: str, ns: int, context: Mapping[str, Any]) -> str:
    """One sentence of numbers: how much of the step, over how many steps."""
    steps, total = int(context["steps"]), int(context["total"])
    share = ns / total if total else 0.0
    per_step = ns / max(steps, 1)
    scope = ("the profiled span (no steps found)" if context.get("whole")
             else f"{steps} step{'s' if steps != 1 else ''}"
             + (f" after {context['warmup']} warm-up" if context.get("warmup") else ""))
    if cause == "host_op":
        calls = int(context.get("calls", 0))
        return (f"{calls} call{'s' if calls != 1 else ''}, {format_ns(ns)} self time in all, "
                f"{format_ns(per_step)} per step: {100 * share:.0f}% of the host's step time over "
                f"{scope}")
    return (f"{_WHAT[cause]} took {format_ns(per_step)} of the average "
            f"{format_ns(total / max(steps, 1))} step on the training thread "
            f"({100 * share:.0f}%, over {scope})")
