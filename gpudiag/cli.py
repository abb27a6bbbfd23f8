"""The `gpudiag` command. Thin: parse options, call the library, render.

Every error that is the input's fault (GpudiagError) prints one line to stderr and exits
with status 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console

from gpudiag import __version__, streams
from gpudiag.errors import GpudiagError, InputError, exhausted
from gpudiag.reports.safe_text import printable, terminal

if TYPE_CHECKING:  # imported where used: `--workers` starts its pool before pandas loads
    from gpudiag.trace import Trace

_DEBUG = {"on": False}


def job_options(command: Any) -> Any:
    """`--workers N` and `--scheduler ADDR`: a job of many ranks analyzed rank by rank
    (`gpudiag.diagnose_job`), for every command that diagnoses."""
    command = click.option(
        "--scheduler", metavar="ADDR",
        help="Read and analyze the files on a Dask cluster: tcp://HOST:PORT or a scheduler "
             "file (workers must see the same paths). Needs gpudiag[dask].")(command)
    return click.option(
        "--workers", type=int, metavar="N",
        help="Read and analyze the files (one per rank) on N local processes, then reduce "
             "(1: in this process). Exit 3 when some files could not be read.")(command)


def finding_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--rank-by saving|lost` and `--no-savings`: the findings' expected savings and order."""
    command = click.option(
        "--savings/--no-savings", default=True, show_default=True,
        help="Replay the schedule without each finding's cause for its expected saving "
             "(--no-savings: skip the replays).")(command)
    return click.option(
        "--rank-by", "rank_by", type=click.Choice(["saving", "lost"]), default="saving",
        show_default=True,
        help="Rank findings by expected saving (a replay of the schedule with the cause "
             "fixed) or by the time they cost. A job analyzed with --workers/--scheduler "
             "has no savings: lost.")(command)


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
@finding_options
@job_options
def analyze(*, paths: tuple[Path, ...], as_json: bool, top: int, fail_on: str | None,
            window: str | None, steps: bool, rank_by: str, savings: bool,
            workers: int | None, scheduler: str | None) -> None:
    """Read profiles (files or directories), attribute the lost GPU time and say what to do.

    PATHS may be Kineto/PyTorch traces, Nsight Systems exports, Nsight Compute reports,
    JAX XSpace files, torch memory snapshots or gpudiag run directories; several are merged.
    With --workers or --scheduler each file is analyzed where it is read and only its
    results are combined: the same diagnosis, for jobs of many ranks.
    """
    budgets: list[Any] = []
    if fail_on:  # a bad --fail-on is said before the analysis
        from gpudiag.analyzers.budgets import parse

        budgets = parse(fail_on)
    dx = _diagnosed(paths, workers=workers, scheduler=scheduler, window=window, steps=steps,
                    rank_by=rank_by, savings=savings)
    info = dx.summary(top=top, window_spec=window)
    info["diagnosis"] = dx.to_dict()
    if as_json:
        click.echo(json.dumps(info, indent=1, default=str))
    else:
        from gpudiag.reports.terminal import print_diagnosis, print_summary

        console = Console(highlight=False)
        print_summary(info, console)
        print_diagnosis(info["diagnosis"], console, top=top)
    if not budgets:
        _exit_if_failed(_failed(dx))
        return
    from gpudiag.analyzers.budgets import exceeded

    if dx.losses.empty:
        raise InputError(", ".join(str(p) for p in paths),
                         "has no GPU timeline, so the --fail-on budgets cannot be checked",
                         "gate on a profile with kernels on a timeline (PyTorch profiler, "
                         "Nsight Systems, JAX), not an Nsight Compute report or a snapshot")
    broken = exceeded(budgets, dx.losses)
    for line in broken:
        click.echo(f"gpudiag: {line}", err=True)
    if broken:
        sys.exit(1)
    _exit_if_failed(_failed(dx))


def _diagnosed(paths: tuple[Path, ...], *, workers: int | None, scheduler: str | None,
               window: str | None, steps: bool, rank_by: str, savings: bool,
               rows: bool = False, require: bool = True) -> Any:
    """The Diagnosis of PATHS, what every command that diagnoses reads: of the merged trace
    in this process, or with --workers/--scheduler of the job read rank by rank (the pool
    starts before pandas loads); the same answer either way. `require`: a trace without
    events is one clear line (`_require_events`; an export writes it as it is)."""
    if workers is not None or scheduler is not None:
        return _job(paths, workers=workers, scheduler=scheduler, window=window, steps=steps,
                    rank_by=rank_by, savings=savings, rows=rows)
    from gpudiag.analyzers.diagnosis import diagnose

    trace = _load(list(paths))
    if require:
        _require_events(trace, paths)
    return diagnose(trace, window=window, steps=steps, rank_by=rank_by, savings=savings)


