"""Gather a run directory into one Trace: every process, every collector, every sampler.

    trace = merge_run(Path("gpudiag-runs/20261202T101500Z-train"))
    trace.meta["processes"]          # pid, host, rank, collectors of every Python process

The layout `gpudiag profile` writes, and what is read from it:

    <run>/meta.json                       the session (command, options, exit status)
    <run>/procs/<host>-<pid>[-rank<R>]/   one Python process: host markers (a Trace dir)
        <plugin>/chunk-NNNNNN/            a plugin's periodic output (Trace dirs: cupti, nccl)
        <plugin>/*.pt.trace.json, *.pickle, *.xplane.pb   files gpudiag.load reads (torch, jax)
    <run>/nvml/chunk-NNNNNN/              the parent's NVML samples (load_samples)
    extra files                           an external tool's result (nsys .sqlite, .ncu-rep)

Every part of a process takes the process's rank when its own source names none, so a
Kineto segment recorded before `init_process_group` still lands on its rank.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag.errors import InputError
from gpudiag.readers.registry import read_path, readable_files
from gpudiag.schema import TABLE_NAMES
from gpudiag.trace import Trace, check_meta, is_trace_dir, load_json, merge, warn_meta
from gpudiag.trace_meta import RUN

log = logging.getLogger(__name__)


#: how often load_samples looks again for chunks replaced while it read
LOAD_ROUNDS = 20

def is_run_dir(path: Path) -> bool:
    """A `gpudiag profile` run directory: its meta.json beside `procs/` (a meta.json that is
    not a regular file too: `read_run_meta` then says so, rather than the folder being
    read file by file as profiles)."""
    return os.path.lexists(path / "meta.json") and (path / "procs").is_dir()


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
    read_run_meta(run_dir)  # a damaged run is one line before anything is merged
    trace = merge_run(run_dir, compress=False)
    check_meta(trace.meta, run_dir / "meta.json")
    return trace


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    """The session's `<run>/meta.json`, checked; an InputError naming it when damaged."""
    file = Path(run_dir) / "meta.json"
    try:
        run_meta = load_json(file)
    except InputError as exc:  # not a regular file
        raise InputError(file, f"unreadable run meta.json ({exc.problem})",
                         "the run directory is damaged") from exc
    except (OSError, ValueError) as exc:
        raise InputError(file, "unreadable run meta.json", "the run directory is damaged") \
            from exc
    problem = RUN(run_meta)
    if problem is not None:
        raise InputError(file, f"run meta.json {problem.lstrip('.')}",
                         "the run directory is damaged")
    return dict(run_meta)


def merge_run(run_dir: Path, extra: Sequence[Path] = (), *, compress: bool = True) -> Trace:
    """Merge everything under `run_dir` (and the `extra` result files) into `<run>/trace/`.

    Process directories that never got a whole meta.json (killed before the first flush)
    are skipped and counted in `meta["warnings"]`; a collector file that cannot be read is
    named in `meta["unreadable"]` and the rest still merges. A run without any Python
    process gives an empty Trace that still carries the run meta.

    `<run>/trace/` is a cache that gpudiag owns (`write_cache`): written into a directory
    it creates, never through a symlink, and skipped (the Trace is still returned) where
    the run directory is read-only or `trace` is not gpudiag's. `compress=False` (reading
    someone's run directory) leaves the raw segments as they are.
    """
    run_dir = Path(run_dir)
    procs = sorted(path for path in (run_dir / "procs").glob("*") if path.is_dir())
    unreadable: list[str] = []
    parts = [process_trace(proc, unreadable) for proc in procs if is_trace_dir(proc)]
    nvml = load_samples(run_dir / "nvml")
    parts += [nvml] if nvml is not None else []
    parts += _read_files(list(extra), unreadable)
    trace = merge(parts) if parts else Trace()
    finish_meta(trace.meta, run_dir, [part.meta for part in parts], unreadable)
    if not write_cache(trace, run_dir):
        trace.warn("merged trace not saved as <run>/trace (the run directory is read-only, "
                   "or its trace is a link or not gpudiag's): merged again on each read")
    if compress:
        compress_segments(run_dir)
    return trace


def process_trace(proc: Path, unreadable: list[str] | None = None) -> Trace:
    """One process of a run: its host markers and every collector's output, merged (each
    part on the process's rank, gpudiag's own threads left out). `meta["process"]` is the
    process's record (pid, host, rank, collectors, `data`: whether anything was collected);
    files that could not be read are added to `unreadable` (else to `meta["unreadable"]`)."""
    host = _host_part(proc)
    process = dict(host.meta.get("process") or {})
    own = process.get("gpudiag_thread_ids") or []
    missed: list[str] = []
    collected = _collector_parts(proc, missed)
    for part in collected:
        _adopt_rank(part, host.meta.get("rank"))
        _drop_threads(part, process.get("pid"), own)
    process["data"] = bool(collected) or not set(process.get("collectors", [])) - {"host"}
    host.meta["process"] = process
    trace = merge([host, *collected])
    trace.meta.update(process=process, rank=host.meta.get("rank"))
    if unreadable is not None:
        unreadable += missed
    elif missed:
        trace.meta["unreadable"] = missed
    return trace


