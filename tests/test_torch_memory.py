"""PyTorch CUDA memory snapshots and profiler memory timelines.

Real snapshots are checked against an independent unpickle done here (with the test's own
restricted unpickler: fixtures from strangers are never opened with pickle.load); hostile
pickles must run nothing; fuzzing checks that only InputError ever comes out.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpudiag
from gpudiag.errors import InputError
from gpudiag.readers.torch_memory.reader import read_snapshot, read_timeline
from gpudiag.trace import Trace
from tests.conftest import ROOT, fixture

TRAINING = "cs336_medium_ctx1024_training_18gb_inactive.pickle"
INFERENCE = "cs336_medium_ctx128_inference_lowfrag.pickle"
SEGMENT_FREE = "cs336_ctx256_forward_segment_free.pickle"
SNAPSHOTS = [TRAINING, INFERENCE, SEGMENT_FREE]
TIMELINE = "memsnap/hta_memory_timeline.raw.json.gz"
PY_SITE = re.compile(r"^\S.*\.py:\d+ \(.+\)$")
STATE_NAMES = {"active_allocated": "allocated", "inactive": "inactive",
               "active_pending_free": "awaiting_free"}
LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/")


# -- independent helpers ---------------------------------------------------------------------


class NoGlobalsUnpickler(pickle.Unpickler):
    """The test's own restricted unpickler, independent of the reader's."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"test refuses {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("test refuses persistent ids")


def unpickle(path: Path) -> dict[str, Any]:
    data = NoGlobalsUnpickler(io.BytesIO(path.read_bytes())).load()
    assert isinstance(data, dict)
    return data


def write_pickle(path: Path, value: Any, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    return path


def frame(filename: str, line: int = 0, name: str = "f") -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


def user_site(frames: list[dict[str, Any]]) -> str | None:
    """The innermost Python frame outside torch and installed packages, as the test sees it."""
    for f in frames:
        fn = f["filename"]
        if fn.endswith(".py") and not any(mark in fn for mark in LIBRARY):
            return f"{fn}:{f['line']} ({f['name']})"
    return None


def values(series: pd.Series) -> list[Any]:
    """A column as plain Python values, NA as None."""
    return [None if pd.isna(v) else v for v in series.astype(object)]


# -- real snapshots --------------------------------------------------------------------------


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_snapshot_entries_match_an_independent_unpickle(name: str) -> None:
    path = fixture(f"memsnap/{name}")
    entries = [e for t in unpickle(path)["device_traces"] for e in t]
    trace = read_snapshot(path)
    trace.validate()
    mem = trace.memory
    assert len(mem) == len(entries)
    assert Counter(values(mem["action"])) == Counter(e["action"] for e in entries)
    assert mem["ts_ns"].tolist() == [e["time_us"] * 1000 for e in entries]
    assert values(mem["addr"]) == [e["addr"] for e in entries]
    assert values(mem["bytes"]) == [e["size"] for e in entries]
    assert values(mem["stream"]) == [e["stream"] for e in entries]
    net = sum(e["size"] for e in entries if e["action"] == "alloc") - sum(
        e["size"] for e in entries if e["action"] == "free_completed")
    assert int(mem["delta_bytes"].sum()) == net
    assert mem["delta_bytes"].notna().sum() == sum(
        e["action"] in ("alloc", "free_completed") for e in entries)
    assert trace.meta["timeline"] is True
    assert trace.meta["warnings"] == {}


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_snapshot_blocks_match_an_independent_unpickle(name: str) -> None:
    path = fixture(f"memsnap/{name}")
    segments = unpickle(path)["segments"]
    blocks = [(s, b) for s in segments for b in s["blocks"]]
    table = read_snapshot(path).memory_blocks
    assert len(table) == len(blocks)
    assert Counter(values(table["state"])) == Counter(STATE_NAMES[b["state"]] for _, b in blocks)
    by_state: Counter[str] = Counter()
    for _, b in blocks:
        by_state[STATE_NAMES[b["state"]]] += b["size"]
    assert table.groupby("state", observed=True)["bytes"].sum().to_dict() == dict(by_state)
    assert values(table["addr"]) == [b["address"] for _, b in blocks]
    assert values(table["requested_bytes"]) == [b["requested_size"] for _, b in blocks]
    assert values(table["segment_addr"]) == [s["address"] for s, _ in blocks]
    assert values(table["pool"]) == [s["segment_type"] for s, _ in blocks]
    assert values(table["expandable"]) == [s["is_expandable"] for s, _ in blocks]
    per_segment = table.drop_duplicates(["device", "segment_addr"])
    assert len(per_segment) == len(segments)
    assert int(per_segment["segment_bytes"].sum()) == sum(s["total_size"] for s in segments)


@pytest.mark.parametrize(("name", "reserved", "allocated", "inactive", "counts"), [
    (TRAINING, 25178406912, 6874481152, 18303925760,
     {"alloc": 7591, "free_requested": 7370, "free_completed": 7370}),
    (INFERENCE, 1763704832, 1703276544, 60428288,
     {"alloc": 1280, "free_requested": 1280, "free_completed": 1280}),
    (SEGMENT_FREE, 26545750016, 26388097024, 157652992,
     {"alloc": 2057, "free_requested": 1155, "free_completed": 1155,
      "segment_alloc": 471, "segment_free": 287}),
])
def test_snapshot_totals_match_the_fixture_manifest(
    name: str, reserved: int, allocated: int, inactive: int, counts: dict[str, int],
) -> None:
    trace = read_snapshot(fixture(f"memsnap/{name}"))
    blocks = trace.memory_blocks
    segments = blocks.drop_duplicates(["device", "segment_addr"])
    assert int(segments["segment_bytes"].sum()) == reserved
    assert int(blocks.loc[blocks["state"] == "allocated", "bytes"].sum()) == allocated
    assert int(blocks.loc[blocks["state"] == "inactive", "bytes"].sum()) == inactive
    assert trace.memory["action"].value_counts().loc[list(counts)].to_dict() == counts


def test_training_snapshot_sites_are_the_users_python_lines_outside_torch() -> None:
    path = fixture(f"memsnap/{TRAINING}")
    entries = [e for t in unpickle(path)["device_traces"] for e in t]
    sites = values(read_snapshot(path).memory["site"])
    expected = [user_site(e["frames"]) for e in entries]
    with_python = [(s, x) for s, x in zip(sites, expected, strict=True) if x is not None]
    assert len(with_python) > len(entries) / 2
    assert all(site == want for site, want in with_python)
    assert all(PY_SITE.match(site) for site, _ in with_python)
    assert not any(mark in site for site, _ in with_python for mark in LIBRARY)
    top_python_site = Counter(s for s, _ in with_python).most_common(1)[0][0]
    assert "cs336_basics/optimizer.py" in top_python_site


def test_c_plus_plus_only_stacks_get_the_op_not_the_allocator_as_site() -> None:
    trace = read_snapshot(fixture(f"memsnap/{TRAINING}"))
    native = [s for s in values(trace.memory["site"]) if s and not PY_SITE.match(s)]
    assert native, "the training file has backward-pass entries without Python frames"
    assert not any(s.startswith(("memory_snapshot.cpp", "Register")) for s in native)
    assert any(s.startswith("VariableType") for s in native)


def test_snapshot_meta_keeps_allocator_settings_as_json() -> None:
    path = fixture(f"memsnap/{TRAINING}")
    trace = read_snapshot(path)
    assert trace.meta["format"] == "torch-memory-snapshot"
    assert trace.meta["vendor"] == "nvidia"
    assert trace.meta["allocator_settings"] == unpickle(path)["allocator_settings"]
    json.dumps(trace.meta, allow_nan=False)


def test_odd_allocator_settings_become_bounded_json(tmp_path: Path) -> None:
    deep: list[Any] = []
    for _ in range(50):
        deep = [deep]
    settings_value = {"deep": deep, "huge": 10**5000, "raw": b"\x00\xff", "set": {1},
                      "nan": float("nan"), (1, 2): "tuple key", "many": list(range(10**4))}
    data = {"segments": [], "allocator_settings": settings_value}
    meta = read_snapshot(write_pickle(tmp_path / "s.pickle", data)).meta
    text = json.dumps(meta, allow_nan=False)
    assert len(text) < 100_000
    kept = meta["allocator_settings"]
    assert (kept["huge"], kept["raw"], kept["set"], kept["nan"]) == ("<large int>", "00ff", [1],
                                                                    "nan")
    assert kept["<tuple>"] == "tuple key"


def test_gpudiag_load_routes_a_snapshot_and_its_tables_survive_parquet(tmp_path: Path) -> None:
    trace = gpudiag.load(fixture(f"memsnap/{INFERENCE}"))
    assert trace.meta["sources"][0]["format"] == "torch-memory-snapshot"
    for name in ("memory", "memory_blocks"):
        getattr(trace, name).to_parquet(tmp_path / f"{name}.parquet", index=False)
    again = Trace(memory=pd.read_parquet(tmp_path / "memory.parquet"),
                  memory_blocks=pd.read_parquet(tmp_path / "memory_blocks.parquet"))
    pd.testing.assert_frame_equal(again.memory_blocks, trace.memory_blocks)
    pd.testing.assert_frame_equal(again.memory, trace.memory)


def test_gzipped_snapshot_loads_like_the_plain_one(tmp_path: Path) -> None:
    path = fixture(f"memsnap/{SEGMENT_FREE}")
    zipped = tmp_path / "snap.pickle.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    plain, packed = read_snapshot(path), read_snapshot(zipped)
    pd.testing.assert_frame_equal(plain.memory, packed.memory)
    pd.testing.assert_frame_equal(plain.memory_blocks, packed.memory_blocks)
    assert gpudiag.load(zipped).row_counts() == plain.row_counts()


# -- synthetic snapshots with exact answers ----------------------------------------------------


def snapshot(entries: list[Any] | None = None, blocks: list[Any] | None = None,
             **segment: Any) -> dict[str, Any]:
    seg = {"device": 0, "address": 1000, "total_size": 300, "stream": 0,
           "segment_type": "large", "is_expandable": False, "blocks": blocks or [], **segment}
    return {"segments": [seg], "device_traces": [entries or []]}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_snapshot_pickled_with_any_protocol_loads(tmp_path: Path, protocol: int) -> None:
    data = snapshot([{"action": "alloc", "addr": 1000, "size": 100, "stream": 0,
                      "time_us": 7, "frames": [frame("/u/train.py", 3, "main")]}])
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", data, protocol))
    assert values(trace.memory["site"]) == ["/u/train.py:3 (main)"]
    assert trace.memory["ts_ns"].tolist() == [7000]


def test_old_snapshot_without_times_or_block_addresses_is_repaired_and_counted(
    tmp_path: Path,
) -> None:
    blocks = [
        {"size": 100, "state": "active_allocated",
         "history": [{"addr": 1000, "real_size": 90, "frames": [frame("/u/model.py", 7, "fwd")]}]},
        {"size": 200, "state": "active_pending_free"},
    ]
    entries = [{"action": "alloc", "addr": 1000, "size": 100, "stream": 0},
               {"action": "free", "addr": 1000, "size": 100, "stream": 0}]
    trace = read_snapshot(write_pickle(tmp_path / "old.pickle", snapshot(entries, blocks)))
    trace.validate()
    assert values(trace.memory_blocks["addr"]) == [1000, 1100]
    assert values(trace.memory_blocks["requested_bytes"]) == [90, None]
    assert values(trace.memory_blocks["state"]) == ["allocated", "awaiting_free"]
    assert values(trace.memory_blocks["site"]) == ["/u/model.py:7 (fwd)", None]
    assert trace.memory["ts_ns"].tolist() == [0, 1]
    assert values(trace.memory["delta_bytes"]) == [100, -100]
    assert trace.meta["timeline"] is False
    warnings = trace.meta["warnings"]
    assert warnings["block addresses computed from the segment address (older snapshot)"] == 2
    assert warnings["trace entries without time_us (torch < 2.1): ts_ns is their order"] == 2


def test_entries_missing_a_time_take_the_time_before_them(tmp_path: Path) -> None:
    entries = [{"action": "alloc", "size": 1}, {"action": "alloc", "size": 1, "time_us": 5},
               {"action": "alloc", "size": 1}, {"action": "alloc", "size": 1, "time_us": 9}]
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", snapshot(entries)))
    assert trace.memory["ts_ns"].tolist() == [5000, 5000, 5000, 9000]
    assert trace.meta["timeline"] is True
    assert sum(trace.meta["warnings"].values()) == 2


def test_devices_come_from_the_trace_list_index_or_the_entry(tmp_path: Path) -> None:
    data = {"device_traces": [[{"action": "alloc", "size": 1, "time_us": 1}],
                              [{"action": "alloc", "size": 2, "time_us": 2},
                               {"action": "alloc", "size": 3, "time_us": 3, "device": 5}]]}
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", data))
    assert values(trace.memory["device"]) == [0, 1, 5]
    assert trace.memory_blocks.empty


def test_oom_entry_keeps_device_free_and_has_no_address(tmp_path: Path) -> None:
    oom = {"action": "oom", "device_free": 1234, "size": 4096, "stream": 0, "time_us": 5}
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", snapshot([oom])))
    assert values(trace.memory["action"]) == ["oom"]
    assert values(trace.memory["addr"]) == [None]
    assert values(trace.memory["delta_bytes"]) == [None]
    row = trace.memory.iloc[0]
    assert (row["device"], row["ts_ns"], row["bytes"], row["device_free_bytes"]) == (
        0, 5000, 4096, 1234)


def test_unknown_actions_states_and_pools_are_kept_as_na_and_counted(tmp_path: Path) -> None:
    data = snapshot([{"action": "mystery", "size": 8, "time_us": 1}, "not a dict"],
                    [{"size": 8, "state": "weird", "address": 1000}], segment_type="huge")
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", data))
    trace.validate()
    assert values(trace.memory["action"]) == [None]
    assert values(trace.memory_blocks["state"]) == [None]
    assert values(trace.memory_blocks["pool"]) == [None]
    assert len(trace.meta["warnings"]) == 4


@pytest.mark.parametrize(("frames", "site"), [
    ([frame("??"), frame("memory_snapshot.cpp"), frame("/v/site-packages/torch/nn/module.py", 9),
      frame("/v/site-packages/einops/einops.py", 4), frame("/u/model.py", 12, "forward"),
      frame("/u/train.py", 30, "main")], "/u/model.py:12 (forward)"),
    ([frame("CUDACachingAllocator.cpp"), frame("/opt/torch/functional.py", 5, "einsum"),
      frame("/v/dist-packages/x.py", 1)], "/opt/torch/functional.py:5 (einsum)"),
    ([frame("??", 0, "unwind"), frame("memory_snapshot.cpp"), frame("RegisterCUDA_0.cpp"),
      frame("VariableType_0.cpp", 0, "mul"), frame("", 0, "x")], "VariableType_0.cpp:0 (mul)"),
    ([frame("C:\\env\\Lib\\site-packages\\torch\\x.py", 1, "lib"),
      frame("C:\\work\\proj\\train.py", 2, "main")], "C:\\work\\proj\\train.py:2 (main)"),
    ([frame("??"), frame("")], None),
    ([], None),
    ("not a list", None),
])
def test_site_is_the_innermost_user_python_frame_with_fallbacks(
    tmp_path: Path, frames: Any, site: str | None,
) -> None:
    entry = {"action": "alloc", "size": 1, "time_us": 1, "frames": frames}
    block = {"size": 300, "state": "inactive", "address": 1000, "frames": frames}
    trace = read_snapshot(write_pickle(tmp_path / "s.pickle", snapshot([entry], [block])))
    assert values(trace.memory["site"]) == [site]
    assert values(trace.memory_blocks["site"]) == [site]


# -- hostile and broken pickles --------------------------------------------------------------


class OpensAFile:
    """Unpickled with pickle.load, this would create `marker` (builtins.open(marker, 'w'))."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


class RunsAShell:
    """Unpickled with pickle.load, this would run `touch marker` through os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class Snapshotish:
    """A harmless class instance: still an object, so still refused."""

    def __init__(self) -> None:
        self.segments: list[Any] = []


def malicious(tmp_path: Path, payload: type, protocol: int = 4) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    data = snapshot([{"action": "alloc", "size": 1, "frames": payload(marker)}])
    return write_pickle(tmp_path / "evil.pickle", data, protocol), marker


@pytest.mark.parametrize("payload", [OpensAFile, RunsAShell])
@pytest.mark.parametrize("protocol", [2, 5])
def test_malicious_pickle_runs_nothing_and_is_refused(
    tmp_path: Path, payload: type, protocol: int,
) -> None:
    path, marker = malicious(tmp_path, payload, protocol)
    with pytest.raises(InputError, match="refusing to load"):
        read_snapshot(path)
    assert not marker.exists()


def test_persistent_ids_as_torch_save_writes_are_refused(tmp_path: Path) -> None:
    class Saver(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return ("storage", 1) if obj == "tensor" else None

    buf = io.BytesIO()
    Saver(buf, protocol=2).dump({"segments": ["tensor"]})
    (tmp_path / "ckpt.pt").write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="persistent object id"):
        read_snapshot(tmp_path / "ckpt.pt")


def test_pickled_class_instance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"refusing to load.*_dump_snapshot"):
        read_snapshot(write_pickle(tmp_path / "obj.pickle", Snapshotish()))


@pytest.mark.parametrize("data", [
    [1, 2, 3],
    {"weight": [0.1, 0.2], "bias": [0.0]},
    {"segments": "many"},
    {"device_traces": [[], 5]},
    {"device_traces": {"0": []}},
    "snapshot",
    None,
])
def test_plain_pickle_that_is_not_a_snapshot_says_how_to_dump_one(
    tmp_path: Path, data: Any,
) -> None:
    with pytest.raises(InputError, match=r"not a torch memory snapshot.*_record_memory_history"):
        read_snapshot(write_pickle(tmp_path / "x.pickle", data))


def test_truncated_pickle_is_an_input_error(tmp_path: Path) -> None:
    raw = fixture(f"memsnap/{INFERENCE}").read_bytes()
    (tmp_path / "cut.pickle").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="not a readable pickle"):
        read_snapshot(tmp_path / "cut.pickle")