def _failed(dx: Any) -> list[tuple[str, str]]:
    """The files of a job that could not be read (none for a merged trace: `load` raises)."""
    from gpudiag.jobs.job import JobDiagnosis

    return dx.failed if isinstance(dx, JobDiagnosis) else []


def _exit_if_failed(failed: list[tuple[str, str]]) -> None:
    """Exit 3 after the rest was analyzed and written when some files could not be read."""
    if failed:
        _say_failed(failed)
        sys.exit(3)


def _job(paths: tuple[Path, ...], *, workers: int | None, scheduler: str | None,
         window: str | None, steps: bool, rows: bool = False, rank_by: str = "saving",
         savings: bool = True) -> Any:
    """`gpudiag.diagnose_job` with a bar per file on a terminal (stderr). `rows`: keep the
    row-level results (what is printed or drawn needs none; an export lists them)."""
    from rich.progress import Progress

    from gpudiag.jobs import diagnose_job

    console = Console(stderr=True)
    if not console.is_terminal:
        return diagnose_job(list(paths), workers=workers, scheduler=scheduler, steps=steps,
                            window=window, rows=rows, rank_by=rank_by, savings=savings)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("analyzing ranks", total=None)

        def advance(outcome: Any, files: int, total: int) -> None:
            batch = outcome.item[0]  # the batch's files
            name = Path(str(batch[-1])).name + (f" and {files - 1} more" if files > 1 else "")
            bar.update(task, total=total, advance=files,
                       description=terminal(("failed " if outcome.error else "read ") + name))

        return diagnose_job(list(paths), workers=workers, scheduler=scheduler, steps=steps,
                            window=window, progress=advance, rows=rows, rank_by=rank_by,
                            savings=savings)


def _say_failed(failed: list[tuple[str, str]]) -> None:
    """The files a job could not read, one line each, after the analysis of the rest."""
    click.echo(f"gpudiag: {len(failed)} file(s) could not be read and were left out:",
               err=True)
    for path, error in failed:
        click.echo(f"gpudiag:   {printable(path)}: {printable(error)}", err=True)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"),
              show_default=True, help="The HTML file to write.")
@click.option("--cdn", is_flag=True, help="Load plotly.js from its CDN (a small file that "
              "needs the network) instead of inlining it.")
@click.option("--window", metavar="RANGE", help="As for `analyze`.")
@click.option("--steps", is_flag=True, help="Also the waterfall of every training step.")
@finding_options
@job_options
def report(*, paths: tuple[Path, ...], output: Path, cdn: bool, window: str | None,
           steps: bool, rank_by: str, savings: bool, workers: int | None,
           scheduler: str | None) -> None:
    """Write one self-contained HTML report (opens offline): summary, waterfall, findings,
    stragglers, heatmaps, kernels, syncs, collectives, memory, Nsight Compute metrics."""
    from gpudiag.reports.build import diagnosis_page
    from gpudiag.reports.html_report import TOP_ROWS

    dx = _diagnosed(paths, workers=workers, scheduler=scheduler, window=window, steps=steps,
                    rank_by=rank_by, savings=savings)
    _write(output, diagnosis_page(dx, info=dx.summary(top=TOP_ROWS, window_spec=window),
                                  cdn=cdn,
                                  generated_for="gpudiag report " + " ".join(map(str, paths))))
    _exit_if_failed(_failed(dx))


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="The HTML file to write (default: the first PATH's name + "
                   ".heatmap.html, here).")
@click.option("--metrics", metavar="NAMES", help="Nsight Compute: comma-separated columns "
              "to show (e.g. sm_throughput_pct,l2_hit_rate_pct).")
@click.option("--sort", default="time", show_default=True,
              help="Nsight Compute rows: time, health, or a column name.")
@click.option("--top", default=50, show_default=True, type=click.IntRange(min=1),
              help="Nsight Compute: rows shown.")
