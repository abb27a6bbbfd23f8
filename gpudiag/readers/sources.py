"""`gpudiag.load`: any supported file, directory or list of them into one Trace.

The format is recognized from the content (gzip is looked through), so a Kineto trace named
`.txt` or an nsys export without `.sqlite` still loads. A directory is either a saved trace /
run directory, or a folder of profiles (one per rank or process) that are merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpudiag.errors import InputError
from gpudiag.readers.claims import refusal
from gpudiag.readers.files import at_most_files, decoded_size
from gpudiag.readers.registry import Reader, detect, read_path, readable_files, supported
from gpudiag.readers.run_dir import is_run_dir, load_run, read_part, run_units
from gpudiag.trace import Trace, is_trace_dir, merge

PathLike = str | os.PathLike[str]
Progress = Callable[[str], None]
#: the reader `read_together` joins files of
KINETO = "gpudiag.readers.kineto.reader:read"

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
    pieces, metas = [], []
    for group in _groups(jobs):
        if progress is not None:
            for path, reader in group:
                progress(f"reading {path.name}" + (f" ({reader.name})" if reader else ""))
        together = read_together([path for path, _ in group])
        if together is not None:
            pieces.append(together[0])
            metas += together[1]
            continue
        for path, reader in group:
            pieces.append(read_file(path, reader))
            metas.append(pieces[-1].meta)
    trace = merge(pieces, metas=metas)  # every file's own meta, also those read together
    refused = refusal(trace, [(str(path), meta.get("rank")) for (path, _), meta
                              in zip(jobs, metas, strict=True) if not path.is_dir()])
    if refused is not None:  # a copy of a rank's file, two runs in one folder
        raise refused
    if skipped:  # files in a folder that no reader accepts: said, never silently dropped
        trace.meta["skipped"] = skipped
        trace.warn("files in the folder that are not a profile gpudiag reads (meta skipped)",
                   len(skipped))
    return trace


def units_of(paths: PathLike | Sequence[PathLike], *, split_runs: bool = False) -> list[Path]:
    """The files (and saved trace or run directories) `load` would read for `paths`, in
    the order it merges them: the units of a many-rank job, read one by one elsewhere.
    `split_runs`: a run directory's units are its processes and samples (`run_units`),
    each read apart (`read_file` knows them)."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise InputError(None, "no input path given", "pass a profile file or directory")
    found: list[Path] = []
    for item in items:
        for path, _ in _expand(Path(item), []):
            split = split_runs and path.is_dir() and is_run_dir(path) and not is_trace_dir(path)
            found += (run_units(path) or [path]) if split else [path]
    return found


def read_file(path: Path, reader: Reader | None = None) -> Trace:
    """Read one file, saved trace directory, run directory or part of a run directory."""
    if path.is_dir():
        if is_run_dir(path) and not is_trace_dir(path):
            return load_run(path)
        part = read_part(path)  # a process directory or the samples of a run
        return part if part is not None else Trace.load_dir(path)
    return read_path(path, reader)


#: consecutive files read together (`read_together`) decode at most this many bytes
TOGETHER_BYTES = 48 << 20


def _groups(jobs: list[tuple[Path, Reader | None]]) -> list[list[tuple[Path, Reader | None]]]:
    """The files in order, in runs of at most TOGETHER_BYTES decoded (a larger file alone)."""
    groups: list[list[tuple[Path, Reader | None]]] = []
    size = 0
    for job in jobs:
        weight = 0 if job[0].is_dir() else decoded_size(job[0])
        if not groups or size + weight > TOGETHER_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(job)
        size += weight
    return groups


def read_together(paths: list[Path]) -> tuple[Trace, list[dict[str, Any]]] | None:
    """Several Kineto traces merged, each table built once for all of them
    (`readers.kineto.joined`), and each file's meta; None when they are not two or more
    Kineto traces that read cleanly: the caller then reads them one by one, which says
    what is wrong with which (or repairs it)."""
    if len(paths) < 2:
        return None
    try:
        if any(path.is_dir() or detect(path).target != KINETO for path in paths):
            return None
        from gpudiag.readers.kineto.joined import read_joined
        from gpudiag.readers.kineto.reader import gc_paused

        with gc_paused():
            return read_joined(paths)
    except Exception:  # an unreadable file, or one the reader repairs: read one by one
        return None


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
            f"point at a file or a folder holding them; supported: {supported()}",
        )
    return found


def _walk(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith("."):
                yield Path(dirpath) / name
