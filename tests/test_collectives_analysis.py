"""Collective analysis: bandwidth against nccl-tests, overlap against a hand computation on
the fixtures' own JSON, and exact arrival skew on synthetic multi-rank traces."""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.collectives import calls as C
from gpudiag.analyzers.collectives.skew import SKEW_COLUMNS, WAIT_COLUMNS
from gpudiag.analyzers.findings import ADVICE, COLUMNS
from gpudiag.trace import Trace
from tests.builders import kernel, trace
from tests.conftest import fixture, tool_missing

KINETO_NCCL = [
    "kineto/v100_rank1of2_nccl_profile_memory.json.gz",
    "kineto/a100_80gb_rank0of16_nccl_streamsync.json.gz",
    "kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz",
    "kineto/world128_sampled_rank0.json.gz",
    "kineto/world128_sampled_rank1.json.gz",
    "kineto/b200_rank0of8_nccl_allgather_pystack.json.gz",
]
WORLD128 = ["kineto/world128_sampled_rank0.json.gz", "kineto/world128_sampled_rank1.json.gz"]
MS = 1_000_000


# -- synthetic multi-rank traces --------------------------------------------------------------


def ranks_trace(calls: list[dict[str, Any]], compute: list[dict[str, Any]] | None = None,
                **meta: Any) -> Trace:
    """A Trace whose collectives are `calls` (rank, start, end, op, seq ... per row), each
    with its own NCCL kernel; `compute` adds plain kernels (rank, start, end)."""
    kernels, rows = [], []
    for i, c in enumerate(calls):
        r = c["rank"]
        kernels.append(kernel(c["start"], c["end"], "ncclDevKernel_AllReduce_RING_LL",
                              device=r, pid=100 + r, rank=r, stream=9))
        rows.append({"rank": r, "pid": 100 + r, "device": r, "stream": 9,
                     "start_ns": c["start"], "end_ns": c["end"], "op": c.get("op", "all_reduce"),
                     "bytes": c.get("bytes", 1 << 20), "dtype": "float",
                     "group_size": c.get("group_size", 3), "comm": c.get("comm", "0"),
                     "seq": c["seq"], "kernel_id": i, "name": "ncclDevKernel_AllReduce"})
    for c in compute or []:
        kernels.append(kernel(c["start"], c["end"], "gemm", device=c["rank"],
                              pid=100 + c["rank"], rank=c["rank"]))
    return trace(kernels=kernels, collectives=pd.DataFrame(rows), meta=meta)


def three_ranks() -> Trace:
    """Two all_reduces on 3 ranks; rank 2 is last in the first, rank 1 in the second."""
    starts = {0: (1_000, 50_000), 1: (1_400, 50_100), 2: (1_900, 49_000)}
    calls = [{"rank": r, "seq": s, "start": start, "end": (10_000, 60_000)[s]}
             for r, pair in starts.items() for s, start in enumerate(pair)]
    return ranks_trace(calls)


def test_three_ranks_exact_waits_and_last_rank() -> None:
    skew = C.arrival_skew(three_ranks())
    assert set(skew["matched_by"]) == {"seq"}
    first = skew[skew["seq"] == 0].set_index("rank")
    assert first["wait_ns"].to_dict() == {0: 900, 1: 500, 2: 0}
    assert set(first["last_rank"]) == {2}
    assert set(first["skew_ns"]) == {900}
    second = skew[skew["seq"] == 1].set_index("rank")
    assert second["wait_ns"].to_dict() == {0: 100, 1: 0, 2: 1_100}
    assert set(second["last_rank"]) == {1}
    assert set(second["skew_ns"]) == {1_100}
    assert not skew["clock_suspect"].any()
    assert (skew["ranks"] == 3).all()


def test_wait_intervals_are_the_waiting_head_of_each_kernel() -> None:
    waits = C.wait_intervals(three_ranks())
    assert list(waits.columns) == list(WAIT_COLUMNS)
    got = sorted(zip(waits["rank"], waits["kernel_id"], waits["start_ns"], waits["end_ns"],
                     strict=True))
    assert got == [(0, 0, 1_000, 1_900), (0, 1, 50_000, 50_100), (1, 2, 1_400, 1_900),
                   (2, 5, 49_000, 50_100)]


