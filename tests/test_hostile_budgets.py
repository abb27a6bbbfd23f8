"""Hostile input stops at a documented budget, fast, with one line saying how to raise it.

Every input is made here, small on disk: gzip bombs of zeros written a block at a time, a
name of a million `},{`, nesting 1,000 deep, numbers too large for int64. docs/formats.md
("Limits on hostile input") lists the budgets these tests hit.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.names import short_name
from tests.builders import KinetoTrace
from tests.test_bad_input import run_cli

MiB = 1 << 20


def gzip_of(path: Path, head: bytes, filler: bytes, filler_bytes: int, tail: bytes = b"") -> Path:
    """`head`, `filler_bytes` of repeated `filler`, `tail`, gzipped a block at a time."""
    block = filler * (MiB // len(filler))
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        for _ in range(filler_bytes // len(block)):
            f.write(block)
        f.write(tail)
    return path


def kineto_text(**kernel: object) -> bytes:
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel("k", ts=20, dur=5, correlation=c, **kernel)
    return json.dumps(kt.document()).encode()


NCCL_HEAD = (b"# nThread 1 nGpus 8 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5\n"
             b"#       size         count      type   redop    root     time   algbw   busbw\n")


PLANE_NAME = b"\x12\x0d/device:GPU:0"
XSPACE_HEAD = b"\n\xff\xff\xff\x7f" + PLANE_NAME  # XSpace.planes, 256 MiB long


def load_error(path: Path, seconds: float) -> str:
    start = time.perf_counter()
    with pytest.raises(InputError) as info:
        gpudiag.load(path)
    assert time.perf_counter() - start < seconds
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


@pytest.mark.parametrize("name,head", [
    ("bomb.json.gz", b'{"traceEvents": [{"name": "'),  # a Kineto trace whose name never ends
    ("bomb.json.gz", b'{"traceEvents": ['),  # whitespace where the events should be
    ("bomb.txt.gz", b"NCCL_HEAD"),
    ("bomb.xplane.pb.gz", XSPACE_HEAD),  # a plane of zeros
])
def test_gzip_bomb_stops_at_the_inflation_budget(name: str, head: bytes, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDIAG_MAX_INFLATED_BYTES", str(16 * MiB))
    head = NCCL_HEAD if head == b"NCCL_HEAD" else head
    path = gzip_of(tmp_path / name, head, b"\0" if name.endswith("pb.gz") else b" ",
                   64 * MiB)
    assert path.stat().st_size < MiB
    message = load_error(path, seconds=10)
    assert "GPUDIAG_MAX_INFLATION_RATIO" in message and "16.0 MiB" in message


def test_gzip_bomb_with_default_budgets_is_refused_by_the_cli(tmp_path: Path) -> None:
    """An nccl-tests log padded with 300 MiB of spaces, 300 KB of gzip: over 100x the file
    and over 256 MiB."""
    path = gzip_of(tmp_path / "allreduce.log.gz", NCCL_HEAD, b" ", 300 * MiB)
    start = time.perf_counter()
    result = run_cli("analyze", str(path))
    assert time.perf_counter() - start < 30
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "inflates to more than 256.0 MiB" in lines[0]


def test_raising_the_ratio_reads_a_highly_compressed_real_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = kineto_text()
    padded = text[:-1] + b', "pad": "' + b" " * (8 * MiB) + b'"}'
    path = tmp_path / "padded.json.gz"
    path.write_bytes(gzip.compress(padded))
    monkeypatch.setenv("GPUDIAG_MAX_INFLATED_BYTES", str(MiB))
    assert "GPUDIAG_MAX_INFLATION_RATIO" in load_error(path, seconds=10)
    monkeypatch.setenv("GPUDIAG_MAX_INFLATION_RATIO", "100000")
    assert len(gpudiag.load(path).kernels) == 1


def test_a_bad_budget_value_is_an_input_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(kineto_text()))
    monkeypatch.setenv("GPUDIAG_MAX_INFLATION_RATIO", "lots")
    with pytest.raises(InputError, match="GPUDIAG_MAX_INFLATION_RATIO='lots' is not a number"):
        gpudiag.load(path)


def test_a_name_of_a_million_false_boundaries_loads_in_linear_time(tmp_path: Path) -> None:
    """A 1 MB name of `},{` (2.4 MB of JSON with escapes): each is a place the splitter may
    cut, and each cut fails to decode; retries double, so this costs a few decodes."""
    name = "},{" * 350_000
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel(name, ts=20, dur=5, correlation=c)
    for i in range(2000):  # enough events for several pieces
        kt.op(f"aten::op{i}", ts=30 + i, dur=1)
    path = kt.write(tmp_path / "boundaries.json")
    start = time.perf_counter()
    trace = gpudiag.load(path)
    assert time.perf_counter() - start < 15
    assert trace.kernels["name"].iloc[0] == name


def test_an_event_longer_than_the_budget_is_an_input_error(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDIAG_MAX_EVENT_BYTES", str(4 * MiB))
    head = b'{"traceEvents": [{"ph": "X", "name": "'
    path = gzip_of(tmp_path / "long.json.gz", head, b"x},{", 12 * MiB, b'"}]}')
    message = load_error(path, seconds=10)
    assert "an event longer than 4.0 MiB" in message and "GPUDIAG_MAX_EVENT_BYTES" in message


def test_a_200_mb_name_stops_at_the_default_event_budget(tmp_path: Path) -> None:
    """No boundary at all for 200 MB: the buffer is searched once, and 64 MiB is the end."""
    head = b'{"traceEvents": [{"ph": "X", "name": "'
    path = gzip_of(tmp_path / "huge.json.gz", head, b"ab", 200 * MiB, b'"}]}')
    assert "an event longer than 64.0 MiB" in load_error(path, seconds=30)


def test_damage_inside_a_gzip_stream_is_one_input_error(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(b'{"traceEvents": [' + b" " * MiB + b"]}"))
    data[len(data) // 2] ^= 0xFF
    path = tmp_path / "damaged.json.gz"
    path.write_bytes(bytes(data))
    assert "gzip" in load_error(path, seconds=5)


def test_an_xspace_of_zeros_is_refused_at_the_first_zero(tmp_path: Path) -> None:
    """Field number 0 does not exist: the walker stops there instead of stepping through
    millions of two-byte 'fields'."""
    zeros = b"\0" * (8 * MiB)
    body = PLANE_NAME + zeros
    path = tmp_path / "zeros.xplane.pb"
    path.write_bytes(b"\n" + _varint(len(body)) + body)
    assert "field number 0" in load_error(path, seconds=5)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_a_megabyte_kernel_name_of_unclosed_lambdas_is_shortened_in_linear_time(
        tmp_path: Path) -> None:
    name = "{lambda(" * 131072  # 1 MiB; the old lambda pattern rescanned to the end per "{"
    start = time.perf_counter()
    assert short_name(name).startswith("{lambda")
    assert time.perf_counter() - start < 5
    kt = KinetoTrace()
    c = kt.launch(ts=10)
    kt.kernel(name, ts=20, dur=5, correlation=c)
    path = kt.write(tmp_path / "lambda.json")
    result = run_cli("analyze", str(path))
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - start < 60


def two_kernels() -> KinetoTrace:
    kt = KinetoTrace()
    for i in range(2):
        c = kt.launch(ts=10 + 100 * i)
        kt.kernel(f"k{i}", ts=20 + 100 * i, dur=50, correlation=c)
    return kt


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("where", ["name", "args", "header", "top"])
def test_nesting_past_the_recursion_limit_is_one_input_error(where: str, tmp_path: Path) -> None:
    text = json.dumps(two_kernels().document())
    text = {"name": lambda t: t.replace('"k0"', DEEP),
            "args": lambda t: t.replace('"registers per thread": 32', f'"grid": {DEEP}', 1),
            "header": lambda t: t[:-1] + f', "extra": {{"a": {DEEP}}}}}',
            "top": lambda t: DEEP}[where](text)
    path = tmp_path / "deep.json"
    path.write_text(text)
    try:
        gpudiag.load(path)
    except InputError as exc:
        assert str(path) in str(exc)
        if where != "top":
            assert "too deeply" in str(exc)


@pytest.mark.parametrize("field,value", [("pid", 2**70), ("tid", -(2**70)), ("rank", 1e300),
                                         ("world_size", 2**70)])
def test_numbers_too_large_for_an_id_are_dropped_and_counted(field: str, value: float,
                                                            tmp_path: Path) -> None:
    doc = two_kernels().document()
    if field in ("rank", "world_size"):
        doc["distributedInfo"] = {field: value}
    else:
        doc["traceEvents"][0][field] = value
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    trace = gpudiag.load(path)
    trace.validate()
    assert len(trace.kernels) == 2 and sum(trace.meta["warnings"].values()) == 1


@pytest.mark.parametrize("dur", [1e300, "inf", "NaN", 86400e6 * 2])
def test_implausible_durations_are_dropped_and_counted(dur: object, tmp_path: Path) -> None:
    """`"dur": 1e300` once became 142 years of kernel and a 99.9999999%-useful waterfall."""
    doc = two_kernels().document()
    kernel = next(e for e in doc["traceEvents"] if e.get("name") == "k1")
    kernel["dur"] = dur
    path = tmp_path / "dur.json"
    path.write_text(json.dumps(doc))
    trace = gpudiag.load(path)
    assert list(trace.kernels["name"]) == ["k0"]
    assert (trace.kernels["end_ns"] - trace.kernels["start_ns"]).max() == 50_000
    [(warning, count)] = trace.meta["warnings"].items()
    assert "implausible duration" in warning and count == 1


def test_a_folder_over_the_file_count_budget_is_refused_before_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(12):
        (tmp_path / f"rank{i}.json").write_bytes(b"")
    monkeypatch.setenv("GPUDIAG_MAX_FILES", "10")
    message = load_error(tmp_path, seconds=5)
    assert "more than 10 files" in message and "GPUDIAG_MAX_FILES" in message
    monkeypatch.setenv("GPUDIAG_MAX_FILES", "12")
    with pytest.raises(InputError, match="no profile gpudiag can read"):
        gpudiag.load(tmp_path)


def test_a_folder_of_tiny_traces_builds_no_table_twice(tmp_path: Path) -> None:
    """Each tiny trace was 60-90 ms, mostly empty tables built column by column and the
    devices table built again from the same deviceProperties. Tables without events are now
    the schema's shared empty table, a job's ranks share one devices table, and a folder
    of Kineto traces is read together, each table built once for all of them: counted here
    (the cost per file is measured by hand, docs/formats.md, never timed in a test)."""
    from gpudiag import schema
    from gpudiag.readers.kineto import reader as kineto_reader

    text = kineto_text()
    for i in range(40):
        (tmp_path / f"rank{i}.json").write_bytes(text)
    gpudiag.load(tmp_path / "rank0.json")  # the devices table of these ranks, built once
    built = kineto_reader._devices_of.cache_info().misses
    conforms = []
    original = schema.Table.empty
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schema.Table, "empty",
                      lambda table: conforms.append(table.name) or original(table))
        trace = gpudiag.load(tmp_path)
    assert len(trace.kernels) == 40
    assert kineto_reader._devices_of.cache_info().misses == built  # no rank built it again
    # the tables these traces have no events for are the schema's empty one, built once
    # for the folder (read together), not once per file
    assert all(1 <= conforms.count(name) < 40 for name in ("syncs", "memory", "metrics"))


def test_a_trace_of_more_events_than_the_budget_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty events cost about 1 µs each to read however small: 100 MB of `{},` from 100 KB
    of gzip took 31 s. The event budget (20 million) bounds that; here it is set lower."""
    monkeypatch.setenv("GPUDIAG_MAX_EVENTS", "100000")
    path = gzip_of(tmp_path / "empties.json.gz", b'{"traceEvents": [', b"{},", 4 * MiB, b"{}]}")
    message = load_error(path, seconds=10)
    assert "more than 100,000 events" in message and "GPUDIAG_MAX_EVENTS" in message


def test_every_budget_of_the_readers_is_documented() -> None:
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "formats.md").read_text()
    section = docs[docs.index("## Limits on hostile input"):]
    names = set()
    modules = [*(root / "gpudiag" / "readers").rglob("*.py"),
               *(root / "gpudiag" / "inputs").rglob("*.py")]  # what reads a stranger's file
    for module in sorted(modules):
        names |= set(re.findall(r'"(GPUDIAG_MAX_\w+)"', module.read_text()))
    assert len(names) >= 6
    assert [n for n in sorted(names) if n not in section] == []