def test_truncated_gzip_of_a_snapshot_is_an_input_error(tmp_path: Path) -> None:
    packed = gzip.compress(pickle.dumps(snapshot()))
    (tmp_path / "cut.pickle.gz").write_bytes(packed[: len(packed) - 6])
    with pytest.raises(InputError, match="gzip"):
        read_snapshot(tmp_path / "cut.pickle.gz")


def test_empty_file_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "empty.pickle").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        read_snapshot(tmp_path / "empty.pickle")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)


def test_cli_refuses_a_malicious_pickle_in_one_line_without_running_it(tmp_path: Path) -> None:
    path, marker = malicious(tmp_path, RunsAShell)
    done = run_cli("analyze", str(path))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "refusing to load" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not marker.exists()


def test_cli_analyzes_the_training_snapshot() -> None:
    done = run_cli("analyze", "--json", str(fixture(f"memsnap/{TRAINING}")))
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert (rows["memory"], rows["memory_blocks"]) == (22331, 1031)


# -- memory timelines ------------------------------------------------------------------------


def test_raw_timeline_matches_an_independent_json_count() -> None:
    path = fixture(TIMELINE)
    rows = json.loads(gzip.decompress(path.read_bytes()))
    trace = read_timeline(path)
    trace.validate()
    mem = trace.memory
    assert len(mem) == len(rows) == 16845
    actions = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
    categories = ["PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION",
                  "GRADIENT", "AUTOGRAD_DETAIL", "UNKNOWN"]
    assert Counter(values(mem["action"])) == Counter(actions[r[1]] for r in rows)
    assert Counter(values(mem["category"])) == Counter(categories[r[3]] for r in rows)
    assert int(mem["delta_bytes"].sum()) == sum(r[2] for r in rows)
    assert values(mem["bytes"]) == [abs(r[2]) for r in rows]
    assert mem["ts_ns"].tolist() == [r[0] for r in rows]
    assert mem["device"].isna().all()
    assert gpudiag.load(path).meta["sources"][0]["format"] == "torch-memory-timeline"


