"""Terminal rendering (rich) of a `gpudiag.analyzers.compare.Comparison`. Colors only on a
terminal.

The tables and their words come from `reports.compare.text` (the page shows the same); here
a change that is worse than the baseline is red and one that is better green, so a reviewer
sees the verdict before reading the numbers.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpudiag.analyzers.compare import Comparison
from gpudiag.reports.compare import text as compare_text
from gpudiag.reports.compare.text import Cell, TextTable
from gpudiag.reports.safe_text import terminal as safe

_COLORS = {1: "green", -1: "red"}


def print_comparison(comparison: Comparison, console: Console, top: int = 15) -> None:
    """Print a comparison as a few compact tables, the baseline first.

        from rich.console import Console
        cmp = gpudiag.analyzers.compare.compare([a, b], ["before", "after"])
        print_comparison(cmp, Console())
    """
    console.print(f"[bold]Runs[/bold] (baseline A): {safe(compare_text.legend(comparison))}",
                  highlight=False)
    for text in compare_text.tables(comparison, top):
        console.print(_rich(text))
        if text.footer:
            console.print(safe(text.footer), highlight=False)
    for note in comparison.notes:
        console.print(f"[dim]note[/dim]: {safe(note)}", highlight=False)


def _rich(text: TextTable) -> Table:
    table = Table(title=safe(text.title), title_justify="left")
    for i, head in enumerate(text.header):
        left = i == 0 or i in text.wide
        table.add_column(safe(head), justify="left" if left else "right",
                         overflow="fold")
    for row in text.rows:
        table.add_row(*(_cell(cell) for cell in row))
    return table


def _cell(cell: Cell) -> str:
    color = _COLORS.get(cell.verdict)
    return f"[{color}]{safe(cell.text)}[/]" if color else safe(cell.text)
