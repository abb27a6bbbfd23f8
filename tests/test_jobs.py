"""A many-rank job diagnosed rank by rank (`jobs.diagnose_job`) equals the diagnosis of the
merged job (`diagnose(gpudiag.load(files))`), to the nanosecond, in this process, on a
local process pool and on a real Dask LocalCluster; a corrupt rank is listed and skipped."""

from __future__ import annotations

import gzip
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import gpudiag
from gpudiag.analyzers.diagnosis import Diagnosis
from gpudiag.jobs import diagnose_job
from gpudiag.jobs.rank_map import Options, read_batch
from tests.conftest import fixtures_dir

KINETO = fixtures_dir() / "kineto"
PAIR = [KINETO / "world128_sampled_rank0.json.gz", KINETO / "world128_sampled_rank1.json.gz"]
TS = re.compile(rb'"ts": ?(-?[0-9.]+)')
DISTRIBUTED = re.compile(rb'"distributedInfo": ?\{[^}]*\}')


def shifted_job(source: Path | list[Path], ranks: int, folder: Path,
                shift_us: float = 137.0) -> Path:
    """`ranks` copies of a real rank trace (of several: rank r copies the r-th modulo
    their count), each its own rank with its clock shifted (so the late rank and the waits
    are known): a job built from real rank files."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = [gzip.decompress(path.read_bytes())
             for path in (source if isinstance(source, list) else [source])]
    for rank in range(ranks):
        text = texts[rank % len(texts)]
        shifted = TS.sub(lambda m, r=rank: b'"ts": ' + repr(float(m[1]) + r * shift_us)
                         .encode(), text)
        info = b'"distributedInfo": ' + json.dumps(
            {"backend": "nccl", "rank": rank, "world_size": ranks}).encode()
        ranked = (DISTRIBUTED.sub(info, shifted, count=1) if DISTRIBUTED.search(shifted)
                  else shifted.replace(b"{", b"{" + info + b", ", 1))
        (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(ranked, 1))
    return folder


ROW_TABLES = ("host_gaps",)  # what a compact job (rows=False) leaves with its ranks


def diagnose(trace: gpudiag.Trace, **options: Any) -> Diagnosis:
    """The merged diagnosis a job equals, expected savings included."""
    return gpudiag.diagnose(trace, **options)


def assert_same(job: Diagnosis, merged: Diagnosis, *, rows: bool = True) -> None:
    """Every frame, table and note of the two diagnoses, equal (values, dtypes, order);
    without the row-level results when the job is compact (`rows=False`)."""
    if not rows:
        assert job.gaps is None and not set(ROW_TABLES) & set(job.tables)
        merged = Diagnosis(**{**vars(merged), "gaps": None, "tables": {
            name: table for name, table in merged.tables.items() if name not in ROW_TABLES}})
    for name in ("losses", "findings", "gaps", "steps", "by_step"):
        left, right = getattr(job, name), getattr(merged, name)
        assert (left is None) == (right is None), name
        if left is not None:
            pd.testing.assert_frame_equal(left.reset_index(drop=True),
                                          right.reset_index(drop=True), obj=name)
    assert job.notes == merged.notes
    assert sorted(job.tables) == sorted(merged.tables)
    for name, table in merged.tables.items():
        pd.testing.assert_frame_equal(job.tables[name].reset_index(drop=True),
                                      table.reset_index(drop=True), obj=name)
    if merged.gaps is not None and "host_gaps" in merged.tables:  # same gap numbering
        assert list(job.tables["host_gaps"].index) == list(merged.tables["host_gaps"].index)
        assert list(job.gaps.index) == list(merged.gaps.index)


@pytest.fixture(scope="module")
def job4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shifted_job(KINETO / "a100_80gb_rank0of16_nccl_streamsync.json.gz", 4,
                       tmp_path_factory.mktemp("job4"))


def test_the_real_rank_pair_in_process_equals_the_merged_diagnosis() -> None:
    merged = diagnose(gpudiag.load(PAIR), steps=True)
    job = diagnose_job(PAIR, workers=1, steps=True)
    assert_same(job, merged)
    assert job.failed == [] and len(job.findings) > 20
    assert (job.findings["cause"] == "comm_wait").any()  # the cross-rank part is there


def test_a_shifted_four_rank_job_on_a_local_pool_equals_the_merged_diagnosis(
        job4: Path) -> None:
    merged = diagnose(gpudiag.load(job4), steps=True)
    job = diagnose_job(job4, workers=2, steps=True)
    assert_same(job, merged)
    waits = merged.losses[merged.losses["cause"] == "comm_wait"].set_index("rank")["lost_ns"]
    assert waits.loc[0] > 0 and waits.loc[3] == 0  # the last rank never waits
    assert len(merged.tables["sync_waits"]) > 0  # syncs of four ranks, combined


def test_a_dask_local_cluster_gives_the_same_diagnosis(job4: Path, dask_client: Any) -> None:
    merged = diagnose(gpudiag.load(job4))
    assert_same(diagnose_job(job4, client=dask_client), merged)


def ranked_job(sources: list[Path], folder: Path, *, lost_launch: int | None = None) -> Path:
    """A job whose ranks are different real traces (each given its rank): unlike copies of
    one rank, its ranks differ in what they recorded (launch calls, step markers, GPUs),
    so whatever an analysis computes over all the rows of a batch differs with the batch.
    `lost_launch`: a kernel of that rank lost its launch call (a dropped CUPTI record)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, source in enumerate(sources):
        raw = source.read_bytes()
        doc = json.loads(gzip.decompress(raw) if source.suffix == ".gz" else raw)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(sources)}
        if rank == lost_launch:
            kernels = [event for event in doc["traceEvents"] if event.get("cat") == "kernel"]
            kernels[len(kernels) // 2]["args"]["correlation"] = 2**31 - 1
        (folder / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return folder


@pytest.fixture(scope="module")
def mixed_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ranked_job([KINETO / name for name in (
        "world128_sampled_rank0.json.gz", "a100_alexnet_sync_critical_path.json.gz",
        "world128_sampled_rank1.json.gz", "h100_bert_small_inference_shapes.json.gz",
        "world128_sampled_rank0.json.gz", "normalization_layers_shapes.json.gz")],
        tmp_path_factory.mktemp("mixed"), lost_launch=2)


def test_ranks_that_differ_give_the_merged_diagnosis_however_they_are_batched(
        mixed_job: Path, dask_client: Any) -> None:
    """Copies of one rank hid two drifts (the same job, another answer on 2 or 3 workers):
    launch times went through float64 whenever a batch held a kernel without its launch
    call (epoch ns rounded to 256 ns, so 50 µs gaps crossed `launch_gap_ns`: rank 5 of a
    real 8-rank V100 job moved 49.8 µs between host_bound and launch_bound), and a rank
    without step markers got no steps when any rank of its batch had them."""
    merged = diagnose(gpudiag.load(mixed_job), steps=True)
    methods = merged.steps.groupby("rank")["method"].first()
    assert list(methods) == ["markers", "repeating_ops", "markers", "markers", "markers",
                             "repeating_ops"]  # each rank's steps, found its own way
    for where in ({"workers": 1}, {"workers": 2}, {"workers": 3}, {"client": dask_client}):
        assert_same(diagnose_job(mixed_job, steps=True, **where), merged)


@pytest.fixture(scope="module")
def job32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 DLRM ranks (the 128-rank job's rank 0, 120 KB, shifted per rank): small files
    that share batches, whose names sort rank0, rank1, rank10, ..., so every batch holds
    ranks far apart and the job interleaves them back in rank order."""
    return shifted_job(PAIR[0], 32, tmp_path_factory.mktemp("job32"), shift_us=53.0)


@pytest.fixture(scope="module")
def job64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 DLRM ranks from the 128-rank job's two sampled rank files (rank r copies rank
    r mod 2), each clock shifted: batches of 16 to 22 small files, cut differently on 2
    and 3 workers."""
    return shifted_job(PAIR, 64, tmp_path_factory.mktemp("job64"), shift_us=53.0)


def test_a_64_rank_job_in_batches_equals_the_merged_diagnosis_everywhere(
        job64: Path, dask_client: Any) -> None:
    """The whole answer, expected savings included: each batch selects its events of the
    job's findings, the job replays them together (`jobs.replay_pass`)."""
    merged = diagnose(gpudiag.load(job64), steps=True)
    assert len(merged.losses["rank"].unique()) == 64
    assert merged.findings["saving_ns"].notna().any()
    for where in ({"workers": 1}, {"workers": 2}, {"workers": 3}, {"client": dask_client}):
        assert_same(diagnose_job(job64, steps=True, **where), merged)
    assert_same(diagnose_job(job64, workers=2, steps=True, rows=False), merged, rows=False)


def test_batches_group_consecutive_small_files_and_leave_large_ones_alone(
        job32: Path, job4: Path) -> None:
    from gpudiag.jobs.batches import plan, read_bytes

    small = [str(path) for path in sorted(job32.glob("*.json.gz"))]
    # 32 ranks of 1.7 MB read (54 MB): two batches under the 48 MB cap, one per worker;
    # a third worker gets its own (each batch pays the analyzers' fixed cost)
    assert [len(batch) for batch in plan(small, 2)] == [16, 16]
    assert [len(batch) for batch in plan(small, 3)] == [11, 10, 11]
    assert [len(batch) for batch in plan(small[:16], 2)] == [8, 8]
    assert [len(batch) for batch in plan(small, 1, batch_bytes=2**30)] == [32]
    assert [file for batch in plan(small, 3) for file in batch] == small  # order kept
    large = [str(path) for path in sorted(job4.glob("*.json.gz"))]
    assert read_bytes(Path(large[0])) > 20 * 2**20  # the gzip trailer: 25.8 MB inflated
    assert [len(batch) for batch in plan(large, 1)] == [1, 1, 1, 1]
    each = max(read_bytes(Path(file)) for file in small)  # 1.7 MB inflated
    assert [len(batch) for batch in plan(small, 1, batch_bytes=2 * each)] == [2] * 16


def test_batches_share_the_bytes_evenly_under_the_cap(tmp_path: Path) -> None:
    from gpudiag.jobs.batches import plan

    def files(*sizes: int) -> list[str]:
        out = []
        for index, size in enumerate(sizes):
            path = tmp_path / f"{len(list(tmp_path.iterdir())):03d}-{index}.json"
            path.write_bytes(b" " * size)
            out.append(str(path))
        return out

    def sizes(batches: list[tuple[str, ...]]) -> list[int]:
        return [sum(Path(file).stat().st_size for file in batch) for batch in batches]

    uneven = files(50, 10, 10, 10, 10, 10, 40, 30, 20, 10)  # 200 bytes
    # one worker, a cap of 100: two batches of about 100 bytes, in order, none over the cap
    one = plan(uneven, 1, batch_bytes=100)
    assert sizes(one) == [100, 100]
    assert [file for batch in one for file in batch] == uneven
    # three workers: three batches of about a third each (a batch per worker)
    three = plan(uneven, 3, batch_bytes=100)
    assert sizes(three) == [70, 70, 60]
    assert [file for batch in three for file in batch] == uneven
    # an even share over the cap (uneven files): more batches, not a fragment cut off
    assert sizes(plan(files(60, 60, 60, 20), 1, batch_bytes=100)) == [60, 60, 80]
    # a file over the cap is a batch of its own; the small ones around it share theirs
    big = files(5, 5, 300, 5, 5)
    assert [len(batch) for batch in plan(big, 1, batch_bytes=100)] == [2, 1, 2]
    # more workers than files: one file each; files of nothing still all read
    assert [len(batch) for batch in plan(files(10, 10), 8, batch_bytes=100)] == [1, 1]
    assert sum(len(batch) for batch in plan(files(0, 0, 0), 2)) == 3


def test_a_batch_with_a_corrupt_file_analyzes_the_others(job32: Path, tmp_path: Path
                                                         ) -> None:
    files = sorted(job32.glob("*.json.gz"))[:3]
    broken = tmp_path / "rank99.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": '))
    part = read_batch(((str(files[0]), str(broken), str(files[1])), Options()))
    assert part.files == (str(files[0]), str(files[1]))
    assert [path for path, _ in part.failed] == [str(broken)]
    job = diagnose_job([files[0], broken, files[1]], workers=1)
    assert [path for path, _ in job.failed] == [str(broken)]
    assert_same(job, diagnose(gpudiag.load(files[:2])))


def test_a_compact_job_gives_the_same_findings_without_the_gap_rows(job4: Path) -> None:
    """rows=False: host-gap pieces are summed per finding key where they are found (with
    each gap's size for the medians); the gap rows stay with their ranks."""
    merged = diagnose(gpudiag.load(job4), steps=True)
    assert_same(diagnose_job(job4, workers=2, steps=True, rows=False), merged, rows=False)
    unit = read_batch(((str(job4 / "rank0.json.gz"),), Options(rows=False)))
    part = unit.group
    assert part is not None and part.gaps is None and part.parts["host_gaps"].pieces is None
    full = read_batch(((str(job4 / "rank0.json.gz"),), Options()))
    assert len(pickle.dumps(unit)) < 0.4 * len(pickle.dumps(full))


def test_allocator_events_of_two_ranks_give_the_merged_fragmentation(tmp_path: Path) -> None:
    """The V100 rank with `profile_memory=True` (28k [memory] events), twice: the
    fragmentation rows name the merged job's memory rows (`event`)."""
    job = shifted_job(KINETO / "v100_rank1of2_nccl_profile_memory.json.gz", 2, tmp_path)
    merged = diagnose(gpudiag.load(job))
    assert len(merged.tables["fragmentation"]) > 1000
    assert_same(diagnose_job(job, workers=1), merged)


def test_ranks_that_lack_an_analyzers_rows_give_the_merged_diagnosis(tmp_path: Path) -> None:
    """Batches of one rank each, of three real jobs: the V100 rank's allocator events, the
    others' none. The batches without them send no allocator part, and the job still
    equals the merge."""
    names = ["world128_sampled_rank0.json.gz", "v100_rank1of2_nccl_profile_memory.json.gz",
             "world128_sampled_rank1.json.gz"]
    for index, name in enumerate(names):  # each its own rank of one job
        text = gzip.decompress((KINETO / name).read_bytes())
        info = b'"distributedInfo": ' + json.dumps(
            {"backend": "nccl", "rank": index, "world_size": len(names)}).encode()
        (tmp_path / f"r{index}.json.gz").write_bytes(
            gzip.compress(DISTRIBUTED.sub(info, text, count=1), 1))
    merged = diagnose(gpudiag.load(tmp_path))
    assert len(merged.tables["fragmentation"]) > 1000
    assert_same(diagnose_job(tmp_path, workers=2), merged)


def test_a_window_gives_the_merged_windowed_diagnosis(job4: Path) -> None:
    trace = gpudiag.load(job4)
    start = int(trace.kernels["start_ns"].min())
    window = (start + 400_000_000, start + 1_200_000_000)
    assert_same(diagnose_job(job4, workers=1, window=window, steps=True),
                diagnose(trace, window=window, steps=True))


def test_warm_up_steps_of_a_job_are_flagged_as_in_the_merged_diagnosis(
        tmp_path: Path) -> None:
    """CPU torch traces without markers: steps are detected and the first are warm-up, so
    the job reads its files a second time for the warm-up window's findings."""
    job = shifted_job(Path(__file__).parent / "data" / "torch_cpu_train.pt.trace.json.gz", 2,
                      tmp_path)
    merged = diagnose(gpudiag.load(job), steps=True)
    assert merged.steps is not None and merged.steps["warmup"].any()
    assert_same(diagnose_job(job, workers=1, steps=True), merged)


def test_a_corrupt_rank_is_listed_and_the_others_analyzed(job4: Path, tmp_path: Path) -> None:
    files = sorted(job4.glob("rank*.json.gz"))
    broken = tmp_path / "rank9.json.gz"
    broken.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": '))
    job = diagnose_job([*files[:2], broken], workers=1)
    assert [path for path, _ in job.failed] == [str(broken)]
    assert "rank9.json.gz" in job.failed[0][1] or "JSON" in job.failed[0][1]
    assert_same(job, diagnose(gpudiag.load(files[:2])))


def test_what_crosses_the_boundary_is_compact_for_analyzers_with_parts(job4: Path) -> None:
    """A rank's part never holds its event tables for the analyzers that have a `part`;
    the ones still without (their window travels, `GroupPart.window`) are named here, so
    one that gains a part must be taken off the list."""
    part = read_batch(((str(job4 / "rank0.json.gz"),), Options())).group
    assert part is not None
    without = sorted(name for name, value in part.parts.items() if value is None)
    assert without == ["kernel_metrics"]  # Nsight Compute data: one process, a few kernels
    assert part.window is None  # this rank has no allocator or ncu data: no trace travels
    # nothing for an analyzer this rank has no rows for (no allocator events, no samples)
    assert "memory" not in part.parts and "gpu_samples" not in part.parts
    for name in ("sync", "host_gaps", "launch", "timeline", "copies", "collectives",
                 "host_steps"):
        value = part.parts[name]
        assert value is not None
        fields = vars(value).values() if hasattr(value, "__dict__") else [value]
        assert not any(isinstance(field, gpudiag.Trace) for field in fields), name
    launch = part.parts["launch"]  # groups of launches, not launches
    assert len(launch.groups) < len(gpudiag.load(job4 / "rank0.json.gz").kernels) / 10
    sync_part = part.parts["sync"]
    assert len(sync_part.waits) < len(gpudiag.load(job4 / "rank0.json.gz").api)
    assert sys.getsizeof(part.lost) < 10_000


def test_analyze_with_workers_prints_what_the_merged_analysis_prints(job4: Path) -> None:
    from click.testing import CliRunner

    from gpudiag.cli import cli

    merged = CliRunner().invoke(cli, ["analyze", "--json", "--steps", str(job4)])
    job = CliRunner().invoke(cli, ["analyze", "--json", "--steps", "--workers", "2",
                                   str(job4)])
    assert merged.exit_code == job.exit_code == 0, job.output
    assert json.loads(job.stdout) == json.loads(merged.stdout)
    assert any(finding["saving_ns"] for finding in json.loads(job.stdout)["diagnosis"]
               ["findings"])


def test_analyze_lists_a_rank_it_cannot_read_and_exits_3(job4: Path, tmp_path: Path) -> None:
    files = sorted(job4.glob("rank*.json.gz"))[:2]
    broken = tmp_path / "rank7.json.gz"
    broken.write_bytes(b"not gzip, not json")
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", "--workers", "1",
                           *map(str, files), str(broken)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 3, done.stderr
    assert "1 file(s) could not be read" in done.stderr and "rank7.json.gz" in done.stderr
    assert "Traceback" not in done.stderr
    assert "findings" in done.stdout.lower() or "comm_wait" in done.stdout


@pytest.mark.parametrize("spec", ["400ms:1200ms", "ProfilerStep#552", "ProfilerStep#55[23]"])
def test_a_window_spec_is_resolved_from_the_ranks_as_on_the_merged_trace(
        job4: Path, spec: str) -> None:
    """Relative to the job's first GPU event, a step name over every rank, a pattern: the
    edges each rank sends give the merged trace's bounds."""
    merged = diagnose(gpudiag.load(job4), window=spec, steps=True)
    job = diagnose_job(job4, workers=2, window=spec, steps=True)
    assert job.window_ns == merged.window_ns and merged.window_ns is not None
    assert_same(job, merged)


def test_a_detected_step_name_is_a_window_of_a_job_too(tmp_path: Path) -> None:
    """A run without step markers: `step 3` names a detected step of every rank."""
    job = shifted_job(Path(__file__).parent / "data" / "torch_cpu_train.pt.trace.json.gz", 2,
                      tmp_path)
    merged = diagnose(gpudiag.load(job), window="step 3")
    assert merged.window_ns is not None
    assert diagnose_job(job, workers=1, window="step 3").window_ns == merged.window_ns


def test_analyze_with_workers_and_a_window_prints_the_merged_analysis(job4: Path) -> None:
    from click.testing import CliRunner

    from gpudiag.cli import cli

    args = ["analyze", "--json", "--window", "ProfilerStep#553", str(job4)]
    merged = CliRunner().invoke(cli, args)
    job = CliRunner().invoke(cli, [*args, "--workers", "2"])
    assert merged.exit_code == job.exit_code == 0, job.output
    assert json.loads(job.stdout) == json.loads(merged.stdout)


@pytest.mark.parametrize("spec", ["NoSuchStep", "90s:100s"])
def test_a_window_that_names_nothing_in_the_job_is_one_clear_line(job4: Path,
                                                                   spec: str) -> None:
    merged = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", "--window", spec,
                             str(job4)], capture_output=True, text=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", "--workers", "2",
                           "--window", spec, str(job4)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == merged.returncode == 2
    assert done.stderr == merged.stderr and done.stderr.count("\n") == 1
    assert "--window" in done.stderr and "Traceback" not in done.stderr


def test_two_nsight_compute_reports_keep_both_reports_rule_results(tmp_path: Path) -> None:
    """Merging reports renumbers their kernels; ncu's rule results name kernels by id and
    follow them (they were dropped by the merge), in a job as in the merged trace."""
    ncu = fixtures_dir() / "ncu"
    files = [ncu / "rtx3050laptop_filter_nvtx.ncu-rep", ncu / "t4_matadd_setfull.ncu-rep"]
    alone = [len(diagnose(gpudiag.load(file)).tables["ncu_rules"]) for file in files]
    merged = diagnose(gpudiag.load(files))
    rules = merged.tables["ncu_rules"]
    assert len(rules) == sum(alone) and alone[0] > 0 and alone[1] > 0
    assert set(rules["kernel_id"]) == {0, 1}  # each report's kernel, renumbered
    assert_same(diagnose_job(files, workers=1), merged)


class TwoWorkersHere:
    """An executor with two workers that runs everything in this process and records what
    it was given; `lose` names a function whose every item comes back as a dead worker's."""

    name = "two workers, here"
    workers = 2

    def __init__(self, lose: str | None = None) -> None:
        self.lose = lose
        self.calls: list[tuple[str, list[Any]]] = []

    def map(self, function: Any, items: Any) -> Any:
        from gpudiag.jobs.executors import WORKER_DIED, InProcess, Outcome

        listed = list(items)
        self.calls.append((function.__name__, listed))
        if function.__name__ == self.lose:
            return iter([Outcome(index, item, error=WORKER_DIED)
                         for index, item in enumerate(listed)])
        return InProcess().map(function, listed)


@pytest.mark.parametrize("lose", [None, "combine_part"])
def test_the_reduce_combines_some_analyzers_on_the_workers_and_any_they_lose_here(
        job4: Path, lose: str | None) -> None:
    """Workers idle once the map is done: the slow combines (`reduce.ELSEWHERE`) run there
    while this process combines the rest; one whose worker died is combined here."""
    from gpudiag.analyzers.pipeline.reduce import ELSEWHERE
    from gpudiag.jobs.job import run

    pool = TwoWorkersHere(lose)
    job = run(pool, job4, steps=True)
    assert_same(job, diagnose(gpudiag.load(job4), steps=True))
    sent = [[name for name, _ in items] for function, items in pool.calls
            if function == "combine_part"]
    assert sent == [list(ELSEWHERE)]


def test_batches_that_share_a_rank_or_device_are_read_as_one_span() -> None:
    from gpudiag.jobs.batches import rejoin

    planned = [("a",), ("b", "c"), ("d",), ("e",), ("f",)]
    assert rejoin(planned, {0: {1}, 1: {2}, 2: {3}, 3: {4}, 4: {5}}) == planned
    assert rejoin(planned, {0: {1}, 1: {2}, 2: {1}, 3: {4}, 4: {5}}) == [
        ("a", "b", "c", "d"), ("e",), ("f",)]  # the batches between come along, in order
    assert rejoin(planned, {0: {1}, 1: {2}, 2: {1, 9}, 3: {4}, 4: {9}}) == [
        ("a", "b", "c", "d", "e", "f")]  # a span that reaches another span takes it too
    assert rejoin(planned, {1: {7}, 3: {7}}) == [("a",), ("b", "c", "d", "e"), ("f",)]


def test_a_rank_profiled_twice_gives_the_merged_diagnosis_on_a_pool(tmp_path: Path) -> None:
    """Two files of rank 0 (a later profiling window of the same rank), among others: each
    small file is its own batch on two workers, and the reduce keys a device's window by
    rank, so the two files of rank 0 are read together (with the batches between them)."""
    job = shifted_job(PAIR[0], 3, tmp_path / "job")
    later = TS.sub(lambda m: b'"ts": ' + repr(float(m[1]) + 5e6).encode(),
                   gzip.decompress((job / "rank0.json.gz").read_bytes()))
    (job / "rank9_is_rank0_again.json.gz").write_bytes(gzip.compress(later, 1))
    files = sorted(job.glob("*.json.gz"))
    merged = diagnose(gpudiag.load(files))
    seen: list[tuple[int, int]] = []
    dx = diagnose_job(files, workers=2, progress=lambda _, n, total: seen.append((n, total)))
    assert sum(n for n, _ in seen) == seen[-1][1] > len(files)  # the re-read span counted too
    note = next(note for note in dx.notes if note.startswith("the same rank or device"))
    assert "rank0.json.gz to rank9_is_rank0_again.json.gz" in note
    dx.notes.remove(note)
    assert_same(dx, merged)
    spans = dx.losses.groupby("rank")["lost_ns"].sum()  # causes add up to the device window
    assert spans.loc[0] > 5_000_000_000 > spans.loc[1]  # rank 0's two windows, 5 s apart


def test_ranks_of_one_program_share_their_launch_groups(job32: Path) -> None:
    """A launch group is a kernel, call site and the values its occupancy follows from, not
    one rank's configuration: a batch of 8 ranks of one program sends as many groups as one
    rank (what the coordinator holds stops growing with ranks), counts and time summed."""
    files = tuple(str(path) for path in sorted(job32.glob("*.json.gz")))
    one = read_batch((files[:1], Options(rows=False))).group
    eight = read_batch((files[:8], Options(rows=False))).group
    assert one is not None and eight is not None
    alone, shared = one.parts["launch"].groups, eight.parts["launch"].groups
    assert len(shared) == len(alone) > 100
    assert shared["count"].sum() == 8 * alone["count"].sum()
    assert shared["dur_ns"].sum() == 8 * alone["dur_ns"].sum()


def test_every_analyzer_offers_one_typed_contract() -> None:
    """`diagnose` and the job call analyzers through their module's `CONTRACT` only (no
    hook looked up by name): every registered analyzer has one, and one with a part
    combines it."""
    from gpudiag.analyzers.diagnosis import ANALYZERS
    from gpudiag.analyzers.findings import Contract

    contracts = {analyzer.name: analyzer.contract() for analyzer in ANALYZERS}
    assert all(isinstance(contract, Contract) for contract in contracts.values())
    assert all((contract.part is None) == (contract.combine is None)
               for contract in contracts.values())
    assert [name for name, contract in contracts.items() if contract.part is None] == \
        ["kernel_metrics"]  # its job runs it on the merged inputs (`GroupPart.window`)
