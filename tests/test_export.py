"""Exports: the Chrome/Perfetto trace (events, idle causes, findings) and CSV/Parquet tables."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpudiag
from gpudiag import intervals
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.errors import InputError
from gpudiag.reports.export import (
    chrome_trace_chunks,
    to_chrome_trace,
    write_chrome_trace,
    write_tables,
)
from gpudiag.trace import Trace
from tests import builders as b
from tests.conftest import ROOT, fixture

ALEXNET = "kineto/a100_alexnet_sync_critical_path.json.gz"
IDLE_CAUSES = ("sync_stall", "launch_bound", "host_bound")


@pytest.fixture(scope="module")
def alexnet() -> tuple[Trace, Diagnosis]:
    trace = gpudiag.load(fixture(ALEXNET))
    return trace, gpudiag.diagnose(trace)


def read(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return dict(json.load(f))


def slices(doc: dict[str, Any], cat: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == cat and e["ph"] == "X"]


def ns(doc: dict[str, Any], us: float) -> int:
    """A `ts` back in absolute ns: the file keeps ns exact relative to its base."""
    return int(doc["baseTimeNanoseconds"]) + round(us * 1000)


def names(doc: dict[str, Any], kind: str) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == kind}


# -- Chrome trace ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace.json.gz", "trace.json"])
def test_kernel_slices_equal_the_kernels_table_to_the_ns(alexnet, tmp_path, name):
    trace, dx = alexnet
    doc = read(write_chrome_trace(trace, tmp_path / name, dx))
    kernels = slices(doc, "kernel")
    assert len(kernels) == len(trace.kernels)
    got = sorted((ns(doc, e["ts"]), ns(doc, e["ts"]) + round(e["dur"] * 1000)) for e in kernels)
    want = sorted(zip(trace.kernels["start_ns"].tolist(), trace.kernels["end_ns"].tolist(),
                      strict=True))
    assert got == want
    assert len(slices(doc, "gpu_memcpy")) == len(trace.copies)
    assert len(slices(doc, "cuda_runtime")) == len(trace.api)
    assert len(slices(doc, "sync")) == len(trace.syncs)
    assert len(slices(doc, "range")) == len(trace.ranges)


def test_the_projects_own_reader_reads_the_export_back_exactly(alexnet, tmp_path):
    trace, dx = alexnet
    again = gpudiag.load(write_chrome_trace(trace, tmp_path / "t.json.gz", dx))
    for table in ("kernels", "copies"):
        old = getattr(trace, table).sort_values(["start_ns", "end_ns"])
        new = getattr(again, table).sort_values(["start_ns", "end_ns"])
        assert new["start_ns"].tolist() == old["start_ns"].tolist()
        assert new["end_ns"].tolist() == old["end_ns"].tolist()


def test_tracks_are_named_by_rank_device_stream_and_host_thread(alexnet, tmp_path):
    trace, dx = alexnet
    doc = to_chrome_trace(trace, dx)
    processes = set(names(doc, "process_name").values())
    threads = set(names(doc, "thread_name").values())
    assert "rank 0 / device 0" in processes
    assert {f"stream {s}" for s in trace.kernels["stream"].unique()} <= threads
    assert {f"thread {t}" for t in trace.api["tid"].unique()} <= threads
    assert {"gpudiag: idle causes", "gpudiag: findings"} <= threads
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tracks <= set(names(doc, "thread_name"))  # every slice sits on a named track


def test_idle_cause_slices_tile_each_devices_idle_time(alexnet):
    trace, dx = alexnet
    doc = to_chrome_trace(trace, dx)
    idle = slices(doc, "gpudiag.idle")
    device_of = {pid: name for (pid, _), name in names(doc, "process_name").items()}
    k, c = trace.kernels, trace.copies
    busy = intervals.union(np.concatenate([k["start_ns"], c["start_ns"]]),
                           np.concatenate([k["end_ns"], c["end_ns"]]))
    window = int(busy[1][-1] - busy[0][0])
    idle_ns = sum(round(e["dur"] * 1000) for e in idle)
    assert {device_of[e["pid"]] for e in idle} == {"rank 0 / device 0"}
    assert idle_ns == window - int((busy[1] - busy[0]).sum())
    by_cause = Counter[str]()
    for e in idle:
        by_cause[e["name"]] += round(e["dur"] * 1000)
    lost = dx.losses.set_index("cause")["lost_ns"]
    for cause in IDLE_CAUSES:
        assert by_cause[cause] == lost[cause], cause
    assert by_cause["copy"] <= lost["copy"]  # the rest of copy is busy, exposed transfer
    starts = sorted((ns(doc, e["ts"]), ns(doc, e["ts"]) + round(e["dur"] * 1000)) for e in idle)
    assert all(a[1] <= b_[0] for a, b_ in pairwise(starts))  # disjoint


def test_idle_slices_carry_rule_and_the_findings_advice(alexnet):
    trace, dx = alexnet
    doc = to_chrome_trace(trace, dx)
    idle = slices(doc, "gpudiag.idle")
    assert all(e["args"]["rule"] and e["args"]["advice"] for e in idle)
    # the top finding of idle time (the alexnet's first is a copy; warm-up ones rank last)
    rank = int(np.flatnonzero(dx.findings["cause"].isin(IDLE_CAUSES))[0])
    top = dx.findings.iloc[rank]
    named = [e for e in idle if e["args"].get("finding") == rank + 1]
    assert named and all(e["name"] == top["cause"] and e["args"]["where"] == top["where"]
                         and e["args"]["advice"] == top["advice"] for e in named)


def test_top_findings_are_marked_where_they_happen_or_as_instants(alexnet):
    trace, dx = alexnet
    doc = to_chrome_trace(trace, dx, top=10)
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "gpudiag.finding"]
    labels = {e["name"].split(" ")[0] for e in marks}
    assert labels == {f"#{i}" for i in range(1, min(10, len(dx.findings)) + 1)}
    rank = int(np.flatnonzero(dx.findings["cause"].isin(IDLE_CAUSES))[0])  # idle: has slices
    first = [e for e in marks if e["name"].startswith(f"#{rank + 1} ")]
    assert first[0]["ph"] == "X" and first[0]["args"]["advice"] == dx.findings["advice"][rank]
    assert all(e["ph"] == "X" or e.get("s") == "g" for e in marks)
    assert doc["otherData"]["gpudiag"]["findings"][0]["cause"] == dx.findings["cause"][0]


def test_strings_with_markup_quotes_and_unicode_survive(tmp_path):
    weird = '<script>alert("x")</script> \\ ünïcødé — 核 \'q\''
    trace = b.trace(kernels=[b.kernel(1_000, 2_000, weird), b.kernel(3_000, 4_500, "k")])
    for name in ("w.json", "w.json.gz"):
        doc = read(write_chrome_trace(trace, tmp_path / name))
        assert [e["name"] for e in slices(doc, "kernel")] == [weird, "k"]
    assert slices(to_chrome_trace(trace), "kernel")[0]["name"] == weird


def test_chunks_do_not_change_the_events(alexnet):
    """Only an arg that is null in a whole chunk is left out: smaller chunks drop more."""
    trace, dx = alexnet

    def events(chunk_rows: int) -> list[str]:
        doc = json.loads(b"".join(chrome_trace_chunks(trace, dx, chunk_rows=chunk_rows)))
        return sorted(json.dumps({**e, "args": {k: v for k, v in e.get("args", {}).items()
                                                if v is not None}}, sort_keys=True)
                      for e in doc["traceEvents"])

    assert events(7) == events(100_000)


def test_epoch_times_keep_ns_precision():
    t0 = 1_695_835_572_943_625_123  # epoch ns: as µs floats these would lose 1/4 µs
    trace = b.trace(kernels=[b.kernel(t0, t0 + 1_001), b.kernel(t0 + 86_400 * 10**9 + 7,
                                                                  t0 + 86_400 * 10**9 + 8)])
    doc = to_chrome_trace(trace)
    got = [(ns(doc, e["ts"]), round(e["dur"] * 1000)) for e in slices(doc, "kernel")]
    assert got == [(t0, 1_001), (t0 + 86_400 * 10**9 + 7, 1)]


def test_an_empty_trace_is_a_valid_empty_chrome_trace(tmp_path):
    doc = read(write_chrome_trace(Trace(), tmp_path / "e.json"))
    assert doc["traceEvents"] == []


def test_an_unwritable_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=r"cannot be written: its folder .* does not exist"):
        write_chrome_trace(Trace(), tmp_path / "missing" / "t.json")


LARGE = """
import resource, sys, time
import numpy as np, pandas as pd
import gpudiag
from gpudiag.reports.export import write_chrome_trace
n = 1_000_000
start = 1_700_000_000_000_000_000 + np.arange(n, dtype=np.int64) * 2_003
trace = gpudiag.Trace(kernels=pd.DataFrame({
    "pid": 1, "device": np.arange(n) % 2, "stream": 7 + np.arange(n) % 4,
    "start_ns": start, "end_ns": start + 1_001, "kernel_id": np.arange(n),
    "name": pd.Categorical.from_codes(np.arange(n) % 50, [f"k{i}<float>" for i in range(50)]),
    "correlation": np.arange(n), "grid_x": 128, "block_x": 256}))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
