"""JAX / XLA profiler reader: XSpace `.xplane.pb` and its Perfetto (Chrome JSON) form.

Counts are checked against an independent walk of the protobuf written here in a few lines
(not gpudiag's walker), and the JSON form is checked against the protobuf form.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpudiag
from gpudiag.errors import InputError
from gpudiag.readers.xplane.reader import read
from gpudiag.readers.xplane.space import parse_space
from tests.conftest import ROOT, fixture

TF = "jax/tf_gpu_multiworker_8gpu.xplane.pb"
AMD = "jax/mi300x8_jax_conv_nonnvidia.xplane.pb"


# -- an independent protobuf walk, and a tiny encoder for synthetic XSpaces ---------------


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of each field of one message; length-delimited as bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _uvarint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _uvarint(buf, pos)
        elif wire == 2:
            size, pos = _uvarint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        else:
            size = 8 if wire == 1 else 4
            value, pos = buf[pos:pos + size], pos + size
        yield key >> 3, value


def wire_counts(path: Path) -> Counter[tuple[str, str]]:
    """Events per (plane name, line name), counted straight from the bytes."""
    return Counter({(p, line): len(events) for p, line, _, events in wire_lines(path)})


def wire_lines(path: Path) -> Iterator[tuple[str, str, int, list[str]]]:
    """(plane name, line name, line id, event names) of every line, from the bytes."""
    for number, plane in _fields(path.read_bytes()):
        if number != 1:
            continue
        fields = list(_fields(plane))
        plane_name = next((v.decode() for n, v in fields if n == 2), "")
        entries = [dict(_fields(v)) for n, v in fields if n == 4]  # event_metadata map
        names = {e.get(1, 0): dict(_fields(e.get(2, b""))).get(2, b"").decode() for e in entries}
        for line in (v for n, v in fields if n == 3):
            line_fields = list(_fields(line))
            text = {n: v.decode() for n, v in line_fields if n in (2, 11)}
            ids = {n: v for n, v in line_fields if n in (1, 10)}
            events = [names.get(dict(_fields(v)).get(1, 0), "") for n, v in line_fields if n == 4]
            yield plane_name, text.get(11) or text.get(2, ""), ids.get(10) or ids.get(1, 0), events


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def field(number: int, value: int | bytes | str) -> bytes:
    """One encoded field: ints as varints, bytes/str length-delimited."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def plane(name: str, lines: list[bytes], events: dict[int, str], stats: dict[int, str],
          *extra: bytes) -> bytes:
    meta = b"".join(field(4, field(1, k) + field(2, field(1, k) + field(2, v)))
                    for k, v in events.items())
    stat_meta = b"".join(field(5, field(1, k) + field(2, field(1, k) + field(2, v)))
                         for k, v in stats.items())
    return field(1, field(2, name) + b"".join(field(3, ln) for ln in lines) + meta + stat_meta
                 + b"".join(extra))


def write(tmp_path: Path, *planes: bytes) -> Path:
    path = tmp_path / "synthetic.xplane.pb"
    path.write_bytes(b"".join(planes) + field(4, "testhost"))
    return path


# -- the real fixtures --------------------------------------------------------------------


def _gpu_counts(trace: gpudiag.Trace) -> Counter[tuple[int, int]]:
    both = pd.concat([trace.kernels[["device", "stream"]], trace.copies[["device", "stream"]]])
    return Counter((int(d), int(s)) for d, s in both.itertuples(index=False))


@pytest.mark.parametrize("name", [TF, AMD])
def test_stream_line_events_become_exactly_the_kernels_and_copies(name: str) -> None:
    path = fixture(name)
    trace = read(path)
    expected = Counter({
        (int(p.rsplit(":", 1)[1]), int(ln.split("#")[1].split("(")[0])): n
        for (p, ln), n in wire_counts(path).items() if ln.startswith("Stream #") and n
    })
    assert _gpu_counts(trace) == expected


@pytest.mark.parametrize("name", [TF, AMD])
def test_every_host_event_is_a_range_an_api_call_or_an_allocation(name: str) -> None:
    path = fixture(name)
    trace = read(path)
    per_thread: Counter[int] = Counter()
    allocations = 0
    for plane_name, line, line_id, events in wire_lines(path):
        if plane_name.startswith("/host:"):
            # the thread id: the number that ends the line name, else the line id
            tid = int(line.rsplit("/", 1)[1]) if "/" in line else line_id & 0xFFFFFFFF
            memory = sum(e in ("MemoryAllocation", "MemoryDeallocation") for e in events)
            per_thread[tid] += len(events) - memory
            allocations += memory
    host_ranges = trace.ranges[trace.ranges["device"].isna()]
    assert Counter(host_ranges["tid"]) + Counter(trace.api["tid"]) == per_thread
    assert len(trace.memory) == allocations > 0


