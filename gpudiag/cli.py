"""The `gpudiag` command. Thin: parse options, call the library, render.

Every error that is the input's fault (GpudiagError) prints one line to stderr and exits
with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console

from gpudiag import __version__
from gpudiag.errors import GpudiagError, InputError
from gpudiag.trace import Trace

_DEBUG = {"on": False}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpudiag")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Where did my GPU time go, and what do I change?"""
    _DEBUG["on"] = debug


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--top", default=10, show_default=True,
              help="How many kernels and findings to list.")
@click.option("--fail-on", "fail_on", metavar="BUDGETS",
              help="Exit 1 when a loss exceeds its budget, e.g. 'sync_stall>5%,host_bound>20ms'.")
@click.option("--window", metavar="RANGE",
              help="Analyze only START:END (e.g. 100ms:300ms from the first GPU event) or "
                   "the span of a named range (e.g. ProfilerStep#3).")
@click.option("--steps", is_flag=True, help="Also show the waterfall of every training step.")
def analyze(*, paths: tuple[Path, ...], as_json: bool, top: int, fail_on: str | None,
            window: str | None, steps: bool) -> None:
    """Read profiles (files or directories), attribute the lost GPU time and say what to do.

    PATHS may be Kineto/PyTorch traces, Nsight Systems exports, Nsight Compute reports,
    JAX XSpace files, torch memory snapshots or gpudiag run directories; several are merged.
    """
    from gpudiag import budgets as budget_mod
    from gpudiag.analyzers.diagnosis import diagnose
    from gpudiag.reports.terminal import print_diagnosis, print_summary
    from gpudiag.summary import summarize

    budgets = budget_mod.parse(fail_on) if fail_on else []

    trace = _load(list(paths))
    if not trace.has_gpu_activity():
        names = ", ".join(str(p) for p in paths)
        raise InputError(
            names, "holds no GPU activity (no kernels, copies, syncs or memory events)",
            "record it with GPU activity on, e.g. torch.profiler.profile(activities="
            "[ProfilerActivity.CPU, ProfilerActivity.CUDA])",
        )
    info = summarize(trace, top=top)
    dx = diagnose(trace, window=window, steps=steps)
    info["diagnosis"] = dx.to_dict()
    if as_json:
        click.echo(json.dumps(info, indent=1, default=str))
    else:
        console = Console(highlight=False)
        print_summary(info, console)
        print_diagnosis(info["diagnosis"], console, top=top)
    if budgets and dx.losses.empty:
        raise InputError(", ".join(str(p) for p in paths),
                         "has no GPU timeline, so the --fail-on budgets cannot be checked",
                         "gate on a profile with kernels on a timeline (PyTorch profiler, "
                         "Nsight Systems, JAX), not an Nsight Compute report or a snapshot")
    broken = budget_mod.exceeded(budgets, dx.losses)
    for line in broken:
        click.echo(f"gpudiag: {line}", err=True)
    if broken:
        sys.exit(1)


@cli.command()
def schema() -> None:
    """Print the Trace schema (every table and column) as Markdown."""
    from gpudiag.schema import markdown

    click.echo(markdown(), nl=False)


def _load(paths: list[Path]) -> Trace:
    """gpudiag.load with a spinner on a terminal (stderr), silent otherwise."""
    from gpudiag.sources import load

    console = Console(stderr=True)
    if not console.is_terminal:
        return load(paths)
    with console.status("reading profiles...") as status:
        return load(paths, progress=status.update)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn errors into one line and an exit status."""
    try:
        cli.main(args=argv, prog_name="gpudiag", standalone_mode=False)
    except GpudiagError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        click.echo(f"gpudiag: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("gpudiag: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("gpudiag: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug in gpudiag: one line, traceback with --debug
        if _DEBUG["on"]:
            traceback.print_exc()
        click.echo(
            f"gpudiag: internal error: {exc.__class__.__name__}: {exc} "
            "(run with --debug for the traceback, and please report it)", err=True,
        )
        sys.exit(1)