def test_coalesced_timeline_becomes_one_sample_per_time_and_category(tmp_path: Path) -> None:
    sizes = [[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 10, 20, 30, 40, 50, 60, 70, 80]]
    (tmp_path / "mem.json").write_text(json.dumps([[-1, 20], sizes]))
    trace = read_timeline(tmp_path / "mem.json")
    trace.validate()
    samples = trace.samples
    assert len(samples) == 16
    assert samples["ts_ns"].tolist() == [-1] * 8 + [20000] * 8
    assert samples["value"].tolist() == [float(v) for row in sizes for v in row[1:]]
    assert values(samples["metric"])[:2] == ["memory.PARAMETER", "memory.OPTIMIZER_STATE"]
    assert values(samples["metric"])[7] == "memory.UNKNOWN"
    assert set(values(samples["unit"])) == {"bytes"}


def test_timeline_codes_torch_does_not_write_are_kept_as_na_and_counted(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text("[[5, 9, -100, 42], [6, 2, 100, 4]]")
    trace = read_timeline(tmp_path / "t.json")
    assert values(trace.memory["action"]) == [None, "create"]
    assert values(trace.memory["category"]) == [None, "ACTIVATION"]
    assert sorted(trace.meta["warnings"].values()) == [1, 1]


@pytest.mark.parametrize("text", [
    '["a", "b"]', "[[1, 2, 3, 4], [1, 2]]", "[[1, 2, 3]]", '[[1, "x", 3, 4]]',
    "[[1, null, 3, 4]]", "[[1.5, 2, 3, 4]]", '{"a": 1}', "[[1, 2], [[0, 1]]]",
    "[[1, 2], [[0, 1, 2, 3, 4, 5, 6, 7, 8]]]", "[[1, 2, 3, 4], [", "[[]]",
    "[[1, 2, 3, 99999999999999999999999]]", "[" * 100000,
])
def test_malformed_timeline_is_an_input_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(InputError):
        read_timeline(tmp_path / "t.json")


# -- fuzzing ---------------------------------------------------------------------------------

ints = st.one_of(st.integers(0, 2**40), st.integers(-5, 5), st.integers(2**63, 2**64),
                 st.text(max_size=2), st.none(), st.booleans())
frames = st.lists(st.fixed_dictionaries({}, optional={
    "filename": st.sampled_from(["??", "", "a.cpp", "/u/m.py", "/s/site-packages/t.py"]),
    "line": ints, "name": st.text(max_size=3)}) | st.integers(), max_size=3)
sizes = st.integers(0, 2**40) | ints  # mostly valid, sometimes anything
block = st.fixed_dictionaries({"size": sizes}, optional={
    "requested_size": ints, "address": ints, "frames": frames,
    "state": st.sampled_from([*STATE_NAMES, "active_awaiting_free", "odd"]),
    "history": st.lists(st.fixed_dictionaries({}, optional={"real_size": ints,
                                                            "frames": frames}), max_size=1)})
segment = st.fixed_dictionaries({"blocks": st.lists(block | st.integers(), max_size=4)}, optional={
    "device": ints, "address": ints, "total_size": ints, "stream": ints,
    "segment_type": st.sampled_from(["large", "small", "odd"]), "is_expandable": st.booleans()})
entry = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from(["alloc", "free_completed", "free_requested", "oom",
                               "segment_map", "odd"]) | st.integers(),
    "addr": ints, "size": sizes, "stream": ints, "frames": frames, "device_free": ints,
    "device": ints, "time_us": ints | st.floats(allow_nan=True)})