def run_units(run_dir: Path) -> list[Path]:
    """The parts of a run directory a job reads one by one (`read_part`): every process
    directory, then the NVML samples when there are some."""
    run_dir = Path(run_dir)
    units = sorted(path for path in (run_dir / "procs").glob("*")
                   if path.is_dir() and is_trace_dir(path))
    nvml = run_dir / "nvml"
    return units + ([nvml] if any(nvml.glob("chunk-*")) else [])


def read_part(path: Path) -> Trace | None:
    """A part of a run directory read on its own (a process directory: `process_trace`;
    the NVML samples), None when `path` is not one."""
    run_dir = path.parent.parent if path.parent.name == "procs" else path.parent
    if not is_run_dir(run_dir):
        return None
    if path.parent.name == "procs" and is_trace_dir(path):
        return process_trace(path)
    if path.name == "nvml":
        samples = load_samples(path)
        return samples if samples is not None else Trace(meta={"chunks": 0})
    return None


def finish_meta(meta: dict[str, Any], run_dir: Path, metas: Sequence[dict[str, Any]],
                unreadable: Sequence[str] = ()) -> None:
    """Complete the meta of a run's merged parts (`metas`: each process's `process_trace`
    meta, the NVML samples') with what the run adds: the session, its processes, hosts and
    ranks, the process directories that never wrote anything, the files that could not be
    read (`unreadable`, and those the parts name)."""
    run_dir = Path(run_dir)
    run_info = read_run_meta(run_dir)
    processes = [part["process"] for part in metas if "process" in part]
    meta.update(
        run=run_info, command=run_info.get("command"),
        backend=(run_info.get("options") or {}).get("backend") or run_info.get("backend"),
        processes=processes,
        hosts=sorted({process.get("host", "") for process in processes} - {""}),
        ranks=sorted({part["rank"] for part in metas
                      if "process" in part and part.get("rank") is not None}),
    )
    samples = [part for part in metas if "chunks" in part and "process" not in part]
    if samples:  # the NVML sampler's (`load_samples`)
        meta["nvml"] = samples[-1].get("nvml", {})
    procs = sum(1 for path in (run_dir / "procs").glob("*") if path.is_dir())
    warn_meta(meta, "process directories without output (killed before the first flush)",
              procs - len(processes))
    missed = [*unreadable, *(name for part in metas for name in part.get("unreadable", []))]
    meta.pop("unreadable", None)
    if missed:
        meta["unreadable"] = missed
        warn_meta(meta, "collector outputs that could not be read (meta unreadable)",
                  len(missed))


#: what `Trace.save` writes: the only entries a stale `<run>/trace/` may hold to be replaced
_CACHE_FILES = frozenset({"meta.json", *(f"{name}.parquet" for name in TABLE_NAMES)})


def write_cache(trace: Trace, run_dir: Path) -> bool:
    """Save `trace` as `<run>/trace/`; False (nothing written) where that is not safe.

    The tables go into a fresh directory made by `mkdtemp` (never an existing path, so
    never through a symlink), renamed into place. An existing `trace` is replaced only
    when it is a real directory holding nothing but files `Trace.save` writes (a merge
    interrupted midway); a symlink, a file or a folder with anything else is left alone.
    """
    target = run_dir / "trace"
    if target.is_symlink() or (target.exists() and not _own_cache(target)):
        log.debug("write_cache: %s is not gpudiag's cache: not written", target)
        return False
    try:
        fresh = Path(tempfile.mkdtemp(prefix=".trace-", dir=run_dir))
    except OSError as exc:  # a read-only run directory is read, not written
        log.debug("write_cache: %s: %s", run_dir, exc)
        return False
    try:
        trace.save(fresh)
        if target.exists() and not target.is_symlink():
            for entry in target.iterdir():
                entry.unlink()
            target.rmdir()
        os.rename(fresh, target)  # fails (kept out) if `trace` appeared meanwhile
    except OSError as exc:
        log.debug("write_cache: %s: %s", target, exc)
        shutil.rmtree(fresh, ignore_errors=True)
        return False
    return True


def _own_cache(path: Path) -> bool:
    """A real directory of regular files that `Trace.save` names (no links, no folders)."""
    if not path.is_dir():
        return False
    try:
        return all(entry.name in _CACHE_FILES and entry.is_file(follow_symlinks=False)
                   for entry in os.scandir(path))
    except OSError:
        return False


def compress_segments(run_dir: Path) -> list[Path]:
    """Gzip the raw torch.profiler segments once merged (JSON compresses ~20x; every reader,
    Perfetto and HTA included, reads them gzipped); the compressed paths."""
    done = []
    for raw in sorted(Path(run_dir).glob("procs/*/torch/segment-*.pt.trace.json")):
        packed = raw.with_name(raw.name + ".gz")
        tmp = packed.with_name(f".{packed.name}.tmp")
        try:
            with raw.open("rb") as source, gzip.open(tmp, "wb", compresslevel=3) as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            os.replace(tmp, packed)
            raw.unlink()
        except OSError as exc:  # a full or read-only disk keeps the raw file: nothing lost
            log.debug("compress_segments: %s: %s", raw, exc)
            tmp.unlink(missing_ok=True)
            continue
        done.append(packed)
    return done


