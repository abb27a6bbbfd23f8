"""The in-process plugin layer of the bootstrap: import triggers, the collection window, plugins.

Stdlib only, loaded by path next to `bootstrap.py` (importing the `gpudiag` package would cost
every Python process of the profiled command half a second of pandas). Three parts:

- `on_import(name, callback)`: run `callback(module)` right after the program first imports
  `name` (at once when it already has). The torch backend starts when the program imports
  torch, so a Python process that never touches a GPU framework never pays for one.
- `main_thread_call(fn)`: run `fn` on the program's main thread at its next bytecode, from
  any thread (the torch profiler must be stopped on the thread that started it).
- `Plugins`: start each named plugin (`gpudiag.profiler.<module>.create(out_dir, settings)`)
  when its trigger module is imported, and fan flush/pause/resume/after_fork out to them;
  the collection window (`collection_window.py`) drives their pause/resume edges.
  A failing plugin is reported once and dropped: the user's program never sees the error.

    watcher = ImportWatcher.install()
    watcher.on_import("torch", lambda torch: print("torch is here", torch.__version__))
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

#: plugin name -> (module, modules whose first import starts it; empty: at process start)
PLUGINS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("gpudiag.collectors.torch_plugin", ("torch",)),
    "torch_memory": ("gpudiag.collectors.torch_snapshot", ("torch",)),
    "jax": ("gpudiag.collectors.jax_plugin", ("jax",)),
    "cupti": ("gpudiag.collectors.cupti.plugin", ("torch", "jax", "cupy", "numba", "cuda")),
    "nccl": ("gpudiag.collectors.nccl.timing", ("torch", "cupy")),
}

Callback = Callable[[ModuleType], None]
_T = TypeVar("_T")
_PENDING_CALLBACK = None  # our one Py_AddPendingCall callback (ctypes), made on first use
_PENDING_ROUNDS = 64  # rounds of calls queued while the pending call runs, run in it (a
# function that queues itself each time must not hold the main thread forever)
_pending_lock = threading.RLock()  # re-entered only by a signal handler on the main thread
_pending_functions: list[Callable[[], None]] = []
_pending_state = {"busy": False}  # one of our pending calls is queued or running

#: launchers that only start the workers: profiling them adds a useless trace per run
LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher(argv: Sequence[str] | None = None) -> bool:
    """True in a torchrun / `python -m torch.distributed.run` launcher process.

    It imports torch but runs no model; the workers it starts get their own collectors.
    `sys.orig_argv` is read because `sys.argv` is still `['-m', ...]` while
    sitecustomize runs.
    """
    args = list(argv if argv is not None else getattr(sys, "orig_argv", sys.argv))[1:]
    while args:  # the interpreter's options, up to the script, -m or -c
        arg = args.pop(0)
        if arg == "-m":
            return bool(args) and args[0] in LAUNCHER_MODULES
        if arg in ("-X", "-W"):  # options that take a value
            args = args[1:]
        elif not arg.startswith("-") or arg == "-c":
            return Path(arg).name in LAUNCHER_SCRIPTS
    return False


def shielded(function: Callable[..., _T]) -> Callable[..., _T | None]:
    """`function`, run where gpudiag's code sits on the program's own call stack (a marker, the
    optimizer hook, an import callback, an atexit hook): a failure of gpudiag's (the run
    directory deleted, an address-space limit that refuses pandas, a module of the program's
    shadowing one gpudiag needs) goes to bootstrap-errors.log and returns None, never into
    the program, whose result must stay what it is without gpudiag.

    Only `Exception`: a KeyboardInterrupt or SystemExit raised by the program's own signal
    handler is the program's and goes on.
    """
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> _T | None:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            report_failure(function.__qualname__, exc)
            return None

    return wrapper


def report_failure(where: str, exc: BaseException) -> None:
    """One line for bootstrap-errors.log: what failed and, when the failure was raised in a
    file of neither Python's, a library's nor gpudiag's (a module of the program's that
    shadows one gpudiag imports), that file."""
    text = f"{where} failed: {exc.__class__.__name__}: {exc}"
    origin = _foreign_file(exc)
    if origin is not None:
        text += f" (raised in {origin})"
    boot = sys.modules.get("gpudiag.profiler.bootstrap")
    with contextlib.suppress(Exception):
        if boot is not None:
            boot.report_problem(text)


def _foreign_file(exc: BaseException) -> str | None:
    import traceback  # only when something failed: start-up imports stay few

    ours = (sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).parents[1]))
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    last = frames[-1].filename if frames else ""
    if not last or last.startswith(("<", *ours)) or "site-packages" in last:
        return None
    return last


class _NotifyingLoader:
    """Wraps a module's loader: after the module body ran, call the watcher's callbacks.

    Everything else is delegated, so `spec.loader` still answers `get_resource_reader`,
    `is_package` and the rest for the frameworks that ask.
    """

    def __init__(self, loader: Any, watcher: ImportWatcher, name: str) -> None:
        self._loader = loader
        self._watcher = watcher
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._watcher.fire(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._loader, attr)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """A meta-path finder that only notices imports of watched names; it never loads anything."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._lock = threading.Lock()
        self._finding = threading.local()

    @classmethod
    def install(cls) -> ImportWatcher:
        """The process's watcher, first on sys.meta_path (installed once)."""
        for finder in sys.meta_path:
            if isinstance(finder, ImportWatcher):
                return finder
        watcher = cls()
        sys.meta_path.insert(0, watcher)
        return watcher

    def on_import(self, name: str, callback: Callback) -> None:
        """Call `callback(module)` once `name` is imported; at once if it already is."""
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None:
            callback(module)
            return
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)

    def fire(self, name: str, module: ModuleType) -> None:
        with self._lock:
            callbacks = self._callbacks.pop(name, [])
        for callback in callbacks:
            callback(module)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._callbacks or getattr(self._finding, "busy", False):
            return None
        self._finding.busy = True  # the other finders below may import; do not recurse
        try:
            spec = self._find_elsewhere(fullname, path, target)
        finally:
            self._finding.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self, fullname)  # type: ignore[assignment]
        return spec

    def _find_elsewhere(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


class Plugins:
    """The started plugins of one process and their output directories.

    `report(exc)` receives every plugin failure (the bootstrap appends it to the run's
    bootstrap-errors.log); a plugin that failed to start is not called again. `imports()`
    surrounds a plugin's import and start (the bootstrap's keeps them out of the program's
    folder).
    """

    def __init__(
        self, names: Sequence[str], settings: dict[str, Any], report: Callable[[str], None],
        imports: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.names = [name for name in names if name in PLUGINS]
        self.imports = imports  # where plugins are imported from (isolation.private_imports)
        self.settings = settings
        self.report = report
        self.started: dict[str, Any] = {}
        self.failed: dict[str, str] = {}
        self.window_on = False
        self.closed = False  # after the final flush: a late trigger starts nothing
        self._lock = threading.RLock()

    def arm(self, watcher: ImportWatcher, proc_dir: Callable[[], Path]) -> None:
        """Start each plugin on the first import of one of its trigger modules."""
        for name in self.names:
            module, triggers = PLUGINS[name]
            fired = threading.Event()

            def trigger(_mod: ModuleType, name: str = name, module: str = module,
                        fired: threading.Event = fired) -> None:
                if not fired.is_set():
                    fired.set()
                    self.start(name, module, proc_dir())

            if not triggers:
                self.start(name, module, proc_dir())
            for trigger_module in triggers:
                watcher.on_import(trigger_module, trigger)

    def start(self, name: str, module: str, proc_dir: Path) -> None:
        with self._lock:
            if self.closed or name in self.started:
                return
            try:
                out_dir = proc_dir / name
                out_dir.mkdir(parents=True, exist_ok=True)
                with self.imports():
                    plugin = importlib.import_module(module).create(out_dir, self.settings)
                    plugin.start()
                if self.window_on:  # both are no-ops when already in that state
                    plugin.resume()
                else:
                    plugin.pause()
            except Exception as exc:  # the program runs on without this collector
                self.failed[name] = f"{exc.__class__.__name__}: {exc}"
                self.report(f"collector {name} not started: {self.failed[name]}")
                return
            self.started[name] = plugin

    def call(self, method: str, *args: Any, optional: bool = False) -> None:
        """Call `method` on every started plugin; a failure is reported, never raised.

        `optional`: only on plugins that define it (hooks such as `on_step`).
        """
        with self._lock:
            plugins = list(self.started.items())
        for name, plugin in plugins:
            function = getattr(plugin, method, None) if optional else None
            if optional and function is None:
                continue
            try:
                (function or getattr(plugin, method))(*args)
            except Exception as exc:
                self.report(f"collector {name} {method} failed: {exc.__class__.__name__}: {exc}")

    def postpone(self, function: Callable[[], None]) -> bool:
        """Whether a started plugin was interrupted on this thread in the middle of writing
        (a signal handler's final flush) and will call `function` once it is done."""
        with self._lock:
            plugins = list(self.started.values())
        return any(getattr(plugin, "when_written", None) is not None
                   and plugin.when_written(function) for plugin in plugins)

    def defines(self, method: str) -> bool:
        """Whether a started plugin has `method` (an optional hook such as `check`)."""
        with self._lock:
            plugins = list(self.started.values())
        return any(getattr(plugin, method, None) is not None for plugin in plugins)

    def close(self) -> None:
        """The final flush is done: plugins not started by now never start."""
        with self._lock:
            self.closed = True

    def edge(self, edge: str) -> None:
        """The collection window crossed an edge: "resume", "pause" or "restart" (plugins
        that can drop what they recorded so far do so, then everyone resumes)."""
        with self._lock:
            self.window_on = edge != "pause"
        if edge == "restart":
            self.call("discard", optional=True)
        self.call("pause" if edge == "pause" else "resume")

    def after_fork(self, proc_dir: Path) -> None:
        """In a forked child: each plugin moves to the child's directory (or disables itself).

        The lock is made anew first: another thread of the parent (the flush thread) may have
        held it at the fork, and the child's copy would then stay locked forever.
        """
        self._lock = threading.RLock()
        for name in list(self.started):
            (proc_dir / name).mkdir(parents=True, exist_ok=True)
        with self._lock:
            plugins = list(self.started.items())
        for name, plugin in plugins:
            try:
                plugin.after_fork(proc_dir / name)
            except Exception as exc:
                self.report(f"collector {name} after_fork failed: {exc}")


def main_thread_call(function: Callable[[], None]) -> bool:
    """Have the main thread run `function` at its next bytecode (Py_AddPendingCall).

    Used for the edges a timer or the flush thread crosses while the program's main thread
    owns the torch profiler: no signal is sent and no system call of the program is
    interrupted; a main thread inside a long C call runs it when the call returns. False when
    it could not be queued (no ctypes, a full queue): the caller falls back to waiting.

    At most one of our pending calls is ever queued or running: calls asked for meanwhile
    (from any thread, or from inside a running one) join its queue and run in that same
    call. CPython 3.11 spins forever when a pending call is added while one runs and the
    running one enters a Python function with a profile hook set (torch.profiler's
    with_stack sets one): the eval breaker stays set, and the function's first instruction
    keeps handling it. Seen as `gpudiag profile --delay` hanging at the window's start.
    """
    global _PENDING_CALLBACK  # noqa: PLW0603 -- built once, on first use
    with _pending_lock:
        _pending_functions.append(function)
        if _pending_state["busy"]:
            return True  # the queued or running call runs it
        _pending_state["busy"] = True
    # Queued outside the lock: the call may run at the next bytecode of this thread.
    try:
        import ctypes

        if _PENDING_CALLBACK is None:
            kind = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
            ctypes.pythonapi.Py_AddPendingCall.argtypes = [kind, ctypes.c_void_p]
            ctypes.pythonapi.Py_AddPendingCall.restype = ctypes.c_int
            _PENDING_CALLBACK = kind(_run_pending)  # lives as long as the process
        queued = ctypes.pythonapi.Py_AddPendingCall(_PENDING_CALLBACK, None) == 0
    except (ImportError, AttributeError, OSError):
        queued = False
    if not queued:  # the others queued meanwhile wait for the next call that is
        with _pending_lock:
            with contextlib.suppress(ValueError):
                _pending_functions.remove(function)
            _pending_state["busy"] = False
    return queued


def _run_pending(_arg: Any) -> int:
    """The pending call: run what is queued, including what is queued while it runs (a
    bounded number of rounds; what is left then waits for the next `main_thread_call`)."""
    for _ in range(_PENDING_ROUNDS):
        with _pending_lock:
            if not _pending_functions:
                break
            functions = list(_pending_functions)
            _pending_functions.clear()
        for function in functions:
            try:
                function()
            except Exception as exc:  # never into the program's frame; said in the log
                report_failure(getattr(function, "__qualname__", "a main-thread call"), exc)
    with _pending_lock:
        _pending_state["busy"] = False
    return 0


def _reset_pending_after_fork() -> None:
    """A forked child has none of the parent's pending calls: start idle and empty."""
    global _pending_lock  # noqa: PLW0603 -- a lock held at the fork stays held in the child
    _pending_lock = threading.RLock()  # re-entered only by a signal handler on the main thread
    _pending_functions.clear()
    _pending_state["busy"] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pending_after_fork)
