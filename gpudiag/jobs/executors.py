"""Where per-rank work runs: in this process, on a local process pool, or on a Dask cluster.

    with executor(workers=2) as pool:              # or scheduler="tcp://host:8786"
        for outcome in pool.map(read_rank, paths):
            print(outcome.item, outcome.error or outcome.value)

One interface, `Executor.map(function, items)`, so the many-rank analysis is written once and
runs anywhere; `function` must be importable by name (a module-level function: the pool and
Dask workers import it, nothing is pickled by value). It yields one `Outcome` per item as
items finish, each with its value or a one-line error, so one unreadable rank is reported
while the others are analyzed, and a worker that dies (killed, out of memory) ends its items
with an error instead of a hang.

- `InProcess`: the items one after another, here (1 worker, or nothing to parallelize).
- `LocalPool`: a `concurrent.futures` process pool, one worker per core by default. Workers
  are never forked from this process, which may hold threads (gzip inflaters, a Dask
  client, a notebook's) whose locks a forked child would inherit held: they are forked from
  a fork server, a process started for them that imports the analysis once (half a
  second with pandas) and runs no thread of ours or the caller's (only a thread pandas'
  libraries start, numpy's BLAS or Arrow's, which prepare for fork), so N workers start
  in milliseconds instead of each importing it again (`start`). Where there is no fork
  server (Windows) they are spawned.
- `DaskCluster`: a `distributed.Client` (given, or connected to `scheduler`: an address or a
  scheduler file, or `DASK_SCHEDULER_ADDRESS` when neither a scheduler nor a count of
  workers is given, as Nsight Systems' recipes do). Workers read the files themselves, so
  they must see the same paths (a shared file system). A cluster that cannot finish (an
  address that names no scheduler, a scheduler that dies or stops answering, no workers
  left) ends the job with one `InputError` naming the address, in bounded time
  (`cluster`); a worker that dies has its items retried by Dask. `dask[distributed]` is the
  `dask` extra, imported only in `cluster` and only when asked for.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from types import TracebackType
from typing import Any, Protocol

from gpudiag.errors import GpudiagError, InputError
from gpudiag.jobs import cluster
from gpudiag.jobs.cluster import SCHEDULER_ENV

#: the start method of a local pool's workers where the platform has it (Linux, macOS)
FORK_SERVER = "forkserver"
WORKER_DIED = ("a worker process died while running it (killed, or out of memory); the "
               "items after it on that worker were not run")


@dataclass(frozen=True)
class Outcome:
    """One item's result: `value`, or `error` (one line saying what went wrong) when the
    function raised or its worker died. `index` is the item's position in the input."""

    index: int
    item: Any
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Executor(Protocol):
    """What runs `function` over items and reports each as it finishes."""

    name: str
    workers: int

    def map(self, function: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        """One Outcome per item, in the order they finish. Workers of their own start the
        items when `map` is called, so the caller can work while they run; in this
        process they run as the outcomes are asked for."""
        ...

    def close(self) -> None:
        """Release the workers (a given Dask client is left open for its owner)."""
        ...

    def start(self, module: str) -> None:
        """Have `module` imported where the workers start, before the first `map` needs it."""
        ...


def failure(exc: BaseException) -> str:
    """One line for an item that raised: our own errors say what to do; anything else is
    a bug of ours, named by its type, and the other items still run."""
    if isinstance(exc, GpudiagError):
        return str(exc)
    return f"{type(exc).__name__}: {exc} (a gpudiag bug: please report it)"


class _Closing:
    """Context-manager protocol for the executors (`with executor(...) as pool:`)."""

    def close(self) -> None:
        """Nothing to release by default."""

    def start(self, module: str) -> None:
        """Nothing to start by default (this process, or a cluster's running workers)."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class InProcess(_Closing):
    """Every item here, one after another."""

    name = "in-process"
    workers = 1

    def map(self, function: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        for index, item in enumerate(items):
            try:
                yield Outcome(index, item, function(item))
            except Exception as exc:
                yield Outcome(index, item, error=failure(exc))


class LocalPool(_Closing):
    """A pool of `workers` processes on this machine (None: one per core), forked from a
    fork server (spawned where there is none)."""

    name = "local pool"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.method = FORK_SERVER if FORK_SERVER in get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                         mp_context=get_context(self.method))

    def start(self, module: str) -> None:
        """Have `module` imported where the workers start, while the caller imports too.

        With a fork server: start the server (if this process has none running yet)
        importing `module`, without waiting for it; the first `map` forks every worker from
        it, warm. Spawned workers: start them now, each importing `module`."""
        if self.method == FORK_SERVER:
            from multiprocessing import forkserver

            forkserver.set_forkserver_preload([module])  # a running server keeps its own
            forkserver.ensure_running()
            return
        with _main_script_hidden():  # a worker starts in submit
            for _ in range(self.workers):
                self._pool.submit(imported, module)

    def map(self, function: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        """Every item submitted now (the caller may work while they run), outcomes as they
        finish."""
        listed = list(items)
        with _main_script_hidden():  # the workers start in submit
            futures = {self._pool.submit(function, item): index
                       for index, item in enumerate(listed)}
        return self._outcomes(futures, listed)

    @staticmethod
    def _outcomes(futures: dict[Any, int], listed: list[Any]) -> Iterator[Outcome]:
        for future in as_completed(futures):
            index = futures[future]
            try:
                yield Outcome(index, listed[index], future.result())
            except BrokenProcessPool:
                yield Outcome(index, listed[index], error=WORKER_DIED)
            except Exception as exc:
                yield Outcome(index, listed[index], error=failure(exc))

    def close(self) -> None:
        """Tell the workers to stop and return: their interpreters' exit (~0.1 s with
        pandas loaded) overlaps the reduce's last steps and the caller's report instead of
        being waited for (the interpreter's own exit still joins them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def imported(module: str) -> None:
    """Import `module` (in a worker: what its tasks will need); nothing to send back."""
    importlib.import_module(module)


@contextmanager
def _main_script_hidden() -> Iterator[None]:
    """Spawned workers without the user's main script: spawn re-runs `__main__` in every
    worker (to find functions defined there), and a script calling `gpudiag.diagnose_job`
    without an `if __name__ == "__main__":` guard would start the job again in each worker
    and kill the pool. The workers run gpudiag's functions only, imported by name."""
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__")
             if main is not None and name in main.__dict__}
    if main is None or not saved:
        yield
        return
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        for name in ("__spec__", "__file__"):
            if name in saved:
                main.__dict__[name] = saved[name]
            else:
                main.__dict__.pop(name, None)