write_chrome_trace(trace, sys.argv[1], chunk_rows=20_000)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.slow
def test_a_million_kernels_stream_in_bounded_memory(tmp_path):
    out = tmp_path / "big.json.gz"
    run = subprocess.run([sys.executable, "-c", LARGE, str(out)], capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    seconds, grown_kb = map(float, run.stdout.split())
    # one list of a million events would take ~1.6 GB; a 20k-row chunk takes ~35 MB
    assert grown_kb < 150_000, f"peak RSS grew {grown_kb / 1e3:.0f} MB while writing"
    assert seconds < 30
    again = gpudiag.load(out)
    assert len(again.kernels) == 1_000_000
    assert int(again.kernels["start_ns"].min()) == 1_700_000_000_000_000_000
    assert int(again.kernels["end_ns"].max()) == 1_700_000_000_000_000_000 + 999_999 * 2_003 \
        + 1_001


# -- tables ----------------------------------------------------------------------------------


def as_strings(frame: pd.DataFrame) -> pd.DataFrame:
    """What CSV keeps of a table: each value's text, NA as an empty field."""
    out = frame.astype(object).where(frame.notna(), "")
    return out.astype(str).reset_index(drop=True)


def test_csv_round_trip_equals_the_tables(alexnet, tmp_path):
    trace, dx = alexnet
    written = write_tables(trace, tmp_path, "csv", dx=dx)
    assert {"kernels", "losses", "findings", "idle_gaps", "sync_points"} <= set(written)
    frames = {**trace.tables(), "losses": dx.losses, "findings": dx.findings, **dx.tables}
    for name, frame in frames.items():
        back = pd.read_csv(written[name], dtype=str, keep_default_na=False)
        assert list(back.columns) == list(frame.columns), name
        pd.testing.assert_frame_equal(back, as_strings(frame), obj=name)


def test_parquet_round_trip_equals_the_tables(alexnet, tmp_path):
    trace, dx = alexnet
    written = write_tables(trace, tmp_path, "parquet", dx=dx)
    frames = {**trace.tables(), "losses": dx.losses, "findings": dx.findings, **dx.tables}
    for name, frame in frames.items():
        back = pd.read_parquet(written[name])
        cats = [c for c in frame.columns if isinstance(frame[c].dtype, pd.CategoricalDtype)
                or frame[c].dtype == object]
        pd.testing.assert_frame_equal(back.astype({c: "string" for c in cats}),
                                      frame.astype({c: "string" for c in cats})
                                      .reset_index(drop=True), obj=name)


def test_tables_writes_only_the_named_tables(alexnet, tmp_path):
    trace, dx = alexnet
    written = write_tables(trace, tmp_path, tables=["kernels", "findings"], dx=dx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["findings.csv", "kernels.csv"]
    assert set(written) == {"kernels", "findings"}


def test_unknown_table_or_format_is_an_input_error(alexnet, tmp_path):
    trace, _ = alexnet
    with pytest.raises(InputError, match="choose from"):
        write_tables(trace, tmp_path, tables=["nope"])
    with pytest.raises(InputError, match="csv or parquet"):
        write_tables(trace, tmp_path, fmt="xlsx")
