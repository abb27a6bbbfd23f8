"""The copies analyzer: nsys expert-rule flags against the rules' own SQL, Kineto counts and
bytes against the JSON events, exact exposed times on synthetic traces, and the edges
(empty trace, copies without API calls)."""

from __future__ import annotations

import functools
import gzip
import json
import re
import sqlite3
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag import intervals
from gpudiag.analyzers.copies import (
    PROBLEM_COLUMNS,
    STATS_COLUMNS,
    copy_stats,
    findings,
    problem_copies,
)
from gpudiag.analyzers.findings import ADVICE, COLUMNS
from gpudiag.readers.nsys.reader import read_sqlite
from gpudiag.trace import Trace
from tests.builders import api_call, copy, kernel, trace
from tests.conftest import fixtures, fixtures_dir
from tests.test_nsys import GPID, GTID, make_export

NSYS = [p.name for p in fixtures("nsys/*.sqlite")]
KINETO = [p.name for p in fixtures("kineto/*.json*")]
MB = 1_000_000


@functools.cache
def load(folder: str, name: str) -> Trace:
    """A real fixture read once per session (the analyzers never modify a Trace)."""
    return gpudiag.load(fixtures_dir() / folder / name)

# -- nsys: the expert rules' own SQL (REFERENCE.md B2) as the oracle --------------------------

RULE_JOIN = """
    JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = m.correlationId
    JOIN StringIds AS s ON s.id = r.nameId"""
RULES = {
    # cuda_memcpy_async: pageable side, async memcpy call
    "pageable": "SELECT m.correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m" + RULE_JOIN +
                " WHERE (m.srcKind = 0 OR m.dstKind = 0) AND s.value LIKE 'cudaMemcpy%Async%'",
    # cuda_memcpy_sync: non-async memcpy call, not DtoD (8), not HtoD (1) of <= 64 KB
    "sync_copy": "SELECT m.correlationId FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m" + RULE_JOIN +
                 " WHERE s.value LIKE 'cudaMemcpy%' AND s.value NOT LIKE '%async%'"
                 " AND m.copyKind != 8 AND NOT (m.copyKind = 1 AND m.bytes <= 65536)",
    # cuda_memset_sync: pinned (1) or managed (4) memory, non-async memset call
    "sync_set": "SELECT m.correlationId FROM CUPTI_ACTIVITY_KIND_MEMSET AS m" + RULE_JOIN +
                " WHERE (m.memKind = 1 OR m.memKind = 4)"
                " AND s.value LIKE 'cudaMemset%' AND s.value NOT LIKE '%async%'",
}
RULE_TABLES = {"pageable": "CUPTI_ACTIVITY_KIND_MEMCPY", "sync_copy": "CUPTI_ACTIVITY_KIND_MEMCPY",
               "sync_set": "CUPTI_ACTIVITY_KIND_MEMSET"}


