"""Numbers in words, the same in the terminal, the page and the comparison: durations
(`format_ns`, from `analyzers.findings`, the one formatter the findings' evidence uses
too), sizes and the analyzed window."""

from __future__ import annotations

from typing import Any

from gpudiag.analyzers.findings import format_ns

__all__ = ["format_bytes", "format_ns", "format_window", "untimed_window"]


def format_bytes(n: int | None) -> str:
    """Bytes in binary units, three significant digits ('1.5 GiB'); '?' unknown."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def format_window(window: dict[str, Any]) -> str:
    """`summarize`'s window in words: its length, where it lies from the first GPU event
    (a chosen window) and its start as UTC wall clock when the clock is the epoch's.

        '12.9 s, starting 2023-09-27 17:26:12.943 UTC'
        'ProfilerStep#3, 5.01 ms: 1.2 s to 1.21 s from the first GPU event (of 12.9 s)'
    """
    text = format_ns(window["duration_ns"])
    start, whole = window.get("offset_ns") or 0, window.get("trace_duration_ns")
    if window.get("spec") or (start, window["duration_ns"]) != (0, whole):  # a chosen one
        text = (f"{window['spec'] + ', ' if window.get('spec') else ''}{text}: "
                f"{format_ns(start)} to {format_ns(start + window['duration_ns'])} from the "
                "first GPU event" + (f" (of {format_ns(whole)})" if whole is not None else ""))
    when = window.get("started_at")
    if when:
        text += ", starting " + when.replace("T", " ").replace("Z", " UTC")
    return text


#: why a file of a format without a timeline has no GPU window, in words
_UNTIMED = {
    "nccl-tests": "each message size's mean time, as nccl-tests reports it: no timeline",
    "ncu-rep": "kernels were replayed one by one (durations are real, gaps are not)",
}


def untimed_window(info: dict[str, Any]) -> str | None:
    """Why `summarize`'s `info` has no GPU window, for a file that records no timeline
    (None for a file that has one, or a window): said by the file's format."""
    if info["window"] or info["timeline"]:
        return None
    formats = {str(source.get("format")) for source in info["sources"]}
    reasons = [text for name, text in _UNTIMED.items() if name in formats]
    return "none: " + ("; ".join(reasons) or "the files record no timeline")