def test_wait_is_clipped_to_the_own_kernel() -> None:
    calls = [{"rank": 0, "seq": 0, "start": 0, "end": 500},   # ends before rank 1 starts
             {"rank": 1, "seq": 0, "start": 400, "end": 1_000}]
    skew = C.arrival_skew(ranks_trace(calls))
    assert skew.set_index("rank")["wait_ns"].to_dict() == {0: 400, 1: 0}
    calls[1]["start"] = 900
    skew = C.arrival_skew(ranks_trace(calls), match="seq")
    assert skew.set_index("rank")["wait_ns"].to_dict() == {0: 500, 1: 0}


def test_offset_clocks_are_flagged_not_reported_as_waiting() -> None:
    offset = 10_000 * MS  # rank 1's clock runs 10 s ahead
    calls = [{"rank": r, "seq": s, "start": s * 5_000 + r * offset, "end": s * 5_000 + 1_000
              + r * offset} for r in (0, 1) for s in range(4)]
    t = ranks_trace(calls)
    skew = C.arrival_skew(t)
    assert set(skew["matched_by"]) == {"seq"}
    assert skew["clock_suspect"].all()
    assert C.wait_intervals(t).empty
    assert not (C.findings(t, min_lost_ns=0)["cause"] == "comm_wait").any()


def test_missing_call_on_one_rank_falls_back_to_matching_by_end() -> None:
    # rank 0 recorded a call (seq 0) that rank 1's trace lacks: seq is off by one
    calls = [{"rank": 0, "seq": 0, "start": 0, "end": 1_000, "bytes": 64},
             {"rank": 0, "seq": 1, "start": 2_000, "end": 5_000},
             {"rank": 1, "seq": 0, "start": 2_600, "end": 5_010},
             {"rank": 0, "seq": 2, "start": 6_000, "end": 9_000, "op": "all_gather"},
             {"rank": 1, "seq": 1, "start": 6_200, "end": 9_000, "op": "all_gather"}]
    skew = C.arrival_skew(ranks_trace(calls))
    assert set(skew["matched_by"]) == {"end"}
    assert skew.groupby("match_id")["kernel_id"].apply(sorted).tolist() == [[1, 2], [3, 4]]
    assert skew.drop_duplicates("match_id")["skew_ns"].tolist() == [600, 200]
    assert set(skew["last_rank"]) == {1}


def test_one_rank_has_no_skew_and_no_error() -> None:
    t = ranks_trace([{"rank": 0, "seq": s, "start": s * 100, "end": s * 100 + 50}
                     for s in range(3)])
    skew = C.arrival_skew(t)
    assert skew.empty
    assert list(skew.columns) == list(SKEW_COLUMNS)
    assert C.wait_intervals(t).empty
    assert not (C.findings(t, min_lost_ns=0)["cause"] == "comm_wait").any()


def test_empty_trace_gives_empty_typed_frames() -> None:
    t = Trace()
    for frame, columns in ((C.arrival_skew(t), SKEW_COLUMNS), (C.wait_intervals(t), WAIT_COLUMNS),
                           (C.overlap(t), C.OVERLAP_COLUMNS)):
        assert frame.empty
        assert {c: str(d) for c, d in frame.dtypes.items()} == columns
    stats = C.collective_stats(t)
    assert stats.empty
    assert list(stats.columns) == [*C.STATS_BY, *C.STATS_COLUMNS]
    assert str(stats["busbw_gbps"].dtype) == "float64"
    f = C.findings(t)
    assert f.empty
    assert list(f.columns) == list(COLUMNS)


