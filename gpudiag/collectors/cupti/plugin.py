"""The CUPTI backend of `gpudiag profile`: NVIDIA's cupti-python inside the program.

    plugin = create(out_dir, {"memory": True})     # MissingDependencyError / CollectorError
    plugin.start(); ...; plugin.flush(final=True)   # what the bootstrap does

CUPTI's Activity API records kernels, copies, memsets, blocking synchronizations, runtime
calls, cudaMalloc/cudaFree (MEMORY2), NVTX ranges (MARKER) and the GPUs (DEVICE) into
buffers; the buffer callback copies each record into a tuple at once (a record does not
outlive its buffer) and every flush converts what arrived since the last one
(`cupti_records`) into one new Trace directory, `chunk-NNNNNN`, renamed into place whole.
Periodic flushes take only buffers whose records are complete; the final one forces the rest
out. The window's pause/resume disable and re-enable the activity kinds.

Python call sites: a runtime-API callback on the blocking calls only (cudaDeviceSynchronize,
cudaStreamSynchronize, cudaEventSynchronize, synchronous cudaMemcpy...) notes the innermost
user frames (library frames skipped as `names.is_user_frame` skips them) and emits them
as `ranges` rows with source "python" around the call, so a sync stall is reported at the
user's line. Launches are not hooked: a callback per launch would cost more than it tells.

Thread ids are the kernel's (`gettid`, CUPTI's SYSTEM thread-id type, as Kineto uses) so API
rows and call-site ranges share them. NVTX reaches CUPTI only through the NVTX injection
variable, set here to the loaded libcupti when unset (it works if NVTX was not used yet).
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

from gpudiag.collectors.cupti.records import (
    BLOCKING_CALLS,
    CONCURRENT_KERNEL,
    DRIVER,
    CallSite,
    CuptiConverter,
    base_api_name,
    measure_offset,
    snapshot,
)
from gpudiag.errors import CollectorError
from gpudiag.names import is_user_frame
from gpudiag.optional import require

PURPOSE = "The cupti backend"
#: activity kinds always enabled (names of cupti.cupti.ActivityKind members)
KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMCPY2", "MEMSET", "SYNCHRONIZATION", "RUNTIME",
         "DEVICE", "CONTEXT", "MARKER")
#: GPUDIAG_CUPTI_DRIVER_API=1 adds driver API records (every runtime call's cu* twin)
ENV_DRIVER_API = "GPUDIAG_CUPTI_DRIVER_API"
NVTX_INJECTION = "NVTX_INJECTION64_PATH"
BUFFER_BYTES = 4 << 20
FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
#: user frames kept per blocking call, innermost first
CALLSITE_FRAMES = 3
_GPUDIAG_DIR = str(Path(__file__).resolve().parents[2]) + os.sep


def create(out_dir: Path, settings: Mapping[str, Any]) -> CuptiCollector:
    """The collector for one process (called by the bootstrap when a GPU framework loads)."""
    api = load_cupti()
    check_driver()
    return CuptiCollector(out_dir, settings, api)


def load_cupti() -> ModuleType:
    """`cupti.cupti`, cupti-python's 1:1 bindings; a missing package is a
    MissingDependencyError, a package that cannot load its library a CollectorError."""
    try:
        require("cupti", PURPOSE)
        return require("cupti.cupti", PURPOSE)
    except (OSError, RuntimeError) as exc:  # the bindings failed to load libcupti
        raise CollectorError(f"{PURPOSE} could not load CUPTI ({exc}); reinstall "
                             "cupti-python matching the CUDA driver") from exc


def check_driver(libcuda: str = "libcuda.so.1", device_nodes: tuple[str, ...] = (
        "/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*", "/dev/dxg")) -> None:
    """Raise CollectorError unless the NVIDIA driver and a GPU are here (/dev/dxg: WSL).
    Only looks (loads libcuda, lists device nodes): initializing CUDA in the bootstrap would
    break programs that fork before they touch the GPU."""
    try:
        ctypes.CDLL(libcuda)
    except OSError as exc:
        raise CollectorError(f"{PURPOSE} needs the NVIDIA driver, but {libcuda} cannot be "
                             f"loaded ({exc}): run on a machine with an NVIDIA GPU, or "
                             "profile with --backend torch") from exc
    if not any(glob.glob(pattern) for pattern in device_nodes):
        raise CollectorError(f"{PURPOSE}: the NVIDIA driver is installed but no GPU is "
                             "visible (no /dev/nvidia<N>); check the container's GPU access")


class CuptiCollector:
    """CUPTI activity tracing of one process, flushed as Trace chunks into `out_dir`."""

    def __init__(self, out_dir: Path, settings: Mapping[str, Any], api: Any) -> None:
        self.api = api
        self.out_dir = Path(out_dir)
        self.kind_names = [*KINDS, *(["MEMORY2"] if settings.get("memory", True) else []),
                           *(["DRIVER"] if os.environ.get(ENV_DRIVER_API) == "1" else [])]
        self.pid = os.getpid()
        self.rank = _env_int("RANK")
        self.enabled: list[Any] = []
        self.converter: CuptiConverter | None = None
        self.paused = False
        self.disabled = False  # after the final flush, or in a forked child
        self.chunks = 0
        self.callback_errors = 0
        self.notes: list[str] = []
        self._rows: dict[int, list[tuple[Any, ...]]] = {}
        self._ignored = 0
        self._sites: list[CallSite] = []
        self._pending: dict[int, tuple[int, tuple[tuple[str, int, str, int], ...]]] = {}
        self._tid: Callable[[], int] = threading.get_native_id
        self._names: dict[tuple[int, int], str | None] = {}
        self._subscriber: Any = None
        self._enter: Any = None
        self._lock = threading.Lock()
        self._flushing = threading.Lock()

    # -- the contract ---------------------------------------------------------------------

    def start(self) -> None:
        """Measure the clock offset, register the buffers, enable the kinds, hook syncs."""
        api = self.api
        try:
            clock = measure_offset(api.get_timestamp)  # also makes the bindings load libcupti
        except Exception as exc:
            raise CollectorError(f"CUPTI did not initialize ({exc}): the NVIDIA driver may be "
                                 "older than this cupti-python; install the cupti-python "
                                 "release of the driver's CUDA version") from exc
        self._use_system_thread_ids()
        nvtx = self._nvtx_injection()
        try:
            api.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        except Exception as exc:
            raise CollectorError(
                f"CUPTI refused the activity buffers ({exc}): another CUPTI client "
                "(torch.profiler, Nsight Systems, Nsight Compute) may own CUPTI in this "
                "process; profile with one backend at a time") from exc
        self._enable()
        if int(CONCURRENT_KERNEL) not in [int(kind) for kind in self.enabled]:
            self._stop()
            raise CollectorError(f"CUPTI would not trace kernels: {'; '.join(self.notes)}")
        callsites = self._subscribe_callsites()
        cupti_meta = {"clock_offset_ns": clock.offset_ns,
                      "clock_uncertainty_ns": clock.uncertainty_ns,
                      "kinds": [getattr(kind, "name", str(kind)) for kind in self.enabled],
                      "python_callsites": callsites, "nvtx_injection": nvtx,
                      "notes": self.notes}
        self.converter = CuptiConverter(
            offset_ns=clock.offset_ns, pid=self.pid, rank=self.rank, api_name=self._api_name,
            meta={"cupti": cupti_meta, "tool_versions": _versions(),
                  "world_size": _env_int("WORLD_SIZE")})

    def flush(self, final: bool = False) -> None:
        """Deliver CUPTI's buffers and write what is new as one chunk (nothing new: none)."""
        with self._flushing:  # the flush thread and the exit flush may meet
            if self.disabled or self.converter is None or os.getpid() != self.pid:
                return
            try:
                self.api.activity_flush_all(FLUSH_FORCED if final else 0)
            except Exception as exc:  # keep what the callbacks already delivered
                self._note(f"activity_flush_all failed: {exc}")
            if final:
                self._stop()
            with self._lock:
                rows, self._rows = self._rows, {}
                sites, self._sites = self._sites, []
                ignored, self._ignored = self._ignored, 0
            if not rows and not sites and not final:
                return
            self.converter.meta["cupti"]["callback_errors"] = self.callback_errors
            trace = self.converter.convert(rows, sites, ignored=ignored, final=final)
            if any(trace.row_counts().values()):
                self._write(trace)

    def pause(self) -> None:
        """Stop recording (the window closed): the activity kinds are disabled."""
        if self.paused or self.disabled:
            return
        self.paused = True
        for kind in self.enabled:
            self._call(self.api.activity_disable, kind)

    def resume(self) -> None:
        """Record again (the window opened)."""
        if not self.paused or self.disabled:
            return
        for kind in self.enabled:
            self._call(self.api.activity_enable, kind)
        self.paused = False

    def after_fork(self, out_dir: Path) -> None:
        """In a forked child: CUDA does not survive fork, so the child is not traced; what
        the parent had buffered stays the parent's."""
        self.out_dir = Path(out_dir)
        self.pid = os.getpid()
        self.disabled = True
        self._lock, self._flushing = threading.Lock(), threading.Lock()  # maybe held at fork
        self._rows, self._sites, self._pending = {}, [], {}

    # -- CUPTI callbacks (CUPTI's threads or the flushing one; never raise into CUPTI) -----

    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0  # (bytes, max records: 0 = as many as fit)

    def _buffer_completed(self, activities: Any) -> None:
        if os.getpid() != self.pid:
            return
        rows: dict[int, list[tuple[Any, ...]]] = {}
        try:
            ignored = snapshot(activities, rows)
        except Exception:  # a record we could not read: count it, keep the rest flowing
            self.callback_errors += 1
            return
        with self._lock:
            for kind, batch in rows.items():
                self._rows.setdefault(kind, []).extend(batch)
            self._ignored += ignored

    def _on_api_call(self, _userdata: Any, _domain: Any, _cbid: Any, cbdata: Any) -> None:
        """Enter: note the time and the user frames; exit: keep the call site."""
        try:
            correlation = int(cbdata.correlation_id)
            if cbdata.callback_site == self._enter:
                if not self.paused and os.getpid() == self.pid:
                    self._pending[correlation] = (time.time_ns(), user_frames(sys._getframe(1)))
                return
            begun = self._pending.pop(correlation, None)
            if begun is not None:
                site = CallSite(self._tid(), correlation, begun[0], time.time_ns(), begun[1])
                with self._lock:
                    self._sites.append(site)
        except Exception:
            self.callback_errors += 1

    # -- helpers --------------------------------------------------------------------------

    def _enable(self) -> None:
        for name in self.kind_names:
            kind = getattr(self.api.ActivityKind, name, None)
            if kind is None:
                self._note(f"this cupti-python has no activity kind {name}")
                continue
            try:
                self.api.activity_enable(kind)
            except Exception as exc:  # e.g. a kind this device or driver does not support
                self._note(f"activity kind {name} not enabled: {exc}")
                continue
            self.enabled.append(kind)

    def _use_system_thread_ids(self) -> None:
        """CUPTI's default thread id is pthread_self() cut to 32 bits; SYSTEM is gettid."""
        try:
            self.api.set_thread_id_type(self.api.ActivityThreadIdType.SYSTEM)
        except Exception as exc:
            self._note(f"thread ids stay CUPTI's default ({exc})")
            self._tid = lambda: threading.get_ident() & 0xFFFFFFFF

    def _nvtx_injection(self) -> str | None:
        """Point NVTX at libcupti (what routes NVTX ranges to MARKER records)."""
        if os.environ.get(NVTX_INJECTION):
            return os.environ[NVTX_INJECTION]
        path = loaded_library("libcupti.so")
        if path is None:
            self._note("libcupti not found among the loaded libraries: no NVTX ranges")
            return None
        os.environ[NVTX_INJECTION] = path
        return path

    def _subscribe_callsites(self) -> bool:
        """Hook the blocking runtime calls; False (and a note) where CUPTI will not."""
        api = self.api
        try:
            self._enter = api.ApiCallbackSite.API_ENTER
            self._subscriber = api.subscribe(self._on_api_call, None)
        except Exception as exc:  # e.g. another subscriber (CUDA <= 13.2 allows one)
            self._note(f"Python call sites of blocking calls not captured: {exc}")
            return False
        hooked = 0
        for cbid in blocking_cbids(api):
            try:
                api.enable_callback(1, self._subscriber, api.CallbackDomain.RUNTIME_API, cbid)
                hooked += 1
            except Exception as exc:  # a cbid this CUPTI does not know
                self._note(f"runtime callback {cbid} not enabled: {exc}")
        if not hooked:
            self._unsubscribe()
        return hooked > 0

    def _unsubscribe(self) -> None:
        if self._subscriber is not None:
            self._call(self.api.unsubscribe, self._subscriber)
            self._subscriber = None

    def _stop(self) -> None:
        """After the final delivery: no more records, no more callbacks."""
        if not self.paused:
            for kind in self.enabled:
                self._call(self.api.activity_disable, kind)
        self._unsubscribe()
        self.disabled = True

    def _api_name(self, layer: int, cbid: int) -> str | None:
        key = (layer, cbid)
        if key not in self._names:
            self._names[key] = api_name(self.api, layer, cbid)
        return self._names[key]

    def _write(self, trace: Any) -> None:
        """One chunk directory, renamed into place whole (readers never see half of it)."""
        self.chunks += 1
        while (self.out_dir / f"chunk-{self.chunks:06d}").exists():
            self.chunks += 1
        name = f"chunk-{self.chunks:06d}"
        tmp = self.out_dir / f".{name}.{self.pid}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        trace.save(tmp)
        os.replace(tmp, self.out_dir / name)

    def _call(self, function: Callable[..., Any], *args: Any) -> None:
        try:
            function(*args)
        except Exception as exc:
            self._note(f"{getattr(function, '__name__', function)} failed: {exc}")

    def _note(self, text: str) -> None:
        if len(self.notes) < 50:
            self.notes.append(text)


