"""JSON decoder benchmark: the choice behind gpudiag's core dependency on msgspec.

Decodes the largest Kineto fixture (uncompressed once, up front) with:

- `json.loads` (standard library),
- `orjson.loads` (when installed),
- `msgspec.json.decode`, untyped (builds the same dicts and lists as json.loads),
- gpudiag's typed decoder (`gpudiag.readers.chrome.structs._DECODER`): msgspec decoding into
  structs that hold only the event fields gpudiag reads, with each event's `args` kept raw.

Each is timed best of `--repeat` (default 5), wall clock and CPU time, with the garbage
collector on, as in real use; the result is freed before the next run. Gunzip time is
reported on its own row.

    python benchmarks/bench_json.py
    python benchmarks/bench_json.py path/to/trace.json.gz --repeat 10
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent.parent / "shared" / "fixtures" / "kineto"


def content_of(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw.startswith(b"\x1f\x8b") else raw


def largest_fixture() -> Path:
    files = [p for p in FIXTURES.iterdir() if p.is_file()]
    if not files:
        sys.exit(f"no fixtures in {FIXTURES}; pass a trace path")
    return max(files, key=lambda p: len(content_of(p)))


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Least wall-clock and least CPU seconds of `repeat` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        del result
    return min(wall), min(cpu)


def decoders() -> dict[str, tuple[Callable[[bytes], Any], str]]:
    """name -> (decode function, version note); the ones not installed are left out."""
    import msgspec

    from gpudiag.readers.chrome import structs as chrome_json

    found: dict[str, tuple[Callable[[bytes], Any], str]] = {
        "json.loads": (json.loads, f"stdlib, Python {platform.python_version()}"),
    }
    try:
        import orjson

        found["orjson.loads"] = (orjson.loads, f"orjson {metadata.version('orjson')}")
    except ImportError:
        pass
    msgspec_version = f"msgspec {metadata.version('msgspec')}"
    found["msgspec.json.decode (untyped)"] = (msgspec.json.decode, msgspec_version)
    found["gpudiag typed decode (msgspec structs)"] = (
        chrome_json._DECODER.decode, msgspec_version)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path,
                        help=f"trace file (default: the largest in {FIXTURES})")
    parser.add_argument("--repeat", type=int, default=5, help="runs per decoder, best kept")
    args = parser.parse_args(argv)
    path = args.trace or largest_fixture()
    repeat = max(args.repeat, 1)
    start_load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None

    gunzip = best_of(lambda: content_of(path), repeat)
    content = content_of(path)
    rows: list[tuple[str, tuple[float, float], str]] = []
    for name, (decode, note) in decoders().items():
        print(f"# {name}", file=sys.stderr, flush=True)
        rows.append((name, best_of(lambda decode=decode: decode(content), repeat), note))

    base, base_cpu = rows[0][1]
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip()
                   for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    lines = [
        "## JSON decode",
        "",
        f"`{path.name}`: {len(content) / 1e6:.1f} MB uncompressed, "
        f"{path.stat().st_size / 1e6:.1f} MB on disk. Best of {repeat}, gc on. "
        f"Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; 1-min "
        f"load average at start {start_load}.",
        "",
        "| decoder | seconds | vs json.loads | CPU seconds | CPU vs json.loads | version |",
        "|---|--:|--:|--:|--:|---|",
    ]
    rows.append(("(gunzip + read, for scale)", gunzip, "zlib"))
    lines += [f"| {name} | {s:.3f} | {s / base:.2f}× | {c:.3f} | {c / base_cpu:.2f}× | {note} |"
              for name, (s, c), note in rows]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
