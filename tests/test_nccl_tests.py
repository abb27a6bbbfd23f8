"""nccl-tests logs: every measured size becomes two collectives rows (out-of-place, in-place)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gpudiag
from gpudiag.errors import InputError
from tests.conftest import fixture

LOGS = {"a100x8_allreduce_superbench.log": "all_reduce",
        "a100x8_alltoall_superbench.log": "all_to_all"}


def table_rows(path: Path) -> list[list[str]]:
    """Independent parse: lines that start with two integers and a type name."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 10 and parts[0].isdigit() and parts[1].isdigit():
            rows.append(parts)
    return rows


@pytest.mark.parametrize("name", LOGS)
def test_log_rows_become_collectives_with_size_and_time(name: str) -> None:
    path = fixture(f"nccl/{name}")
    rows = table_rows(path)
    trace = gpudiag.load(path)
    trace.validate()
    c = trace.collectives
    assert len(c) == 2 * len(rows)
    assert set(c["op"].astype(str)) == {LOGS[name]}
    assert c["group_size"].unique().tolist() == [8]
    assert c["bytes"].iloc[::2].tolist() == [int(r[0]) for r in rows]
    out_of_place_us = [float(r[-8]) for r in rows]
    dur_ns = (c["end_ns"] - c["start_ns"]).iloc[::2]
    assert dur_ns.tolist() == [round(t * 1000) for t in out_of_place_us]
    assert trace.meta["timeline"] is False


def test_op_inferred_from_bus_bandwidth_factor_without_a_telling_file_name(tmp_path: Path) -> None:
    text = fixture("nccl/a100x8_allreduce_superbench.log").read_text()
    path = tmp_path / "perf.log"
    path.write_text(text)
    assert set(gpudiag.load(path).collectives["op"].astype(str)) == {"all_reduce"}


def test_log_without_results_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "failed.log"
    path.write_text("# nThread 1 nGpus 8 minBytes 8 maxBytes 128\n# Using devices\n"
                    "NCCL WARN something broke\n")
    with pytest.raises(InputError, match=re.escape(str(path))):
        gpudiag.load(path)