# -- bandwidth ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 4, 1.5), ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875),
    ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0), ("send_recv", 2, 1.0), ("barrier", 8, None),
])
def test_busbw_factor_per_op(op: str, n: int, factor: float | None) -> None:
    calls = [{"rank": 0, "seq": 0, "start": 0, "end": 1_000, "op": op, "bytes": 4_000,
              "group_size": n}]
    stats = C.collective_stats(ranks_trace(calls)).iloc[0]
    assert stats["algbw_gbps"] == pytest.approx(4.0)  # 4000 bytes / 1000 ns = 4 GB/s
    if factor is None:
        assert math.isnan(stats["busbw_gbps"])
    else:
        assert stats["busbw_gbps"] == pytest.approx(4.0 * factor)


def test_group_size_from_world_size_is_marked_assumed() -> None:
    calls = [{"rank": 0, "seq": 0, "start": 0, "end": 1_000, "bytes": 4_000, "group_size": None}]
    stats = C.collective_stats(ranks_trace(calls, world_size=4)).iloc[0]
    assert stats["group_size"] == 4
    assert stats["group_size_assumed"]
    assert stats["busbw_gbps"] == pytest.approx(6.0)
    bare = C.collective_stats(ranks_trace(calls, world_size=4), assume_world=False).iloc[0]
    assert math.isnan(bare["busbw_gbps"])


