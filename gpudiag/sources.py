"""`gpudiag.load`: any supported file, directory or list of them into one Trace.

The format is recognized from the content (gzip is looked through), so a Kineto trace named
`.txt` or an nsys export without `.sqlite` still loads. A directory is either a saved trace /
run directory, or a folder of profiles (one per rank or process) that are merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpudiag.collectors import READERS, Probe, Reader, find_reader
from gpudiag.collectors.files import at_most_files, read_head
from gpudiag.errors import InputError
from gpudiag.trace import Trace, check_meta, is_trace_dir, load_json, merge
from gpudiag.trace_meta import RUN

PathLike = str | os.PathLike[str]
Progress = Callable[[str], None]

SUPPORTED = ", ".join(r.description for r in READERS)


def load(paths: PathLike | Sequence[PathLike], *, progress: Progress | None = None) -> Trace:
    """Read one or more profiles into a Trace (several are merged, keeping pid and rank).

        trace = gpudiag.load("rank0.pt.trace.json.gz")
        trace = gpudiag.load(["rank0.json.gz", "rank1.json.gz"])   # or the folder holding them
        trace = gpudiag.load("report.ncu-rep")

    `progress`, if given, is called with a short message before each file is read.
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise InputError(None, "no input path given", "pass a profile file or directory")
    jobs: list[tuple[Path, Reader | None]] = []
    skipped: list[str] = []
    for item in items:
        jobs += _expand(Path(item), skipped)
    traces = []
    for path, reader in jobs:
        if progress is not None:
            progress(f"reading {path.name}" + (f" ({reader.name})" if reader else ""))
        traces.append(read_file(path, reader))
    trace = merge(traces)
    if skipped:  # files in a folder that no reader accepts: said, never silently dropped
        trace.meta["skipped"] = skipped
        trace.warn("files in the folder that are not a profile gpudiag reads (meta skipped)",
                   len(skipped))
    return trace


def read_file(path: Path, reader: Reader | None = None) -> Trace:
    """Read one file (or saved trace directory) with the reader its content calls for."""
    if path.is_dir():
        return load_run(path) if is_run_dir(path) and not is_trace_dir(path) \
            else Trace.load_dir(path)
    if reader is None:
        reader = detect(path)
    trace = reader.read(path)
    trace.fill_rank()
    fmt = trace.meta.get("format") or reader.name
    trace.meta["sources"] = [
        {"path": str(path), "format": fmt, "bytes": path.stat().st_size},
        *[s for s in trace.meta.get("sources", []) if s.get("path") != str(path)],
    ]
    return trace


def detect(path: Path) -> Reader:
    """The reader for `path`, judged from its content; InputError when none fits."""
    head, gzipped = read_head(path)
    reader = find_reader(Probe(path, head, gzipped))
    if reader is None:
        shown = head[:16].hex(" ")
        raise InputError(
            path, f"is not a profile format gpudiag reads (starts with bytes {shown})",
            f"supported: {SUPPORTED}",
        )
    return reader


def _expand(path: Path, skipped: list[str]) -> list[tuple[Path, Reader | None]]:
    if not path.exists():
        raise InputError(path, "does not exist", "check the path")
    if not path.is_dir():  # a file, or a FIFO/device that detect() refuses before it blocks
        return [(path, None)]
    if is_trace_dir(path):
        return [(path, None)]
    if is_run_dir(path):
        return [(path, None)]  # read_file: load_run
    found = readable_files(sorted(at_most_files(path, _walk(path))), skipped)
    if not found:
        raise InputError(
            path, "is a directory with no profile gpudiag can read",
            f"point at a file or a folder holding them; supported: {SUPPORTED}",
        )
    return found


def is_run_dir(path: Path) -> bool:
    """A `gpudiag profile` run directory: its meta.json beside `procs/`."""
    return (path / "meta.json").is_file() and (path / "procs").is_dir()


def load_run(run_dir: Path) -> Trace:
    """A run directory's Trace: its merged `<run>/trace/`, or merged now if the session
    never did (killed before its merge, or interrupted during it).

    Reading never writes outside what gpudiag owns: a `trace` that is a symlink is neither
    read nor written through; the merge caches `<run>/trace/` only into a directory it
    creates (`gather.write_cache`), keeps the Trace in memory where the run directory is
    read-only, and leaves the raw segments uncompressed.
    """
    cache = run_dir / "trace"
    if not cache.is_symlink() and is_trace_dir(cache):
        return Trace.load_dir(cache)
    from gpudiag.profiler.gather import merge_run

    file = run_dir / "meta.json"
    try:
        run_meta = load_json(file)
    except (OSError, ValueError) as exc:
        raise InputError(file, "unreadable run meta.json", "the run directory is damaged") \
            from exc
    problem = RUN(run_meta)
    if problem is not None:
        raise InputError(file, f"run meta.json {problem.lstrip('.')}",
                         "the run directory is damaged")
    trace = merge_run(run_dir, compress=False)
    check_meta(trace.meta, file)
    return trace


def _walk(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith("."):
                yield Path(dirpath) / name


def readable_files(paths: list[Path], skipped: list[str]) -> list[tuple[Path, Reader | None]]:
    """The files a reader accepts, without reading one run twice.

    Two files that are the same run in two formats are read once: an nsys report and its
    SQLite export with the same stem (the export wins), and a JAX run folder's
    `*.xplane.pb` beside the trace-viewer JSON written from it (`perfetto_trace.json.gz` with
    `create_perfetto_trace=True`, `<host>.trace.json.gz` by newer jax; the XSpace wins: it
    has more detail).
    """
    accepted: list[tuple[Path, Reader]] = []
    for path in paths:
        try:
            accepted.append((path, detect(path)))
        except InputError as exc:
            skipped.append(str(exc))
    formats = {(p.parent, _stem(p)): r.name for p, r in accepted}
    folders_with_xplane = {p.parent for p, r in accepted if r.name == "xplane"}
    xplane_stems = {(p.parent, _stem(p)) for p, r in accepted if r.name == "xplane"}
    kept: list[tuple[Path, Reader | None]] = []
    for path, reader in accepted:
        if reader.name == "nsys-rep" and formats.get((path.parent, _stem(path))) == "nsys-sqlite":
            continue
        if reader.name != "xplane" and (
            (path.parent in folders_with_xplane and path.name.startswith("perfetto_trace"))
            or (path.parent, _stem(path)) in xplane_stems
        ):
            continue
        kept.append((path, reader))
    return kept


def _stem(path: Path) -> str:
    return path.name.split(".")[0]
