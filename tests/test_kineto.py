"""Kineto (PyTorch profiler) traces: real fixtures against independent JSON counts, and
synthetic traces with exact answers."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpudiag
from tests.builders import KinetoTrace
from tests.conftest import fixture, fixtures

KINETO = [p.name for p in fixtures("kineto/*")] or ["(shared fixtures absent)"]
KERNEL = {"kernel", "Kernel"}
COPY = {"gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
API = {"cuda_runtime", "Runtime", "cuda_driver", "Driver"}
RANGES = {"cpu_op", "Operator", "user_annotation", "python_function", "gpu_user_annotation"}


def raw_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc, doc["traceEvents"]


def count(events: list[dict[str, Any]], cats: set[str]) -> int:
    return sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in cats)


@pytest.mark.parametrize("name", KINETO)
def test_fixture_tables_match_an_independent_count_of_the_json(name: str) -> None:
    path = fixture(f"kineto/{name}")
    doc, events = raw_events(path)
    trace = gpudiag.load(path)
    trace.validate()
    assert len(trace.kernels) == count(events, KERNEL)
    assert len(trace.copies) == count(events, COPY)
    assert len(trace.api) == count(events, API)
    assert len(trace.syncs) == count(events, {"cuda_sync"})
    assert len(trace.ranges) == count(events, RANGES)
    assert len(trace.memory) == sum(1 for e in events if e.get("name") == "[memory]")
    assert len(trace.devices) == len(doc.get("deviceProperties", []))
    nccl = [e for e in events if e.get("cat") in KERNEL and "nccl" in e["name"].lower()]
    assert len(trace.collectives) == len(nccl)
    kernel_us = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL)
    kernel_ns = int((trace.kernels["end_ns"] - trace.kernels["start_ns"]).sum())
    assert kernel_ns == pytest.approx(kernel_us * 1000, abs=len(trace.kernels))


@pytest.mark.parametrize("name", KINETO)
def test_fixture_kernels_keep_their_launch_configuration(name: str) -> None:
    path = fixture(f"kineto/{name}")
    _, events = raw_events(path)
    grids = Counter(tuple(e["args"]["grid"]) for e in events
                    if e.get("cat") in KERNEL and "grid" in e.get("args", {}))
    trace = gpudiag.load(path)
    ours = Counter(zip(trace.kernels["grid_x"].dropna().astype(int),
                       trace.kernels["grid_y"].dropna().astype(int),
                       trace.kernels["grid_z"].dropna().astype(int), strict=True))
    assert ours == grids


def test_legacy_2021_schema_reads_capitalised_categories() -> None:
    trace = gpudiag.load(fixture("kineto/v100_resnet50_legacy2021_schema.pt.trace.json.gz"))
    assert len(trace.kernels) == 8772
    assert trace.kernels["stream"].notna().all()  # tid is "stream 7": the args carry it
    assert trace.kernels["external_id"].notna().all()  # lower-case "external id"
    assert (trace.copies["host_mem"] == "pageable").sum() > 0
    assert set(trace.ranges["source"]) == {"torch_op"}
    devices = Counter(trace.memory["device"].astype(int))
    assert devices == {-1: 4618, 0: 8220}  # Device Type 0 (CPU) is host memory: device -1


def test_kernels_are_attributed_to_the_host_process_through_correlation() -> None:
    trace = gpudiag.load(fixture("kineto/v100_rank1of2_nccl_profile_memory.json.gz"))
    assert trace.kernels["pid"].notna().all()
    assert set(trace.kernels["pid"]) == {783658}
    assert set(trace.kernels["device"]) == {1}
    assert trace.meta["rank"] == 1 and set(trace.kernels["rank"]) == {1}


def test_collective_arguments_are_read_from_the_nccl_kernel() -> None:
    trace = gpudiag.load(fixture("kineto/b200_rank0of8_nccl_allgather_pystack.json.gz"))
    row = trace.collectives.iloc[0]
    assert row["op"] == "all_gather"
    assert row["bytes"] == 201088 * 2  # out msg nelems x bf16
    assert row["group_size"] == 8 and row["comm"] == "3" and row["dtype"] == "BFloat16"


def test_collectives_without_args_take_size_from_the_enclosing_annotation() -> None:
    path = fixture("kineto/world128_sampled_rank0.json.gz")
    _, events = raw_events(path)
    annotations = Counter(e["name"] for e in events if e.get("name", "").startswith("nccl:"))
    trace = gpudiag.load(path)
    # the kernels are all ncclKernel_SendRecv: the op comes from the annotation around the launch
    assert Counter(trace.collectives["op"].astype(str)) == {
        "all_to_all": annotations["nccl:all_to_all"],
        "all_reduce": annotations["nccl:all_reduce"],
        "all_gather": annotations["nccl:_all_gather_base"],
    }
    reduces = trace.collectives[trace.collectives["op"] == "all_reduce"]
    assert (reduces["bytes"] == 19618307 * 4).any()  # Input Dims [[19618307]], float


def test_cpu_only_and_rocm_traces_load(tmp_path: Path) -> None:
    kt = KinetoTrace()
    kt.op("aten::add", ts=10, dur=5)
    cpu_only = gpudiag.load(kt.write(tmp_path / "cpu.json"))
    assert len(cpu_only.ranges) == 1 and not cpu_only.has_gpu_activity()
    rocm = gpudiag.load(fixture("kineto/mi250_rocm_minitoy_nonnvidia.json.gz"))
    assert rocm.meta["vendor"] == "amd"
    assert len(rocm.kernels) == 14 and rocm.kernels["stream"].notna().all()


def test_python_stack_depth_is_deeper_than_the_python_parent() -> None:
    path = fixture("kineto/b200_rank0of8_nccl_allgather_pystack.json.gz")
    _, events = raw_events(path)
    python = [e for e in events if e.get("cat") == "python_function"]
    trace = gpudiag.load(path)
    rows = trace.ranges[trace.ranges["source"] == "python"]
    assert len(rows) == len(python) == 15230
    keys = zip(rows["name"].astype(str), rows["start_ns"], rows["end_ns"], strict=True)
    depth = dict(zip(keys, rows["depth"], strict=True))
    base = int(raw_events(path)[0]["baseTimeNanoseconds"])

    def key(e: dict[str, Any]) -> tuple[str, int, int]:
        start = base + round(e["ts"] * 1000)
        return e["name"], start, start + round(e["dur"] * 1000)

    by_id = {e["args"]["Python id"]: e for e in python}
    pairs = [(by_id[e["args"]["Python parent id"]], e) for e in python
             if e["args"].get("Python parent id") in by_id]
    assert len(pairs) > 10000
    assert all(depth[key(child)] > depth[key(parent)] for parent, child in pairs)


# -- synthetic, exact ---------------------------------------------------------------------


def synthetic(tmp_path: Path) -> Path:
    kt = KinetoTrace()
    kt.annotation("ProfilerStep#1", ts=0, dur=1000)
    kt.op("aten::mm", ts=10, dur=40, external_id=7)
    c1 = kt.launch(ts=20, dur=10)
    kt.kernel("void gemm<float>(float*)", ts=35, dur=200.5, correlation=c1, grid=(64, 2, 1))
    c2 = kt.runtime("cudaMemcpyAsync", ts=60, dur=5)
    kt.memcpy("DtoH", "Device", "Pinned", ts=240, dur=10, correlation=c2, nbytes=4096)
    c3 = kt.runtime("cudaStreamSynchronize", ts=70, dur=185)
    kt.cuda_sync("Stream Sync", ts=70, dur=185, correlation=c3, stream=7)
    c4 = kt.runtime("cudaMemsetAsync", ts=300, dur=3)
    kt.memset(ts=310, dur=1, correlation=c4, nbytes=128)
    kt.memory(ts=15, nbytes=4096, addr=0x7F00, allocated=4096, reserved=2 << 20)
    kt.memory(ts=400, nbytes=-4096, addr=0x7F00, allocated=0, reserved=2 << 20)
    kt.header["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    kt.header["distributedInfo"] = {"rank": 2, "world_size": 4, "backend": "nccl"}
    return kt.write(tmp_path / "synthetic.pt.trace.json.gz")


def test_synthetic_trace_gives_exact_tables(tmp_path: Path) -> None:
    trace = gpudiag.load(synthetic(tmp_path))
    trace.validate()
    base = 1_700_000_000_000_000_000
    k = trace.kernels.iloc[0]
    assert (k["start_ns"], k["end_ns"]) == (base + 35_000, base + 235_500)
    assert (k["grid_x"], k["grid_y"], k["block_x"], k["pid"], k["rank"]) == (64, 2, 128, 1000, 2)
    copies = trace.copies.set_index("kind", drop=False)
    assert copies.loc["DtoH", "host_mem"] == "pinned" and copies.loc["DtoH", "bytes"] == 4096
    assert copies.loc["memset", "dst_mem"] == "device"
    sync = trace.syncs.iloc[0]
    assert (sync["kind"], sync["stream"], sync["tid"]) == ("stream", 7, 1000)
    assert list(trace.api["name"].astype(str)) == [
        "cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMemsetAsync"]
    assert trace.ranges.set_index("name").loc["ProfilerStep#1", "source"] == "step"
    assert trace.ranges.set_index("name").loc["aten::mm", "depth"] == 1
    assert trace.memory["delta_bytes"].tolist() == [4096, -4096]
    assert trace.memory["action"].astype(str).tolist() == ["alloc", "free"]
    assert trace.devices.iloc[0]["max_blocks_per_sm"] == 32  # filled from CC 9.0


def test_microsecond_floats_become_exact_nanoseconds(tmp_path: Path) -> None:
    kt = KinetoTrace()
    c = kt.launch(ts=1365627862757.064, dur=1.5)
    kt.kernel("k", ts=1365627866520.196, dur=2.08, correlation=c)
    trace = gpudiag.load(kt.write(tmp_path / "t.json"))
    assert trace.kernels["start_ns"].iloc[0] == 1365627866520196
    assert trace.kernels["end_ns"].iloc[0] == 1365627866522276
    assert trace.api["start_ns"].iloc[0] == 1365627862757064


def test_negative_durations_are_clipped_and_counted(tmp_path: Path) -> None:
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel("k", ts=20, dur=-3, correlation=c)
    trace = gpudiag.load(kt.write(tmp_path / "t.json"))
    assert np.all(trace.kernels["end_ns"] >= trace.kernels["start_ns"])
    assert trace.meta["warnings"]["events with negative duration clipped to 0"] == 1


def test_odd_arg_types_fall_back_without_failing(tmp_path: Path) -> None:
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel("k", ts=20, dur=5, correlation=c, stream="0x1f")
    kt.events[-1]["args"]["device"] = [0]  # not a number: must not break the reader
    trace = gpudiag.load(kt.write(tmp_path / "t.json"))
    assert trace.kernels["stream"].iloc[0] == 0x1F
    assert trace.kernels["device"].iloc[0] == 0  # falls back to the event's pid (the GPU)


def test_bare_quotes_kineto_left_in_names_are_repaired_and_counted(tmp_path: Path) -> None:
    """torch.profiler with_stack writes Python function names unescaped (a real case:
    pyarrow's `core.py(0): "fragmentation"`); such a trace still loads."""
    import gzip

    good = ('{\n  "traceEvents": [\n  {\n    "ph": "X", "cat": "cpu_op",\n'
            '    "name": "aten::mm",\n    "pid": 1, "tid": 1,\n    "ts": 10, "dur": 5\n  },\n'
            '  {\n    "ph": "X", "cat": "python_function",\n'
            '    "name": "core.py(0): "fragmentation"",\n'
            '    "pid": 1, "tid": 1,\n    "ts": 11, "dur": 2\n  }\n  ]\n}\n')
    path = tmp_path / "broken.pt.trace.json.gz"
    path.write_bytes(gzip.compress(good.encode()))
    trace = gpudiag.load(path)
    assert set(trace.ranges["name"].astype(str)) == {"aten::mm", 'core.py(0): "fragmentation"'}
    assert trace.meta["warnings"][
        "event names with unescaped quotes repaired (Kineto writes them so)"] == 1
    (tmp_path / "other.json").write_text('{"traceEvents": [ {"ph": "X" oops} ]}')
    with pytest.raises(gpudiag.InputError, match="is not valid JSON"):
        gpudiag.load(tmp_path / "other.json")
