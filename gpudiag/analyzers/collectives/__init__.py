"""Collectives: bus bandwidth and overlap per call (`calls`), cross-rank arrival skew and
the wait intervals the waterfall uses (`skew`).

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.collectives.<function>` keeps working.
"""

from __future__ import annotations

from gpudiag.analyzers.collectives.calls import (
    arrival_skew,
    collective_calls,
    collective_stats,
    findings,
    overlap,
)

__all__ = ["arrival_skew", "collective_calls", "collective_stats", "findings", "overlap"]
