"""Terminal tables of what a file without a timeline holds (an nccl-tests log, a memory
snapshot or timeline): with no loss waterfall to draw, its numbers are the answer."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.findings import format_ns
from gpudiag.reports.formats import format_bytes
from gpudiag.reports.safe_text import terminal as safe

__all__ = ["print_untimed"]


def print_untimed(dx: dict[str, Any], console: Console) -> None:
    """Print `Diagnosis.to_dict()`'s `collectives` and `memory`, when it has them."""
    if dx.get("collectives"):
        _collectives(dx["collectives"], console)
    if dx.get("memory"):
        _memory(dx["memory"], console)


def _collectives(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Collectives: bandwidth by message size (busbw: nccl-tests' bus "
                  "bandwidth, comparable with the link's peak)", title_justify="left")
    for col in ("op", "size", "ranks", "dtype", "calls", "mean time", "algbw", "busbw"):
        table.add_column(col, justify="left" if col in ("op", "dtype") else "right")
    for row in rows:
        table.add_row(safe(row["op"]), format_bytes(row["bytes"]),
                      "?" if row["group_size"] is None else f"{row['group_size']:,}",
                      safe(row["dtype"] or "?"), f"{row['count']:,}",
                      format_ns(row["mean_ns"]), _gbps(row["algbw_gbps"]),
                      _gbps(row["busbw_gbps"]))
    best = max(rows, key=lambda row: _number(row["busbw_gbps"]))
    console.print(table)
    console.print(f"peak busbw {_gbps(best['busbw_gbps'])} ({safe(best['op'])}, "
                  f"{format_bytes(best['bytes'])})", highlight=False)


def _memory(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Allocator memory per device", title_justify="left")
    for col in ("device", "events", "peak reserved", "peak allocated", "worst fragmentation",
                "final fragmentation"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for row in rows:
        device = "-" if row["device"] is None else safe(row["device"])
        if row["rank"] is not None:
            device = f"rank {safe(row['rank'])} · {device}"
        table.add_row(device, f"{row['events']:,}", _bytes(row["peak_reserved"]),
                      _bytes(row["peak_allocated"]), _share(row["max_frag"]),
                      _share(row["last_frag"]))
    console.print(table)


def _number(value: Any) -> float:
    return -1.0 if value is None or math.isnan(float(value)) else float(value)


def _gbps(value: Any) -> str:
    return "-" if _number(value) < 0 else f"{float(value):.3g} GB/s"


def _bytes(value: Any) -> str:
    return "-" if value is None else format_bytes(int(value))


def _share(value: Any) -> str:
    return "-" if _number(value) < 0 else f"{100 * float(value):.1f}%"