@click.option("--per-launch", is_flag=True, help="Nsight Compute: one row per launch.")
@click.option("--cdn", is_flag=True, help="Load plotly.js from its CDN.")
def heatmap(*, paths: tuple[Path, ...], output: Path | None, metrics: str | None, sort: str,
            top: int, per_launch: bool, cdn: bool) -> None:
    """Heatmaps as HTML: kernel x metric for Nsight Compute reports; time x stream
    utilization (with the loss cause of idle time), collective waits and allocator
    occupancy for traces, run directories or memory snapshots. Several PATHS are merged,
    as `report` merges them (the ranks of a job: their collective waits side by side)."""
    from gpudiag.analyzers.diagnosis import diagnose
    from gpudiag.reports.build import heatmap_page

    path = paths[0]
    trace = _load(list(paths))
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    dx = diagnose(trace, savings=False)  # the heatmaps show no findings
    html = heatmap_page(trace, dx, cdn=cdn, per_launch=per_launch, metrics=chosen, sort=sort,
                        top=top)
    _write(output or Path(path.name.split(".")[0] + ".heatmap.html"), html)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write HTML.")
@click.option("--fail-on", "fail_on", metavar="BUDGETS", help="Exit 1 on a regression "
              "against the first run, e.g. 'step_time>+5%,peak_memory>+10%,sync_stall>+2pp'.")
@click.option("--step-size", type=click.IntRange(min=1), help="Samples per step, for samples/s.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--cdn", is_flag=True, help="With -o: load plotly.js from its CDN.")
@job_options
def compare(*, paths: tuple[Path, ...], output: Path | None, fail_on: str | None,
            step_size: int | None, as_json: bool, cdn: bool, workers: int | None,
            scheduler: str | None) -> None:
    """Compare two or more runs or traces side by side (the first is the baseline). With
    --workers or --scheduler each run (a folder of ranks) is diagnosed rank by rank."""
    from gpudiag.analyzers.compare import compare as compare_runs
    from gpudiag.analyzers.compare import parse_fail_on, regressions
    from gpudiag.reports.build import compare_page
    from gpudiag.reports.terminal.compare import print_comparison

    if len(paths) < 2:
        raise InputError(str(paths[0]), "is only one run", "give two or more to compare")
    budgets = parse_fail_on(fail_on) if fail_on else []
    if workers is not None or scheduler is not None:
        cmp = _compare_jobs(paths, workers=workers, scheduler=scheduler, step_size=step_size)
    else:
        cmp = compare_runs([_load([p]) for p in paths], _labels(paths), step_size=step_size)
    broken = regressions(cmp, budgets) if budgets else []
    if as_json:
        click.echo(json.dumps(cmp.to_dict(), indent=1, default=str))
    else:
        print_comparison(cmp, Console(highlight=False))
    if output is not None:
        _write(output, compare_page(cmp, broken, cdn=cdn))
    for line in broken:
        click.echo(f"gpudiag: {line}", err=True)
    if broken:
        sys.exit(1)


def _compare_jobs(paths: tuple[Path, ...], *, workers: int | None, scheduler: str | None,
                  step_size: int | None) -> Any:
    """`compare --workers`: each run a job diagnosed rank by rank, compared from its
    Diagnosis and `run_facts.of_parts` (what the ranks sent): the comparison of the merged
    runs. A run with unreadable files stops the comparison (a partial run would compare
    as a regression)."""
    from gpudiag.analyzers import run_facts
    from gpudiag.analyzers.compare import compare as compare_runs

    jobs = [_job((path,), workers=workers, scheduler=scheduler, window=None, steps=False)
            for path in paths]
    for path, job in zip(paths, jobs, strict=True):
        if job.failed:
            _say_failed(job.failed)
            raise InputError(str(path), f"has {len(job.failed)} file(s) that could not be "
                             "read, so it would compare as a smaller run",
                             "fix or remove those files")
    facts = [run_facts.of_parts(job.summary_parts, job.meta) for job in jobs]
    return compare_runs(facts, _labels(paths), step_size=step_size, diagnoses=jobs)


#: how to record what gpudiag needs, in the words of the framework that made the trace
_RECORD_ADVICE = {
    "jax": "record the training loop inside jax.profiler.trace(log_dir) (or run "
           "gpudiag profile --backend jax -- python train.py)",
    "tensorflow": "record the training loop between tf.profiler.experimental.start(logdir) "
                  "and tf.profiler.experimental.stop()",
    "torch": "record it with torch.profiler.profile(activities=[ProfilerActivity.CPU, "
             "ProfilerActivity.CUDA]) around a few steps (or run gpudiag profile -- python "
             "train.py)",
}


