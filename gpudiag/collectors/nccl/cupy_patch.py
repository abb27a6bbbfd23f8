"""How `nccl_cupy` puts its wrappers in place: on CuPy's class, else through a subclass.

Separate from the timing (`nccl_cupy`) because it is all about CPython's rules for
extension types: `NcclCommunicator` is a Cython class whose attributes cannot be set, so a
same-named subclass with the wrapped methods replaces it in the modules that export it;
unpatching restores every name exactly as it was.

    patcher = Patcher(timing); patcher.patch(cupy.cuda.nccl); ...; patcher.unpatch()
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.collectors.nccl.rows import MARK, W_REPATCHED, Call, call_arg

if TYPE_CHECKING:
    from gpudiag.collectors.nccl.cupy_comm import CupyTiming

#: method -> (op, its parameters after self as CuPy names them, S = count x ranks x size)
METHODS: dict[str, tuple[str, str, bool]] = {
    "allReduce": ("all_reduce", "sendbuf recvbuf count datatype op stream", False),
    "reduce": ("reduce", "sendbuf recvbuf count datatype op root stream", False),
    "broadcast": ("broadcast", "sendbuff recvbuff count datatype root stream", False),
    "bcast": ("broadcast", "buff count datatype root stream", False),
    "reduceScatter": ("reduce_scatter", "sendbuf recvbuf recvcount datatype op stream", True),
    "allGather": ("all_gather", "sendbuf recvbuf count datatype stream", True),
    "send": ("send", "sendbuf count datatype peer stream", False),
    "recv": ("recv", "recvbuf count datatype peer stream", False),
}
#: CuPy's constant -> (its value in nccl.h's ncclDataType_t, dtype as torch names it, bytes)
DATATYPES: dict[str, tuple[int, str, int]] = {
    "NCCL_INT8": (0, "int8", 1), "NCCL_UINT8": (1, "uint8", 1), "NCCL_INT32": (2, "int32", 4),
    "NCCL_UINT32": (3, "uint32", 4), "NCCL_INT64": (4, "int64", 8),
    "NCCL_UINT64": (5, "uint64", 8), "NCCL_FLOAT16": (6, "float16", 2),
    "NCCL_FLOAT32": (7, "float32", 4), "NCCL_FLOAT64": (8, "float64", 8),
    "NCCL_BFLOAT16": (9, "bfloat16", 2), "NCCL_FLOAT8E4M3": (10, "float8_e4m3fn", 1),
    "NCCL_FLOAT8E5M2": (11, "float8_e5m2", 1),
}
#: the modules that may hold NcclCommunicator, groupStart and groupEnd
MODULES = ("cupy.cuda.nccl", "cupy_backends.cuda.libs.nccl")
W_INIT_ALL = "cupy nccl: communicators from initAll (not timed: this CuPy has no _initAll)"
MISSING = object()


@dataclass(frozen=True)
class Method:
    """Where a wrapped method keeps its count, datatype and stream ((index, name) each)."""

    call: Call
    count: tuple[int, str]
    datatype: tuple[int, str]
    stream: tuple[int, str]
    per_rank: bool

    @classmethod
    def of(cls, name: str) -> Method:
        operation, names, per_rank = METHODS[name]
        params = names.split()
        count = "recvcount" if "recvcount" in params else "count"
        return cls(Call(name, operation, "cupy", None, None), (params.index(count), count),
                   (params.index("datatype"), "datatype"), (params.index("stream"), "stream"),
                   per_rank)


class Patcher:
    """Puts the wrappers in place (on the class, else through a subclass) and takes them out."""

    def __init__(self, timing: CupyTiming) -> None:
        self.timing = timing
        self.patched: list[tuple[Any, str, Any, Any]] = []  # target, name, old (raw), new

    def patch(self, nccl: Any) -> None:
        cls = nccl.NcclCommunicator
        if getattr(cls, MARK, False) or getattr(getattr(cls, "allReduce", None), MARK, False):
            return  # installed already
        found = [nccl, *(candidate for candidate in map(sys.modules.get, MODULES)
                         if candidate is not None)]
        modules = list({id(candidate): candidate for candidate in found}.values())
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
                if callable(original) and not getattr(original, MARK, False):
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
            elif old is MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)
        del self.patched[since:]

    def _set(self, target: Any, name: str, new: Any) -> None:
        old = vars(target).get(name, MISSING)
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
            name: _wrap_method(timing, Method.of(name), getattr(cls, name))
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
                     "__doc__": base.__doc__, MARK: True,
                     **self._wrappers(base, init_all if original is not None else None)}
        timed: Any = type(base)(base.__name__, (base,), namespace)  # type(base): `type` for Cython
        return timed


def _wrap_method(timing: CupyTiming, method: Method,
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

    setattr(wrapper, MARK, True)
    return wrapper


def _wrap_init(timing: CupyTiming, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(comm: Any, *args: Any, **kwargs: Any) -> None:
        original(comm, *args, **kwargs)
        timing.named(comm, call_arg(args, kwargs, (1, "commId")))

    return __init__


def _wrap_init_all(timing: CupyTiming, original: Callable[..., Any]) -> Callable[..., Any]:
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

    setattr(wrapper, MARK, True)
    return wrapper
