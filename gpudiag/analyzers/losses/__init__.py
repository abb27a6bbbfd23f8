"""The loss model: every nanosecond of a device's window gets one cause.

`waterfall` (the loss table and `LossTimeline`), `gaps` (idle gaps and their causes), `waits`
(blocking host waits, deduplicated). `gpudiag.analyzers.losses.losses(trace)` is the waterfall.

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.losses.<function>` keeps working.
"""

from __future__ import annotations

from gpudiag.analyzers.losses.waterfall import (
    LossTimeline,
    loss_timeline,
    losses,
    losses_frame,
)

__all__ = ["LossTimeline", "loss_timeline", "losses", "losses_frame"]
