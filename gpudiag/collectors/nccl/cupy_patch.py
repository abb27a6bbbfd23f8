"""How `nccl_cupy` puts its wrappers in place: on CuPy's class, else through a subclass.

Separate from the timing (`nccl_cupy`) because it is all about CPython's rules for
extension types: `NcclCommunicator` is a Cython class whose attributes cannot be set, so a
same-named subclass with the wrapped methods replaces it in the modules that export it;
unpatching restores every name exactly as it was.

    patcher = _Patcher(timing); patcher.patch(cupy.cuda.nccl); ...; patcher.unpatch()
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from gpudiag.collectors.nccl.cupy_comm import (
    _MISSING,
    METHODS,
    MODULES,
    W_INIT_ALL,
    _CupyTiming,
    _Method,
)
from gpudiag.collectors.nccl.rows import _arg
from gpudiag.collectors.nccl.timing import _MARK, W_REPATCHED


class _Patcher:
    """Puts the wrappers in place (on the class, else through a subclass) and takes them out."""

    def __init__(self, timing: _CupyTiming) -> None:
        self.timing = timing
        self.patched: list[tuple[Any, str, Any, Any]] = []  # target, name, old (raw), new

    def patch(self, nccl: Any) -> None:
        cls = nccl.NcclCommunicator
        if getattr(cls, _MARK, False) or getattr(getattr(cls, "allReduce", None), _MARK, False):
            return  # installed already
        found = [nccl, *(m for m in map(sys.modules.get, MODULES) if m is not None)]
        modules = list({id(m): m for m in found}.values())
        if not self._on_class(cls):
            timed = self._subclass(cls)
            for module in modules:
                if vars(module).get("NcclCommunicator") is cls:
                    self._set(module, "NcclCommunicator", timed)
        wrappers: dict[int, Any] = {}  # one per original, shared by the modules
        hooks = {"groupStart": self.timing.group_start, "groupEnd": self.timing.group_end}
        for module in modules:
            for name, hook in hooks.items():
                original = vars(module).get(name)
                if callable(original) and not getattr(original, _MARK, False):
                    wrappers.setdefault(id(original), _wrap_group(hook, original))
                    self._set(module, name, wrappers[id(original)])

    def unpatch(self) -> None:
        """Put the originals back (communicators of the subclass keep it, calling through)."""
        self._undo(0)
        self.timing.enabled = False

    def _undo(self, since: int) -> None:
        for target, name, old, new in reversed(self.patched[since:]):
            if vars(target).get(name) is not new:
                self.timing.shared.warn(W_REPATCHED)
            elif old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)
        del self.patched[since:]

    def _set(self, target: Any, name: str, new: Any) -> None:
        old = vars(target).get(name, _MISSING)
        setattr(target, name, new)
        self.patched.append((target, name, old, new))

    def _on_class(self, cls: type) -> bool:
        """Wrap on the class itself; False, and nothing changed, when the class refuses."""
        count = len(self.patched)
        try:
            for name, wrapper in self._wrappers(cls, getattr(cls, "initAll", None)).items():
                self._set(cls, name, wrapper)
        except TypeError:  # "cannot set 'allReduce' attribute of immutable type"
            self._undo(count)
            return False
        return True

    def _wrappers(self, cls: type, init_all: Callable[..., Any] | None) -> dict[str, Any]:
        """The wrapped collectives, and __init__ / initAll to name the communicators."""
        timing = self.timing
        wrappers: dict[str, Any] = {
            name: _wrap_method(timing, _Method.of(name), getattr(cls, name))
            for name in METHODS if callable(getattr(cls, name, None))}
        wrappers["__init__"] = _wrap_init(timing, getattr(cls, "__init__"))  # noqa: B009
        if init_all is not None:
            wrappers["initAll"] = staticmethod(_wrap_init_all(timing, init_all))
        return wrappers

    def _subclass(self, base: type) -> type:
        """NcclCommunicator's stand-in: same name, wrapped methods, and an initAll that makes
        its instances through CuPy's `_initAll`, as CuPy's own initAll does."""
        original, fill = getattr(base, "initAll", None), getattr(base, "_initAll", None)
        shared = self.timing.shared

        def init_all(devices: Any) -> Any:
            devlist = list(range(devices)) if isinstance(devices, int) else devices
            if fill is None or not isinstance(devlist, list):
                if fill is None:
                    shared.warn(W_INIT_ALL)
                return original(devices) if original is not None else None
            comms = [timed.__new__(timed) for _ in devlist]
            fill(comms, len(devlist), devlist)
            return comms

        if original is not None:
            functools.update_wrapper(init_all, original)
        namespace = {"__module__": base.__module__, "__qualname__": base.__qualname__,
                     "__doc__": base.__doc__, _MARK: True,
                     **self._wrappers(base, init_all if original is not None else None)}
        timed: Any = type(base)(base.__name__, (base,), namespace)  # type(base): `type` for Cython
        return timed


def _wrap_method(timing: _CupyTiming, method: _Method,
                 original: Callable[..., Any]) -> Callable[..., Any]:
    enter, leave, finish = timing.enter, timing.leave, timing.finish

    @functools.wraps(original)
    def wrapper(comm: Any, *args: Any, **kwargs: Any) -> Any:
        token = enter(method, comm, args, kwargs)
        if token is None:
            return original(comm, *args, **kwargs)
        try:
            result = original(comm, *args, **kwargs)
        finally:
            leave()
        finish(token)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _wrap_init(timing: _CupyTiming, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(comm: Any, *args: Any, **kwargs: Any) -> None:
        original(comm, *args, **kwargs)
        timing.named(comm, _arg(args, kwargs, (1, "commId")))

    return __init__


def _wrap_init_all(timing: _CupyTiming, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def initAll(devices: Any) -> Any:
        comms = original(devices)
        if isinstance(comms, list):
            timing.named_all(comms)
        return comms

    return initAll


def _wrap_group(hook: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    setattr(wrapper, _MARK, True)
    return wrapper