class DaskCluster(_Closing):
    """The workers of a Dask distributed cluster, through a `distributed.Client`; a
    cluster that cannot finish the job (its scheduler gone or stuck, no workers left) ends
    it with one line (`cluster.Watch`), never a hang."""

    name = "dask"

    def __init__(self, client: Any, shown: str | None = None) -> None:
        self.client = client
        self._owned = False
        self._levels: dict[str, int] = {}
        self.shown = shown or str(client.scheduler.address)  # how messages name it
        self.workers = cluster.workers_of(client, self.shown)

    @classmethod
    def connect(cls, spec: str, origin: str = "") -> DaskCluster:
        """A client of the scheduler `spec` names: an address (tcp://host:port) or the
        path of a scheduler file (`dask scheduler --scheduler-file`); `origin`: the
        environment variable it came from, for the messages."""
        address = cluster.address_of(spec, origin)
        shown = f"{origin}={spec}" if origin else spec.strip()
        levels = cluster.quiet()  # our client's failures are said in one line, not logged
        try:
            client = cluster.client_of(address, shown)
        except BaseException:
            cluster.restore(levels)
            raise
        try:
            made = cls(client, shown)
        except BaseException:
            client.close()
            cluster.restore(levels)
            raise
        made._owned, made._levels = True, levels
        return made

    def map(self, function: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Outcome]:
        """Every item submitted now, outcomes as they finish."""
        listed = list(items)
        if self.client.status != "running":  # the scheduler went away before this map
            raise cluster.lost(self.shown, "the Dask client lost its scheduler (client "
                                           f"{self.client.status})")
        futures = self.client.map(function, listed, pure=False)
        return self._outcomes(futures, listed)

    def _outcomes(self, futures: list[Any], listed: list[Any]) -> Iterator[Outcome]:
        """Each future's outcome as it finishes; while none does, the cluster is watched."""
        distributed = cluster.distributed_module()
        finished: queue.Queue[Any] = queue.Queue()
        for future in futures:
            future.add_done_callback(finished.put)  # called on Dask's thread
        positions = {future.key: index for index, future in enumerate(futures)}
        watch = cluster.Watch(self.client, self.shown)
        for _ in futures:
            future = _next(finished, watch)
            index = positions[future.key]
            try:
                yield Outcome(index, listed[index], future.result())
            except distributed.KilledWorker:
                yield Outcome(index, listed[index], error=WORKER_DIED)
            except CancelledError as exc:  # not by us: the client lost the scheduler
                reason = getattr(exc, "reason", None) or "cancelled"
                raise cluster.lost(self.shown, f"the Dask cluster cancelled the job's tasks "
                                               f"({reason})") from exc
            except Exception as exc:
                yield Outcome(index, listed[index], error=failure(exc))

    def close(self) -> None:
        """Close a client this cluster opened (a given one is its owner's), then let Dask's
        client loggers speak again."""
        if self._owned:
            self.client.close()
            cluster.restore(self._levels)


def _next(finished: queue.Queue[Any], watch: cluster.Watch) -> Any:
    """The next finished future; the cluster checked each time none came for a while."""
    while True:
        try:
            return finished.get(timeout=cluster.PING_INTERVAL_S)
        except queue.Empty:
            watch.check()


def executor(workers: int | None = None, scheduler: str | None = None,
             client: Any = None) -> InProcess | LocalPool | DaskCluster:
    """The executor a command line or notebook asked for.

        executor()                              # a local pool, one worker per core
        executor(workers=1)                     # in this process
        executor(scheduler="tcp://head:8786")   # a Dask cluster (or a scheduler file)

    `client` (a `distributed.Client`) wins, then `scheduler`; then `workers` local processes
    (1: in this process) when a count is given, else `DASK_SCHEDULER_ADDRESS` when it is
    set, else one local worker per core.
    """
    if client is not None:
        return DaskCluster(client)
    if scheduler is not None:  # given, even empty: an address or file, or one line why not
        return DaskCluster.connect(scheduler)
    if workers is None and os.environ.get(SCHEDULER_ENV):
        return DaskCluster.connect(os.environ[SCHEDULER_ENV], origin=SCHEDULER_ENV)
    if workers is not None and workers < 1:
        raise InputError(None, f"--workers {workers} is not a number of workers",
                         "give 1 or more (1: in this process)")
    if workers == 1:
        return InProcess()
    return LocalPool(workers)
