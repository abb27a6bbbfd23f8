"""Streaming Chrome-trace JSON in pieces gives exactly the events of a whole-file decode,
whatever the piece size and however tricky the text between events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.errors import InputError
from gpudiag.readers.chrome import stream as stream_module
from gpudiag.readers.chrome.stream import ChromeTraceStream
from gpudiag.readers.chrome.structs import decode
from tests.conftest import fixture

SMALL_FIXTURES = ["a100_alexnet_sync_critical_path.json.gz", "h100_cuda_sync_category_small.json",
                  "mi250_rocm_minitoy_nonnvidia.json.gz", "world128_sampled_rank0.json.gz"]


def streamed(path: Path, piece_bytes: int) -> tuple[list[tuple[Any, ...]], Any]:
    stream = ChromeTraceStream(path, piece_bytes=piece_bytes)
    events = [(e.ph, e.cat, e.name, e.ts, bytes(e.args)) for piece in stream.pieces()
              for e in piece]
    return events, stream.header


def whole(path: Path) -> list[tuple[Any, ...]]:
    return [(e.ph, e.cat, e.name, e.ts, bytes(e.args)) for e in decode(path).traceEvents or []]


@pytest.mark.parametrize("name", SMALL_FIXTURES)
@pytest.mark.parametrize("piece_bytes", [1, 700, 65536])
def test_pieces_of_a_real_trace_equal_the_whole_decode(name: str, piece_bytes: int) -> None:
    path = fixture(f"kineto/{name}")
    events, header = streamed(path, piece_bytes)
    assert events == whole(path)
    full = decode(path)
    assert header.deviceProperties == full.deviceProperties
    assert header.distributedInfo == full.distributedInfo
    assert header.baseTimeNanoseconds == full.baseTimeNanoseconds


TRICKY = [
    {"ph": "X", "cat": "cpu_op", "name": 'a}, {"b": 1}, {c', "ts": 1, "dur": 1,
     "args": {"Input Dims": [{"x": 1}, {"y": 2}], "s": "}  ,  {"}},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 2, "dur": 1, "args": {"grid": [1, 1, 1]}},
    {"ph": "i", "name": "]}, \"traceName\": 1}", "ts": 3, "args": {}},
]


def write(path: Path, doc: Any, *, gz: bool = False, indent: int | None = None) -> Path:
    data = json.dumps(doc, indent=indent).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("layout", ["events first", "events last", "array form", "indented"])
@pytest.mark.parametrize("piece_bytes", [1, 40, 1 << 20])
def test_false_boundaries_inside_strings_and_nested_objects(
    layout: str, piece_bytes: int, tmp_path: Path
) -> None:
    header = {"deviceProperties": [{"id": 0}, {"id": 1}], "traceName": "t"}
    doc: Any = {
        "events first": {"traceEvents": TRICKY, **header},
        "events last": {**header, "traceEvents": TRICKY},
        "array form": TRICKY,
        "indented": {**header, "traceEvents": TRICKY},
    }[layout]
    path = write(tmp_path / "t.json", doc, indent=2 if layout == "indented" else None)
    events, parsed = streamed(path, piece_bytes)
    assert [e[2] for e in events] == [e["name"] for e in TRICKY]
    if layout != "array form":
        assert parsed.deviceProperties == header["deviceProperties"]
        assert parsed.traceName == "t"


def test_empty_event_list_and_concatenated_gzip_members(tmp_path: Path) -> None:
    assert streamed(write(tmp_path / "e.json", {"traceEvents": [], "traceName": "x"}), 8)[0] == []
    data = json.dumps({"traceEvents": TRICKY}).encode()
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(data[:50]) + gzip.compress(data[50:]))
    assert len(streamed(path, 16)[0]) == len(TRICKY)


@pytest.mark.parametrize("cut", [10, 60, 150, -3, -1])
def test_truncated_text_is_an_input_error(cut: int, tmp_path: Path) -> None:
    text = json.dumps({"traceEvents": TRICKY, "traceName": "x"}).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(text[:cut])
    with pytest.raises(InputError, match=str(path)):
        streamed(path, 32)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(
    names=st.lists(st.text(alphabet='{}[],: "\\abc\n', max_size=12), min_size=1, max_size=12),
    piece_bytes=st.integers(1, 300),
)
def test_any_names_and_piece_size_give_the_same_events(
    names: list[str], piece_bytes: int, tmp_path: Path
) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "ts": i, "dur": 1,
               "args": {"nested": [{"k": n}, {"k": [n]}]}} for i, n in enumerate(names)]
    path = write(tmp_path / "h.json", {"traceEvents": events, "tail": names})
    assert [e[2] for e in streamed(path, piece_bytes)[0]] == names


def test_the_array_end_is_found_from_the_header_after_it() -> None:
    from gpudiag.readers.chrome.stream import _closing_bracket

    events = b'[{"name": "a]"}, {"args": {"d": [1, 2]}}]'
    assert _closing_bracket(events + b"}") == len(events) - 1
    assert _closing_bracket(events + b', "traceName": "x", "n": 1}\n') == len(events) - 1
    # lists after the array: the last `]` that passes is the header's, whose cut fails to
    # decode as events, and the reader falls back to the decoder's trailing offset
    tail = b', "deviceProperties": [{"id": 0}], "x": "y"}'
    assert _closing_bracket(events + tail) == len(events) + tail.index(b"]")
    assert _closing_bracket(events + b', "x": "' + b"]" * 9 + b'", "y": 1}') is None


@pytest.mark.parametrize("tail", [{}, {"traceName": "t"},
                                  {"deviceProperties": [{"id": 0}], "x": [[1], [2]]}])
def test_a_header_after_the_events_keeps_every_event(tail: dict[str, Any],
                                                     tmp_path: Path) -> None:
    events = [{"ph": "X", "name": f"e{n}]", "ts": n, "dur": 1, "args": {"l": [n]}}
              for n in range(50)]
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": ' + json.dumps(events).encode() + b"".join(
        b", " + json.dumps(key).encode() + b": " + json.dumps(value).encode()
        for key, value in tail.items()) + b"}")
    got, header = streamed(path, 1 << 20)
    assert [event[2] for event in got] == [event["name"] for event in events]
    if "traceName" in tail:
        assert header.traceName == "t"


@pytest.mark.parametrize("thread_bytes", [0, 1 << 40], ids=["thread", "inline"])
def test_a_file_read_by_a_thread_or_inline_gives_the_same_events_and_errors(
    thread_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files under THREAD_BYTES are read in the caller's thread, larger ones by a thread of
    their own: the events, a truncated gzip's error and giving up early are the same."""
    monkeypatch.setattr(stream_module, "THREAD_BYTES", thread_bytes)
    path = fixture("kineto/world128_sampled_rank0.json.gz")
    assert streamed(path, 65536)[0] == whole(path)
    data = gzip.compress(json.dumps({"traceEvents": TRICKY, "traceName": "x"}).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or damaged gzip"):
        streamed(cut, 16)
    stream = ChromeTraceStream(path, piece_bytes=4096)
    pieces = stream.pieces()
    assert next(pieces)
    pieces.close()  # the caller gives up after one piece: the reader stops, the file closes
    text = stream._text
    assert text._thread is None or not text._thread.is_alive()