@pytest.mark.parametrize("name", [TF, AMD])
def test_fixture_passes_schema_validation(name: str) -> None:
    trace = read(fixture(name))
    trace.validate()
    assert trace.meta["format"] == "xplane" and trace.meta["hostnames"]


def test_gzipped_xspace_reads_like_the_plain_file(tmp_path: Path) -> None:
    path = fixture(AMD)
    packed = tmp_path / "host.xplane.pb.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert gpudiag.load(packed).row_counts() == read(path).row_counts()


def test_tf_gpu_work_sits_on_the_gpus_that_ran_it() -> None:
    trace = read(fixture(TF))
    assert set(trace.kernels["device"]) == {4, 6}
    assert set(trace.copies["device"]) == {1, 4, 6}
    assert sorted(trace.devices["device"]) == list(range(8))  # idle GPUs are still devices
    assert set(trace.copies["kind"]) == {"HtoD", "DtoH"}
    assert trace.copies["bytes"].notna().all() and (trace.copies["bytes"] > 0).all()


def test_tf_kernel_details_give_geometry_and_registers() -> None:
    kernels = read(fixture(TF)).kernels
    for col in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                "regs_per_thread", "smem_static_bytes", "correlation"):
        assert kernels[col].notna().all(), col
    philox = kernels[kernels["name"].astype(str).str.contains("FillPhilox")].iloc[0]
    assert (philox["grid_x"], philox["block_x"], philox["regs_per_thread"]) == (160, 1024, 38)
    assert kernels["smem_bytes"].isna().all()  # TF's old format has no dynamic shared size


def test_derived_device_lines_never_become_kernels() -> None:
    path = fixture(TF)
    trace = read(path)
    derived = {ln for (p, ln), n in wire_counts(path).items()
               if p.startswith("/device:") and not ln.startswith("Stream #") and n}
    assert derived == {"TensorFlow Ops", "TensorFlow Name Scope", "Steps"}
    device_ranges = trace.ranges.dropna(subset=["device"])
    assert set(device_ranges["domain"]) == derived
    op_names = set(device_ranges["name"].astype(str))
    assert not op_names & set(trace.kernels["name"].astype(str))
    steps = device_ranges[device_ranges["source"] == "step"]
    assert list(steps["device"]) == [4, 6] and (steps["depth"] == 0).all()


def test_tf_host_launch_records_become_api_calls_joined_by_correlation() -> None:
    trace = read(fixture(TF))
    assert set(trace.api["name"]) >= {"cuLaunchKernel", "cuMemcpyHtoDAsync"}
    gpu_side = set(trace.kernels["correlation"]) | set(trace.copies["correlation"])
    assert set(trace.api["correlation"]) == gpu_side


def test_tf_allocator_events_become_memory_rows_per_device() -> None:
    memory = read(fixture(TF)).memory
    assert set(memory["device"]) == {-1, 1, 4, 6}  # gpu_host_bfc is host memory
    assert set(memory["action"]) == {"alloc", "free"}
    assert (memory["bytes"] > 0).all() and memory["total_allocated_bytes"].notna().all()


def test_device_plane_stats_describe_the_gpus() -> None:
    devices = read(fixture(TF)).devices
    row = devices.iloc[0]
    assert (row["sm_count"], row["cc_major"], row["cc_minor"]) == (80, 7, 0)
    assert row["clock_khz"] == 1_530_000 and row["mem_bytes"] == 16_945_512_448
    assert row["mem_bandwidth_bytes_per_s"] == 898_048_000_000
    assert row["vendor"] == "nvidia" and row["max_blocks_per_sm"] == 32  # filled from cc 7.0


def test_amd_fixture_is_amd_with_lds_as_shared_memory() -> None:
    trace = read(fixture(AMD))
    assert trace.meta["vendor"] == "amd" and set(trace.devices["vendor"]) == {"amd"}
    assert trace.devices["max_blocks_per_sm"].isna().all()  # no CUDA limits for AMD
    kernels = trace.kernels
    fusion = kernels[kernels["name"].astype(str).str.startswith("input_transpose_fusion_1")]
    assert (fusion["grid_x"] == 6240).all() and (fusion["block_x"] == 256).all()
    assert (fusion["smem_bytes"] == 2112).all()  # group_mem: the workgroup's whole LDS
    assert kernels["smem_bytes"].notna().all() and kernels["regs_per_thread"].isna().all()
    assert trace.api["name"].astype(str).str.startswith("hip").all()
    python = trace.ranges[trace.ranges["source"] == "python"]
    assert len(python) and python["name"].astype(str).str.startswith("$").all()