def rule_rows(path: Path, rule: str) -> list[int]:
    """Correlation ids the nsys rule reports (empty when the export lacks its tables)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        if not {RULE_TABLES[rule], "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds"} <= tables:
            return []
        return sorted(r[0] for r in con.execute(RULES[rule]))
    finally:
        con.close()


def flagged(rows: pd.DataFrame, rule: str) -> list[int]:
    is_set = (rows["kind"] == "memset").fillna(False)
    flag = rows["pageable"] if rule == "pageable" else rows["synchronous"]
    pick = flag.fillna(False) & (is_set if rule == "sync_set" else ~is_set)
    return sorted(int(c) for c in rows.loc[pick, "correlation"])


STRINGS = [(1, "cudaMemcpyAsync_v3020"), (2, "cudaMemcpy_v3020"), (3, "cudaMemcpy2D_v3020"),
           (4, "cudaMemcpy2DAsync_v3020"), (5, "cudaMemcpyPeerAsync_v4000"),
           (6, "cudaMemset_v3020"), (7, "cudaMemsetAsync_v3020"), (8, "cudaMemset2D_v3020"),
           (9, "cudaLaunchKernel_v7000")]
#: (correlation, nameId, copyKind, srcKind, dstKind, bytes): one row per rule branch
MEMCPYS = [
    (1, 1, 1, 0, 2, 4 * MB),   # async HtoD from pageable: pageable
    (2, 1, 1, 1, 2, 4 * MB),   # async HtoD from pinned: nothing
    (3, 1, 2, 2, 0, 512),      # async DtoH to pageable: pageable
    (4, 2, 1, 0, 2, MB),       # cudaMemcpy HtoD 1 MB: synchronous
    (5, 2, 1, 0, 2, 65536),    # cudaMemcpy HtoD of exactly 64 KB: exempt
    (6, 2, 1, 1, 2, 65537),    # one byte more: synchronous
    (7, 2, 8, 2, 2, 8 * MB),   # cudaMemcpy DtoD (same device): exempt
    (8, 2, 2, 2, 1, 16),       # cudaMemcpy DtoH of 16 B: synchronous (only H2D is exempt)
    (9, 3, 2, 2, 0, 4096),     # cudaMemcpy2D DtoH: synchronous
    (10, 5, 10, 2, 2, MB),     # cudaMemcpyPeerAsync: nothing
    (11, 2, 9, 0, 0, 64),      # cudaMemcpy HtoH: synchronous, not pageable (not async)
    (12, 4, 1, 0, 3, 2048),    # cudaMemcpy2DAsync pageable -> array: pageable
    (13, 9, 8, 2, 2, 64),      # a copy whose call is not a memcpy call (graph node): nothing
    (999, 1, 1, 0, 2, MB),     # no runtime call with this correlation: unknown
]
#: (correlation, nameId, memKind)
MEMSETS = [(20, 6, 1), (21, 6, 2), (22, 7, 4), (23, 8, 4), (24, 6, 4)]


def rules_export(path: Path) -> Path:
    """A tiny export with one copy or memset per branch of the three nsys rules."""
    gpu = (0, 1, 7)
    calls = [(1000 * c, 1000 * c + 500, 0, GTID, c, name, 0)
             for c, name, *_ in MEMCPYS + MEMSETS if c != 999]
    copies = [(1000 * c + 100, 1000 * c + 400, *gpu, c, GPID, nbytes, kind, src, dst)
              for c, _, kind, src, dst, nbytes in MEMCPYS]
    sets = [(1000 * c + 100, 1000 * c + 300, *gpu, c, GPID, 0, 256, mem)
            for c, _, mem in MEMSETS]
    return make_export(path, {
        "StringIds": ("id, value", STRINGS),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            "start, end, eventClass, globalTid, correlationId, nameId, returnValue", calls),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, bytes, "
            "copyKind, srcKind, dstKind", copies),
        "CUPTI_ACTIVITY_KIND_MEMSET": (
            "start, end, deviceId, contextId, streamId, correlationId, globalPid, value, bytes, "
            "memKind", sets),
    })


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", NSYS)
def test_real_nsys_flags_equal_the_rules_sql(name: str, rule: str) -> None:
    path = fixtures_dir() / "nsys" / name
    rows = problem_copies(load("nsys", name))
    assert flagged(rows, rule) == rule_rows(path, rule)
    for flag in ("pageable", "synchronous", "small"):
        assert not rows[flag].isna().any()  # every copy in these exports has its call


@pytest.mark.parametrize("rule", list(RULES))
def test_synthetic_nsys_flags_equal_the_rules_sql(tmp_path: Path, rule: str) -> None:
    path = rules_export(tmp_path / "rules.sqlite")
    assert flagged(problem_copies(read_sqlite(path)), rule) == rule_rows(path, rule)


def test_synthetic_nsys_rules_flag_the_expected_rows(tmp_path: Path) -> None:
    """The oracle itself is checked: each rule flags the rows its comments say."""
    path = rules_export(tmp_path / "rules.sqlite")
    assert rule_rows(path, "pageable") == [1, 3, 12]
    assert rule_rows(path, "sync_copy") == [4, 6, 8, 9, 11]
    assert rule_rows(path, "sync_set") == [20, 23, 24]


def test_copy_without_its_call_is_unknown_not_false(tmp_path: Path) -> None:
    rows = problem_copies(read_sqlite(rules_export(tmp_path / "rules.sqlite")))
    lost = rows[rows["correlation"] == 999].iloc[0]
    assert pd.isna(lost["pageable"]) and pd.isna(lost["synchronous"]) and pd.isna(lost["api_name"])
    assert not pd.isna(lost["small"]) and not lost["small"]  # its size is known


def test_static_managed_memset_counts_as_managed(tmp_path: Path) -> None:
    """A deliberate superset of cuda_memset_sync: memKind 6 (static managed) is managed."""
    path = rules_export(tmp_path / "rules.sqlite")
    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET memKind = 6 WHERE correlationId = 24")
    con.commit()
    con.close()
    rows = problem_copies(read_sqlite(path))
    assert 24 not in rule_rows(path, "sync_set")
    assert bool(rows.loc[rows["correlation"] == 24, "synchronous"].iloc[0])


# -- Kineto: independent sums over the JSON events -----------------------------------------

COPY_CATS = {"gpu_memcpy", "memcpy"}
SET_CATS = {"gpu_memset", "memset"}
DIRECTIONS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP")
NAME = re.compile(r"^Memcpy (\w+) \(([\w ]+) -> ([\w ]+)\)")


def kineto_events(name: str) -> list[dict[str, Any]]:
    path = fixtures_dir() / "kineto" / name
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    doc = json.loads(raw)
    return list(doc["traceEvents"] if isinstance(doc, dict) else doc)


@functools.cache
def kineto_copies(name: str) -> list[dict[str, Any]]:
    """Each memcpy / memset event as kind, host side, bytes, dur_ns and its API call name."""
    events = kineto_events(name)
    calls = {e.get("args", {}).get("correlation"): e["name"] for e in events
             if str(e.get("cat", "")).lower() in {"cuda_runtime", "runtime"}}
    out = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") != "X" or cat not in COPY_CATS | SET_CATS:
            continue
        m = NAME.match(e["name"])
        direction, src, dst = m.groups() if m else (e["args"].get("kind"), "", "")
        kind = "memset" if cat in SET_CATS else direction
        host = src if kind == "HtoD" else dst if kind == "DtoH" else ""
        out.append({"kind": kind if kind in (*DIRECTIONS, "memset") else "other",
                    "host": host.lower() if host in ("Pageable", "Pinned") else None,
                    "pageable_side": "Pageable" in (src, dst),
                    "bytes": e["args"].get("bytes"), "dur_ns": round(e["dur"] * 1000),
                    "api": calls.get(e["args"].get("correlation"))})
    return out


@pytest.mark.parametrize("name", KINETO)
def test_kineto_counts_and_bytes_per_kind_equal_the_json(name: str) -> None:
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # count, bytes, with bytes
    for c in kineto_copies(name):
        expected[c["kind"]][0] += 1
        if c["bytes"] is not None:
            expected[c["kind"]][1] += int(c["bytes"])
            expected[c["kind"]][2] += 1
    stats = copy_stats(load("kineto", name))
    got = stats.groupby("kind")[["count", "bytes"]].sum(min_count=1)
    assert sorted(got.index) == sorted(expected)
    for kind, (count, nbytes, known) in expected.items():
        assert got.at[kind, "count"] == count
        assert (pd.isna(got.at[kind, "bytes"]) if not known else got.at[kind, "bytes"] == nbytes)


@pytest.mark.parametrize("name", KINETO)
def test_kineto_median_bandwidth_equals_the_json(name: str) -> None:
    rates: dict[tuple[str, Any], list[float]] = defaultdict(list)
    for c in kineto_copies(name):
        if c["bytes"] is not None and c["dur_ns"] > 0:
            rates[c["kind"], c["host"]].append(c["bytes"] / c["dur_ns"] * 1e9)
    stats = copy_stats(load("kineto", name))
    for row in stats.itertuples():
        key = (row.kind, None if pd.isna(row.host_mem) else row.host_mem)
        if key in rates:
            assert row.median_bytes_per_s == pytest.approx(statistics.median(rates[key]),
                                                           rel=1e-3)
        else:
            assert np.isnan(row.median_bytes_per_s)


@pytest.mark.parametrize("name", KINETO)
def test_kineto_pageable_flags_equal_a_join_over_the_json(name: str) -> None:
    """cuda_memcpy_async on Kineto: `Pageable` in the event name, async memcpy call."""
    events = kineto_copies(name)
    expected = sum(c["pageable_side"] and c["kind"] != "memset" and c["api"] is not None
                   and re.match(r"(?i)^(cuda|hip)memcpy.*async", c["api"]) is not None
                   for c in events)
    rows = problem_copies(load("kineto", name))
    assert int(rows["pageable"].fillna(False).sum()) == expected


def test_alexnet_pageable_uploads_are_one_finding_at_the_copy_op() -> None:
    t = load("kineto", "a100_alexnet_sync_critical_path.json.gz")
    rows = problem_copies(t)
    pageable = rows[rows["pageable"].fillna(False)]
    assert len(pageable) == 16 and set(pageable["api_name"]) == {"cudaMemcpyAsync"}
    f = findings(t)
    assert f.loc[0, "advice"] == ADVICE["copy_pageable"] and f.loc[0, "count"] == 16
    assert f.loc[0, "lost_ns"] == pageable["exposed_share_ns"].sum()
    assert "16 pageable" in f.loc[0, "evidence"]


# -- every real fixture: shapes and the waterfall's copy time ------------------------------


@pytest.mark.parametrize("path", fixtures("nsys/*.sqlite") + fixtures("kineto/*.json*"),
                         ids=lambda p: p.name)
def test_exposed_shares_sum_to_the_copy_only_time(path: Path) -> None:
    """Per device, the shares add up to the time when copies ran and no kernel did."""
    t = load(path.parent.name, path.name)
    rows = problem_copies(t)
    assert list(rows.columns) == list(PROBLEM_COLUMNS) and len(rows) == len(t.copies)
    assert (rows["exposed_share_ns"] <= rows["exposed_ns"] + 1).all()
    for (rank, device), group in rows.groupby([rows["rank"].fillna(-1), rows["device"]]):
        k = t.kernels[(t.kernels["rank"].fillna(-1) == rank) & (t.kernels["device"] == device)]
        busy = intervals.union(k["start_ns"], k["end_ns"])
        copying = intervals.union(group["start_ns"], group["end_ns"])
        alone = intervals.total(copying) - int(intervals.overlap(*copying, busy).sum())
        assert abs(int(group["exposed_share_ns"].sum()) - alone) <= len(group)
    f = findings(t)
    assert list(f.columns) == list(COLUMNS) and (f["cause"] == "copy").all()
    assert (f["lost_ns"] > 0).all() and f["advice"].isin(list(ADVICE.values())).all()
    assert f["count"].sum() <= len(rows)


# -- exact answers on synthetic traces -------------------------------------------------------


def exposed(t: Trace) -> list[int]:
    return [int(v) for v in problem_copies(t)["exposed_ns"]]


def test_copy_alone_is_exposed_whole() -> None:
    assert exposed(trace(copies=[copy(100, 300)])) == [200]


def test_copy_under_a_kernel_is_hidden() -> None:
    t = trace(kernels=[kernel(0, 1000, stream=1)], copies=[copy(100, 300, stream=2)])
    assert exposed(t) == [0]


def test_half_overlapped_copy_is_half_exposed() -> None:
    t = trace(kernels=[kernel(0, 200, stream=1)], copies=[copy(100, 300, stream=2)])
    assert exposed(t) == [100]


def test_kernel_on_another_device_hides_nothing() -> None:
    t = trace(kernels=[kernel(0, 1000, device=1)],
              copies=[copy(100, 300, device=0), copy(100, 300, device=1)])
    assert exposed(t) == [200, 0]


def test_kernel_of_another_rank_hides_nothing() -> None:
    t = trace(kernels=[{**kernel(0, 1000), "rank": 1}],
              copies=[{**copy(100, 300), "rank": 0}, {**copy(100, 300), "rank": 1}])
    assert exposed(t) == [200, 0]


def test_concurrent_copies_share_their_exposed_time() -> None:
    t = trace(kernels=[kernel(140, 150)],
              copies=[copy(0, 100, "HtoD", stream=1), copy(50, 150, "DtoH", stream=2)])
    rows = problem_copies(t)
    assert rows["exposed_ns"].tolist() == [100, 90]
    assert rows["exposed_share_ns"].tolist() == [75, 65]  # [50,100) is split in two


def test_empty_trace_gives_empty_typed_frames() -> None:
    stats, rows, found = copy_stats(Trace()), problem_copies(Trace()), findings(Trace())
    assert len(stats) == len(rows) == len(found) == 0
    assert dict(stats.dtypes.astype(str)) == STATS_COLUMNS
    assert dict(rows.dtypes.astype(str)) == PROBLEM_COLUMNS
    assert list(found.columns) == list(COLUMNS)


def xfer(start: int, end: int, kind: str, nbytes: int, src: str | None, dst: str,
         **extra: Any) -> dict[str, Any]:
    """A copy row with both memory kinds; host_mem derived as the readers derive it."""
    host = src if kind == "HtoD" else dst if kind == "DtoH" else None
    return {**copy(start, end, kind, nbytes, host_mem=host if host in ("pageable", "pinned")
                   else None), "src_mem": src, "dst_mem": dst, **extra}


def test_without_api_table_flags_are_unknown_only_where_the_call_matters() -> None:
    t = trace(copies=[
        xfer(0, 100, "HtoD", MB, "pinned", "device"),
        xfer(200, 300, "HtoD", MB, "pageable", "device"),
        xfer(400, 500, "DtoD", 64, "device", "device"),
        xfer(600, 700, "HtoD", 1024, "pageable", "device"),
        xfer(800, 900, "memset", 256, None, "device"),
        xfer(1000, 1100, "memset", 256, None, "pinned"),
    ])
    rows = problem_copies(t)

    def values(col: str) -> list[Any]:
        return [None if pd.isna(v) else bool(v) for v in rows[col]]

    assert values("pageable") == [False, None, False, None, False, False]
    assert values("synchronous") == [None, None, False, False, False, None]
    assert values("small") == [False, False, True, True, False, False]
    assert rows["api_name"].isna().all() and rows["blocked_ns"].isna().all()
    f = findings(t)  # only what is known is reported: the two small copies
    assert f["advice"].tolist() == [ADVICE["copy_small"]] * 2
    assert set(f["where"]) == {"DtoD copy", "HtoD copy"}


def sync_trace() -> Trace:
    """cudaMemcpy DtoH [0, 1000) whose copy runs [600, 1000); a kernel ran [0, 500)."""
    ranges = pd.DataFrame([{"pid": 100, "tid": 100, "start_ns": 0, "end_ns": 2000,
                            "name": "train.py(42): step", "depth": 0, "source": "python"}])
    return trace(kernels=[kernel(0, 500, correlation=1)],
                 copies=[xfer(600, 1000, "DtoH", MB, "device", "pinned", correlation=2)],
                 api=[api_call(0, 5, correlation=1),
                      api_call(10, 1000, "cudaMemcpy", correlation=2)],
                 ranges=ranges)


def test_synchronous_copy_loses_exposed_time_plus_idle_host_block() -> None:
    t = sync_trace()
    row = problem_copies(t).iloc[0]
    assert bool(row["synchronous"]) and not bool(row["pageable"]) and not bool(row["small"])
    assert (row["exposed_ns"], row["blocked_ns"], row["idle_blocked_ns"]) == (400, 590, 100)
    assert row["where"] == "train.py:42 (step)" and row["api_name"] == "cudaMemcpy"
    f = findings(t, count_host_blocked=True)
    assert f.loc[0, ["lost_ns", "count", "where", "advice"]].tolist() == [
        500, 1, "train.py:42 (step)", ADVICE["copy_sync"]]
    # by default the idle host block is left to the sync findings (no double count)
    assert findings(t).loc[0, "lost_ns"] == 400
    assert "GPU idle 100 ns" in f.loc[0, "evidence"]
    assert findings(t, count_host_blocked=False).loc[0, "lost_ns"] == 400


def test_a_copy_with_several_problems_is_reported_once() -> None:
    t = trace(copies=[xfer(0, 100, "HtoD", 16, "pageable", "device", correlation=1)],
              api=[api_call(0, 50, "cudaMemcpyAsync", correlation=1)])
    row = problem_copies(t).iloc[0]
    assert bool(row["pageable"]) and bool(row["small"])
    f = findings(t)
    assert f["advice"].tolist() == [ADVICE["copy_pageable"]]
    assert f.loc[0, "where"] == "cudaMemcpyAsync (HtoD)"  # no frames: the call and kind


def test_small_threshold_is_a_keyword() -> None:
    t = trace(copies=[copy(0, 100, "DtoD", 100_000, host_mem=None)])
    assert not bool(problem_copies(t)["small"].iloc[0])
    assert bool(problem_copies(t, small_bytes=200_000)["small"].iloc[0])


def test_copy_stats_bandwidth_and_dram_share() -> None:
    devices = pd.DataFrame([{"device": 0, "name": "GPU", "vendor": "nvidia",
                             "mem_bandwidth_bytes_per_s": 2e12}])
    t = trace(copies=[
        copy(0, 100_000, "HtoD", MB, host_mem="pinned"),
        copy(200_000, 300_000, "HtoD", MB, host_mem="pinned"),
        copy(400_000, 500_000, "HtoD", 4 * MB, host_mem="pinned"),
        copy(600_000, 600_000, "HtoD", 8 * MB, host_mem="pinned"),  # 0 ns: no rate
        copy(700_000, 1_700_000, "DtoD", 1000 * MB, host_mem=None),
    ], devices=devices)
    stats = copy_stats(t).set_index("kind")
    h2d, d2d = stats.loc["HtoD"], stats.loc["DtoD"]
    assert (h2d["count"], h2d["bytes"], h2d["dur_ns"]) == (4, 14 * MB, 300_000)
    assert h2d["bytes_per_s"] == pytest.approx(2e10)  # 6 MB / 300 µs
    assert h2d["median_bytes_per_s"] == pytest.approx(1e10)
    assert pd.isna(h2d["peak_ref"]) and np.isnan(h2d["peak_share"])  # PCIe: no DRAM share
    assert d2d["bytes_per_s"] == pytest.approx(1e12) and d2d["peak_ref"] == "dram"
    assert d2d["peak_share"] == pytest.approx(1.0)  # read + write: 2 x 1 TB/s of 2 TB/s