#: tables an analyzer reads even when their rows name no device
_DEVICELESS_TABLES = ("collectives", "memory", "memory_blocks", "samples", "metrics")


def _require_events(trace: Trace, paths: tuple[Path, ...]) -> None:
    """A trace with neither GPU activity nor host events has nothing to analyze: say how
    to record one, in its framework's words. Host events alone (a CPU-only run) are
    analyzed: the host-side step breakdown applies; so are collectives, allocator events
    and samples without a device (an nccl-tests log, a torch memory timeline)."""
    from gpudiag.analyzers.frameworks import framework
    from gpudiag.analyzers.host.steps import has_host_events
    from gpudiag.analyzers.summary import run_outcome

    if trace.has_gpu_activity() or has_host_events(trace) or any(
            len(getattr(trace, name)) for name in _DEVICELESS_TABLES):
        return
    outcome = run_outcome(trace.meta)
    if outcome is not None and outcome["failed"]:  # a run that died before it wrote data
        raise InputError(", ".join(str(p) for p in paths),
                         outcome["what"] + "; it ended before any GPU activity or host "
                                           "event was written",
                         "fix the failure first; `--flush-interval` writes markers sooner")
    raise InputError(", ".join(str(p) for p in paths),
                     "holds no GPU activity and no host events (no kernels, copies, syncs, "
                     "memory events or framework ops)",
                     _RECORD_ADVICE.get(framework(trace) or "torch", _RECORD_ADVICE["torch"]))


def _labels(paths: tuple[Path, ...]) -> list[str]:
    """Distinct short labels: each file's stem, numbered where two are alike."""
    stems = [p.name.split(".")[0] or str(p) for p in paths]
    return [f"{s}#{i + 1}" if stems.count(s) > 1 else s for i, s in enumerate(stems)]


def _write(path: Path, text: str) -> None:
    """Write a page; a folder that is missing or not writable is the user's to fix."""
    from gpudiag.reports.export import cannot_write

    data = text.encode("utf-8", "backslashreplace")  # a page holds valid text: never fails
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise cannot_write(path, exc) from exc
    click.echo(f"wrote {printable(path)} ({len(data) / 1e6:.1f} MB)", err=True)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["perfetto", "chrome", "csv", "parquet"]),
              default="perfetto", show_default=True,
              help="perfetto/chrome: a trace with the diagnosis as annotated slices, to open "
                   "in ui.perfetto.dev; csv/parquet: one file per table.")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="File (perfetto/chrome; default trace.gpudiag.json.gz) or folder "
                   "(csv/parquet; default gpudiag-tables-csv or gpudiag-tables-parquet).")
@click.option("--tables", metavar="NAMES", help="csv/parquet: comma-separated table names.")
@click.option("--no-diagnosis", is_flag=True, help="Export the events only.")
@finding_options
@job_options
def export(*, paths: tuple[Path, ...], fmt: str, output: Path | None, tables: str | None,
           no_diagnosis: bool, rank_by: str, savings: bool, workers: int | None,
           scheduler: str | None) -> None:
    """Export the normalized events (and the diagnosis) for other tools. With --workers or
    --scheduler (csv/parquet): the job's diagnosis tables, its events staying with its
    ranks."""
    from gpudiag.reports.export import write_chrome_trace, write_tables
    from gpudiag.trace import Trace

    names = [t.strip() for t in tables.split(",") if t.strip()] if tables else None
    by_rank = workers is not None or scheduler is not None
    if by_rank:
        _job_can_export(fmt, no_diagnosis)
    dx = None
    if no_diagnosis:
        trace = _load(list(paths))
    else:  # rows: an export lists the row-level results (gaps, host_gaps) too
        dx = _diagnosed(paths, workers=workers, scheduler=scheduler, window=None, steps=False,
                        rank_by=rank_by, savings=savings, rows=True, require=False)
        trace = dx.source if dx.source is not None else Trace(meta=dx.meta)
    if fmt in ("perfetto", "chrome"):
        written = write_chrome_trace(trace, output or Path("trace.gpudiag.json.gz"), dx)
        click.echo(f"wrote {printable(written)}", err=True)
        return
    folder = output or tables_dir(fmt)
    files = write_tables(trace, folder, fmt, tables=names, dx=dx, events=not by_rank)
    click.echo(f"wrote {len(files)} {fmt} files to {printable(folder)}", err=True)
    _exit_if_failed(_failed(dx))