def _drop_threads(part: Trace, pid: Any, tids: list[int]) -> None:
    """Leave out the events of gpudiag's own threads (its flush thread, window timers): the
    torch profiler's Python tracer records every thread, and they are not the program's."""
    if not tids or pid is None or not len(part.ranges):
        return
    ranges = part.ranges
    own = ranges["tid"].isin(tids).fillna(False) & (ranges["pid"].fillna(pid) == pid)
    if own.any():
        part.ranges = ranges[~own.to_numpy(bool)].reset_index(drop=True)
        part.warn("events of gpudiag's own threads left out", int(own.sum()))




#: the bootstrap's sealed marker chunks, part of the process's own (host) Trace
MARKERS = "markers"


def _host_part(proc: Path) -> Trace:
    """A process's host Trace: the open markers plus every sealed chunk, each row once.

    A kill between sealing a chunk and clearing the open tail leaves rows in both, so
    duplicates (same thread, times, name and source) are dropped.
    """
    host = Trace.load_dir(proc)
    chunks = [chunk for chunk in sorted((proc / MARKERS).glob("chunk-*")) if is_trace_dir(chunk)]
    if chunks:
        frames = [Trace.load_dir(chunk).ranges for chunk in chunks] + [host.ranges]
        ranges = pd.concat([frame for frame in frames if len(frame)] or frames[:1],
                           ignore_index=True)
        key = ["pid", "tid", "start_ns", "end_ns", "name", "source"]
        host.ranges = ranges.drop_duplicates(key, ignore_index=True)
    return host


def _collector_parts(proc: Path, unreadable: list[str]) -> list[Trace]:
    """Each plugin folder's Trace chunks and readable files (markers belong to the host)."""
    folders = sorted(path for path in proc.iterdir() if path.is_dir() and path.name != MARKERS)
    parts: list[Trace] = []
    for folder in folders:
        entries = sorted(path for path in folder.iterdir() if not path.name.startswith("."))
        for chunk in (path for path in entries if path.is_dir() and is_trace_dir(path)):
            parts.append(Trace.load_dir(chunk))
        parts += _read_files(_files_below(folder), unreadable)
    return parts


def _files_below(folder: Path) -> list[Path]:
    """Collector files under `folder`, outside Trace dirs (jax nests its xplane files)."""
    found: list[Path] = []
    for path in sorted(folder.rglob("*")):
        between = path.relative_to(folder).parents  # folder-relative dirs holding the file
        if path.is_file() and not path.name.startswith(".") and not any(
            str(rel) != "." and is_trace_dir(folder / rel) for rel in between
        ):
            found.append(path)
    return found


def _read_files(paths: Iterable[Path], unreadable: list[str]) -> list[Trace]:
    """Each profile file read once (jax's JSON beside its XSpace is the same run)."""
    parts = []
    for path, reader in readable_files(list(paths), unreadable):
        try:
            parts.append(read_path(path, reader))
        except InputError as exc:  # one bad file must not lose the others
            log.debug("merge_run: %s", exc)
            unreadable.append(str(exc))
    return parts


def _adopt_rank(part: Trace, rank: Any) -> None:
    """A collector part without its own rank belongs to its process's rank."""
    if rank is not None and part.meta.get("rank") is None:
        part.meta["rank"] = rank
        part.fill_rank()


def load_samples(out_dir: Path) -> Trace | None:
    """Every chunk under `out_dir` as one Trace (the meta of the newest), None without any.

    A killed session may leave a hidden `.chunk-*.tmp` (half written: skipped) or two chunks
    of one segment (their shared rows are kept once). Read while the sampler runs, a chunk
    replaced under the reader is dropped and its successor read instead.
    """
    root = Path(out_dir)
    loaded: dict[Path, Trace] = {}
    for attempt in range(LOAD_ROUNDS):
        fresh = [chunk for chunk in sorted(root.glob("chunk-*"))
                 if chunk not in loaded and is_trace_dir(chunk)]
        failed = False
        for path in fresh:
            try:
                loaded[path] = Trace.load_dir(path)
            except InputError:
                if path.is_dir() and attempt == LOAD_ROUNDS - 1:
                    raise  # damaged, not replaced
                failed = True
        gone = [path for path in loaded if not path.is_dir()]
        for path in gone:
            del loaded[path]
        if not failed and not gone:
            break
    if not loaded:
        return None
    parts = [loaded[path] for path in sorted(loaded)]
    trace = merge(parts)
    samples = trace.samples.drop_duplicates(["device", "ts_ns", "metric"], ignore_index=True)
    meta = {**parts[-1].meta, "chunks": len(parts)}
    return Trace(meta=meta, **{**trace.tables(), "samples": samples})
