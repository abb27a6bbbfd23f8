"""Blocking host waits: every interval in which a host thread was blocked on the GPU.

Two sources describe the same waits and must not be counted twice:
- the `syncs` table (CUPTI SYNCHRONIZATION records, Kineto `cuda_sync` events), which knows
  what was waited on (device, stream, event, context) but not always the thread;
- the `api` table, whose synchronize calls and synchronous (non-Async) memcpy calls carry
  the thread and so the call site.
A `syncs` row and an API call with the same (pid, correlation) are one wait; API calls
without a `syncs` row are added. `stream_wait` records (cudaStreamWaitEvent) do not block
the host and are left out.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpudiag.analyzers import keys
from gpudiag.trace import Trace

#: host calls that block until the GPU has finished the work they wait for
SYNC_APIS = re.compile(
    r"^(?:cuda|hip)(?:DeviceSynchronize|StreamSynchronize|EventSynchronize|ThreadSynchronize)"
    r"|^cu(?:Ctx|Stream|Event)Synchronize")
#: synchronous copies: the host returns only when the copy is done (nsys cuda_memcpy_sync)
SYNC_COPY_APIS = re.compile(r"^(?:cuda|hip)Memcpy(?:2D|3D)?(?:Peer)?(?:ToSymbol|FromSymbol)?$"
                            r"|^cuMemcpy(?:DtoH|HtoD|DtoD|2D|3D|Peer)?(?:_v2)?$")

_API_KIND = {"DeviceSynchronize": "device", "ThreadSynchronize": "device",
             "StreamSynchronize": "stream", "EventSynchronize": "event",
             "CtxSynchronize": "context"}

WAIT_COLUMNS = ("rank", "pid", "tid", "device", "start_ns", "end_ns", "kind", "api",
                "correlation")


def blocking_waits(trace: Trace) -> pd.DataFrame:
    """One row per blocking wait: `rank, pid, tid, device, start_ns, end_ns, kind, api,
    correlation`, sorted by start. `kind` is device/stream/event/context, `copy` for a
    synchronous memcpy, `unknown` otherwise.

        waits = blocking_waits(trace)
        waits.groupby("kind")["end_ns"].count()
        (waits.end_ns - waits.start_ns).sum()   # host time blocked, ns

    Computed once per trace (the idle gaps and the sync analyzer both read it); do not
    modify the frame you get back.
    """
    return trace.derived("blocking_waits", lambda: _blocking_waits(trace))


def _blocking_waits(trace: Trace) -> pd.DataFrame:
    api = trace.api
    kind_of_name = {name: ("copy" if SYNC_COPY_APIS.search(name) else _kind_of_api(name))
                    for name in api["name"].cat.categories
                    if SYNC_APIS.search(name) or SYNC_COPY_APIS.search(name)}  # per name
    calls = api[api["name"].isin(list(kind_of_name))].copy()
    calls["kind"] = calls["name"].map(kind_of_name).astype("string")
    calls["api"] = calls["name"].astype("string")
    calls["device"] = pd.array([pd.NA] * len(calls), dtype="Int64")

    syncs = trace.syncs[trace.syncs["kind"] != "stream_wait"].copy()
    syncs["kind"] = syncs["kind"].astype("string")
    # a syncs row and the API call with its (rank, pid, correlation) are one wait
    pos = keys.join([syncs["rank"], syncs["pid"], syncs["correlation"]],
                    [calls["rank"], calls["pid"], calls["correlation"]])
    matched = (pos >= 0) & syncs["correlation"].notna().to_numpy(bool)
    syncs["api"] = pd.array([pd.NA] * len(syncs), dtype="string")
    if matched.any():  # the syncs row takes the thread and API name of its call
        src = calls.iloc[pos[matched]]
        syncs.loc[matched, "tid"] = syncs.loc[matched, "tid"].fillna(
            pd.Series(src["tid"].to_numpy(), index=syncs.index[matched]))
        syncs.loc[matched, "api"] = src["api"].to_numpy()
    used = np.zeros(len(calls), dtype=bool)
    used[pos[matched]] = True
    extra = calls[~used]
    cols = list(WAIT_COLUMNS)
    out = pd.concat([syncs[cols], extra[cols]], ignore_index=True)
    out = out.astype({"rank": "Int64", "pid": "Int64", "tid": "Int64", "device": "Int64",
                      "start_ns": "int64", "end_ns": "int64", "kind": "string",
                      "api": "string", "correlation": "Int64"})
    return out.sort_values("start_ns", kind="stable", ignore_index=True)


def _kind_of_api(name: str) -> str:
    for suffix, kind in _API_KIND.items():
        if suffix in name:
            return kind
    return "unknown"
