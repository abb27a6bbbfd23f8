"""The errors gpudiag raises, and what each one asks of the user.

Every message names the file (or thing) involved, the problem and the fix, so the CLI can
print it as one line and exit with status 2 without a traceback. Internal bugs stay ordinary
exceptions: they are ours to fix, not the user's.
"""

from __future__ import annotations

from pathlib import Path


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
