"""The errors gpudiag raises, and what each one asks of the user.

Every message names the file (or thing) involved, the problem and the fix, so the CLI can
print it as one line and exit with status 2 without a traceback. Internal bugs stay ordinary
exceptions: they are ours to fix, not the user's.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

_RESOURCE: ModuleType | None
try:  # now, not when a limit is hit: under `ulimit -v` the module itself cannot be mapped
    import resource as _RESOURCE
except ImportError:  # Windows has no rlimits
    _RESOURCE = None


class GpudiagError(Exception):
    """Base of every error that is the input's or the environment's fault, not a bug."""

    exit_code = 2


class InputError(GpudiagError):
    """A file or directory that gpudiag cannot read, with what to do about it."""

    def __init__(self, path: str | Path | None, problem: str, fix: str = "") -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        self.fix = fix
        where = f"{self.path}: " if self.path else ""
        tail = f" ({fix})" if fix else ""
        super().__init__(f"{where}{problem}{tail}")

    def __reduce__(self) -> tuple[type[InputError], tuple[str | None, str, str]]:
        # raised in a pool or Dask worker, it is pickled back to the coordinator: rebuilt
        # from its parts (the default would call __init__ with the message alone)
        return type(self), (self.path, self.problem, self.fix)


class MissingDependencyError(GpudiagError):
    """An optional package is needed for this input or feature and is not installed."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module = module
        self.extra = extra
        self.purpose = purpose
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed "
            f"(pip install 'gpudiag[{extra}]')"
        )

    def __reduce__(self) -> tuple[type[MissingDependencyError], tuple[str, str, str]]:
        return type(self), (self.module, self.extra, self.purpose)


class CollectorError(GpudiagError):
    """Live collection or an external tool (nsys, ncu) failed in a way the user can fix."""


class SchemaError(Exception):
    """A table does not match the declared schema: a bug in a reader, never the user's input."""


class ResourceError(GpudiagError):
    """A limit of the machine or of the process (memory, the address space, open files)
    stopped gpudiag: which limit, and how to raise it."""


def exhausted(exc: BaseException) -> ResourceError | None:
    """`exc` as the limit it ran into (a MemoryError, a shared library that could not be
    mapped, too many open files), or None when it is something else.

    Under `ulimit -v` pandas and pyarrow fail to import ("failed to map segment from shared
    object") or allocate (MemoryError); under `ulimit -n` opening a file fails with EMFILE.
    Neither is a bug of gpudiag's: the message names the limit and how to raise it.
    """
    import errno

    text = str(exc)
    if isinstance(exc, MemoryError) or "failed to map segment" in text or (
            isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return ResourceError(f"out of memory{_limit('RLIMIT_AS', 'ulimit -v', 1024, ' KB')}: "
                             "raise the limit or free memory")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceError(f"too many open files{_limit('RLIMIT_NOFILE', 'ulimit -n', 1)}:"
                             " raise the limit (ulimit -n 4096)")
    return None


def _limit(name: str, shell: str, unit: int, suffix: str = "") -> str:
    """` (the limit, `ulimit -v`, is 614400 KB)` when the process has a finite one."""
    if _RESOURCE is None:
        return ""
    try:
        soft, _hard = _RESOURCE.getrlimit(getattr(_RESOURCE, name))
    except (AttributeError, ValueError, OSError):
        return ""
    if soft == _RESOURCE.RLIM_INFINITY:
        return ""
    return f" (the limit, `{shell}`, is {soft // unit}{suffix})"
