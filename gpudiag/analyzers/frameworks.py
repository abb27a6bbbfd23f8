"""Which framework recorded a trace, and the findings' advice in its words.

A finding's advice is written once, in PyTorch's words (`findings.ADVICE`: `.item()`,
DataLoader, torch.compile), because the analyzers find the same causes in every trace. A JAX
or TensorFlow user told to call torch.compile has been told nothing, so `in_words_of` swaps
each such advice for the same action in the framework that made the trace, once the
findings are ranked (the expected-savings replay recognizes findings by their advice text,
so the swap comes after it).

    in_words_of(dx.findings, framework(trace))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from gpudiag.analyzers.findings import ADVICE
from gpudiag.trace import Trace

#: advice key -> framework -> the action in that framework's words (torch's is ADVICE's)
FRAMEWORK_ADVICE: Mapping[str, Mapping[str, str]] = {
    "launch_bound": {
        "jax": "fewer, larger launches: jit a larger part of the loop (the whole step, "
               "lax.scan over several steps) so XLA fuses the ops into fewer kernels",
        "tensorflow": "fewer, larger launches: run the step as tf.function(jit_compile=True) "
                      "so XLA fuses its ops into fewer kernels",
    },
    "host_python": {
        "jax": "the host runs Python between launches slower than the GPU runs them: jit "
               "the whole step (lax.scan over several) so one dispatch launches it all",
        "tensorflow": "the host runs Python between launches slower than the GPU runs them: "
                      "wrap the step in tf.function (jit_compile=True) so it runs as one graph",
    },
    "host_data": {
        "jax": "load data in the background: a prefetching input pipeline (tf.data or grain "
               "with prefetch) and jax.device_put of the next batch while the step runs",
        "tensorflow": "load data in the background: tf.data with .map(num_parallel_calls="
                      "tf.data.AUTOTUNE) and .prefetch(tf.data.AUTOTUNE)",
    },
    "sync_item": {
        "jax": "move host reads of device values (float(loss), np.asarray, "
               ".block_until_ready()) out of the step loop (every N steps), or keep the value "
               "on the device",
        "tensorflow": "move host reads of tensors (.numpy(), float(loss)) out of the step "
                      "loop (every N steps), or keep the value on the device",
    },
    "sync_copy": {
        "jax": "read the device value a step later (jax.device_get of the previous step's "
               "result) instead of waiting for this step's",
        "tensorflow": "read the tensor a step later (the previous step's .numpy()) instead of "
                      "waiting for this step's",
    },
    "copy_pageable": {
        "jax": "put the next batch on the device ahead of its step (jax.device_put while the "
               "step runs)",
        "tensorflow": "prefetch batches to the GPU (tf.data.experimental.prefetch_to_device)",
    },
    "small_grid": {
        "jax": "give the kernel more blocks than the GPU has SMs x blocks/SM: a larger batch, "
               "or let XLA fuse the small ops (jit a larger part of the step)",
        "tensorflow": "give the kernel more blocks than the GPU has SMs x blocks/SM: a larger "
                      "batch, or let XLA fuse the small ops (tf.function(jit_compile=True))",
    },
}


def framework(trace: Trace) -> str | None:
    """'torch', 'jax', 'tensorflow' or None: which framework's profiler recorded the trace."""
    return framework_of(formats_of(trace.meta),
                        bool((trace.ranges["source"] == "torch_op").any()))


def formats_of(meta: Mapping[str, Any]) -> frozenset[str]:
    """A trace's (or a job's merged) formats, its files' and its own, and what its meta
    says of its framework ('framework:tensorflow': an XSpace's reader tells TensorFlow from
    JAX)."""
    formats = {str(source.get("format")) for source in meta.get("sources", []) or []}
    formats.add(str(meta.get("format")))
    if meta.get("backend") == "jax":
        formats.add("xplane")
    if meta.get("framework"):
        formats.add(f"framework:{meta['framework']}")
    return frozenset(formats)


def framework_of(formats: frozenset[str], torch_ops: bool) -> str | None:
    """The framework of `formats_of`'s formats (of one trace or a job's ranks): the one its
    files declare, else JAX's for XLA formats, torch's for Kineto or torch ops."""
    declared = {name.split(":", 1)[1] for name in formats if name.startswith("framework:")}
    if len(declared) == 1:
        return declared.pop()
    if formats & {"xplane", "jax-perfetto"}:
        return "jax"
    if "kineto" in formats or torch_ops:
        return "torch"
    return None


def in_words_of(findings: pd.DataFrame, name: str | None) -> pd.DataFrame:
    """`findings` with each PyTorch-worded advice that has a version in `name`'s words
    swapped for it (unchanged for torch, None or a framework without one)."""
    if name is None:
        return findings
    swaps = {ADVICE[key]: words[name] for key, words in FRAMEWORK_ADVICE.items()
             if name in words}
    if not swaps or findings.empty:
        return findings
    return findings.assign(advice=findings["advice"].map(lambda text: swaps.get(text, text)))
