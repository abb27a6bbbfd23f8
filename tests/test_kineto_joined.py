"""Kineto files read together (their tables built once, `readers.kineto.joined`) give
exactly the merge of the files read one by one: every table, the merged meta and each
file's own meta; anything else is read one by one."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest

import gpudiag
from gpudiag.jobs import rank_map
from gpudiag.readers import sources
from gpudiag.readers.kineto.joined import read_joined
from gpudiag.readers.sources import read_file, read_together
from gpudiag.trace import merge
from tests.conftest import ROOT, fixture, fixtures

DATA = ROOT / "tests" / "data"


def one_by_one(paths: list[Path]) -> tuple[dict[str, pd.DataFrame], dict, list[dict]]:
    traces = [read_file(path) for path in paths]
    metas = [dict(trace.meta) for trace in traces]
    merged = merge(traces)
    merged.fill_rank()
    return merged.tables(), merged.meta, metas


def assert_same(paths: list[Path]) -> None:
    tables, meta, metas = one_by_one(paths)
    joined, joined_metas = read_joined(paths)
    for name, frame in tables.items():
        pd.testing.assert_frame_equal(getattr(joined, name), frame, check_exact=True,
                                      obj=name)
    assert repr(joined.meta) == repr(meta)
    assert repr(joined_metas) == repr(metas)


def test_every_kineto_fixture_together_equals_their_merge() -> None:
    paths = fixtures("kineto/*")
    if len(paths) < 2:
        pytest.skip("the shared Kineto fixtures are not beside the checkout")
    assert_same(paths)
    assert_same(paths[::-1])


@pytest.mark.parametrize("names", [
    ["world128_sampled_rank0.json.gz", "world128_sampled_rank1.json.gz"],
    # the same file twice: equal pids, tids and correlation ids in both
    ["a100_rank0of2_nccl_eventsync_annotations.json.gz"] * 2,
    ["v100_rank1of2_nccl_profile_memory.json.gz", "b200_rank0of8_nccl_allgather_pystack.json.gz",
     "v100_resnet50_legacy2021_schema.pt.trace.json.gz"],
])
def test_rank_files_together_equal_their_merge(names: list[str]) -> None:
    assert_same([fixture(f"kineto/{name}") for name in names])


def test_host_collectives_and_cpu_traces_together_equal_their_merge() -> None:
    assert_same([DATA / "gloo_rank0.pt.trace.json.gz", DATA / "gloo_rank1.pt.trace.json.gz",
                 DATA / "torch_cpu_train.pt.trace.json.gz"])


def test_what_is_not_plain_kineto_is_read_one_by_one(tmp_path: Path) -> None:
    rank = fixture("kineto/world128_sampled_rank0.json.gz")
    assert read_together([rank]) is None  # one file: nothing to join
    assert read_together([rank, DATA / "jax_cpu_train_perfetto.trace.json.gz"]) is None
    cut = tmp_path / "cut.json.gz"
    data = rank.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert read_together([rank, cut]) is None
    quotes = tmp_path / "quotes.json.gz"  # Kineto's bare quotes: the reader repairs it alone
    text = gzip.decompress(data).replace(b'"name": "', b'"name": "a"b', 1)
    quotes.write_bytes(gzip.compress(text))
    assert read_together([rank, quotes]) is None
    assert read_together([rank, rank]) is not None


def test_a_job_batch_of_kineto_ranks_is_read_together(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counted(paths: list[Path]) -> object:
        calls.append(paths)
        return read_together(paths)

    monkeypatch.setattr(rank_map, "read_together", counted)
    files = (str(fixture("kineto/world128_sampled_rank0.json.gz")),
             str(fixture("kineto/world128_sampled_rank1.json.gz")))
    part = rank_map.read_batch((files, rank_map.Options(rows=False)))
    assert len(calls) == 1 and part.files == files and not part.failed
    assert sources.read_together(calls[0]) is not None


@pytest.mark.parametrize("together_bytes", [48 << 20, 3 << 20], ids=["one run", "short runs"])
def test_load_reads_runs_of_kineto_files_together_as_one_by_one(
    together_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpudiag.load` of Kineto files beside another format: the same Trace as reading
    every file alone, however the files are grouped."""
    paths = [fixture("kineto/world128_sampled_rank0.json.gz"),
             fixture("kineto/world128_sampled_rank1.json.gz"),
             DATA / "jax_cpu_train_perfetto.trace.json.gz",
             DATA / "gloo_rank0.pt.trace.json.gz", DATA / "gloo_rank1.pt.trace.json.gz"]
    monkeypatch.setattr(sources, "TOGETHER_BYTES", together_bytes)
    together = gpudiag.load(paths)
    monkeypatch.setattr(sources, "read_together", lambda paths: None)
    alone = gpudiag.load(paths)
    for name, frame in alone.tables().items():
        pd.testing.assert_frame_equal(getattr(together, name), frame, check_exact=True,
                                      obj=name)
    assert repr(together.meta) == repr(alone.meta)
