"""Trace: always every table, lossless Parquet round trip, merging processes and ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.schema import TABLE_NAMES
from gpudiag.trace import Trace, merge
from tests import builders as b


def assert_same(a: Trace, c: Trace) -> None:
    for name in TABLE_NAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(c, name), obj=name)


def test_new_trace_has_every_table_empty_and_valid() -> None:
    trace = Trace()
    assert set(trace.tables()) == set(TABLE_NAMES)
    assert all(len(f) == 0 for f in trace.tables().values())
    trace.validate()
    assert not trace.has_gpu_activity()


def test_assigning_a_table_conforms_it() -> None:
    trace = Trace()
    trace.kernels = pd.DataFrame({"start_ns": [1], "end_ns": [9], "kernel_id": [0]})
    assert trace.kernels["grid_x"].dtype == "Int64"
    trace.validate()


def test_save_and_load_round_trip_without_loss(tmp_path: Path) -> None:
    trace = b.trace(
        kernels=[b.kernel(0, 100, "gemm", grid=(256, 1, 1)), b.kernel(150, 160, "relu")],
        copies=[b.copy(100, 150, "DtoH", 4096, host_mem="pinned")],
        syncs=[b.sync(100, 150, "stream")],
        meta={"rank": 3, "tool_versions": {"x": "1"}},
    )
    trace.warn("something repaired", 2)
    trace.save(tmp_path / "run")
    back = gpudiag.load(tmp_path / "run")
    assert_same(trace, back)
    assert back.meta["rank"] == 3
    assert back.meta["warnings"] == {"something repaired": 2}


def test_merge_keeps_pid_and_rank_and_keeps_kernel_ids_unique() -> None:
    r0 = b.trace(kernels=[b.kernel(0, 10, pid=11), b.kernel(20, 30, pid=11)], meta={"rank": 0})
    r1 = b.trace(kernels=[b.kernel(5, 15, pid=22)], meta={"rank": 1})
    merged = merge([r0, r1])
    assert merged.kernels["pid"].tolist() == [11, 11, 22]
    assert merged.kernels["rank"].tolist() == [0, 0, 1]
    assert merged.kernels["kernel_id"].is_unique
    assert merged.meta["ranks"] == [0, 1]
    merged.validate()


def test_merge_keeps_categories_when_names_differ_between_ranks() -> None:
    merged = merge([b.trace(kernels=[b.kernel(0, 1, "a")]),
                    b.trace(kernels=[b.kernel(0, 1, "b")])])
    assert merged.kernels["name"].dtype == "category"
    assert sorted(merged.kernels["name"].astype(str)) == ["a", "b"]


def test_loading_a_damaged_run_directory_names_the_file(tmp_path: Path) -> None:
    b.trace(kernels=[b.kernel(0, 1)]).save(tmp_path / "run")
    (tmp_path / "run" / "kernels.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match=r"kernels\.parquet"):
        gpudiag.load(tmp_path / "run")


def test_a_newer_format_version_asks_to_upgrade(tmp_path: Path) -> None:
    out = b.trace().save(tmp_path / "run")
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "gpudiag_format_version": 99}))
    with pytest.raises(InputError, match="upgrade"):
        gpudiag.load(out)
