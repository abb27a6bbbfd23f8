"""What a profiled process's meta says about the process itself, besides what it recorded:
the uncaught exception that ended it, and its role when it only serves a training process.

The session knows the command's exit status; what it cannot know is which of the program's
processes died and of what. Each process keeps the uncaught exception that ends it (Python
calls `sys.excepthook` with it just before the process exits, after which the bootstrap's
final flush writes it into the process's meta). A process that never wrote its final meta
(`end_ns` missing) ended without exiting Python: killed, crashed, or through `os._exit`.

A DataLoader worker's whole life used to read as one step of "Python between ops, 99.8%",
ahead of the trainer waiting on that very loader: `role()` names it, and the analyses leave
helpers (`trace_meta.HELPER_ROLES`) out of the training loop's numbers.

    process_facts.watch(collector.died_of)   # stdlib only, loaded by path
    process_facts.role()                     # 'dataloader worker', 'compile worker' or None
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import TracebackType

#: an exception's text is kept up to this many characters (a CUDA error's is a paragraph)
MAX_TEXT = 500


def watch(record: Callable[[str], None]) -> None:
    """Call `record("RuntimeError: ...")` with the uncaught exception that ends the main
    thread, then the program's (or Python's) own hook, whose output is unchanged."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException,
                   traceback: TracebackType | None) -> None:
        with contextlib.suppress(Exception):  # the program's own report is printed anyway
            record(describe(value))
        previous(kind, value, traceback)

    sys.excepthook = excepthook


def describe(error: BaseException) -> str:
    """'RuntimeError: the message' on one line, at most MAX_TEXT characters."""
    text = " ".join(str(error).split())
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= MAX_TEXT else line[:MAX_TEXT - 1] + "…"


#: the script torch.compile's Inductor starts its compile worker pool with (a subprocess of
#: `python .../compile_worker/__main__.py`, whose own workers are forked from it)
COMPILE_WORKER = "torch/_inductor/compile_worker/__main__.py"


def role() -> str | None:
    """This process's role, from what the program runs in it (stdlib only, never imports):
    a DataLoader worker, or one of torch.compile's compile workers (their Python, compiling
    kernels beside the training loop, read as its "Python between ops")."""
    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is not None and getattr(worker, "_worker_info", None) is not None:
        return "dataloader worker"
    script = (sys.argv[0] if sys.argv else "").replace("\\", "/")
    if script.endswith(COMPILE_WORKER):
        return "compile worker"
    return None
