"""Allocator memory: fragmentation over time, OOM verdicts, stranded-block sites, churn.

`allocator` (the analyzer), `replay` and `layout` (the allocator state back from a snapshot),
`grid` (the address x time figure's data), `sites` (where stranded blocks were allocated).

The package re-exports its analyzer's public functions, so
`gpudiag.analyzers.memory.<function>` keeps working.
"""

from __future__ import annotations

from gpudiag.analyzers.memory.allocator import (
    churn,
    findings,
    fragmentation,
    ooms,
)

__all__ = ["churn", "findings", "fragmentation", "ooms"]
