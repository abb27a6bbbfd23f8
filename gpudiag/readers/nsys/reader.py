"""Nsight Systems exports (`nsys export --type sqlite`) and reports (`.nsys-rep`, `.qdrep`).

    trace = gpudiag.readers.nsys.reader.read_sqlite(Path("report.sqlite"))

Every table is selected in SQL (pid/tid taken out of the serialized global ids, sentinels
turned into NULL) and read with one `pd.read_sql_query`; strings are StringIds ids resolved
once per distinct string into categories. Columns are found through the spellings in
`nsys_schema`, so exports from nsys 2020-2026 read the same way, and a table the export
lacks (nothing of that kind was captured) becomes an empty table.

Synchronization kinds: the `syncType` that nsys 2023.1 and 2023.3 wrote does not follow
CUPTI's numbering that ENUM_CUPTI_SYNC_TYPE documents (in our fixtures cudaEventSynchronize
is stored as 2, "stream wait", and cuCtxSynchronize as 1, "event"; nsys 2026 keeps that
column as `deprecatedSyncType` beside a new `syncType`). So a sync's kind comes from the API
call that blocked (same correlation id) when we know the call, then from `syncType` where it
agrees with the ids CUPTI fills in for that kind (a stream sync has a stream and no event, a
context sync neither), else from those ids; each override is counted in meta warnings.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pandas as pd

from gpudiag.devices import fill_from_compute_capability, vendor_of
from gpudiag.errors import InputError
from gpudiag.intervals import nesting_depth
from gpudiag.readers.files import open_regular
from gpudiag.readers.nsys import schema as ns
from gpudiag.schema import TABLES
from gpudiag.trace import Trace

Repairs = Counter[str]
SYNC_TYPE_VS_CALL = "syncs whose syncType disagrees with their API call (kind taken from the call)"
SYNC_TYPE_VS_IDS = "syncs whose syncType disagrees with their stream/event ids (kind from the ids)"
NOT_UTF8 = "text values that are not UTF-8 (their bad bytes read as U+FFFD)"
EXPORT_HINT = "nsys export --type sqlite -o {stem}.sqlite {stem}.nsys-rep"
#: how long to wait for a lock held by a writer (nsys still exporting) before giving up
LOCK_WAIT_S = 5.0


def read_sqlite(path: Path) -> Trace:
    """Read an Nsight Systems SQLite export into a Trace."""
    with open_export(path) as con:
        database = ns.Export(con)
        if not database.is_nsys():
            raise InputError(
                path, "is an SQLite database but not an Nsight Systems export (no "
                "CUPTI_ACTIVITY_KIND_*, NVTX_*, TARGET_INFO_*, StringIds or META_DATA_EXPORT "
                "tables)",
                "export a report with: " + EXPORT_HINT.format(stem=path.stem),
            )
        return _read(database)


def read_report(path: Path) -> Trace:
    """Read an `.nsys-rep` / `.qdrep` report through its SQLite export (needs `nsys`)."""
    from gpudiag.readers.nsys.export import exported

    _regular(path)  # nsys would wait on a FIFO until its export timeout
    with exported(path) as (sqlite_path, info):
        trace = read_sqlite(sqlite_path)
    if "nsys_cli_version" in info:
        trace.meta["tool_versions"]["nsys_cli"] = info["nsys_cli_version"]
    trace.meta.update(format="nsys-rep", export=info.get("export"))
    return trace


@contextmanager
def open_export(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection; every SQLite failure inside becomes an InputError.

    SQLite reads lazily: a truncated file can pass the first query and fail on a later
    page, so the whole read runs inside this context.
    """
    _regular(path)  # SQLite's own open() would wait forever on a FIFO
    uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True, timeout=LOCK_WAIT_S)
    except sqlite3.Error as exc:
        raise _db_error(path, exc) from exc
    try:
        yield con
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        raise _db_error(path, exc) from exc
    except UnicodeDecodeError as exc:  # SQLite's message quotes a name that is not UTF-8
        raise InputError(path, "is a damaged SQLite file (its schema names a table or "
                         "column in bytes that are not UTF-8)",
                         "export it again: " + EXPORT_HINT.format(stem=path.stem)) from exc
    finally:
        con.close()


def _regular(path: Path) -> None:
    """InputError unless `path` is a readable regular file (not a FIFO, device, folder)."""
    try:
        open_regular(Path(path)).close()
    except OSError as exc:
        raise InputError(path, f"cannot be opened ({exc.strerror or exc})",
                         "check that the file exists and is readable") from exc


