"""Terminal rendering (rich) of what `gpudiag analyze` found. Colors only on a terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(info: dict[str, Any], console: Console) -> None:
    """Print the output of `gpudiag.summary.summarize` as a few compact tables."""
    sources = ", ".join(f"{s.get('path')} ({s.get('format')})" for s in info["sources"])
    console.print(f"[bold]Sources[/bold]: {sources or '-'}", highlight=False)
    if info["ranks"]:
        console.print(f"[bold]Ranks[/bold]: {', '.join(map(str, info['ranks']))}")
    window = info["window"]
    if window:
        console.print(
            f"[bold]GPU window[/bold]: {format_ns(window['duration_ns'])} "
            f"(from {window['start_ns']} to {window['end_ns']} ns)"
        )
    elif not info["timeline"]:
        console.print("[bold]GPU window[/bold]: none (kernels were replayed one by one, "
                      "as Nsight Compute does: durations are real, gaps are not)")
    _devices(info["devices"], console)
    _rows(info["rows"], console)
    _kernels(info["top_kernels"], console)
    for kind, count in info["warnings"].items():
        console.print(f"[yellow]note[/yellow]: {kind}: {count}", highlight=False)


def _devices(devices: list[dict[str, Any]], console: Console) -> None:
    if not devices:
        return
    table = Table(title="Devices", title_justify="left")
    for col in ("rank", "device", "name", "SMs", "CC", "memory", "used"):
        table.add_column(col)
    for d in devices:
        table.add_row(
            "-" if d["rank"] is None else str(d["rank"]), str(d["device"]), d["name"] or "?",
            str(d["sm_count"] or "?"), d["compute_capability"] or "?",
            format_bytes(d["mem_bytes"]), "yes" if d["used"] else "",
        )
    console.print(table)


def _rows(rows: dict[str, int], console: Console) -> None:
    table = Table(title="Rows per table", title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, count in rows.items():
        table.add_row(name, f"{count:,}", style=None if count else "dim")
    console.print(table)


def _kernels(kernels: list[dict[str, Any]], console: Console) -> None:
    if not kernels:
        return
    table = Table(title="Top kernels by total GPU time", title_justify="left")
    for col, justify in (("kernel", "left"), ("launches", "right"), ("total", "right"),
                         ("mean", "right"), ("share", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for k in kernels:
        table.add_row(k["short_name"], f"{k['count']:,}", format_ns(k["total_ns"]),
                      format_ns(k["mean_ns"]), f"{100 * k['share']:.1f}%")
    console.print(table)


def format_ns(ns: float | None) -> str:
    """1234567 -> '1.23 ms'."""
    if ns is None:
        return "?"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"
