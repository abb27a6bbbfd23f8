"""Training steps: from markers, or found (`detection`: torch optimizer steps, jax jitted
steps, a repeating op sequence); warm-up flags and the per-step waterfall (`training`).

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.steps.<function>` keeps working.
"""

from __future__ import annotations

from gpudiag.analyzers.steps.training import (
    flag_warmup,
    losses_by_step,
    step_windows,
    summary,
    training_steps,
    warmup_window,
)

__all__ = ["flag_warmup", "losses_by_step", "step_windows", "summary", "training_steps",
           "warmup_window"]
