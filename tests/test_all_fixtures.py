"""Every real profile in ../shared/fixtures loads into a valid Trace and survives a
save/load round trip without loss."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.schema import TABLE_NAMES
from tests.conftest import fixture, profile_fixtures

ALL = profile_fixtures() or ["(shared fixtures absent)"]
LOADABLE = [f for f in ALL if not f.endswith(".nsys-rep") or shutil.which("nsys")]


@pytest.mark.parametrize("name", LOADABLE)
def test_fixture_loads_into_a_valid_trace(name: str) -> None:
    trace = gpudiag.load(fixture(name))
    trace.validate()
    assert sum(trace.row_counts().values()) > 0
    assert trace.meta["sources"][0]["path"].endswith(Path(name).name)


@pytest.mark.parametrize("name", LOADABLE)
def test_fixture_round_trips_through_parquet(name: str, tmp_path: Path) -> None:
    trace = gpudiag.load(fixture(name))
    back = gpudiag.load(trace.save(tmp_path / "saved"))
    for table in TABLE_NAMES:
        pd.testing.assert_frame_equal(getattr(trace, table), getattr(back, table), obj=table)
    assert back.meta["sources"] == trace.meta["sources"]


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
@pytest.mark.parametrize("name", [f for f in ALL if f.endswith(".nsys-rep")])
def test_nsys_report_without_nsys_says_how_to_export_it(name: str) -> None:
    with pytest.raises(InputError, match="nsys export --type sqlite"):
        gpudiag.load(fixture(name))
