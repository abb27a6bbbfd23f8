"""The executors run per-item work in this process, a local process pool and a real Dask
LocalCluster (started here), with the same outcomes: values, one-line errors for an item that
raised, and an error, never a hang, for an item whose worker died."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudiag.errors import InputError, MissingDependencyError
from gpudiag.jobs import cluster, executors
from gpudiag.jobs.executors import DaskCluster, InProcess, LocalPool, Outcome, executor
from tests.conftest import framework


def square_or_refuse(item: int) -> int:
    """The work of the tests: 3 is an unreadable input, 5 a bug."""
    if item == 3:
        raise InputError(f"rank{item}.json", "is truncated JSON", "copy it completely")
    if item == 5:
        raise ZeroDivisionError("division by zero")
    return item * item


def die_on_two(item: int) -> int:
    """A worker killed while running item 2 (the OOM killer, a segfault in a reader)."""
    if item == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return item


def worker_pid(_: int) -> int:
    return os.getpid()


def by_index(outcomes: Iterator[Outcome]) -> list[Outcome]:
    return sorted(outcomes, key=lambda outcome: outcome.index)


def check_squares(outcomes: list[Outcome]) -> None:
    assert [o.item for o in outcomes] == list(range(7))
    assert [o.value for o in outcomes if o.ok] == [0, 1, 4, 16, 36]
    assert outcomes[3].error == "rank3.json: is truncated JSON (copy it completely)"
    assert outcomes[5].error is not None and outcomes[5].error.startswith(
        "ZeroDivisionError: division by zero (a gpudiag bug")


def test_in_process_runs_every_item_and_reports_each_failure() -> None:
    with executor(workers=1) as pool:
        assert isinstance(pool, InProcess)
        check_squares(by_index(pool.map(square_or_refuse, range(7))))


def test_a_local_pool_gives_the_same_outcomes_from_other_processes() -> None:
    with executor(workers=2) as pool:
        assert isinstance(pool, LocalPool) and pool.workers == 2
        check_squares(by_index(pool.map(square_or_refuse, range(7))))
        pids = {o.value for o in pool.map(worker_pid, range(8))}
    assert os.getpid() not in pids


def test_a_dask_cluster_gives_the_same_outcomes(dask_client: Any) -> None:
    with executor(client=dask_client) as cluster:
        assert isinstance(cluster, DaskCluster) and cluster.workers == 2
        check_squares(by_index(cluster.map(square_or_refuse, range(7))))
        pids = {o.value for o in cluster.map(worker_pid, range(8))}
    assert os.getpid() not in pids
    assert dask_client.status == "running"  # a client the caller gave stays theirs


@pytest.mark.timeout(120)
def test_a_killed_pool_worker_ends_its_items_with_an_error_not_a_hang() -> None:
    with LocalPool(2) as pool:
        outcomes = by_index(pool.map(die_on_two, range(4)))
    assert len(outcomes) == 4
    assert outcomes[2].error == executors.WORKER_DIED
    assert all(o.value == o.item for o in outcomes if o.ok)


@pytest.mark.timeout(120)
def test_a_killed_dask_worker_ends_its_item_with_an_error_not_a_hang(dask_client: Any) -> None:
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        outcomes = by_index(DaskCluster(dask_client).map(die_on_two, range(4)))
    assert outcomes[2].error == executors.WORKER_DIED  # the cluster restarts the worker
    assert [o.value for o in outcomes if o.index != 2] == [0, 1, 3]


def test_a_scheduler_nobody_runs_is_one_line(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    framework("distributed")
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2.0)  # the refused connects, retried
    with pytest.raises(InputError, match="no Dask scheduler answered"):
        executor(scheduler="tcp://127.0.0.1:9")


def test_without_distributed_the_scheduler_option_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(module: str, purpose: str) -> None:
        raise MissingDependencyError(module, "dask", purpose)

    monkeypatch.setattr(cluster, "require", missing)
    with pytest.raises(MissingDependencyError, match=r"pip install 'gpudiag\[dask\]'"):
        executor(scheduler="tcp://127.0.0.1:8786")
    with executor(workers=2) as pool:  # the local pool needs nothing more
        assert isinstance(pool, LocalPool)


def test_the_environment_names_the_scheduler_like_the_nsight_recipes(
        monkeypatch: pytest.MonkeyPatch, dask_client: Any) -> None:
    monkeypatch.setenv(executors.SCHEDULER_ENV, dask_client.scheduler.address)
    with executor() as cluster:
        assert isinstance(cluster, DaskCluster)
        assert [o.value for o in by_index(cluster.map(square_or_refuse, [2, 4]))] == [4, 16]
    with executor(workers=1) as here:  # a count asked for wins over the environment
        assert isinstance(here, InProcess)


def test_zero_workers_is_refused() -> None:
    with pytest.raises(InputError, match="--workers 0"):
        executor(workers=0)


def test_every_error_a_worker_raises_comes_back_whole() -> None:
    """A worker's exception is pickled to the coordinator; one that cannot be rebuilt from
    its pickle broke the whole pool (every later item 'died')."""
    import pickle

    from gpudiag.errors import CollectorError
    from gpudiag.readers.chrome.structs import InvalidJSONError

    for error in (InputError("a.json", "is empty", "record again"), InputError(None, "bad"),
                  MissingDependencyError("distributed", "dask", "Running on Dask"),
                  CollectorError("nsys failed"),
                  InvalidJSONError("a.json", "is truncated JSON", truncated=True)):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
        assert vars(again) == vars(error)


def test_a_script_without_a_main_guard_runs_its_job_on_a_local_pool(tmp_path: Path) -> None:
    """Spawned workers re-run the main script to find its functions; gpudiag's workers run
    gpudiag's functions only, so an unguarded script must not start itself again in them."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from gpudiag.jobs.executors import executor
        from tests.test_executors import worker_pid
        with executor(workers=2) as pool:
            pids = {{outcome.value for outcome in pool.map(worker_pid, range(8))}}
        print("ran on", len(pids), "workers")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("ran on") == 1 and "bootstrapping" not in done.stderr