# -- the Perfetto JSON form ---------------------------------------------------------------


def perfetto_document(path: Path) -> dict[str, Any]:
    """The trace-viewer JSON jax.profiler writes for an XSpace: planes as processes, lines
    as threads, one complete event per XEvent, ts/dur in µs, stats as string args."""
    events: list[dict[str, Any]] = []
    for pid, xplane in enumerate(parse_space(path.read_bytes()).planes, start=1):
        events.append({"ph": "M", "pid": pid, "name": "process_name",
                       "args": {"name": xplane.name}})
        for line in xplane.lines:
            tid = (line.display_id or line.id) & 0xFFFFFFFF
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                           "args": {"name": line.label}})
            for i, mid in enumerate(line.metadata_ids):
                meta = xplane.event_metadata[mid]
                stats = {**meta.stats, **(line.stats[i] or {})}
                args = {str(k): str(v) for k, v in stats.items() if not isinstance(v, bytes)}
                start_ps = line.timestamp_ns * 1000 + line.offsets_ps[i]
                events.append({
                    "ph": "X", "pid": pid, "tid": tid, "name": args.get("step_name", meta.label),
                    "ts": start_ps / 1e6, "dur": max(line.durations_ps[i], 1) / 1e6,
                    "args": args,
                })
    return {"displayTimeUnit": "ns", "traceEvents": events}


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["device", "stream", "start_ns"]).reset_index(drop=True)


@pytest.mark.parametrize("name", [TF, AMD])
def test_perfetto_json_gives_the_same_tables_as_the_protobuf(name: str, tmp_path: Path) -> None:
    path = fixture(name)
    json_path = tmp_path / "perfetto_trace.json.gz"
    json_path.write_bytes(gzip.compress(json.dumps(perfetto_document(path)).encode()))
    from_pb, from_json = read(path), gpudiag.load(json_path)  # via the Kineto reader's sniff
    assert from_json.meta["format"] == "jax-perfetto"
    assert from_json.meta["vendor"] == from_pb.meta["vendor"]
    from_json.validate()
    assert from_json.row_counts() == from_pb.row_counts() and len(from_pb.kernels)
    for table in ("kernels", "copies"):
        a, b = _sorted(getattr(from_pb, table)), _sorted(getattr(from_json, table))
        shift = from_pb.meta["clock_offset_ns"]  # the protobuf keeps the epoch start
        assert ((a["start_ns"] - shift - b["start_ns"]).abs() <= 1).all()
        dur_a, dur_b = a["end_ns"] - a["start_ns"], b["end_ns"] - b["start_ns"]
        assert ((dur_a - dur_b).abs() <= 1).all()
        assert (a["correlation"] == b["correlation"]).all()
    kernels_pb, kernels_json = _sorted(from_pb.kernels), _sorted(from_json.kernels)
    assert (kernels_pb["name"] == kernels_json["name"]).all()
    assert kernels_pb["grid_x"].equals(kernels_json["grid_x"])


# -- synthetic XSpaces: wire-format corners -----------------------------------------------


def test_negative_ids_unknown_fields_and_refs_decode(tmp_path: Path) -> None:
    stat = field(1, 7) + field(7, 8)  # ref to stat metadata 8, whose name is the value
    event = field(1, 1) + field(2, -5_000) + field(3, 2_000_000) + field(4, stat) \
        + field(99, "a field from a newer profiler")  # negative int64 offset: 10-byte varint
    line = field(1, -3) + field(2, "Stream #3(Kernel)") + field(3, 100) + field(4, event)
    stats = {7: "kernel_details", 8: "regs:32 static_shared:16 dynamic_shared:48 "
             "grid:2,3,4 block:64,1,1 occ_pct:50"}
    path = write(tmp_path, plane("/device:GPU:0", [line], {1: "k"}, stats))
    trace = read(path)
    kernel = trace.kernels.iloc[0]
    assert (kernel["start_ns"], kernel["end_ns"], kernel["stream"]) == (95, 2095, 3)
    assert trace.meta["clock_offset_ns"] == 0  # no Task Environment start: kept relative
    assert (kernel["grid_y"], kernel["smem_bytes"], kernel["smem_dynamic_bytes"]) == (3, 64, 48)


