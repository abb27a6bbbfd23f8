"""How Nsight Systems SQLite exports spell things, release by release, as data.

`nsys export --type sqlite` changes its schema between releases: tables appear lazily (no
MEMCPY table when nothing was copied), columns are renamed (TARGET_INFO_CUDA_GPU's
`numMultiprocessors` became TARGET_INFO_GPU's `smCount`) and enums move. The reader never
names a column directly: it asks `Export.select()` for an output field, and each field lists
its spellings here, newest first. A spelling is a source column, or `(column, SQL template)`
where `{c}` is the qualified column (for unit conversions and sentinels). Where an export has
several of a field's spellings, the first non-NULL one per row wins (SQL COALESCE).

Which release spells what, and how we know (fixture: a real export our tests read; doc:
NVIDIA's SQLite schema reference of that release; code: a public project's queries). The
evidence starts at 2021.1; exports of 2020 releases read where their spellings match these.

- GPU properties: TARGET_INFO_CUDA_GPU in 2021.1-2021.2 (code: report scripts copied from
  nsys 2021.1.1, joined on `deviceId`); TARGET_INFO_GPU from 2021.3 (fixtures 2023.1 and
  2023.3, doc 2026.4), keyed by `cuDevice` and `id`.
- In TARGET_INFO_CUDA_GPU: numMultiprocessors, computeCapabilityMajor/Minor,
  maxWarpsPerMultiprocessor, numThreadsPerWarp, coreClockRate (code: Extra-P). The other
  limits there are assumed to carry CUPTI_ActivityDevice's names (maxBlocksPerMultiprocessor,
  globalMemorySize, ...): UNVERIFIED. coreClockRate's unit is undocumented (CUPTI's is kHz);
  we decide by magnitude.
- In TARGET_INFO_GPU: smCount, computeMajor/Minor, maxWarpsPerSm, threadsPerWarp,
  clockRate in Hz, memoryBandwidth in B/s (fixtures, doc).
- Export metadata: EXPORT_META_DATA in 2023.1 (fixture), META_DATA_EXPORT from 2023.3
  (fixture, doc 2026.4). Older exports may have neither: tool_versions stays empty.
- StringIds(id, value) and the kernel name ids demangledName/shortName/mangledName: every
  release we have evidence for (2021.1 code, fixtures, doc 2026.4).
- globalPid on GPU tables, globalTid on host tables: fixtures and doc; older releases
  UNVERIFIED, so pid falls back to globalTid, then to the launching API call.
- Sync kind: `syncType` up to 2023.3 (fixtures; its numbering does NOT follow
  ENUM_CUPTI_SYNC_TYPE, see nsys.py); 2026.4 has `deprecatedSyncType`, `syncType` and
  `eventSyncId` (doc).
- NVTX: eventType 59 push/pop and 60 start/end ranges, 75 domain create (fixtures'
  ENUM_NSYS_EVENT_TYPE; 70/71 are the NVTXT-file twins of 59/60).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpudiag.readers.files import budget

#: a column, or (column, SQL template with {c} standing for the qualified column)
Spelling = str | tuple[str, str]
Fields = Mapping[str, tuple[Spelling, ...]]

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"  # not seen in any export we have; read if present
NVTX = "NVTX_EVENTS"
STRINGS = "StringIds"
GPU_TABLES = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU")
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
SESSION_START = "TARGET_INFO_SESSION_START_TIME"
SYSTEM_ENV = "TARGET_INFO_SYSTEM_ENV"
PROCESSES = "PROCESSES"

#: table name prefixes that only an nsys export has
NSYS_PREFIXES = ("CUPTI_ACTIVITY_KIND_", "NVTX_", "TARGET_INFO_", "ENUM_NSYS_")

STRING_VALUE: tuple[Spelling, ...] = ("value",)
KERNEL_NAME_IDS = ("demangledName", "shortName", "mangledName")  # preference order

# Serialized global ids pack (hw, vm, pid, tid): pid is bits 24-47, tid bits 0-23.
PID_OF = "(({c} >> 24) & 16777215)"
TID_OF = "({c} & 16777215)"
#: CUPTI_SYNCHRONIZATION_INVALID_VALUE (uint32 all ones); some writers store it as -1
NOT_INVALID = "NULLIF(NULLIF({c}, 4294967295), -1)"

TIMES: Fields = {"start_ns": ("start",), "end_ns": ("end",)}
HOST_THREAD: Fields = {"pid": (("globalTid", PID_OF),), "tid": (("globalTid", TID_OF),)}
GPU_ROW: Fields = {
    **TIMES,
    "pid": (("globalPid", PID_OF), ("globalTid", PID_OF)),
    "device": ("deviceId",),
    "stream": (("streamId", NOT_INVALID),),
    "correlation": ("correlationId",),
}

KERNEL_FIELDS: Fields = {
    **GPU_ROW,
    "grid_x": ("gridX",), "grid_y": ("gridY",), "grid_z": ("gridZ",),
    "block_x": ("blockX",), "block_y": ("blockY",), "block_z": ("blockZ",),
    "regs_per_thread": ("registersPerThread",),
    "smem_static_bytes": ("staticSharedMemory",),
    "smem_dynamic_bytes": ("dynamicSharedMemory",),
}
MEMCPY_FIELDS: Fields = {
    **GPU_ROW, "bytes": ("bytes",),
    "copy_kind": ("copyKind",), "src_kind": ("srcKind",), "dst_kind": ("dstKind",),
}
MEMSET_FIELDS: Fields = {**GPU_ROW, "bytes": ("bytes",), "mem_kind": ("memKind",)}
SYNC_FIELDS: Fields = {
    **GPU_ROW,
    "sync_type": ("syncType",),
    "event_handle": (("eventId", NOT_INVALID),),
    "event_sync_id": (("eventSyncId", NOT_INVALID),),  # 2024+: unique per event record
}
API_FIELDS: Fields = {
    **TIMES, **HOST_THREAD, "correlation": ("correlationId",), "event_class": ("eventClass",),
}
NVTX_FIELDS: Fields = {
    **TIMES, **HOST_THREAD,
    "event_type": ("eventType",), "text": ("text",), "domain_id": ("domainId",),
}

# Hz (TARGET_INFO_GPU.clockRate) -> kHz. coreClockRate's unit is not documented for nsys;
# CUPTI reports kHz. A GPU clock is 0.1-5 GHz, so a value >= 10^7 can only be Hz.
HZ_TO_KHZ = "({c} / 1000)"
KHZ_OR_HZ = "(CASE WHEN {c} >= 10000000 THEN {c} / 1000 ELSE {c} END)"
KB_TO_B = "({c} * 1000)"  # CUPTI's globalMemoryBandwidth is kB/s

DEVICE_FIELDS: Fields = {
    "device": ("cuDevice", "deviceId", "id"),
    "name": ("name",),
    "sm_count": ("smCount", "numMultiprocessors", "multiProcessorCount"),
    "cc_major": ("computeMajor", "computeCapabilityMajor"),
    "cc_minor": ("computeMinor", "computeCapabilityMinor"),
    "warps_per_sm": ("maxWarpsPerSm", "maxWarpsPerMultiprocessor"),
    "warp_size": ("threadsPerWarp", "numThreadsPerWarp"),
    "max_blocks_per_sm": ("maxBlocksPerSm", "maxBlocksPerMultiprocessor"),
    "max_threads_per_block": ("maxThreadsPerBlock",),
    "regs_per_sm": ("maxRegistersPerSm", "maxRegistersPerMultiprocessor"),
    "regs_per_block": ("maxRegistersPerBlock",),
    "smem_per_sm_bytes": ("maxShmemPerSm", "maxSharedMemoryPerMultiprocessor"),
    "smem_per_block_bytes": ("maxShmemPerBlock", "maxSharedMemoryPerBlock"),
    "smem_per_block_optin_bytes": ("maxShmemPerBlockOptin", "maxSharedMemoryPerBlockOptin"),
    "mem_bytes": ("totalMemory", "globalMemorySize"),
    "l2_bytes": ("l2CacheSize",),
    "clock_khz": (("clockRate", HZ_TO_KHZ), ("coreClockRate", KHZ_OR_HZ)),
    "mem_bandwidth_bytes_per_s": ("memoryBandwidth", ("globalMemoryBandwidth", KB_TO_B)),
}

# -- enums (ENUM_* tables of the export; values are CUPTI's) ---------------------------------

#: ENUM_CUDA_MEMCPY_OPER -> copies.kind (array and unified-memory copies are 'other')
COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
#: ENUM_CUDA_MEM_KIND -> copies.src_mem / dst_mem ("static" variants are the same memory)
MEM_KINDS = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
             5: "device", 6: "managed"}
#: ENUM_CUPTI_SYNC_TYPE as CUPTI defines it (CUpti_ActivitySynchronizationType)
SYNC_TYPES = {1: "event", 2: "stream_wait", 3: "stream", 4: "context"}
#: the blocking API call -> syncs.kind (names without version and _ptsz/_ptds suffixes)
SYNC_CALLS = {
    "cudaEventSynchronize": "event", "cuEventSynchronize": "event",
    "cudaStreamWaitEvent": "stream_wait", "cuStreamWaitEvent": "stream_wait",
    "cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream",
    "cudaDeviceSynchronize": "device", "cudaThreadSynchronize": "device",
    "cuCtxSynchronize": "context",
}
#: ENUM_NSYS_EVENT_CLASS id of CUDA driver calls in the RUNTIME table
DRIVER_EVENT_CLASS = 1
#: ENUM_NSYS_EVENT_TYPE: push/pop and start/end ranges (59, 60) and their NVTXT-file twins
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_DOMAIN_CREATE = 75
VERSION_SUFFIX = r"_v\d+$"  # cudaLaunchKernel_v7000
STREAM_VARIANT = r"_pt(?:sz|ds)$"  # per-thread default stream entry points


#: seconds one SELECT may run before it is interrupted (GPUDIAG_NSYS_QUERY_SECONDS)
DEFAULT_QUERY_SECONDS = 300.0
QUERY_SECONDS_ENV = "GPUDIAG_NSYS_QUERY_SECONDS"
#: SQLite VM instructions between two looks at the clock (about a millisecond of work)
CLOCK_EVERY_STEPS = 100_000


def query_seconds() -> float:
    """The per-SELECT time budget: GPUDIAG_NSYS_QUERY_SECONDS, else DEFAULT_QUERY_SECONDS."""
    return budget(QUERY_SECONDS_ENV, DEFAULT_QUERY_SECONDS)


#: fields that hold text; every other field is an integer (or NULL)
TEXT_FIELDS = frozenset({"name", "text", "value"})
#: SQLite stores any type in any column, so a stranger's export may put text or a blob where
#: an integer belongs: each column is read through one of these guards, which turn a value
#: of the wrong type (or a real past int64) into NULL before any template or pandas sees it
AS_INTEGER = ("(CASE typeof({c}) WHEN 'integer' THEN {c} WHEN 'real' THEN (CASE WHEN "
              "abs({c}) < 9.2e18 THEN CAST({c} AS INTEGER) END) END)")
AS_TEXT = "(CASE WHEN typeof({c}) = 'blob' THEN NULL ELSE CAST({c} AS TEXT) END)"


class Text:
    """SQLite's text decoded as UTF-8, with the bytes that are not UTF-8 read as U+FFFD and
    counted once per distinct value: the one place an export's text becomes str
    (`sqlite3`'s own decoding would stop the whole read at the first bad byte of one kernel
    name)."""

    def __init__(self) -> None:
        self.bad: set[bytes] = set()

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.bad.add(raw)
            return raw.decode("utf-8", "replace")

    @property
    def replaced(self) -> int:
        """How many distinct text values were not UTF-8."""
        return len(self.bad)


class Export:
    """An open nsys export: which tables and columns it has, and rows read through the
    spellings above.

    Only real tables count: nsys writes no views, and a view in a stranger's file can be an
    endless recursive query or a cross join that makes one SELECT run for hours. Text is
    decoded by `Text` (`text.replaced` counts the values that were not UTF-8).
    """

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        self.text = Text()
        con.text_factory = self.text
        self.seconds = query_seconds()
        self._deadline = time.monotonic() + self.seconds
        # Every statement runs under a clock: past its budget SQLite stops it with
        # OperationalError('interrupted'), which open_export turns into an InputError.
        con.set_progress_handler(self._over_budget, CLOCK_EVERY_STEPS)
        # Schema-defined SQL (generated columns) may then call no function with side effects.
        con.execute("PRAGMA trusted_schema = OFF")
        rows = self.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        self.tables = frozenset(row[0] for row in rows)
        self._columns: dict[str, frozenset[str]] = {}

    def _over_budget(self) -> int:
        return int(time.monotonic() > self._deadline)

    def execute(self, sql: str, parameters: Iterable[Any] = ()) -> sqlite3.Cursor:
        """`con.execute` with a fresh time budget (rows are fetched within it too)."""
        self._deadline = time.monotonic() + self.seconds
        return self.con.execute(sql, tuple(parameters))

    def is_nsys(self) -> bool:
        """True when some table only an Nsight Systems export has is present."""
        named = {STRINGS, *META_TABLES}
        return bool(named & self.tables) or any(table.startswith(NSYS_PREFIXES)
                                                for table in self.tables)

    def has(self, table: str) -> bool:
        return table in self.tables

    def first_table(self, candidates: Iterable[str]) -> str | None:
        return next((table for table in candidates if table in self.tables), None)

    def columns(self, table: str) -> frozenset[str]:
        if table not in self._columns:
            rows = self.execute(f'PRAGMA table_info("{table}")')
            self._columns[table] = frozenset(row[1] for row in rows)
        return self._columns[table]

    def expr(self, table: str, alias: str, spellings: tuple[Spelling, ...],
             text: bool = False) -> str | None:
        """SQL for one field: COALESCE of the spellings `table` has, None when it has none.

        Each column is read through its type guard (AS_TEXT when `text`, else AS_INTEGER).
        """
        cols = self.columns(table)
        guard = AS_TEXT if text else AS_INTEGER
        parts = []
        for spelling in spellings:
            name, template = (spelling, "{c}") if isinstance(spelling, str) else spelling
            if name in cols:
                parts.append(template.format(c=guard.format(c=f'{alias}."{name}"')))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else f"COALESCE({', '.join(parts)})"

    def select(self, table: str, fields: Fields, alias: str = "t") -> str:
        """`expr AS field, ...` for every field (NULL where the export lacks it)."""
        return ", ".join(
            f"{self.expr(table, alias, spellings, field in TEXT_FIELDS) or 'NULL'} AS {field}"
            for field, spellings in fields.items()
        )

    def strings_used(self, table: str, id_columns: Iterable[str]) -> str | None:
        """SQL of (id, value) for the StringIds rows that `id_columns` of `table` refer to."""
        value = self.expr(STRINGS, "s", STRING_VALUE, text=True) if STRINGS in self.tables \
            else None
        present = [column for column in id_columns if column in self.columns(table)]
        if value is None or not present:
            return None
        used = " UNION ".join(f'SELECT "{column}" FROM {table}' for column in present)
        sid = AS_INTEGER.format(c="s.id")
        return f"SELECT {sid} AS id, {value} AS value FROM {STRINGS} AS s WHERE s.id IN ({used})"

    def query(self, sql: str) -> pd.DataFrame:
        self._deadline = time.monotonic() + self.seconds
        return pd.read_sql_query(sql, self.con)

    def rows(self, table: str, fields: Fields, names: tuple[str, ...] = (), *,
             where: str = "1", order: str = "") -> pd.DataFrame:
        """Rows of `table` as `fields`, plus `name`: the string of the first of the StringIds
        id columns `names` that resolves.

        Ids are read, not strings: each distinct string is then fetched once (a kernel name
        repeated a million times costs one Python object, not a million).
        """
        ids = {f"string_id_{position}": (column,) for position, column in enumerate(names)}
        frame = self.query(f"SELECT {self.select(table, {**fields, **ids})} FROM {table} AS t "
                           f"WHERE {where} {order}")
        if names:
            frame["name"] = self._interned(table, names, frame[list(ids)])
            frame = frame.drop(columns=list(ids))
        return frame

    def _interned(self, table: str, names: tuple[str, ...], ids: pd.DataFrame) -> Any:
        """Per row of `ids`, the string of its first id that StringIds resolves (Categorical)."""
        sql = self.strings_used(table, names)
        strings = self.query(sql) if sql else pd.DataFrame({"id": [], "value": []})
        strings = strings.dropna(subset=["id"]).drop_duplicates("id")
        if not len(strings):
            return pd.Categorical.from_codes(np.full(len(ids), -1),
                                             categories=pd.Index([], dtype=str))
        known = pd.Index(strings["id"].astype("int64"))
        position = np.full(len(ids), -1, dtype=np.int64)
        for column in reversed(ids.columns):  # the first column that resolves wins
            found = known.get_indexer(ids[column].astype("float64"))
            position = np.where(found >= 0, found, position)
        codes, uniques = pd.factorize(strings["value"])  # values may repeat across ids
        return pd.Categorical.from_codes(np.where(position >= 0, codes[position], -1),
                                         categories=uniques)
