"""The host side: launch- and host-bound gaps by call site (`bound`), and each training
step's host time by category (`steps`, `categories`) with advice per framework (`advice`).

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.host.<function>` keeps working.
"""

from __future__ import annotations

from gpudiag.analyzers.host.bound import (
    findings,
    host_gaps,
)

__all__ = ["findings", "host_gaps"]
