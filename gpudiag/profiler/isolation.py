"""Keep the program's own modules its own, and gpudiag's imports out of the program's folder.

Loaded by path beside `bootstrap.py` (stdlib only). Python puts the program's folder (the
script's directory; the working directory for `-c`, `-m` and the REPL) first on `sys.path`
after `sitecustomize` ran. A program may keep a `json.py`, `signal.py` or `zoneinfo.py` there,
which its own imports find before the standard library's. Two things broke that:

- The bootstrap imports some standard modules at start-up (json, socket, threading...),
  before the folder is on the path. Cached in `sys.modules`, they were what the program got:
  its own `json.py` was never imported. `release_shadowed` drops from `sys.modules` what the
  bootstrap imported and the folder shadows (the bootstrap keeps its references), so the
  program imports its own, as it would without gpudiag.
- gpudiag imports pandas, pyarrow and its plugins later, inside the program's process, once
  the folder is on the path: pandas then ran the program's `zoneinfo.py`, and its error came
  out of `gpudiag.step()`. `private_imports()` makes gpudiag's own imports (on the calling
  thread only) skip the program's folder, then releases what the folder shadows as above.

    with private_imports():
        import pandas        # never the program's pandas.py, zoneinfo.py, ...
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType

#: never dropped from sys.modules: gpudiag's own modules are the bootstrap's instances
KEEP = frozenset({"gpudiag"})
_state: dict[str, str | None] = {}  # "dir": the program's folder, once known


def remember_program_dir() -> str | None:
    """The folder Python puts first on `sys.path` for this program (called while
    sitecustomize runs, before Python adds it); None under `-P` / `-I`."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        _state["dir"] = None
        return None
    first = sys.argv[0] if sys.argv else ""
    if first in ("", "-", "-c", "-m"):
        folder = os.getcwd()
    else:
        path = os.path.realpath(first)
        folder = path if os.path.isdir(path) else os.path.dirname(path)
    _state["dir"] = folder
    return folder


def program_dir() -> str | None:
    """The program's folder: as remembered at start-up, else `sys.path[0]` (capture())."""
    if "dir" not in _state:
        first = sys.path[0] if sys.path else None
        _state["dir"] = None if first is None else os.path.realpath(first or os.getcwd())
    return _state["dir"]


def shadows(name: str, folder: str) -> bool:
    """Whether `folder` holds a module or regular package `name` (not a namespace part)."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, [folder])
    except (ImportError, ValueError, OSError):
        return False
    return spec is not None and spec.loader is not None


def release_shadowed(before: set[str]) -> list[str]:
    """Drop from `sys.modules` the modules imported since `before` whose top-level name
    the program's folder shadows; their top-level names."""
    folder = program_dir()
    if folder is None:
        return []
    added = {name.partition(".")[0] for name in set(sys.modules) - before} - KEEP
    gone = {top for top in added if shadows(top, folder) and not _inside(top, folder)}
    for name in [name for name in sys.modules if name.partition(".")[0] in gone]:
        del sys.modules[name]
    return sorted(gone)


def _inside(name: str, folder: str) -> bool:
    """The module imported as `name` is the program's own (another thread imported it)."""
    origin = getattr(sys.modules.get(name), "__file__", None) or ""
    return bool(origin) and os.path.realpath(origin).startswith(folder + os.sep)


class _Finder(importlib.abc.MetaPathFinder):
    """While the calling thread is in `private_imports()`, a top-level module that the
    program's folder shadows is looked up everywhere else on `sys.path` first (one found
    nowhere else is the folder's after all, as without gpudiag: gpudiag itself, when the
    program runs from its checkout)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        folder = program_dir()
        if path is not None or not getattr(self.local, "on", False) or folder is None:
            return None
        if fullname in sys.builtin_module_names or fullname in KEEP \
                or not shadows(fullname, folder):
            return None  # builtins come first anyway; nothing of the program's to skip
        rest = [entry for entry in sys.path
                if os.path.realpath(entry or os.getcwd()) != folder]
        return importlib.machinery.PathFinder.find_spec(fullname, rest)  # None: only there


_finder = _Finder()


@contextlib.contextmanager
def private_imports() -> Iterator[None]:
    """gpudiag's imports in this block, on this thread, skip the program's folder; what
    they imported that the folder shadows is dropped from `sys.modules` afterwards."""
    if getattr(_finder.local, "on", False) or program_dir() is None:
        yield
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    before = set(sys.modules)
    _finder.local.on = True
    try:
        yield
    finally:
        _finder.local.on = False
        release_shadowed(before)
