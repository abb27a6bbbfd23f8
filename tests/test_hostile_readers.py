"""Hostile input for the pickle, nsys and ncu readers: every one a one-line InputError, fast,
without running code, writing through a planted symlink or hanging (issue 12)."""

from __future__ import annotations

import copyreg
import pickle
import time
from pathlib import Path

import pytest

from gpudiag.collectors import torch_memory
from gpudiag.collectors.torch_memory_pickle import load_plain
from gpudiag.errors import InputError

# -- torch memory snapshots ----------------------------------------------------------------

CALLS: list[object] = []
EXT_CODE = 0xF1  # an EXT1 code no stdlib module registers


def record_call(*args: object) -> str:
    """Stands in for os.system: what a crafted extension pickle would call."""
    CALLS.append(args)
    return "called"


def _extension_pickle() -> bytes:
    """PROTO 2; EXT1 code; ('echo pwned',) ; REDUCE; STOP: calls the registered callable."""
    return b"\x80\x02\x82" + bytes([EXT_CODE]) + b"X\x0a\x00\x00\x00echo pwned\x85R."


@pytest.fixture
def cached_extension():
    """`record_call` registered as an extension and already resolved (cached) in-process."""
    copyreg.add_extension(__name__, "record_call", EXT_CODE)
    try:
        assert pickle.loads(_extension_pickle()) == "called"  # fills copyreg's cache
        assert copyreg._extension_cache  # the state the hole needs
        CALLS.clear()
        yield
    finally:
        copyreg.remove_extension(__name__, "record_call", EXT_CODE)
        CALLS.clear()


def test_cached_extension_opcode_is_refused_without_calling(
        tmp_path: Path, cached_extension: None) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_extension_pickle())
    with pytest.raises(InputError, match="extension code 241") as info:
        load_plain(path)
    assert not CALLS and str(path) in str(info.value) and "\n" not in str(info.value)


def test_registered_but_uncached_extension_is_refused_by_find_class(tmp_path: Path) -> None:
    copyreg.add_extension(__name__, "record_call", EXT_CODE)
    try:
        path = tmp_path / "snapshot.pickle"
        path.write_bytes(_extension_pickle())
        with pytest.raises(InputError, match="carries code"):
            load_plain(path)
        assert not CALLS
    finally:
        copyreg.remove_extension(__name__, "record_call", EXT_CODE)


def _shared_snapshot(k: int) -> bytes:
    """k segments that are one segment of k blocks that are one block: k*k blocks, O(k) bytes."""
    block = {"size": 512, "state": "active_allocated", "address": 0}
    segment = {"blocks": [block] * k, "segment_type": "large", "address": 0}
    return pickle.dumps({"segments": [segment] * k, "device_traces": []}, protocol=4)


def test_shared_references_are_bounded_by_the_row_budget(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_shared_snapshot(40_000))  # 1.6e9 blocks, as in the issue
    assert path.stat().st_size < 200_000
    start = time.perf_counter()
    with pytest.raises(InputError, match="GPUDIAG_MAX_SNAPSHOT_ROWS") as info:
        torch_memory.read_snapshot(path)
    assert time.perf_counter() - start < 5
    assert "10,000,000" in str(info.value) and "max_rows" in str(info.value)


def test_row_budget_is_raised_by_keyword_or_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_shared_snapshot(30))  # 900 blocks
    assert len(torch_memory.read_snapshot(path).memory_blocks) == 900
    with pytest.raises(InputError, match="more than 100 "):
        torch_memory.read_snapshot(path, max_rows=100)
    monkeypatch.setenv("GPUDIAG_MAX_SNAPSHOT_ROWS", "100")
    with pytest.raises(InputError, match="more than 100 "):
        torch_memory.read_snapshot(path)
    assert len(torch_memory.read_snapshot(path, max_rows=900).memory_blocks) == 900