def _log_rows(path: Path) -> list[tuple[int, float, float, float, float]]:
    """(size, out-of-place time µs, algbw, busbw, half a unit of the time's last printed
    digit) read from the log's own table: the oracle."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 10 or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        time, algbw, busbw = [p for p in parts[3:] if re.fullmatch(r"\d+(\.\d+)?", p)][:3]
        digits = len(time.split(".")[1]) if "." in time else 0
        rows.append((int(parts[0]), float(time), float(algbw), float(busbw), 0.5 * 10**-digits))
    return rows


@pytest.mark.parametrize("log", ["nccl/a100x8_allreduce_superbench.log",
                                 "nccl/a100x8_alltoall_superbench.log"])
def test_busbw_equals_the_nccl_tests_log(log: str) -> None:
    path = fixture(log)
    stats = C.collective_stats(gpudiag.load(path), by=(*C.STATS_BY, "name"))
    stats = stats[stats["name"].str.endswith("out-of-place")].set_index("bytes")
    rows = _log_rows(path)
    assert len(rows) >= 30
    for size, time_us, algbw, busbw, half_ulp in rows:
        # the log rounds time (to `half_ulp` µs) and busbw (to 0.005 GB/s)
        tolerance = 0.005 + busbw * half_ulp / time_us + 1e-9
        assert stats.loc[size, "busbw_gbps"] == pytest.approx(busbw, abs=tolerance)
        assert stats.loc[size, "algbw_gbps"] == pytest.approx(algbw, abs=tolerance)


def test_slow_collective_is_found_with_its_lost_time() -> None:
    big = 64 << 20
    calls = [{"rank": 0, "seq": s, "start": s * 10 * MS, "end": s * 10 * MS + MS, "bytes": big,
              "group_size": 2} for s in range(5)]
    calls[3]["end"] = calls[3]["start"] + 8 * MS  # 8x slower than its peers
    f = C.findings(ranks_trace(calls))
    slow = f[f["where"].str.startswith("slow")]
    assert len(slow) == 1
    assert slow["count"].iloc[0] == 1
    assert slow["lost_ns"].iloc[0] == 7 * MS  # 8 ms taken, 1 ms at the median bandwidth
    assert slow["cause"].iloc[0] == "comm"


# -- overlap ------------------------------------------------------------------------------------


def test_overlap_three_definitions_exact() -> None:
    # comm [0,100) on two streams [0,60) and [40,100); compute [50,150)
    calls = [{"rank": 0, "seq": 0, "start": 0, "end": 60}, {"rank": 0, "seq": 1, "start": 40,
                                                             "end": 100}]
    t = ranks_trace(calls, compute=[{"rank": 0, "start": 50, "end": 150}])
    ov = C.overlap(t).iloc[0]
    assert (ov["comm_ns"], ov["compute_ns"], ov["overlap_ns"]) == (100, 100, 50)
    assert ov["exposed_comm_ns"] == 50
    assert ov["overlap_of_comm"] == pytest.approx(0.5)
    # nsys: per kernel 10 of 60 and 50 of 60 covered by compute -> 60 / 120
    assert (ov["comm_kernel_ns"], ov["comm_kernel_overlap_ns"]) == (120, 60)
    assert ov["overlap_of_comm_kernel_ns"] == pytest.approx(0.5)
    assert ov["step_source"] == "gpu_window"
    assert ov["step_ns"] == 150
    assert ov["overlap_of_step"] == pytest.approx(50 / 150)


def test_overlap_of_step_uses_step_ranges_extended_by_their_kernels() -> None:
    calls = [{"rank": 0, "seq": 0, "start": 1_000, "end": 1_100}]
    t = ranks_trace(calls, compute=[{"rank": 0, "start": 1_050, "end": 1_500}])
    t.kernels["correlation"] = pd.array([1, 2], dtype="Int64")
    t.api = pd.DataFrame({"rank": [0, 0], "pid": [100, 100], "tid": [1, 1],
                          "start_ns": [100, 200], "end_ns": [110, 210],
                          "name": ["cudaLaunchKernel"] * 2, "correlation": [1, 2]})
    t.ranges = pd.DataFrame({"rank": [0], "pid": [100], "tid": [1], "start_ns": [0],
                             "end_ns": [800], "name": ["ProfilerStep#1"], "source": ["step"]})
    ov = C.overlap(t).iloc[0]
    assert ov["step_source"] == "steps"
    assert ov["step_ns"] == 1_500  # the host step ends at 800, its last kernel at 1500
    assert ov["overlap_of_step"] == pytest.approx(50 / 1_500)


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as f:
        return json.load(f)["traceEvents"]  # type: ignore[no-any-return]


def _ns(us: float) -> int:
    """µs -> ns the way the reader converts (integer part split off, then rounded)."""
    whole = math.floor(us)
    return whole * 1000 + round((us - whole) * 1000)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _inside(s: int, e: int, merged: list[tuple[int, int]], starts: list[int]) -> int:
    i, total = max(bisect.bisect_right(starts, s) - 1, 0), 0
    while i < len(merged) and merged[i][0] < e:
        total += max(0, min(e, merged[i][1]) - max(s, merged[i][0]))
        i += 1
    return total


def _by_hand(path: Path) -> dict[int, dict[str, int]]:
    """Per device, from the fixture's own JSON: comm = kernels named nccl*, compute = other
    kernels; merged by sorting; overlap by walking the merged lists."""
    spans: dict[int, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for ev in _events(path):
        if ev.get("cat") == "kernel" and ev.get("ph") == "X":
            start = _ns(ev["ts"])
            side = "comm" if "nccl" in ev["name"].lower() else "compute"
            spans[ev["args"]["device"]][side].append((start, start + _ns(ev["dur"])))
    out = {}
    for device, sides in spans.items():
        if not sides["comm"]:
            continue
        comm, compute = _merge(sides["comm"]), _merge(sides["compute"])
        starts = [s for s, _ in compute]
        out[device] = {
            "comm_ns": sum(e - s for s, e in comm),
            "compute_ns": sum(e - s for s, e in compute),
            "overlap_ns": sum(_inside(s, e, compute, starts) for s, e in comm),
            "comm_kernel_overlap_ns": sum(_inside(s, e, compute, starts)
                                          for s, e in sides["comm"]),
        }
    return out


@pytest.mark.parametrize("name", KINETO_NCCL)
def test_overlap_equals_a_hand_computation_on_the_fixture(name: str) -> None:
    path = fixture(name)
    expected = _by_hand(path)
    ov = C.overlap(gpudiag.load(path)).set_index("device")
    assert set(ov.index) == set(expected)
    for device, numbers in expected.items():
        row = ov.loc[device]
        assert {k: int(row[k]) for k in numbers} == numbers
        assert row["overlap_of_comm"] == pytest.approx(numbers["overlap_ns"] / numbers["comm_ns"])
        assert row["exposed_comm_ns"] == numbers["comm_ns"] - numbers["overlap_ns"]
        assert 0 <= row["overlap_of_step"] <= row["overlap_of_comm"] <= 1


def test_exposed_comm_findings_add_up_to_the_overlap_table() -> None:
    # one NCCL stream: per-call exposure sums to the union-based exposed time
    t = gpudiag.load(fixture("kineto/a100_rank0of2_nccl_eventsync_annotations.json.gz"))
    f = C.findings(t, min_lost_ns=0)
    exposed = f[(f["cause"] == "comm") & ~f["where"].str.startswith("slow")]
    assert exposed["lost_ns"].sum() == C.overlap(t)["exposed_comm_ns"].sum()
    assert set(exposed["advice"]) == {ADVICE["comm_exposed"]}


def test_findings_name_the_python_call_site_when_the_trace_has_stacks() -> None:
    t = gpudiag.load(fixture("kineto/b200_rank0of8_nccl_allgather_pystack.json.gz"))
    where = C.findings(t, min_lost_ns=0)["where"].iloc[0]
    assert where.startswith("all_gather on process group 3 at ")
    assert re.search(r"\.py:\d+ \(", where)


# -- the world128 pair: two ranks of one job ------------------------------------------------------


def test_world128_pair_is_matched_by_end_and_rank1_arrives_last() -> None:
    t = gpudiag.load([fixture(n) for n in WORLD128])
    skew = C.arrival_skew(t)
    assert set(skew["matched_by"]) == {"end"}  # seq is off by one: the files were sampled
    per_call = skew.drop_duplicates("match_id")
    assert per_call["op"].tolist() == ["all_to_all", "all_reduce", "all_gather", "all_reduce",
                                       "all_gather"]
    assert per_call["skew_ns"].tolist() == [4_859_000, 3_302_000, 84_000, 22_328_000,
                                            1_292_000]
    assert set(skew["last_rank"]) == {1}
    assert not skew["clock_suspect"].any()
    assert (skew.groupby("match_id")["end_ns"].agg(lambda e: e.max() - e.min()) < MS).all()
    waits = C.wait_intervals(t)
    assert set(waits["rank"]) == {0}
    assert (waits["end_ns"] - waits["start_ns"]).sum() == per_call["skew_ns"].sum()


def test_world128_comm_wait_findings_blame_rank1() -> None:
    t = gpudiag.load([fixture(n) for n in WORLD128])
    f = C.findings(t)
    wait = f[f["cause"] == "comm_wait"]
    assert len(wait) == 3
    assert wait["where"].str.contains("rank 1 arrives last").all()
    assert set(wait["advice"]) == {ADVICE["comm_wait"]}
    assert wait["lost_ns"].sum() <= C.wait_intervals(t).pipe(
        lambda w: (w.end_ns - w.start_ns).sum())


# -- HTA as the oracle of overlap_of_comm ---------------------------------------------------------

HTA_OVERLAP = """
import json, logging, os, shutil, sys, tempfile, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # float µs: compare with our exact ns
from hta.common.trace import Trace
Trace._filter_irrelevant_gpu_kernels = lambda self, *a, **k: None  # keep the last step
from hta.trace_analysis import TraceAnalysis
out = {}
for path in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(path, folder)
        frame = TraceAnalysis(trace_dir=folder).get_comm_comp_overlap(visualize=False)
        out[os.path.basename(path)] = frame.to_dict("records")
print(json.dumps(out))
"""


@pytest.mark.slow
def test_overlap_of_comm_equals_hta_comp_comm_overlap() -> None:
    from tests.oracle_runs import INSTALL, hta_python

    python = hta_python()
    if python is None:
        tool_missing(f"Holistic Trace Analysis not found; to run the oracle: {INSTALL}")
    paths = [fixture(n) for n in KINETO_NCCL]
    done = subprocess.run([python, "-c", HTA_OVERLAP, *map(str, paths)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for path in paths:
        ours = C.overlap(gpudiag.load(path)).set_index("rank")["overlap_of_comm"]
        for row in theirs[path.name]:  # HTA rounds the percentage to 2 places
            assert 100 * ours[row["rank"]] == pytest.approx(row["comp_comm_overlap_pctg"],
                                                            abs=0.005 + 1e-9)
