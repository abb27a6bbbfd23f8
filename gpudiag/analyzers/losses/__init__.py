"""The loss model: every nanosecond of a device's window gets one cause.

`waterfall` (the loss table and `LossTimeline`), `gaps` (idle gaps and their causes), `waits`
(blocking host waits, deduplicated), `options` (the gap thresholds, `GapOptions`, with their
defaults). `gpudiag.analyzers.losses.losses(trace)` is the waterfall.

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.losses.<function>` keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LossTimeline", "loss_timeline", "losses", "losses_frame"]


def __getattr__(name: str) -> Any:
    """The re-exports, imported on first use: `losses.options` (the gap thresholds, which
    `gpudiag.jobs` reads before the analysis is imported) needs no pandas."""
    if name in __all__:
        from gpudiag.analyzers.losses import waterfall

        return getattr(waterfall, name)
    raise AttributeError(f"module 'gpudiag.analyzers.losses' has no attribute {name!r}")
