"""Terminal rendering (rich) of what `gpudiag analyze` found. Colors only on a terminal.

Durations go through `format_ns` (the one formatter, from `analyzers.findings`), shares
that nobody could measure (no timeline) are left out rather than printed as nan, and times
of day are relative to the first GPU event (as `--window` counts) or UTC wall clock.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.findings import HOST_CAUSES, format_ns
from gpudiag.reports.formats import format_bytes, format_window, untimed_window
from gpudiag.reports.safe_text import terminal as safe

__all__ = ["print_diagnosis", "print_summary", "sources_line"]


def print_summary(info: dict[str, Any], console: Console) -> None:
    """Print the output of `gpudiag.analyzers.summary.summarize` as a few compact tables,
    after how the run failed when it did (the first thing to know)."""
    ended = info.get("outcome")
    if ended:
        color = "bold red" if ended["failed"] else "yellow"
        console.print(f"[{color}]{safe(ended['headline'])}[/{color}]", highlight=False)
    console.print(f"[bold]Sources[/bold]: {safe(sources_line(info))}", highlight=False)
    if info["ranks"]:
        console.print(f"[bold]Ranks[/bold]: {safe(', '.join(map(str, info['ranks'])))}")
    window = info["window"]
    if window:
        label = "Window" if window.get("spec") else "GPU window"
        console.print(f"[bold]{label}[/bold]: {safe(format_window(window))}",
                      highlight=False)
    elif untimed_window(info):
        console.print(f"[bold]GPU window[/bold]: {untimed_window(info)}", highlight=False)
    _devices(info["devices"], console)
    _rows(info["rows"], console)
    _kernels(info["top_kernels"], console)
    for kind, count in info["warnings"].items():
        console.print(f"[yellow]note[/yellow]: {safe(kind)}: {safe(count)}", highlight=False)


def sources_line(info: dict[str, Any]) -> str:
    """The sources as one line: each file with its format; a `gpudiag profile` run's host
    markers (which have no file) as the run, its program and its process count."""
    sources = info["sources"]
    parts = [f"{s['path']} ({s.get('format')})" for s in sources if s.get("path")]
    run = info.get("run")
    if run:
        n = run["processes"]
        parts.append(f"gpudiag profile run of {run['program'] or 'a command'} "
                     f"({n} process{'es' if n != 1 else ''})")
    unnamed = Counter(str(s.get("format") or "unknown") for s in sources if not s.get("path"))
    if run:
        unnamed.pop("gpudiag-host", None)
    parts += [f"{fmt} ({n} part{'s' if n != 1 else ''})" for fmt, n in unnamed.items()]
    return ", ".join(parts) or "-"


#: device rows listed one by one; past them, alike devices share a row with their counts
MAX_DEVICE_ROWS = 16


def _devices(devices: list[dict[str, Any]], console: Console) -> None:
    if not devices:
        return
    if len(devices) > MAX_DEVICE_ROWS:
        _device_kinds(devices, console)
        return
    table = Table(title="Devices", title_justify="left")
    for col in ("rank", "device", "name", "SMs", "CC", "memory", "used"):
        table.add_column(col)
    for d in devices:
        table.add_row(
            "-" if d["rank"] is None else safe(d["rank"]), safe(d["device"]),
            safe(d["name"] or "?"), safe(d["sm_count"] or "?"),
            safe(d["compute_capability"] or "?"),
            format_bytes(d["mem_bytes"]), "yes" if d["used"] else "",
        )
    console.print(table)


def _device_kinds(devices: list[dict[str, Any]], console: Console) -> None:
    """Many devices (a job of many ranks): one row per kind, with how many, on how many
    ranks, and how many ran GPU work."""
    kinds: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for d in devices:
        kinds.setdefault((d["name"], d["sm_count"], d["compute_capability"], d["mem_bytes"]),
                         []).append(d)
    table = Table(title=f"Devices ({len(devices):,})", title_justify="left")
    for col in ("name", "SMs", "CC", "memory", "devices", "ranks", "used"):
        table.add_column(col, justify="right" if col in ("devices", "ranks", "used")
                         else "left")
    for (name, sms, cc, mem), rows in kinds.items():
        ranks = len({d["rank"] for d in rows})
        table.add_row(safe(name or "?"), safe(sms or "?"), safe(cc or "?"), format_bytes(mem),
                      f"{len(rows):,}", f"{ranks:,}", f"{sum(bool(d['used']) for d in rows):,}")
    console.print(table)


def _rows(rows: dict[str, int], console: Console) -> None:
    table = Table(title="Rows per table", title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name, count in rows.items():
        table.add_row(safe(name), f"{count:,}", style=None if count else "dim")
    console.print(table)


def _kernels(kernels: list[dict[str, Any]], console: Console) -> None:
    if not kernels:
        return
    table = Table(title="Top kernels by total GPU time", title_justify="left")
    for col, justify in (("kernel", "left"), ("launches", "right"), ("total", "right"),
                         ("mean", "right"), ("share", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for k in kernels:
        table.add_row(safe(k["short_name"]), f"{k['count']:,}", format_ns(k["total_ns"]),
                      format_ns(k["mean_ns"]), f"{100 * k['share']:.1f}%")
    console.print(table)


_CAUSE_STYLE = {"useful": "green", "sync_stall": "red", "launch_bound": "magenta",
                "host_bound": "yellow", "copy": "cyan", "comm_wait": "blue",
                "small_grid": "bright_red"}


def print_diagnosis(dx: dict[str, Any], console: Console, top: int = 10) -> None:
    """Print `Diagnosis.to_dict()`: the waterfall per device as bars, then the findings."""
    _waterfall(dx["losses"], console)
    from gpudiag.reports.terminal.untimed import print_untimed

    print_untimed(dx, console)
    if dx.get("by_step"):
        _steps(dx["by_step"], console)
    from gpudiag.reports.terminal.steps import print_steps

    print_steps(dx, console)
    from gpudiag.reports.terminal.ranks import print_stragglers

    print_stragglers(dx, console)
    _findings(dx["findings"][:top], console)
    for note in dx["notes"]:
        console.print(f"[dim]note[/dim]: {safe(note)}", highlight=False)


#: devices drawn one by one; a job of more is drawn as one bar per cause (its ranks follow
#: in the per-rank table, worst first)
MAX_DEVICES = 8


def _waterfall(losses: list[dict[str, Any]], console: Console) -> None:
    if not losses:
        return
    devices = {(row["rank"], row["device"]) for row in losses}
    if len(devices) > MAX_DEVICES:
        losses = _job_total(losses, len(devices))
    table = Table(title="Where the GPU time went (loss waterfall per device)",
                  title_justify="left")
    for col, justify in (("device", "left"), ("cause", "left"), ("time", "right"),
                         ("share", "right"), ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in losses:
        if not row["lost_ns"] and row["cause"] != "useful":
            continue
        device = safe(row["device"] if row["rank"] is None else f"r{row['rank']}:{row['device']}")
        share = _known(row["share"])
        bar = "█" * round(30 * (share or 0.0))
        table.add_row(device, safe(row["cause"]), format_ns(row["lost_ns"]), _percent(share),
                      f"[{_CAUSE_STYLE.get(row['cause'], 'white')}]{bar}[/]")
    console.print(table)


def _job_total(losses: list[dict[str, Any]], devices: int) -> list[dict[str, Any]]:
    """The waterfall of every device together: one row per cause, its share of all the
    devices' windows."""
    time: dict[str, int] = {}
    for row in losses:
        time[row["cause"]] = time.get(row["cause"], 0) + row["lost_ns"]
    window = sum(time.values())
    return [{"rank": None, "device": f"all {devices:,} devices", "cause": cause,
             "lost_ns": ns, "share": ns / window if window else None}
            for cause, ns in time.items()]


