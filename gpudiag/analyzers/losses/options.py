"""The thresholds of the gap rules, in one place.

`diagnose`, a job's map and the expected savings carry them as one `GapOptions` value; the
analyzers' public functions keep their keyword arguments (`idle_gaps(trace,
launch_gap_ns=...)`), their defaults these constants. Stdlib only: `gpudiag.jobs` reads the
defaults without importing the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

#: idle gaps shorter than this are per-launch host overhead, longer ones host work (HTA's
#: runtime cutoff)
LAUNCH_GAP_NS = 50_000
#: how far a blocking wait may miss a gap's edges and still explain it (Kineto's clocks
#: round to the microsecond)
SYNC_TOLERANCE_NS = 2_000


class GapKwargs(TypedDict):
    """The gap thresholds as keyword arguments."""

    launch_gap_ns: int
    sync_tolerance_ns: int


@dataclass(frozen=True)
class GapOptions:
    """What the gap rules are given (`losses.gaps`: rules 3-5 and 1)."""

    launch_gap_ns: int = LAUNCH_GAP_NS
    sync_tolerance_ns: int = SYNC_TOLERANCE_NS

    def kwargs(self) -> GapKwargs:
        """As the keyword arguments the analyzers' functions take."""
        return {"launch_gap_ns": self.launch_gap_ns, "sync_tolerance_ns": self.sync_tolerance_ns}