def _db_error(path: Path, exc: BaseException) -> InputError:
    cause = exc.__cause__ if isinstance(exc, pd.errors.DatabaseError) and exc.__cause__ else exc
    reason = str(cause).splitlines()[0] if str(cause) else cause.__class__.__name__
    if "interrupted" in reason:
        return InputError(
            path, f"needs more than {ns.query_seconds():g} s for one query (a view or a "
            "table far larger than nsys writes)",
            f"if it is a genuine export, raise the budget: {ns.QUERY_SECONDS_ENV}=<seconds>")
    if "locked" in reason:
        return InputError(path, f"is locked by another program ({reason})",
                          "wait until nsys has finished writing it, or read a copy")
    if isinstance(cause, sqlite3.OperationalError) and "unable to open" in reason:
        return InputError(path, f"cannot be opened ({reason})",
                          "check that the file exists and is readable")
    return InputError(path, f"is a damaged or truncated SQLite file ({reason})",
                      "export it again: " + EXPORT_HINT.format(stem=path.stem))


def _read(database: ns.Export) -> Trace:
    repairs: Repairs = Counter()
    api = _api(database, repairs)
    tables: dict[str, pd.DataFrame | None] = {
        "kernels": _kernels(database, api, repairs),
        "copies": _copies(database, api, repairs),
        "syncs": _syncs(database, api, repairs),
        "ranges": _ranges(database, repairs),
        "api": api,
    }
    trace = Trace(meta=_meta(database, tables), devices=_devices(database), **tables)
    repairs[NOT_UTF8] += database.text.replaced
    for kind, count in repairs.items():
        trace.warn(kind, count)
    return trace


def _timed(frame: pd.DataFrame, what: str, repairs: Repairs) -> pd.DataFrame:
    """Drop rows without timestamps (CUPTI writes 0/0 when it could not time a record) and
    clip rows that end before they start, counting both."""
    start, end = frame["start_ns"], frame["end_ns"]
    untimed = (start.isna() | end.isna() | ((start == 0) & (end == 0))).to_numpy()
    if untimed.any():
        repairs[f"{what} without timestamps dropped"] += int(untimed.sum())
        frame = frame[~untimed].reset_index(drop=True)
    backwards = (frame["end_ns"] < frame["start_ns"]).to_numpy()
    if backwards.any():
        repairs[f"{what} ending before they start clipped to 0 ns"] += int(backwards.sum())
        frame["end_ns"] = frame["end_ns"].where(~backwards, frame["start_ns"])
    return frame.astype({"start_ns": "int64", "end_ns": "int64"})


# -- host API calls -----------------------------------------------------------------------


def _api(database: ns.Export, repairs: Repairs) -> pd.DataFrame:
    frames = [_api_rows(database, table) for table in (ns.RUNTIME, ns.DRIVER)
              if database.has(table)]
    if not frames:
        return TABLES["api"].empty()
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.sort_values("start_ns", kind="stable", ignore_index=True)
    frame = _timed(frame, "API calls", repairs)
    names = _renamed(frame["name"], ns.VERSION_SUFFIX)
    driver = (_matches(names, r"cu(?!da)") | (frame.pop("event_class") == ns.DRIVER_EVENT_CLASS)
              | frame.pop("driver_table"))
    return frame.assign(name=names, kind=np.where(driver, "driver", "runtime"))


def _api_rows(database: ns.Export, table: str) -> pd.DataFrame:
    frame = database.rows(table, ns.API_FIELDS, ("nameId",))
    frame["driver_table"] = table == ns.DRIVER
    return frame


def _renamed(names: pd.Series, pattern: str, repl: str = "") -> pd.Series:
    """`names` as a category with `pattern` replaced, computed once per distinct name."""
    cat = names.astype("category")
    if not len(cat.cat.categories):
        return cat
    codes, uniques = pd.factorize(cat.cat.categories.str.replace(pattern, repl, regex=True))
    old = cat.cat.codes.to_numpy()
    new = np.where(old >= 0, codes[old], -1)
    return pd.Series(pd.Categorical.from_codes(new, categories=uniques), index=names.index)


def _matches(names: pd.Series, pattern: str) -> np.ndarray:
    """Per row of a category Series: does the name match `pattern` (False for NA)."""
    cats = names.cat.categories
    hit = np.append(np.asarray(cats.str.match(pattern), dtype=bool), False)
    return hit[names.cat.codes.to_numpy()]


