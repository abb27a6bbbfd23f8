"""The schema contract: every table declared once, conform() and validate() follow it."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from gpudiag.diagnosis_schema import full_markdown
from gpudiag.errors import SchemaError
from gpudiag.schema import TABLE_NAMES, TABLES, markdown
from tests.conftest import ROOT

EXPECTED_TABLES = ("devices", "kernels", "copies", "api", "syncs", "ranges", "collectives",
                   "memory", "memory_blocks", "samples", "metrics")


def test_all_design_tables_are_declared() -> None:
    assert TABLE_NAMES == EXPECTED_TABLES


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_empty_table_is_valid_and_has_every_column(name: str) -> None:
    table = TABLES[name]
    frame = table.empty()
    assert list(frame.columns) == table.names
    assert table.problems(frame) == []


def test_times_are_int64_nanoseconds_and_sizes_bytes() -> None:
    for table in TABLES.values():
        for col in table.columns:
            if col.name.endswith("_ns"):
                assert (col.dtype, col.unit) == ("int64", "ns"), (table.name, col.name)
            if col.name == "bytes" or col.name.endswith("_bytes"):
                assert col.unit == "bytes", (table.name, col.name)


def test_conform_fills_missing_columns_with_na_and_casts() -> None:
    frame = TABLES["copies"].conform({"start_ns": [1, 2], "end_ns": [3, 4],
                                      "kind": ["HtoD", "memset"], "bytes": [1.0, None]})
    assert TABLES["copies"].problems(frame) == []
    assert frame["bytes"].tolist() == [1, pd.NA]
    assert frame["device"].isna().all()
    assert list(frame["kind"].cat.categories) == list(TABLES["copies"].column("kind").values)


def test_conform_rejects_undeclared_columns() -> None:
    with pytest.raises(SchemaError, match="undeclared"):
        TABLES["kernels"].conform({"start_ns": [1], "end_ns": [2], "kernel_id": [0],
                                   "colour": ["red"]})


def test_conform_rejects_values_outside_an_enumeration() -> None:
    with pytest.raises(SchemaError, match="not declared"):
        TABLES["syncs"].conform({"start_ns": [1], "end_ns": [2], "kind": ["sometimes"]})


def test_required_time_column_cannot_be_missing() -> None:
    with pytest.raises(SchemaError):
        TABLES["kernels"].conform({"name": ["k"], "kernel_id": [0]})
    with pytest.raises(SchemaError):
        TABLES["kernels"].conform({"start_ns": [None], "end_ns": [2], "kernel_id": [0]})


def test_problems_reports_rows_that_end_before_they_start() -> None:
    frame = TABLES["kernels"].conform({"start_ns": [5], "end_ns": [4], "kernel_id": [0]})
    assert any("end before" in p for p in TABLES["kernels"].problems(frame))


def test_docs_schema_table_is_generated_from_the_declaration() -> None:
    text = (ROOT / "docs" / "schema.md").read_text()
    assert text == full_markdown(), "docs/schema.md is stale: run `gpudiag schema > docs/schema.md`"
    assert text.startswith(markdown()) and "\n# Diagnosis schema\n" in text  # both parts


def test_schema_command_prints_the_docs_table() -> None:
    out = subprocess.run([sys.executable, "-m", "gpudiag", "schema"], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    assert out.stdout == full_markdown()