# -- module helpers ------------------------------------------------------------------------


def blocking_cbids(api: Any) -> list[int]:
    """Runtime-API callback ids of the blocking calls (every version and _ptsz variant)."""
    enum = getattr(api, "RuntimeApiTraceCbid", None) or getattr(api, "Runtime_api_trace_cbid",
                                                                None)
    members = getattr(enum, "__members__", {})
    return sorted({int(member) for name, member in members.items()
                   if BLOCKING_CALLS.match(base_api_name(name))})


def api_name(api: Any, layer: int, cbid: int) -> str | None:
    """A runtime or driver function's name: cupti's `get_callback_name`, else the cbid enum."""
    domain = api.CallbackDomain.DRIVER_API if layer == DRIVER else api.CallbackDomain.RUNTIME_API
    try:
        name = api.get_callback_name(domain, cbid)
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        names = ("DriverApiTraceCbid", "Driver_api_trace_cbid") if layer == DRIVER else (
            "RuntimeApiTraceCbid", "Runtime_api_trace_cbid")
        for enum in (getattr(api, enum_name, None) for enum_name in names):
            for member_name, member in getattr(enum, "__members__", {}).items():
                if int(member) == cbid:
                    return str(member_name)
    return None


_USER_CODE: dict[CodeType, bool] = {}


def user_frames(frame: FrameType | None,
                limit: int = CALLSITE_FRAMES) -> tuple[tuple[str, int, str, int], ...]:
    """(file, line, function, depth) of the innermost `limit` user frames from `frame` out;
    depth 0 is the thread's outermost frame. Library and gpudiag frames are skipped."""
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    out = []
    for position, stack_frame in enumerate(stack):
        code = stack_frame.f_code
        user = _USER_CODE.get(code)
        if user is None:
            user = _USER_CODE[code] = not code.co_filename.startswith(_GPUDIAG_DIR) and (
                is_user_frame(f"{code.co_filename}(0): {code.co_name}"))
        if user:
            out.append((code.co_filename, stack_frame.f_lineno or 0, code.co_name,
                        len(stack) - 1 - position))
            if len(out) == limit:
                break
    return tuple(out)


def loaded_library(stem: str) -> str | None:
    """Path of a shared library this process has mapped whose name starts with `stem`."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if path.startswith("/") and os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        pass
    return None


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"cupti-python": version("cupti-python")}
    except PackageNotFoundError:
        return {}


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.lstrip("-").isdigit() else None