def _calls_of(rows: pd.DataFrame, api: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Row index into `api` of the call each row came from (-1: none), joined on `keys`.

    Correlation ids can repeat (nsys gave cuCtxSynchronize and cudaDeviceReset the same
    one); the call whose time span holds the row wins.
    """
    cols = [*keys, "start_ns", "end_ns"]
    ints = dict.fromkeys(keys, "Int64")
    left = rows[cols].astype(ints).assign(row=np.arange(len(rows))).dropna(subset=keys)
    right = api[cols].astype(ints).assign(call=np.arange(len(api))).dropna(subset=keys)
    pairs = left.merge(right, on=keys, suffixes=("", "_call"))
    pairs["inside"] = (pairs["start_ns_call"] <= pairs["start_ns"]) & (
        pairs["end_ns"] <= pairs["end_ns_call"])
    best = pairs.sort_values(["row", "inside"], ascending=[True, False], kind="stable")
    best = best.drop_duplicates("row")
    out = np.full(len(rows), -1, dtype=np.int64)
    out[best["row"].to_numpy()] = best["call"].to_numpy()
    return out


def _take(column: pd.Series, index: np.ndarray) -> Any:
    """column[index] with -1 giving NA, keeping the column's (nullable) dtype."""
    array = column.astype("Int64").array if column.dtype.kind in "iuf" else column.array
    return array.take(index, allow_fill=True)


def _fill_pid(frame: pd.DataFrame, api: pd.DataFrame) -> pd.DataFrame:
    """Exports whose GPU tables lack globalPid: take the pid of the launching call."""
    missing = frame["pid"].isna().to_numpy()
    if missing.any() and len(api):
        launcher = _take(api["pid"], _calls_of(frame, api, ["correlation"]))
        frame["pid"] = frame["pid"].astype("Int64").fillna(pd.Series(launcher, index=frame.index))
    return frame


# -- GPU activity -------------------------------------------------------------------------


#: CUPTI's sharedMemoryExecuted: the carveout the launch ran with (exports from 2021 on)
CARVEOUT_FIELD: ns.Fields = {"smem_config_bytes": ("sharedMemoryExecuted",)}
IMPLAUSIBLE_CARVEOUT = ("kernels whose sharedMemoryExecuted is not above zero or is below their "
                        "shared memory per block (carveout left NA)")


def _kernels(database: ns.Export, api: pd.DataFrame, repairs: Repairs) -> pd.DataFrame | None:
    if not database.has(ns.KERNEL):
        return None
    frame = database.rows(ns.KERNEL, {**ns.KERNEL_FIELDS, **CARVEOUT_FIELD}, ns.KERNEL_NAME_IDS,
                    order='ORDER BY t."start", t."end"')
    frame = _fill_pid(_timed(frame, "kernels", repairs), api)
    repairs["kernels whose name id is not in StringIds"] += int(frame["name"].isna().sum())
    smem = frame["smem_static_bytes"] + frame["smem_dynamic_bytes"]
    return frame.assign(smem_bytes=smem, kernel_id=np.arange(len(frame), dtype=np.int64),
                        smem_config_bytes=_carveout(frame["smem_config_bytes"], smem, repairs))


def _carveout(executed: pd.Series, smem: pd.Series, repairs: Repairs) -> pd.Series:
    """sharedMemoryExecuted where it can be the carveout a launch ran with: above zero and
    holding the block's own shared memory; other values are counted and left NA."""
    executed = pd.to_numeric(executed, errors="coerce").astype("Int64")
    too_small = (executed < smem).fillna(False)
    plausible = ((executed > 0) & ~too_small).fillna(False).astype(bool)
    repairs[IMPLAUSIBLE_CARVEOUT] += int((executed.notna() & ~plausible).sum())
    return executed.where(plausible)


def _copies(database: ns.Export, api: pd.DataFrame, repairs: Repairs) -> pd.DataFrame | None:
    parts = [reader(database) for table, reader in ((ns.MEMCPY, _memcpy), (ns.MEMSET, _memset))
             if database.has(table)]
    if not parts:
        return None
    frame = pd.concat(parts, ignore_index=True)
    frame = frame.sort_values("start_ns", kind="stable", ignore_index=True)
    frame = _fill_pid(_timed(frame, "copies", repairs), api)
    frame["host_mem"] = _host_side(frame)
    return frame


def _memcpy(database: ns.Export) -> pd.DataFrame:
    frame = database.rows(ns.MEMCPY, ns.MEMCPY_FIELDS)
    kind = frame.pop("copy_kind").map(ns.COPY_KINDS).fillna("other")
    return frame.assign(kind=kind.astype(object), src_mem=_mem(frame.pop("src_kind")),
                        dst_mem=_mem(frame.pop("dst_kind")))


def _memset(database: ns.Export) -> pd.DataFrame:
    frame = database.rows(ns.MEMSET, ns.MEMSET_FIELDS)
    return frame.assign(kind="memset", src_mem=pd.Series(None, index=frame.index, dtype=object),
                        dst_mem=_mem(frame.pop("mem_kind")))


def _mem(codes: pd.Series) -> pd.Series:
    return codes.map(ns.MEM_KINDS).fillna("unknown").astype(object)


def _host_side(copies: pd.DataFrame) -> pd.Series:
    """Pageable or pinned: the host memory of each HtoD / DtoH copy (NA otherwise)."""
    kind = copies["kind"]
    host = copies["src_mem"].where(kind == "HtoD", copies["dst_mem"].where(kind == "DtoH"))
    return host.where(host.isin(["pageable", "pinned"]))


def _syncs(database: ns.Export, api: pd.DataFrame, repairs: Repairs) -> pd.DataFrame | None:
    if not database.has(ns.SYNC):
        return None
    frame = database.rows(ns.SYNC, ns.SYNC_FIELDS, order='ORDER BY t."start"')
    frame = _timed(frame, "syncs", repairs)
    keys = ["pid", "correlation"] if frame["pid"].notna().all() else ["correlation"]
    call = _calls_of(frame, api, keys)
    called = pd.Series(_take(api["name"], call), index=frame.index, dtype=object)
    # Event handles are reused; nsys 2024+ adds eventSyncId, unique per event record.
    unique_ids = "eventSyncId" in database.columns(ns.SYNC)
    return frame.assign(
        pid=frame["pid"].astype("Int64").fillna(pd.Series(_take(api["pid"], call),
                                                          index=frame.index)),
        tid=_take(api["tid"], call),
        kind=_sync_kinds(frame, called, repairs),
        event_id=frame["event_sync_id" if unique_ids else "event_handle"],
    ).drop(columns=["sync_type", "event_handle", "event_sync_id"])


def _sync_kinds(frame: pd.DataFrame, called: pd.Series, repairs: Repairs) -> np.ndarray:
    """Kind of each sync: its API call, else syncType where its ids agree, else its ids."""
    by_call = called.str.replace(ns.VERSION_SUFFIX, "", regex=True).str.replace(
        ns.STREAM_VARIANT, "", regex=True).map(ns.SYNC_CALLS)
    stream = frame["stream"].notna().to_numpy()
    event = (frame["event_handle"].notna() | frame["event_sync_id"].notna()).to_numpy()
    by_ids = pd.Series(np.select([stream & event, stream, event],
                                 ["stream_wait", "stream", "event"], "context"), index=frame.index)
    by_type = frame["sync_type"].map(ns.SYNC_TYPES)
    typed = by_type.where(by_type.isna() | (by_type == by_ids), by_ids).fillna("unknown")
    call_kind = by_call.replace("device", "context")
    repairs[SYNC_TYPE_VS_CALL] += int((by_call.notna() & by_type.notna()
                                       & (call_kind != by_type)).sum())
    repairs[SYNC_TYPE_VS_IDS] += int((by_call.isna() & by_type.notna()
                                      & (by_type != by_ids)).sum())
    return by_call.fillna(typed).to_numpy(dtype=object)


# -- host ranges, devices, meta -----------------------------------------------------------


def _ranges(database: ns.Export, repairs: Repairs) -> pd.DataFrame | None:
    """NVTX push/pop and start/end ranges, with their domain's name and nesting depth."""
    if not database.has(ns.NVTX):
        return None
    etype = database.expr(ns.NVTX, "t", ("eventType",)) or "NULL"
    frame = _nvtx_rows(database, f"{etype} IN {ns.NVTX_RANGE_TYPES}", 'ORDER BY t."start"')
    open_ended = frame["end_ns"].isna().to_numpy()
    repairs["NVTX ranges without an end skipped"] += int(open_ended.sum())
    frame = _timed(frame[~open_ended], "NVTX ranges", repairs)
    domains = _nvtx_rows(database, f"{etype} = {ns.NVTX_DOMAIN_CREATE}")
    domains = domains.rename(columns={"name": "domain"})
    keys = ["pid", "domain_id"]
    domains = domains[[*keys, "domain"]].dropna(subset=keys).drop_duplicates(keys)
    ints = dict.fromkeys(keys, "Int64")
    frame = frame.astype(ints).merge(domains.astype(ints), how="left", on=keys)
    lane = frame.groupby(["pid", "tid"], dropna=False, sort=False).ngroup().to_numpy()
    return frame.drop(columns=["event_type", "domain_id"]).assign(
        depth=nesting_depth(lane, frame["start_ns"], frame["end_ns"]), source="nvtx")


def _nvtx_rows(database: ns.Export, where: str, order: str = "") -> pd.DataFrame:
    """NVTX rows named by their inline `text`, else by their registered string `textId`."""
    frame = database.rows(ns.NVTX, ns.NVTX_FIELDS, ("textId",), where=where, order=order)
    text = frame.pop("text")
    frame["name"] = text.astype(object).where(text.notna(), frame["name"].astype(object))
    return frame


def _devices(database: ns.Export) -> pd.DataFrame | None:
    table = database.first_table(ns.GPU_TABLES)
    if table is None:
        return None
    frame = database.rows(table, ns.DEVICE_FIELDS)
    frame = frame.dropna(subset=["device"]).drop_duplicates("device")
    frame = frame.sort_values("device", ignore_index=True)
    frame["max_threads_per_sm"] = frame.pop("warps_per_sm") * frame["warp_size"]
    # CUPTI exists only on NVIDIA GPUs: a CUDA device whose name says no vendor is NVIDIA's.
    vendor = frame["name"].fillna("").astype(str).map(vendor_of)
    cuda = (frame["cc_major"].fillna(0) > 0).to_numpy()
    frame["vendor"] = vendor.mask((vendor == "unknown") & cuda, "nvidia")
    return fill_from_compute_capability(frame)


def _meta(database: ns.Export, tables: dict[str, pd.DataFrame | None]) -> dict[str, Any]:
    export = _name_values(database, database.first_table(ns.META_TABLES),
                          ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION"))
    env = _name_values(database, ns.SYSTEM_ENV,
                       ("CudaDriverVersion", "NvDriverVersion", "Hostname"))
    versions = {
        "nsys": export.get("EXPORT_PRODUCT_VERSION"),
        "nsys_export_schema": export.get("EXPORT_SCHEMA_VERSION"),
        "cuda_driver": env.get("CudaDriverVersion"),
        "nvidia_driver": env.get("NvDriverVersion"),
    }
    meta: dict[str, Any] = {
        "format": "nsys-sqlite", "vendor": "nvidia", "timeline": True,
        "tool_versions": {tool: version for tool, version in versions.items()
                          if version is not None},
        "process_names": _process_names(database, tables),
    }
    if "Hostname" in env:
        meta["hostname"] = env["Hostname"]
    if database.has(ns.SESSION_START) and "utcEpochNs" in database.columns(ns.SESSION_START):
        start = database.execute(f"SELECT utcEpochNs FROM {ns.SESSION_START} "
                           "WHERE typeof(utcEpochNs) = 'integer' LIMIT 1").fetchone()
        if start and start[0] is not None:
            meta["session_start_epoch_ns"] = int(start[0])
    return meta


def _name_values(database: ns.Export, table: str | None, names: tuple[str, ...]) -> dict[str, str]:
    """name -> value rows of a key/value table (export metadata, system environment)."""
    if table is None or not database.has(table) or not {"name", "value"} <= database.columns(table):
        return {}
    marks = ", ".join("?" * len(names))
    rows = database.execute(f"SELECT name, value FROM {table} WHERE name IN ({marks})", names)
    return {str(name): str(value) for name, value in rows if value is not None}


def _process_names(database: ns.Export, tables: dict[str, pd.DataFrame | None]) -> dict[str, str]:
    """Names of the processes that rows of the trace belong to, by pid (as a string)."""
    if not database.has(ns.PROCESSES):
        return {}
    fields = {"pid": ("pid", ("globalPid", ns.PID_OF)), "name": ("name",)}
    procs = database.rows(ns.PROCESSES, fields)
    pids = [frame["pid"] for frame in tables.values() if frame is not None and len(frame)]
    if not pids:
        return {}
    used = pd.concat(pids)
    procs = procs.dropna().astype({"pid": "int64"}).drop_duplicates("pid")
    procs = procs[procs["pid"].isin(used.dropna().astype("int64").unique())]
    return dict(zip(procs["pid"].astype(str), procs["name"].astype(str), strict=True))
