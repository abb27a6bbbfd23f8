"""Synthetic traces with known answers, for exact unit tests.

Two levels:
- Trace-level builders (`kernel`, `copy`, `sync`, `api_call`, `trace`) give a Trace directly;
- Kineto-level builders (`KinetoTrace`) write a PyTorch-profiler JSON file, so a test checks
  the reader and the numbers it must produce from the same literal events.
Times are given in microseconds where Kineto uses them and nanoseconds in Trace rows.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag.trace import Trace

# -- Trace-level ---------------------------------------------------------------------------


def kernel(start_ns: int, end_ns: int, name: str = "k", *, device: int = 0, stream: int = 7,
           grid: tuple[int, int, int] = (1, 1, 1), block: tuple[int, int, int] = (128, 1, 1),
           correlation: int | None = None, pid: int = 100, **extra: Any) -> dict[str, Any]:
    return {
        "pid": pid, "device": device, "stream": stream, "start_ns": start_ns, "end_ns": end_ns,
        "name": name, "correlation": correlation,
        "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
        "block_x": block[0], "block_y": block[1], "block_z": block[2], **extra,
    }


def copy(start_ns: int, end_ns: int, kind: str = "HtoD", nbytes: int = 1024, *,
         host_mem: str | None = "pageable", device: int = 0, stream: int = 7,
         pid: int = 100) -> dict[str, Any]:
    return {"pid": pid, "device": device, "stream": stream, "start_ns": start_ns,
            "end_ns": end_ns, "kind": kind, "bytes": nbytes, "host_mem": host_mem}


def sync(start_ns: int, end_ns: int, kind: str = "stream", *, device: int = 0,
         stream: int | None = 7, pid: int = 100, tid: int = 100) -> dict[str, Any]:
    return {"pid": pid, "tid": tid, "device": device, "stream": stream,
            "start_ns": start_ns, "end_ns": end_ns, "kind": kind}


def api_call(start_ns: int, end_ns: int, name: str = "cudaLaunchKernel", *,
             correlation: int | None = None, pid: int = 100, tid: int = 100) -> dict[str, Any]:
    return {"pid": pid, "tid": tid, "start_ns": start_ns, "end_ns": end_ns, "name": name,
            "kind": "runtime", "correlation": correlation}


Rows = list[dict[str, Any]]


def trace(*, kernels: Rows | None = None, copies: Rows | None = None,
          syncs: Rows | None = None, api: Rows | None = None,
          meta: dict[str, Any] | None = None, **tables: Any) -> Trace:
    """A Trace from row dicts; kernel_id is assigned in the given order."""
    rows = [dict(k, kernel_id=i) for i, k in enumerate(kernels or [])]
    given = {"kernels": rows, "copies": copies, "syncs": syncs, "api": api}
    frames = {name: pd.DataFrame(r) for name, r in given.items() if r}
    return Trace(meta=meta, **frames, **tables)


# -- Kineto-level --------------------------------------------------------------------------


@dataclass
class KinetoTrace:
    """Build a PyTorch profiler (Kineto) Chrome trace event by event.

        kt = KinetoTrace()
        c = kt.launch(ts=10, dur=5)              # cudaLaunchKernel on the host thread
        kt.kernel("gemm", ts=20, dur=100, correlation=c)
        kt.write(tmp_path / "t.json.gz")
    """

    pid: int = 1000
    tid: int = 1000
    device: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=lambda: {
        "schemaVersion": 1,
        "deviceProperties": [{
            "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000,
            "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
            "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
            "sharedMemPerMultiprocessor": 233472, "numSms": 132,
            "sharedMemPerBlockOptin": 232448,
        }],
    })
    _next_correlation: int = 1

    def _x(self, cat: str, name: str, ts: float, dur: float, pid: Any, tid: Any,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
        event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                 "dur": dur, "args": args or {}}
        self.events.append(event)
        return event

    def correlation(self) -> int:
        self._next_correlation += 1
        return self._next_correlation - 1

    def op(self, name: str, ts: float, dur: float, external_id: int | None = None) -> None:
        args = {} if external_id is None else {"External id": external_id}
        self._x("cpu_op", name, ts, dur, self.pid, self.tid, args)

    def annotation(self, name: str, ts: float, dur: float) -> None:
        self._x("user_annotation", name, ts, dur, self.pid, self.tid)

    def python(self, name: str, ts: float, dur: float) -> None:
        self._x("python_function", name, ts, dur, self.pid, self.tid)

    def runtime(self, name: str, ts: float, dur: float, correlation: int | None = None) -> int:
        corr = self.correlation() if correlation is None else correlation
        self._x("cuda_runtime", name, ts, dur, self.pid, self.tid, {"correlation": corr})
        return corr

    def launch(self, ts: float, dur: float = 5.0) -> int:
        return self.runtime("cudaLaunchKernel", ts, dur)

    def kernel(self, name: str, ts: float, dur: float, correlation: int, stream: int = 7,
               grid: tuple[int, int, int] = (1, 1, 1), block: tuple[int, int, int] = (128, 1, 1),
               **args: Any) -> None:
        self._x("kernel", name, ts, dur, self.device, stream, {
            "device": self.device, "stream": stream, "correlation": correlation,
            "grid": list(grid), "block": list(block), "registers per thread": 32,
            "shared memory": 0, **args,
        })

    def memcpy(self, direction: str, src: str, dst: str, ts: float, dur: float,
               correlation: int, nbytes: int, stream: int = 7) -> None:
        self._x("gpu_memcpy", f"Memcpy {direction} ({src} -> {dst})", ts, dur, self.device,
                stream, {"device": self.device, "stream": stream, "correlation": correlation,
                         "bytes": nbytes})

    def memset(self, ts: float, dur: float, correlation: int, nbytes: int,
               stream: int = 7) -> None:
        self._x("gpu_memset", "Memset (Device)", ts, dur, self.device, stream,
                {"device": self.device, "stream": stream, "correlation": correlation,
                 "bytes": nbytes})

    def cuda_sync(self, kind: str, ts: float, dur: float, correlation: int,
                  stream: int = -1) -> None:
        self._x("cuda_sync", kind, ts, dur, self.device, stream if stream >= 0 else 7, {
            "cuda_sync_kind": kind, "stream": stream, "correlation": correlation,
            "device": self.device, "wait_on_cuda_event_id": -1,
        })

    def memory(self, ts: float, nbytes: int, addr: int, allocated: int, reserved: int) -> None:
        self.events.append({
            "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": self.pid, "tid": self.tid, "ts": ts,
            "args": {"Device Type": 1, "Device Id": self.device, "Addr": addr, "Bytes": nbytes,
                     "Total Allocated": allocated, "Total Reserved": reserved},
        })

    def document(self) -> dict[str, Any]:
        return {**self.header, "traceEvents": self.events}

    def write(self, path: Path) -> Path:
        data = json.dumps(self.document()).encode()
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        return path