settings_dicts = st.recursive(st.none() | st.integers() | st.floats() | st.text(),
                              lambda c: st.lists(c) | st.dictionaries(st.text(), c))
# well-formed snapshots with odd insides, and sparse dicts that often are not snapshots
snapshots = st.fixed_dictionaries({
    "segments": st.lists(segment | st.none() | st.fixed_dictionaries({"blocks": ints}),
                         min_size=1, max_size=4),
    "device_traces": st.lists(st.lists(entry | st.text(max_size=2), max_size=5), max_size=3),
}, optional={"allocator_settings": settings_dicts}) | st.fixed_dictionaries({}, optional={
    "segments": st.lists(segment, max_size=2),
    "device_traces": st.lists(st.lists(entry, max_size=3) | st.integers(), max_size=3),
    "allocator_settings": settings_dicts, "other": st.integers()})


def is_snapshot(data: dict[str, Any]) -> bool:
    traces = data.get("device_traces", [])
    return ("segments" in data or "device_traces" in data) and all(
        isinstance(t, list) for t in traces)


def valid_size(value: Any) -> int:
    return value if type(value) is int and -(2**63) <= value < 2**63 else 0


def block_bytes(data: dict[str, Any]) -> int:
    return sum(valid_size(b.get("size")) for s in data.get("segments", [])
               if isinstance(s, dict) and isinstance(s.get("blocks"), list)
               for b in s["blocks"] if isinstance(b, dict))


FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=snapshots)
def test_fuzzed_snapshot_dicts_load_or_raise_input_error(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any],
) -> None:
    path = write_pickle(tmp_path_factory.mktemp("fuzz") / "s.pickle", data)
    try:
        trace = read_snapshot(path)
    except InputError:
        assert not is_snapshot(data)
        return
    assert is_snapshot(data)
    trace.validate()
    json.dumps(trace.meta, allow_nan=False)
    entries = [e for t in data.get("device_traces", []) for e in t if isinstance(e, dict)]
    assert len(trace.memory) == len(entries)
    assert int(trace.memory_blocks["bytes"].sum()) == block_bytes(data)


@FUZZ
@given(head=st.sampled_from([b"", b"\x80\x02", b"\x80\x04", b"\x80\x05", b"\x1f\x8b"]),
       body=st.binary(max_size=300))
def test_random_bytes_raise_only_input_error(
    tmp_path_factory: pytest.TempPathFactory, head: bytes, body: bytes,
) -> None:
    path = tmp_path_factory.mktemp("bytes") / "r.pickle"
    path.write_bytes(head + body)
    with contextlib.suppress(InputError):
        read_snapshot(path).validate()


@pytest.fixture(scope="module")
def fixture_bytes() -> bytes:
    return fixture(f"memsnap/{SEGMENT_FREE}").read_bytes()


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                      max_size=6),
       keep=st.just(1.0) | st.floats(0, 1))
def test_mutated_and_truncated_real_snapshot_raises_only_input_error(
    tmp_path_factory: pytest.TempPathFactory, fixture_bytes: bytes,
    flips: list[tuple[float, int]], keep: float,
) -> None:
    raw = bytearray(fixture_bytes)
    for where, value in flips:
        raw[int(where * len(raw))] = value
    path = tmp_path_factory.mktemp("mut") / "m.pickle"
    path.write_bytes(bytes(raw[: max(1, int(keep * len(raw)))]))
    with contextlib.suppress(InputError):
        read_snapshot(path).validate()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=30)


@FUZZ
@given(doc=st.lists(st.lists(st.integers(-3, 10), min_size=0, max_size=5), max_size=6)
       | st.lists(json_values, max_size=4) | json_values)
def test_fuzzed_timeline_json_loads_or_raises_input_error(
    tmp_path_factory: pytest.TempPathFactory, doc: Any,
) -> None:
    path = tmp_path_factory.mktemp("tl") / "t.json"
    path.write_text(json.dumps(doc))
    with contextlib.suppress(InputError):
        read_timeline(path).validate()