def tables_dir(fmt: str) -> Path:
    """`export`'s default folder for `fmt` (csv, parquet): one per format, so exporting
    both leaves two folders, not one holding the two mixed."""
    return Path(f"gpudiag-tables-{fmt}")


def _job_can_export(fmt: str, no_diagnosis: bool) -> None:
    """`export --workers` writes the job's diagnosis tables only: the events never leave
    the ranks."""
    if fmt in ("perfetto", "chrome"):
        raise InputError(f"--format {fmt}", "needs every event of the job in one file, and "
                         "--workers/--scheduler keep the events with their ranks",
                         "export without --workers, or use --format csv/parquet for the "
                         "job's diagnosis tables")
    if no_diagnosis:
        raise InputError("--no-diagnosis", "with --workers/--scheduler leaves nothing to "
                         "export (the events stay with their ranks)",
                         "export the events without --workers")


class StepCount(click.ParamType):
    """`--steps`: a positive number of steps, or `all`."""

    name = "steps"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or str(value).lower() == "all":
            return value if isinstance(value, int) else "all"
        if str(value).isdigit() and int(value) > 0:
            return int(value)
        self.fail(f"{value!r} is not a positive number of steps or 'all'", param, ctx)


@cli.command(context_settings={"ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Run directory (default gpudiag-runs/<timestamp>-<command>/).")
@click.option("--backend", type=click.Choice(["auto", "cupti", "torch", "jax", "nsys", "ncu"]),
              default="auto", show_default=True,
              help="auto: CUPTI with a GPU and cupti-python, else torch.profiler / jax.profiler "
                   "in the processes that import them; nsys/ncu run the NVIDIA tool around "
                   "the command.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Stop collecting S seconds after collection began.")
@click.option("--delay", type=click.FloatRange(min=0), metavar="S",
              help="Start collecting S seconds after each process starts (skip warm-up).")
@click.option("--steps", type=StepCount(), metavar="N|all",
              help="Collect N steps after the warm-up (default 20; a step is a gpudiag.step() "
                   "or, without markers, an optimizer step); all: the whole run.")
@click.option("--warmup-steps", type=click.IntRange(min=0), metavar="W",
              help="Leading steps left out of the collection window (default 3).")
@click.option("--nvml-interval", type=click.FloatRange(min=0), default=0.1, show_default=True,
              metavar="S", help="Seconds between NVML samples of the GPUs (0: off).")
@click.option("--no-memory", is_flag=True,
              help="Do not record allocator events and the memory snapshot.")
@click.option("--ncu-set", type=click.Choice(["launch", "memory", "full"]), default="launch",
              show_default=True, help="Metric set of --backend ncu (scripts/ncu_wrappers).")
@click.option("--ncu-kernels", metavar="REGEX", help="--backend ncu: only kernels matching.")
@click.option("--no-report", is_flag=True, help="Do not analyze or write report.html.")
@click.option("--stall-timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              metavar="S", help="End a profiled process S seconds after it stopped making "
                                "progress once the command or another rank finished, its "
                                "stacks written to the run directory (0: never).")
@click.option("--segment-interval", type=click.FloatRange(min=1), metavar="S",
              help="Write the torch profile in segments of at most S seconds (default 30): "
                   "a kill or crash loses at most the open one.")
@click.option("--flush-interval", default=1.0, show_default=True, type=click.FloatRange(0.05),
              help="Seconds between flushes of what each process collected.")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Analyze the run process by process on N local processes, then reduce "
                   "(default: a run of 8 or more processes is, one worker per core).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile(*, output: Path | None, backend: str, duration: float | None, delay: float | None,
            steps: int | str | None, warmup_steps: int | None, nvml_interval: float,
            no_memory: bool, ncu_set: str, ncu_kernels: str | None, no_report: bool,
            flush_interval: float, stall_timeout: float, segment_interval: float | None,
            workers: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND (after `--`) with collectors injected into every Python process, merge
    what they recorded into one trace, analyze it and write report.html; exits with
    COMMAND's status. `gpudiag doctor` says what this machine can collect."""
    from gpudiag.profiler.backends import resolve
    from gpudiag.profiler.session import (
        CommandNotStarted,
        ProfileOptions,
        RunNotWritten,
        profile_command,
    )

    plan = resolve(backend)
    options = ProfileOptions(
        backend=backend, collectors=plan.collectors, flush_interval_s=flush_interval,
        duration_s=duration, delay_s=delay, steps=steps, warmup_steps=warmup_steps,
        nvml_interval_s=nvml_interval or None, memory=not no_memory, report=not no_report,
        ncu_set=ncu_set, ncu_kernels=ncu_kernels, stall_timeout_s=stall_timeout,
        segment_s=segment_interval,
    )
    try:
        gathered = profile_command(
            list(command), plan, options, output,
            progress=lambda line: click.echo(f"gpudiag: {line}", err=True), workers=workers)
    except CommandNotStarted as exc:
        click.echo(f"gpudiag: error: cannot start {printable(command[0])}: "
                   f"{exc.strerror or exc}",
                   err=True)
        sys.exit(127)
    except RunNotWritten as exc:  # the program ran: say it, and exit with its own status
        _after_run_failed(exc.result, exc.error)
    try:
        _show_profile(gathered, "gpudiag profile -- " + " ".join(command),
                      report=not no_report)
    except Exception as exc:  # the same: the program's status is what comes back
        _after_run_failed(gathered.result, exc)
    sys.exit(gathered.result.exit_code)


def _after_run_failed(result: Any, error: BaseException) -> NoReturn:
    """One line for what failed after the command ran; exit with the command's status."""
    from gpudiag.profiler.notes import after_run_failure

    if _DEBUG["on"]:
        traceback.print_exception(error)
    line = after_run_failure(result.run_dir, result.exit_code, error)
    click.echo(f"gpudiag: error: {printable(line)}", err=True)
    sys.exit(result.exit_code)


def _show_profile(gathered: Any, generated_for: str, *, report: bool) -> None:
    """After `gpudiag profile`: the notes, what was collected, and (`report`) the run's
    diagnosis printed and report.html written."""
    from gpudiag.reports.build import diagnosis_page
    from gpudiag.reports.html_report import TOP_ROWS
    from gpudiag.reports.terminal import print_diagnosis

    for note in gathered.notes:
        click.echo(f"gpudiag: {printable(note)}", err=True)  # notes quote paths and names
    click.echo(f"gpudiag: collected {gathered.collected() or 'nothing'}", err=True)
    click.echo(f"gpudiag: run directory {printable(gathered.result.run_dir)}", err=True)
    dx = gathered.diagnosis() if report else None
    if dx is None:
        return
    print_diagnosis(dx.to_dict(), Console(stderr=True, highlight=False))
    _write(gathered.result.run_dir / "report.html",
           diagnosis_page(dx, info=dx.summary(top=TOP_ROWS), generated_for=generated_for))


@cli.command()
def doctor() -> None:
    """What this machine can collect and read (GPU, driver, CUPTI, torch, jax, cupy, NVTX,
    nsys, ncu and its counter permission, the ncu reader), and how to get what is
    missing."""
    from rich.markup import escape

    from gpudiag.profiler.doctor import checks, render, summary

    console = Console(highlight=False)
    results = checks()
    console.print(render(results))
    for line in summary(results):
        head, _, rest = line.partition(": ")
        console.print(f"[bold]{escape(head)}[/bold]: {escape(rest)}")


@cli.command()
def schema() -> None:
    """Print the Trace schema, then the Diagnosis schema (every table and column), as
    Markdown: docs/schema.md."""
    from gpudiag.diagnosis_schema import full_markdown

    click.echo(full_markdown(), nl=False)


def _load(paths: list[Path]) -> Trace:
    """gpudiag.load with a spinner on a terminal (stderr), silent otherwise."""
    from gpudiag.readers.sources import load

    console = Console(stderr=True)
    if not console.is_terminal:
        return load(paths)
    with console.status("reading profiles...") as status:
        return load(paths, progress=lambda line: status.update(terminal(line)))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn errors into one line and an exit status."""
    streams.lenient()
    try:
        cli.main(args=argv, prog_name="gpudiag", standalone_mode=False)
    except GpudiagError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        click.echo(f"gpudiag: error: {printable(exc)}", err=True)  # a name may hold ESC
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
        limit = exhausted(exc)  # a limit of the machine's is not a bug: say which
        if limit is not None:
            click.echo(f"gpudiag: error: {printable(limit)}", err=True)
            sys.exit(limit.exit_code)
        click.echo(
            f"gpudiag: internal error: {exc.__class__.__name__}: {printable(exc)} "
            "(run with --debug for the traceback, and please report it)", err=True,
        )
        sys.exit(1)