def _findings(findings: list[dict[str, Any]], console: Console) -> None:
    if not findings:
        console.print("No findings.")
        return
    host = [f["cause"] in HOST_CAUSES for f in findings]  # host time, not GPU time
    saved = [f.get("saving_ns") is not None for f in findings]
    if any(saved):
        title = ("Findings, by expected saving (a replay of the schedule with the cause "
                 "fixed; lost: the time it cost)")
    elif all(host):
        title = "Findings, by host time (share of step time)"
    elif not any(f["lost_ns"] for f in findings):
        title = ("Findings (none costs measured time: a file without a timeline, such as an "
                 "Nsight Compute report, shows where each kernel falls short, not how long "
                 "it kept the GPU from other work)")
    else:
        title = "Findings, by GPU time lost" + (" (host-side findings after)" if any(host)
                                                else "")
    table = Table(title=title, title_justify="left", show_lines=True)
    columns = [("#", "right"), ("cause", "left"), ("lost", "right"),
               ("saves", "right"), ("where", "left"), ("evidence", "left"),
               ("what to do", "left")]
    if not any(saved):
        columns.remove(("saves", "right"))
    timed = any(f["lost_ns"] for f in findings)
    if not timed:  # a column of '-' says nothing
        columns.remove(("lost", "right"))
    for col, justify in columns:
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for i, f in enumerate(findings, 1):
        share = _known(f["share"])  # none without a timeline: not a share of anything
        lost = format_ns(f["lost_ns"]) + (f" ({_percent(share)})" if share else "")
        cells = [str(i), safe(f["cause"])] + ([lost if f["lost_ns"] else "-"] if timed else [])
        if any(saved):
            cells.append(_saving(f))
        cells += [safe(f["where"] or "-"), safe(f["evidence"] or ""), safe(f["advice"] or "")]
        table.add_row(*cells)
    console.print(table)


def _saving(finding: dict[str, Any]) -> str:
    """'12 ms (3.1%, 40% of a step)': the expected saving, of the window and of the median
    step; 'n/a' where no fix was replayed."""
    ns = finding.get("saving_ns")
    if ns is None:
        return "n/a"
    parts = [_percent(share) for share in (_known(finding.get("saving_share")),) if share]
    step = _known(finding.get("saving_step_share"))
    if step is not None and ns:
        parts.append(f"{_percent(step)} of a step")
    return format_ns(ns) + (f" ({', '.join(parts)})" if parts and ns else "")


def _steps(rows: list[dict[str, Any]], console: Console) -> None:
    by_step: dict[tuple[Any, Any, str], dict[str, float]] = {}
    for r in rows:
        by_step.setdefault((r["rank"], r["device"], r["step"]), {})[r["cause"]] = \
            _known(r["share"]) or 0.0
    causes = [c for c in _CAUSE_STYLE if any(v.get(c) for v in by_step.values())]
    table = Table(title="Per step (share of the step's GPU time)", title_justify="left")
    for col in ("device", "step", *causes):
        table.add_column(col, justify="left" if col in ("device", "step") else "right")
    for (rank, device, step), shares in by_step.items():
        label = str(device) if rank is None else f"r{rank}:{device}"
        table.add_row(safe(label), safe(step),
                      *(f"{100 * shares.get(c, 0.0):.1f}%" for c in causes))
    console.print(table)


def _known(share: float | None) -> float | None:
    """A share, or None where it is missing or NaN (no timeline to be a share of)."""
    return None if share is None or math.isnan(share) else float(share)


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"
