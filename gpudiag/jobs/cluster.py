"""The Dask scheduler a job runs on: its address checked, reached within a deadline, and
watched while the job waits on it, so that every way a cluster fails is one line.

    address = address_of("tcp://head:8786")     # InputError for what is no address
    identity = reach(address)                   # InputError unless a scheduler answers
    watch = Watch(client, address)              # .check(): InputError once it cannot finish

Dask's client alone is not enough for that: it retries a refused connection until its
timeout, but waits forever for the handshake of a server that accepts and never answers,
reads a length from a server that answers something else and tries to allocate it (a
`MemoryError`, or an `error` of `struct`), raises a bare `ValueError` for an address
without a port, and waits forever on futures when the cluster has no workers left. So the
address is parsed first; one connection asks the scheduler who it is, on a thread of its
own (a notebook's thread runs an event loop) under a deadline over the whole exchange; and
while a job waits for its results, `Watch.check` asks again whenever nothing came back for
`PING_INTERVAL_S`. While a client of gpudiag's own is open, Dask's client loggers are quiet
(`quiet`): a lost scheduler is logged with two tracebacks that the job's one line replaces.
`distributed` is imported here only when a cluster is asked for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpudiag.errors import InputError
from gpudiag.optional import require

#: the environment variable Dask (and the Nsight recipes) read a scheduler address from
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
#: how long reaching a scheduler may take (refused connections retried meanwhile)
CONNECT_TIMEOUT_S = 20.0
#: a job waiting on its cluster asks the scheduler whether it still answers this often
PING_INTERVAL_S = 10.0
#: how long that question may take before the scheduler counts as stopped
PING_TIMEOUT_S = 20.0
#: how long a job waits for a worker while the cluster has none (at the start or later)
NO_WORKERS_S = 30.0
#: what to do when no scheduler answers
START_ONE = ("start one (`dask scheduler`, then `dask worker ADDRESS`) or check the "
             "address / scheduler file")
#: what to give instead of something that names no scheduler
HOW = "give tcp://HOST:PORT (what `dask scheduler` prints) or a scheduler file's path"


def distributed_module() -> ModuleType:
    """`distributed`, or a one-line error: not installed, or Dask's configuration cannot be
    read (dask parses its YAML files, `DASK_CONFIG` among them, on import)."""
    try:
        return require("distributed", "Running gpudiag on a Dask cluster")
    except ValueError as exc:  # dask.config: "A dask config file at '...' is malformed"
        first = str(exc).splitlines()[0].rstrip(", :")
        raise InputError(None, f"Dask's configuration cannot be read ({first})",
                         "fix or remove that file (DASK_CONFIG names where Dask looks)"
                         ) from exc


def address_of(scheduler: str, origin: str = "") -> str:
    """The address `scheduler` names: itself, or the one in a scheduler file (`dask
    scheduler --scheduler-file`). `origin` says where it came from (an environment
    variable), for the message. Nothing is connected to."""
    text = scheduler.strip()
    shown = f"{origin}={scheduler}" if origin else scheduler or "''"
    if not text:
        raise InputError(shown, "names no Dask scheduler (it is empty)", HOW)
    if "://" not in text and Path(text).is_file():
        return _checked(_in_file(Path(text)), text)
    return _checked(text, shown)


def _in_file(path: Path) -> str:
    """The address a scheduler file holds."""
    try:
        address = json.loads(path.read_text(encoding="utf-8")).get("address")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise InputError(path, f"is not a Dask scheduler file ({type(exc).__name__})",
                         HOW) from exc
    if not isinstance(address, str):
        raise InputError(path, "is not a Dask scheduler file (it has no \"address\")", HOW)
    return address


def _checked(address: str, shown: str) -> str:
    """`address` when Dask can connect to what it names (a known scheme; a host and a
    port from 1 to 65535 where the scheme has them)."""
    distributed = distributed_module()
    comm = distributed.comm
    try:
        scheme, location = comm.parse_address(address, strict=False)
        comm.registry.get_backend(scheme)
        if scheme != "inproc":
            _, port = comm.parse_host_port(location)
            if not 0 < int(port) < 65536:
                raise ValueError(f"port {port} is out of range")
    except (ValueError, TypeError) as exc:
        what = "a Dask scheduler address" + ("" if "://" in address else " or scheduler file")
        raise InputError(shown, f"is not {what} ({exc})", HOW) from exc
    return address


def reach(address: str, shown: str | None = None) -> dict[str, Any]:
    """The identity of the scheduler at `address` (its workers among it), asked over one
    connection within `CONNECT_TIMEOUT_S`; a one-line error for anything that is not a
    scheduler answering. `shown`: how the message names it (default: the address)."""
    distributed = distributed_module()
    box: dict[str, Any] = {}
    asker = threading.Thread(target=_ask, args=(distributed, address, box), daemon=True,
                             name="gpudiag-dask-reach")
    asker.start()
    asker.join(CONNECT_TIMEOUT_S + 5)  # the exchange has its own deadline: a margin
    shown = shown or address
    error = box.get("error")
    if asker.is_alive() or isinstance(error, TimeoutError):
        raise InputError(shown, f"answered nothing a Dask scheduler says within "
                         f"{CONNECT_TIMEOUT_S:g} s (another kind of server listens there, "
                         "or the scheduler is stuck)", START_ONE)
    if isinstance(error, OSError):  # refused until the deadline, reset, closed
        raise InputError(shown, f"no Dask scheduler answered ({error})", START_ONE) from error
    if error is not None:
        raise InputError(shown, "is not a Dask scheduler: what answers there speaks another "
                         f"protocol ({type(error).__name__}: {str(error)[:120]})",
                         HOW) from error
    identity = box.get("identity")
    kind = identity.get("type") if isinstance(identity, dict) else type(identity).__name__
    if kind != "Scheduler":
        raise InputError(shown, f"is not a Dask scheduler (it is a Dask {kind})", HOW)
    assert isinstance(identity, dict)
    return identity


def _ask(distributed: ModuleType, address: str, box: dict[str, Any]) -> None:
    """Ask `address` who it is (in `box["identity"]`, or what failed in `box["error"]`),
    on an event loop of this thread's own, the whole exchange under one deadline (Dask's
    connect bounds the connection, not the handshake after it)."""
    async def identity() -> Any:
        args = distributed.security.Security().get_connection_args("client")
        comm = await distributed.comm.connect(address, timeout=CONNECT_TIMEOUT_S, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        box["identity"] = asyncio.run(asyncio.wait_for(identity(), CONNECT_TIMEOUT_S + 1))
    except BaseException as exc:  # every failure, cancelled included: the caller words it
        box["error"] = exc


def client_of(address: str, shown: str) -> Any:
    """A client of the scheduler at `address`, once `reach` found it; a client that is
    not the process's default (a notebook's own Dask work keeps its client)."""
    distributed = distributed_module()
    reach(address, shown)
    try:
        return distributed.Client(address, timeout=f"{CONNECT_TIMEOUT_S}s",
                                  set_as_default=False)
    except Exception as exc:  # it answered a moment ago: gone, or refusing clients
        raise InputError(shown, f"did not accept a client ({type(exc).__name__}: {exc})",
                         START_ONE) from exc


def lost(shown: str, what: str) -> InputError:
    """The one line for a cluster that failed while a job ran on it: `what` happened."""
    return InputError(shown, f"{what}, so the job cannot finish",
                      "check the scheduler and its workers (their logs say why), then run "
                      "the job again")


#: the loggers of Dask's client side: while a client of gpudiag's own is open, the one line
#: a job ends with says what they would (a lost scheduler is logged with two tracebacks)
CLIENT_LOGGERS = ("distributed.client", "distributed.core", "distributed.comm",
                  "distributed.batched", "distributed.utils")


def quiet() -> dict[str, int]:
    """Silence `CLIENT_LOGGERS` (their levels before, for `restore`)."""
    levels = {name: logging.getLogger(name).level for name in CLIENT_LOGGERS}
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    return levels


def restore(levels: dict[str, int]) -> None:
    """The levels `quiet` found."""
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


class Watch:
    """Whether the cluster a job waits on can still finish it: `check` when no result came
    back for `PING_INTERVAL_S`."""

    def __init__(self, client: Any, shown: str) -> None:
        self.client = client
        self.shown = shown
        self.workerless_since: float | None = None

    def check(self) -> None:
        """A one-line error when the scheduler stopped answering, or has had no worker for
        `NO_WORKERS_S` (Dask would wait for one forever); nothing while it works."""
        scheduler = self.client.scheduler
        try:
            identity = self.client.sync(scheduler.identity, callback_timeout=PING_TIMEOUT_S)
        except Exception as exc:  # closed, refused, or no answer within the deadline
            why = str(exc) or f"no answer within {PING_TIMEOUT_S:g} s"
            raise lost(self.shown, f"the Dask scheduler stopped answering ({why})") from exc
        if identity.get("workers"):
            self.workerless_since = None
            return
        now = time.monotonic()
        if self.workerless_since is None:
            self.workerless_since = now
        if now - self.workerless_since >= NO_WORKERS_S:
            raise lost(self.shown, f"the Dask cluster has had no workers for {NO_WORKERS_S:g} s "
                                   "(they died or were stopped, and none joined)")


def workers_of(client: Any, shown: str) -> int:
    """How many workers the cluster has, once it has one: a cluster without any would
    leave the job's tasks waiting forever, so it gets `NO_WORKERS_S` to start one."""
    try:
        count = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        if not count:
            client.wait_for_workers(1, timeout=NO_WORKERS_S)
            count = len(client.scheduler_info(n_workers=-1).get("workers", {}))
    except TimeoutError as exc:
        raise InputError(shown, f"has no Dask workers (none joined within {NO_WORKERS_S:g} s)",
                         "start some: `dask worker ADDRESS`") from exc
    except Exception as exc:  # it answered a moment ago: gone since
        raise lost(shown, f"the Dask scheduler went away ({type(exc).__name__}: {exc})"
                   ) from exc
    return count or 1