def test_a_local_pool_forks_its_workers_from_a_server_that_imported_the_analysis(
        tmp_path: Path) -> None:
    """Workers are forked from a fork server (never from the caller, which may hold threads)
    that imported the map, the readers and the analyzers once: a worker's first task finds
    them loaded instead of importing them again (half a second each)."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "probe.py").write_text(textwrap.dedent("""
        import os, sys

        def loaded(_):
            return (os.getppid(), all(name in sys.modules for name in (
                "pandas", "msgspec", "gpudiag.jobs.rank_map", "gpudiag.readers.kineto.joined",
                "gpudiag.analyzers.kernels.launch", "gpudiag.analyzers.host.steps")))
    """))
    (tmp_path / "job.py").write_text(textwrap.dedent(f"""
        import os, sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).parents[1])!r}]
        from gpudiag.jobs import WORKER_IMPORTS
        from gpudiag.jobs.executors import LocalPool
        from probe import loaded
        with LocalPool(2) as pool:
            pool.start(WORKER_IMPORTS)
            assert "pandas" not in sys.modules  # the caller did not wait for the imports
            seen = {{outcome.value for outcome in pool.map(loaded, range(6))}}
        print(pool.method, sorted({{ok for _, ok in seen}}),
              sorted({{parent == os.getpid() for parent, _ in seen}}))
    """))
    done = subprocess.run([sys.executable, str(tmp_path / "job.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    if sys.platform == "win32":  # no fork server: spawned workers, each importing
        assert done.stdout.split()[0] == "spawn"
        return
    assert done.stdout.split() == ["forkserver", "[True]", "[False]"]