def test_aggregated_events_without_a_time_are_skipped_and_counted(tmp_path: Path) -> None:
    timed = field(1, 1) + field(2, 0) + field(3, 1000)
    counted = field(1, 1) + field(5, 42) + field(3, 1000)  # num_occurrences, no offset
    line = field(1, 5) + field(2, "python") + field(4, timed) + field(4, counted)
    trace = read(write(tmp_path, plane("/host:CPU", [line], {1: "f"}, {})))
    assert len(trace.ranges) == 1 and trace.ranges["tid"].iloc[0] == 5
    assert trace.meta["warnings"] == {"aggregated events without a timestamp skipped": 1}


# -- bad input ----------------------------------------------------------------------------


def _truncated(tmp_path: Path) -> Path:
    path = tmp_path / "truncated.xplane.pb"
    path.write_bytes(fixture(AMD).read_bytes()[:150_000])
    return path


def _random_bytes(tmp_path: Path) -> Path:
    rng = random.Random(7)
    path = tmp_path / "random.xplane.pb"
    path.write_bytes(b"\n" + bytes(rng.randrange(256) for _ in range(300)) + b"/host:"
                     + bytes(rng.randrange(256) for _ in range(300)))
    return path


def _no_planes(tmp_path: Path) -> Path:
    path = tmp_path / "noplanes.xplane.pb"
    path.write_bytes(field(1, b"") + field(4, "/host:CPU"))  # one empty plane, a hostname
    return path


BAD = {"truncated fixture": (_truncated, "truncated"),
       "random bytes": (_random_bytes, "not a valid XSpace"),
       "no planes": (_no_planes, "no /device: or /host: planes")}


@pytest.mark.parametrize("case", BAD)
def test_bad_xspace_raises_input_error_naming_the_file(case: str, tmp_path: Path) -> None:
    make, problem = BAD[case]
    path = make(tmp_path)
    with pytest.raises(InputError) as info:
        gpudiag.load(path)
    assert str(path) in str(info.value) and problem in str(info.value)


@pytest.mark.parametrize("case", BAD)
def test_cli_reports_bad_xspace_in_one_line_with_status_2(case: str, tmp_path: Path) -> None:
    path = BAD[case][0](tmp_path)
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and str(path) in done.stderr
    assert "Traceback" not in done.stderr


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_xspace_raises_input_error_or_loads(data: st.DataObject, tmp_path: Path) -> None:
    raw = bytearray(fixture(AMD).read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[:data.draw(st.integers(1, len(raw)), label="length")]
    for _ in range(data.draw(st.integers(0, 8), label="mutations")):
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] = data.draw(st.integers(0, 255), label="byte")
    path = tmp_path / "damaged.xplane.pb"
    path.write_bytes(bytes(raw))
    try:
        trace = read(path)
    except InputError as exc:
        assert str(path) in str(exc)
    else:
        trace.validate()


# -- which reader a Chrome JSON goes to: the registry decides, not the Kineto reader -------


REAL_PERFETTO = ROOT / "tests" / "data" / "jax_cpu_train_perfetto.trace.json.gz"


def test_real_jax_trace_viewer_json_is_sent_to_the_jax_reader_by_the_registry() -> None:
    """jax.profiler's own JSON (tests/data, recorded on CPU): the sniff sees its plane-named
    processes, so the Kineto reader is never tried on it; the steps are the jitted step's
    executions, as in the XSpace of the same program."""
    from gpudiag.analyzers.steps.training import summary, training_steps
    from gpudiag.readers.registry import detect

    assert detect(REAL_PERFETTO).name == "jax-perfetto"
    trace = gpudiag.load(REAL_PERFETTO)
    assert trace.meta["format"] == "jax-perfetto"
    assert trace.meta["sources"][0]["format"] == "jax-perfetto"
    info = summary(training_steps(trace))
    assert info["count"] == 20 and info["method"] == "jit_function"
    assert "train_step" in info["detail"]


def test_a_kineto_trace_naming_a_process_like_an_xla_plane_stays_kineto(tmp_path: Path) -> None:
    """Kineto's header keys win over a process name that happens to look like a plane."""
    from gpudiag.readers.registry import detect

    doc = {"schemaVersion": 1, "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0,
         "dur": 2.0}]}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    assert detect(path).name == "chrome-trace"
    assert gpudiag.load(path).meta["format"] != "jax-perfetto"
