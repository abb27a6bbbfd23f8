"""Readers and collectors, one module per source format, registered by a key.

A reader is a `sniff(probe) -> bool` that recognizes its format from the first bytes of the
content (not the file name alone) and a `read(path) -> Trace`. Readers are imported only when
a file of theirs is read, so `import gpudiag` stays light and optional vendor packages
(ncu_report) are touched only for their own formats. New formats register here; nothing else
in gpudiag changes.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag.errors import InputError
from gpudiag.inputs.text import valid
from gpudiag.readers.files import read_head

if TYPE_CHECKING:
    from gpudiag.trace import Trace


@dataclass(frozen=True)
class Probe:
    """What sniffers look at: the path and the first bytes of its (decompressed) content."""

    path: Path
    head: bytes
    gzipped: bool

    @property
    def text_head(self) -> bytes:
        """The head without a UTF-8 byte-order mark and leading whitespace."""
        return self.head.removeprefix(b"\xef\xbb\xbf").lstrip()


@dataclass(frozen=True)
class Reader:
    name: str
    description: str
    sniff: Callable[[Probe], bool]
    target: str  # "module:function" reading a path into a Trace

    def read(self, path: Path) -> Trace:
        module, func = self.target.split(":")
        reader: Callable[[Path], Trace] = getattr(importlib.import_module(module), func)
        return reader(path)


READERS: list[Reader] = []


def register(name: str, description: str, sniff: Callable[[Probe], bool], target: str) -> None:
    """Add a reader; earlier registrations win when two sniffers accept the same file."""
    READERS.append(Reader(name, description, sniff, target))


def find_reader(probe: Probe) -> Reader | None:
    return next((r for r in READERS if r.sniff(probe)), None)


_JSON_LIST_OF_LISTS = re.compile(rb"^\[\s*\[")
_JSON_START = re.compile(rb"^[\[{]")


def _is_pickle(p: Probe) -> bool:
    return len(p.head) > 2 and p.head[0] == 0x80 and 2 <= p.head[1] <= 5


#: a trace-viewer process named after an XLA plane ("/host:CPU", "/device:GPU:0")
_XLA_PLANE_NAME = re.compile(rb'"name"\s*:\s*"/(?:host|device):')
#: header keys only Kineto writes
_KINETO_KEY = re.compile(rb'"(?:schemaVersion|deviceProperties|baseTimeNanoseconds|'
                         rb'distributedInfo|traceName)"\s*:')


def _is_jax_chrome_trace(p: Probe) -> bool:
    # jax.profiler's Chrome JSON names its processes after the XSpace planes, in metadata
    # events it writes first; Kineto's header keys come first in its traces.
    head = p.text_head
    return bool(_JSON_START.match(head)) and bool(_XLA_PLANE_NAME.search(head)) \
        and not _KINETO_KEY.search(head)


def _is_xplane(p: Probe) -> bool:
    # XSpace field 1 (planes), length-delimited: tag byte 0x0a, then a plane whose name is
    # "/host:..." or "/device:..." within its first bytes.
    return p.head[:1] == b"\n" and (b"/host:" in p.head[:4096] or b"/device:" in p.head[:4096])


register(
    "nsys-sqlite", "Nsight Systems SQLite export (nsys export --type sqlite)",
    lambda p: p.head.startswith(b"SQLite format 3\x00"),
    "gpudiag.readers.nsys.reader:read_sqlite",
)
register(
    "nsys-rep", "Nsight Systems report (.nsys-rep / .qdrep), exported through nsys",
    lambda p: p.head.startswith(b"NVIDIA Tegra Profiler Report")
    or p.path.suffix in (".nsys-rep", ".qdrep"),
    "gpudiag.readers.nsys.reader:read_report",
)
register(
    "ncu-rep", "Nsight Compute report (.ncu-rep), read with ncu_report",
    lambda p: p.head.startswith(b"NVR\x00"),
    "gpudiag.readers.ncu.reader:read",
)
register(
    "torch-memory-snapshot", "PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot)",
    _is_pickle,
    "gpudiag.readers.torch_memory.reader:read_snapshot",
)
register(
    "torch-memory-timeline", "PyTorch profiler export_memory_timeline (.json / .raw.json.gz)",
    lambda p: bool(_JSON_LIST_OF_LISTS.match(p.text_head)),
    "gpudiag.readers.torch_memory.reader:read_timeline",
)
register(
    "xplane", "JAX / XLA profiler XSpace (.xplane.pb)",
    _is_xplane,
    "gpudiag.readers.xplane.reader:read",
)
register(
    "nccl-tests", "nccl-tests output (all_reduce_perf, alltoall_perf, ... logs)",
    lambda p: b"nThread" in p.head[:4096] and b"nGpus" in p.head[:4096],
    "gpudiag.readers.nccl_tests:read",
)
register(
    "jax-perfetto", "JAX profiler trace-viewer JSON (perfetto_trace.json.gz, *.trace.json.gz)",
    _is_jax_chrome_trace,
    "gpudiag.readers.xplane.reader:read_perfetto",
)
register(
    "chrome-trace", "PyTorch profiler / Kineto trace (Chrome JSON)",
    lambda p: bool(_JSON_START.match(p.text_head)),
    "gpudiag.readers.kineto.reader:read",
)


def detect(path: Path) -> Reader:
    """The reader for `path`, judged from its content; InputError when none fits."""
    head, gzipped = read_head(path)
    reader = find_reader(Probe(path, head, gzipped))
    if reader is None:
        shown = head[:16].hex(" ")
        raise InputError(
            path, f"is not a profile format gpudiag reads (starts with bytes {shown})",
            f"supported: {supported()}",
        )
    return reader


def read_path(path: Path, reader: Reader | None = None) -> Trace:
    """Read one file with the reader its content calls for (`detect` when none is given)."""
    if reader is None:
        reader = detect(path)
    trace = reader.read(path)
    trace.fill_rank()
    note_source(trace.meta, path, reader.name)
    return trace


def note_source(meta: dict[str, Any], path: Path, reader_name: str) -> None:
    """Name `path` first among the meta's sources (its format, its size on disk). The name
    is kept as valid text (`text.valid`: a byte that is not UTF-8 reads `\\xff`), as every
    report and export shows it."""
    fmt = meta.get("format") or reader_name
    name = valid(str(path))
    meta["sources"] = [
        {"path": name, "format": fmt, "bytes": path.stat().st_size},
        *[s for s in meta.get("sources", []) if s.get("path") != name],
    ]


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


def supported() -> str:
    """The formats gpudiag reads, for messages."""
    return ", ".join(reader.description for reader in READERS)
