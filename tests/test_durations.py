"""One duration formatter for every terminal line: a unit that fits the size, never nan.

`analyzers.findings.format_ns` writes the evidence of findings, the terminal tables, the
budgets' lines and the comparison; these tests pin its table and check the places that
used to print '0.00 ms' beside a 4.64 µs loss or 'nan' for a share of no timeline.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

import gpudiag
from gpudiag.analyzers import budgets
from gpudiag.analyzers.compare import compare
from gpudiag.analyzers.findings import format_ns
from gpudiag.reports import formats, terminal
from gpudiag.reports.terminal import diagnosis as terminal_diagnosis
from gpudiag.reports.terminal.compare import print_comparison
from tests.conftest import fixture


@pytest.mark.parametrize(("ns", "text"), [
    (0, "0 ns"), (20, "20 ns"), (999, "999 ns"), (999.6, "1 µs"), (4_640, "4.64 µs"),
    (15_000, "15 µs"), (999_700, "1 ms"), (2_620_000, "2.62 ms"), (-2_620_000, "-2.62 ms"),
    (415_856_500, "416 ms"), (12.9e9, "12.9 s"), (12_345e9, "12,300 s"),
    (None, "n/a"), (math.nan, "n/a"),
])
def test_format_ns_picks_the_unit_that_fits(ns: float | None, text: str) -> None:
    assert format_ns(ns) == text


def test_the_terminal_uses_the_same_formatter() -> None:
    assert formats.format_ns is terminal_diagnosis.format_ns is format_ns


def _render(print_fn: Callable[..., None], *args: Any) -> str:
    out = io.StringIO()
    print_fn(*args, Console(file=out, width=200, highlight=False))
    return out.getvalue()


def test_findings_and_waterfall_without_a_share_print_no_nan() -> None:
    dx = {"losses": [{"rank": None, "device": 0, "cause": "useful", "lost_ns": 5_000,
                      "share": math.nan}],
          "findings": [{"cause": "small_grid", "lost_ns": 4_640, "share": math.nan,
                        "where": "k", "evidence": "e", "advice": "a"},
                       {"cause": "fragmentation", "lost_ns": 0, "share": None,
                        "where": "w", "evidence": "e", "advice": "a"}],
          "notes": []}
    text = _render(terminal.print_diagnosis, dx)
    assert "nan" not in text.lower()
    assert "4.64 µs" in text and "n/a" in text  # the waterfall's share: n/a, not 0.0%


def test_budget_lines_write_small_losses_in_their_unit() -> None:
    losses = pd.DataFrame({"cause": ["useful", "sync_stall"], "lost_ns": [1_000_000, 4_640]})
    [line] = budgets.exceeded(budgets.parse("sync_stall>1us"), losses)
    assert "sync_stall>1µs exceeded: sync_stall lost 4.64 µs" in line


def test_comparing_with_a_run_without_timeline_prints_na_not_nan() -> None:
    timed = gpudiag.load(fixture("kineto/a100_alexnet_sync_critical_path.json.gz"))
    snapshot = gpudiag.load(fixture("memsnap/cs336_medium_ctx128_inference_lowfrag.pickle"))
    text = _render(print_comparison, compare([timed, snapshot], ["timed", "snapshot"]))
    assert "nan" not in text.lower(), text
    assert "n/an/a" not in text
    assert "no kernels or copies on a timeline" in text  # the reason for each n/a
