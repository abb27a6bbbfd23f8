"""Loss budgets for CI: `gpudiag analyze --fail-on 'sync_stall>5%,small_grid>10%'`.

A budget is `CAUSE>LIMIT` where LIMIT is a share of the analyzed GPU time (`5%`) or a
time (`20ms`, `1.5s`, `300us`, `1000ns`). A cause's share is its lost time summed over all
devices divided by the sum of their windows, the same numbers the waterfall prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from gpudiag.analyzers.findings import LOSS_CAUSES, format_ns
from gpudiag.errors import InputError

_BUDGET = re.compile(r"^\s*(?P<cause>[a-z_]+)\s*>\s*(?P<value>\d+(?:\.\d+)?)\s*"
                     r"(?P<unit>%|ns|us|µs|ms|s)\s*$")
_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@dataclass(frozen=True)
class Budget:
    cause: str
    limit: float  # a share (0-1) when `share`, else ns
    share: bool

    def __str__(self) -> str:
        return (f"{self.cause}>{100 * self.limit:g}%" if self.share
                else f"{self.cause}>{format_ns(self.limit).replace(' ', '')}")


def parse(spec: str) -> list[Budget]:
    """'sync_stall>5%,host_bound>20ms' -> budgets; an InputError names a bad part."""
    budgets = []
    for part in filter(str.strip, spec.split(",")):
        m = _BUDGET.match(part)
        if m is None or m["cause"] not in LOSS_CAUSES:
            raise InputError("--fail-on", f"cannot read budget '{part.strip()}'",
                             "write CAUSE>LIMIT with CAUSE one of " + ", ".join(LOSS_CAUSES)
                             + " and LIMIT like 5% or 20ms, separated by commas")
        value = float(m["value"])
        share = m["unit"] == "%"
        budgets.append(Budget(m["cause"], value / 100 if share else value * _NS[m["unit"]],
                              share))
    return budgets


def exceeded(budgets: list[Budget], losses: pd.DataFrame) -> list[str]:
    """One line per budget the waterfall exceeds (empty when all hold)."""
    total = float(losses["lost_ns"].sum())
    by_cause = losses.groupby("cause")["lost_ns"].sum()
    lines = []
    for budget in budgets:
        lost = float(by_cause.get(budget.cause, 0))
        share = lost / total if total else 0.0
        value = share if budget.share else lost
        if value > budget.limit:
            lines.append(f"budget {budget} exceeded: {budget.cause} lost {format_ns(lost)} "
                         f"= {100 * share:.2f}% of GPU time")
    return lines
