"""Hostile clusters for a many-rank job (`--scheduler`, `--workers`, `diagnose_job`): a
scheduler that dies, stops or is no scheduler at all, workers killed, an address that is no
address, workers whose working directory is not the caller's, DASK_* settings in the
environment. Each ends in the right answer or in one line and exit status 2, in bounded time.

The clusters are real: `dask scheduler` and `dask worker` subprocesses started here (each
in a session of its own, so the test kills exactly what it started), and servers of other
protocols on threads of this process.
"""

from __future__ import annotations

import gzip
import http.server
import json
import os
import re
import shutil
import signal
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gpudiag
from gpudiag.errors import InputError
from gpudiag.jobs import batches, cluster, diagnose_job
from gpudiag.jobs.executors import DaskCluster, InProcess, LocalPool, executor
from tests.conftest import cli_status, framework, wait_for
from tests.test_jobs import PAIR, TS, assert_same, diagnose, shifted_job

DASK = [sys.executable, "-m", "dask"]


class Cluster:
    """`dask scheduler` and one `dask worker` (with its nanny unless `nanny=False`, in
    `cwd`) in subprocesses, ready once the worker has joined."""

    def __init__(self, folder: Path, *, nanny: bool = True, cwd: Path | None = None) -> None:
        framework("distributed")
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / "scheduler.json"
        self.scheduler = self._start([*DASK, "scheduler", "--scheduler-file", str(self.file),
                                      "--host", "127.0.0.1", "--port", "0",
                                      "--no-dashboard"], folder / "scheduler.log", folder)
        self.worker: subprocess.Popen[bytes] | None = None
        self.address = self._address()
        self.worker = self._start([*DASK, "worker", self.address, "--nthreads", "1",
                                   "--no-dashboard", *([] if nanny else ["--no-nanny"])],
                                  folder / "worker.log", cwd or folder)
        self._joined()

    @staticmethod
    def _start(line: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(line, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    start_new_session=True)

    def _address(self) -> str:
        wait_for(self.file, 60)
        deadline = time.monotonic() + 30
        while True:  # the file may be read while it is written
            try:
                return str(json.loads(self.file.read_text())["address"])
            except (ValueError, KeyError):
                assert time.monotonic() < deadline, "no scheduler file"
                time.sleep(0.1)

    def _joined(self) -> None:
        deadline = time.monotonic() + 90
        while not cluster.reach(self.address).get("workers"):
            assert time.monotonic() < deadline, "the worker never joined"
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill what this cluster started (each process group, by its own id)."""
        for process in (self.worker, self.scheduler):
            if process is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGCONT)
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(30)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four small real rank files (the 128-rank job's rank 0, each its own rank)."""
    return shifted_job(PAIR[0], 4, tmp_path_factory.mktemp("ranks") / "job", shift_us=53.0)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster left healthy by the tests that use it (its worker's nanny restarts a
    killed worker); its worker runs in a folder of its own, not the tests' directory."""
    made = Cluster(tmp_path_factory.mktemp("shared"), cwd=tmp_path_factory.mktemp("elsewhere"))
    yield made
    made.stop()


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A cluster of the test's own, to break."""
    made: list[Cluster] = []

    def start(**options: Any) -> Cluster:
        made.append(Cluster(tmp_path / f"cluster{len(made)}", **options))
        return made[-1]

    yield start
    for each in made:
        each.stop()


@pytest.fixture
def one_file_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file a batch of its own, so a job of a few ranks is several tasks."""
    monkeypatch.setattr(batches, "plan", lambda files, workers: [(file,) for file in files])


def after_first_outcome(monkeypatch: pytest.MonkeyPatch,
                        act: Callable[[DaskCluster], object]) -> list[str]:
    """Run `act(cluster)` once the first batch of a job on Dask came back, mid-job; the
    list it returns gets "acted" once it ran."""
    real = DaskCluster._outcomes
    acted: list[str] = []

    def outcomes(self: DaskCluster, futures: list[Any], listed: list[Any]) -> Iterator[Any]:
        stream = real(self, futures, listed)
        yield next(stream)
        if not acted:
            act(self)
            acted.append("acted")
        yield from stream

    monkeypatch.setattr(DaskCluster, "_outcomes", outcomes)
    return acted


def one_line(err: str) -> str:
    """The single line gpudiag printed, checked to be one error line and no traceback."""
    assert err.count("\n") == 1 and err.startswith("gpudiag: error: "), err[-3000:]
    assert "Traceback" not in err
    return err


# -- 1. a scheduler that dies or stops mid-job ------------------------------------------------


@pytest.mark.timeout(180)
def test_a_scheduler_killed_mid_job_is_one_line_and_exit_2(
        ranks: Path, fresh: Callable[..., Cluster], one_file_per_batch: None,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """It was Dask's logged tracebacks, then every file 'could not be read' as 'a gpudiag
    bug' (FutureCancelledError)."""
    dask = fresh()
    def kill(_: DaskCluster) -> None:
        dask.scheduler.kill()
        dask.scheduler.wait()

    acted = after_first_outcome(monkeypatch, kill)
    capfd.readouterr()
    assert cli_status("analyze", str(ranks), "--scheduler", dask.address) == 2
    line = one_line(capfd.readouterr().err)
    assert acted and dask.address in line and "so the job cannot finish" in line


@pytest.mark.timeout(180)
def test_a_scheduler_that_stops_answering_mid_job_ends_it_in_bounded_time(
        ranks: Path, fresh: Callable[..., Cluster], one_file_per_batch: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped scheduler (SIGSTOP: a hung host) keeps its connections open: the job
    waited forever for results."""
    dask = fresh()
    monkeypatch.setattr(cluster, "PING_INTERVAL_S", 0.5)
    monkeypatch.setattr(cluster, "PING_TIMEOUT_S", 1.0)
    after_first_outcome(monkeypatch, lambda _: os.kill(dask.scheduler.pid, signal.SIGSTOP))
    started = time.monotonic()
    with pytest.raises(InputError, match="the Dask scheduler stopped answering") as info:
        diagnose_job(ranks, scheduler=dask.address)
    assert dask.address in str(info.value) and time.monotonic() - started < 60


@pytest.mark.timeout(180)
def test_a_scheduler_that_dies_while_the_job_connects_is_one_line(
        ranks: Path, fresh: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after it answered who it is, before the client is made."""
    dask = fresh()
    real = cluster.reach

    def then_killed(address: str, shown: str | None = None) -> dict[str, Any]:
        identity = real(address, shown)
        dask.scheduler.kill()
        dask.scheduler.wait()
        return identity

    monkeypatch.setattr(cluster, "reach", then_killed)
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2.0)
    with pytest.raises(InputError, match="did not accept a client") as info:
        diagnose_job(ranks, scheduler=dask.address)
    assert str(info.value).startswith(dask.address)


# -- 2. workers killed mid-job ------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_worker_killed_mid_job_is_restarted_and_the_answer_is_the_merged_one(
        ranks: Path, shared: Cluster, one_file_per_batch: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def kill_the_worker(dask: DaskCluster) -> None:
        for pid in dask.client.run(os.getpid).values():  # the nanny starts another
            os.kill(pid, signal.SIGKILL)

    acted = after_first_outcome(monkeypatch, kill_the_worker)
    job = diagnose_job(ranks, scheduler=shared.address)
    assert acted and job.failed == []
    assert_same(job, diagnose(gpudiag.load(ranks)))


@pytest.mark.timeout(180)
def test_a_cluster_whose_workers_all_died_ends_the_job_in_bounded_time(
        ranks: Path, fresh: Callable[..., Cluster], one_file_per_batch: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a nanny nothing restarts the worker: Dask waits for one forever."""
    dask = fresh(nanny=False)
    monkeypatch.setattr(cluster, "PING_INTERVAL_S", 0.5)
    monkeypatch.setattr(cluster, "NO_WORKERS_S", 1.0)
    assert dask.worker is not None
    worker = dask.worker
    def kill(_: DaskCluster) -> None:
        worker.kill()
        worker.wait()

    after_first_outcome(monkeypatch, kill)
    with pytest.raises(InputError, match=r"has had no workers for 1 s") as info:
        diagnose_job(ranks, scheduler=dask.address)
    assert str(info.value).startswith(dask.address)


def test_a_scheduler_without_workers_is_one_line_not_a_hang(
        ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    distributed: Any = framework("distributed")
    monkeypatch.setattr(cluster, "NO_WORKERS_S", 1.0)
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                                  dashboard_address=":0") as empty, \
            pytest.raises(InputError, match=r"has no Dask workers \(none joined within 1 s"):
        diagnose_job(ranks, scheduler=empty.scheduler_address)


# -- 3. addresses that name no scheduler --------------------------------------------------------


@pytest.mark.parametrize(("given", "says"), [
    ("nonsense", "is not a Dask scheduler address or scheduler file (missing port number"),
    ("tcp://", "is not a Dask scheduler address (missing port number"),
    ("tcp://host:notaport", "is not a Dask scheduler address (invalid literal"),
    ("tcp://127.0.0.1:99999", "port 99999 is out of range"),
    ("foo://host:1", "unknown address scheme 'foo'"),
    ("", "names no Dask scheduler (it is empty)"),
])
def test_an_address_that_is_no_address_is_one_line_at_once(
        ranks: Path, given: str, says: str, capfd: pytest.CaptureFixture[str]) -> None:
    """They were internal errors (ValueError, exit 1), a 20 s wait, or (empty) a silent
    run on a local pool."""
    framework("distributed")
    started = time.monotonic()
    assert cli_status("analyze", str(ranks), "--scheduler", given) == 2
    line = one_line(capfd.readouterr().err)
    assert says in line and line.startswith(f"gpudiag: error: {given or repr('')}: ")
    assert time.monotonic() - started < 10


class Garbage(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"garbage, not Dask\n" * 8)


class HugeFrame(socketserver.BaseRequestHandler):
    def handle(self) -> None:  # a frame of 4 GiB announced, 64 bytes sent
        self.request.sendall(struct.pack("<Q", 1 << 32) + b"x" * 64)
        SERVERS_DONE.wait(30)


class Silent(socketserver.BaseRequestHandler):
    def handle(self) -> None:  # accepts, never answers
        SERVERS_DONE.wait(30)


class QuietHTTP(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Not on this test's stderr: only gpudiag's line is."""


class Closes(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.close()


SERVERS_DONE = threading.Event()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server of another protocol on a thread here, by handler (or "http")."""
    socketserver.ThreadingTCPServer.daemon_threads = True
    SERVERS_DONE.clear()
    made: socketserver.TCPServer = (
        http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHTTP)
        if request.param == "http" else
        socketserver.ThreadingTCPServer(("127.0.0.1", 0), request.param))
    threading.Thread(target=made.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{made.server_address[1]}"
    SERVERS_DONE.set()
    made.shutdown()
    made.server_close()


@pytest.mark.parametrize(("server", "says"), [
    (Garbage, "speaks another protocol"),   # was MemoryError: allocating 2 EiB
    (HugeFrame, "answered nothing a Dask scheduler says within 1 s"),
    (Silent, "answered nothing a Dask scheduler says within 1 s"),  # was a hang
    ("http", "answered nothing a Dask scheduler says within 1 s"),  # was a hang
    (Closes, "no Dask scheduler answered"),
], indirect=["server"])
def test_a_server_that_is_no_scheduler_is_one_line_in_bounded_time(
        ranks: Path, server: str, says: str, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    framework("distributed")
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1.0)
    started = time.monotonic()
    assert cli_status("analyze", str(ranks), "--scheduler", server) == 2
    line = one_line(capfd.readouterr().err)
    assert says in line and line.startswith(f"gpudiag: error: {server}: ")
    assert time.monotonic() - started < 15


def test_a_worker_address_is_not_a_scheduler(ranks: Path, shared: Cluster) -> None:
    worker = next(iter(cluster.reach(shared.address)["workers"]))
    with pytest.raises(InputError, match=r"is not a Dask scheduler \(it is a Dask Worker\)"):
        diagnose_job(ranks, scheduler=worker)


def test_a_scheduler_file_is_read_and_a_damaged_one_is_one_line(
        ranks: Path, shared: Cluster, tmp_path: Path) -> None:
    job = diagnose_job(ranks, scheduler=str(shared.file))
    assert_same(job, diagnose(gpudiag.load(ranks)))
    damaged = tmp_path / "scheduler.json"
    damaged.write_text('{"type": "Scheduler"}')
    with pytest.raises(InputError, match=r"is not a Dask scheduler file \(it has no "):
        diagnose_job(ranks, scheduler=str(damaged))


# -- 4. workers whose working directory is not the caller's -------------------------------------


def test_relative_paths_are_read_by_workers_elsewhere_and_named_as_given(
        ranks: Path, shared: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker runs in another folder: relative paths were 'No such file' there."""
    monkeypatch.chdir(ranks.parent)
    given = [f"{ranks.name}/rank{rank}.json.gz" for rank in range(4)]
    job = diagnose_job(given, scheduler=shared.address)
    merged = gpudiag.load(given)
    assert_same(job, diagnose(merged))
    assert [s["path"] for s in job.summary()["sources"]] == given  # as load names them
    assert job.units == given


def test_a_file_the_worker_cannot_see_says_where_it_was_looked_for(ranks: Path,
                                                                   tmp_path: Path) -> None:
    """A Dask worker on another host without the shared file system: the file is listed
    with the host that did not find it, and the others are analyzed."""
    from gpudiag.jobs.rank_map import Options, read_batch

    gone = tmp_path / "rank9.json.gz"
    part = read_batch(((str(gone), str(ranks / "rank0.json.gz")), Options()))
    assert part.files == (str(ranks / "rank0.json.gz"),)
    [(path, error)] = part.failed
    assert path == str(gone) and error.startswith(f"{gone}: not found on ")
    assert "workers must see the job's files at the same paths" in error


# -- 5. Dask settings in the environment --------------------------------------------------------


def test_the_environment_never_overrides_an_explicit_choice(
        ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    framework("distributed")
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "tcp://127.0.0.1:9")  # nobody listens
    with executor(workers=1) as here:
        assert isinstance(here, InProcess)
    with executor(workers=2) as pool:
        assert isinstance(pool, LocalPool)
    with pytest.raises(InputError, match="names no Dask scheduler"):  # was the environment's
        executor(scheduler="")
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "nonsense")
    with pytest.raises(InputError, match=r"^DASK_SCHEDULER_ADDRESS=nonsense: is not a Dask"):
        diagnose_job(ranks)


def test_profile_analyzes_its_run_here_whatever_the_environment_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's processes are analyzed on local workers, never on the cluster that
    DASK_SCHEDULER_ADDRESS (the profiled program's setting) names: it went there."""
    from gpudiag.profiler import backends, session
    from tests.builders import kernel, trace

    run = tmp_path / "run"
    plan = backends.resolve("torch")
    options = session.ProfileOptions(backend="torch", collectors=plan.collectors)
    session.make_run_dir(["train.py"], run)
    session.write_json(run / "meta.json", {**session.run_meta(["train.py"], options, 0),
                                           "end_ns": 1, "exit_code": 0})
    for rank in range(2):
        proc = run / "procs" / f"h-{rank + 7}-rank{rank}"
        gpudiag.Trace(meta={"rank": rank, "process": {"pid": rank + 7, "host": "h",
                                                      "collectors": ["host", "cupti"]}}
                      ).save(proc)
        trace(kernels=[kernel(1_000, 2_000)]).save(proc / "cupti" / "chunk-000000")
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "tcp://127.0.0.1:9")  # nobody listens
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(session, "JOB_PROCESSES", 2)
    monkeypatch.setattr(session, "run", lambda *_, **__: session.SessionResult(
        run, 0, None, 0, 1))
    gathered = session.profile_command(["train.py"], plan, options)
    assert gathered.job is not None and gathered.job.failed == []
    assert sorted(gathered.job.losses["rank"].unique()) == [0, 1]


def test_a_malformed_dask_configuration_is_one_line(ranks: Path, tmp_path: Path) -> None:
    """dask reads DASK_CONFIG's YAML on import: it was an internal error (ValueError)."""
    framework("distributed")
    bad = tmp_path / "dask.yaml"
    bad.write_text("distributed: [\n  bad: {")
    done = subprocess.run([sys.executable, "-m", "gpudiag", "analyze", str(ranks),
                           "--scheduler", "tcp://127.0.0.1:9"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DASK_CONFIG": str(bad)})
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "Dask's configuration cannot be read" in line and str(bad) in line


# -- 6. ranks whose clocks are hours apart ------------------------------------------------------


def test_ranks_whose_clocks_are_hours_apart_say_so_and_claim_no_waiting(tmp_path: Path) -> None:
    """Rank 1's clock 3 h ahead: every collective matched across the ranks starts 3 h
    apart. It was the note 'comm_wait needs collectives from two or more ranks' (there are
    two), and comm findings citing the early rank's whole calls as 'waiting for late
    ranks'; the job says what the merged trace says."""
    job = shifted_job(PAIR[0], 2, tmp_path, shift_us=3 * 3600e6)
    merged = diagnose(gpudiag.load(job))
    assert_same(diagnose_job(job, workers=2), merged)
    [note] = [note for note in merged.notes if note.startswith("comm_wait")]
    assert note.startswith("comm_wait: all 10 collectives matched across ranks start up to "
                           "10,800 s apart") and "the ranks' clocks disagree" in note
    assert note.endswith("not measured")
    comm = merged.findings[merged.findings["cause"] == "comm"]
    assert len(comm) and not comm["evidence"].str.contains("waiting for late ranks").any()
    waits = merged.losses[merged.losses["cause"] == "comm_wait"]
    assert (waits["lost_ns"] == 0).all()


# -- 7. two files that claim one rank -----------------------------------------------------------


def rewritten(source: Path, target: Path, *, shift_us: float = 0.0,
              pid: tuple[int, int] | None = None) -> None:
    """`source` as `target`, its clock shifted by `shift_us` and (`pid`: old, new) its
    process id changed: the same rank recorded by another run."""
    text = gzip.decompress(source.read_bytes())
    if shift_us:
        text = TS.sub(lambda m: b'"ts": ' + repr(float(m[1]) + shift_us).encode(), text)
    if pid is not None:
        text = re.sub(rb'"pid": ?%d\b' % pid[0], b'"pid": %d' % pid[1], text)
    target.write_bytes(gzip.compress(text, 1))


@pytest.mark.parametrize("extra", [[], ["--workers", "2"]])
def test_a_copy_of_a_rank_file_is_refused_in_one_line(
        tmp_path: Path, extra: list[str], one_file_per_batch: None,
        capfd: pytest.CaptureFixture[str]) -> None:
    """It was analyzed: rank 0's kernels, communication and host time counted twice (the
    job added a note at the end). On a pool each file is its own batch here, so the two
    meet only when the job reads the batches that share rank 0 again as one."""
    job = shifted_job(PAIR[0], 3, tmp_path / "job")
    shutil.copy(job / "rank0.json.gz", job / "rank0_copy.json.gz")
    assert cli_status("analyze", str(job), *extra) == 2
    line = one_line(capfd.readouterr().err)
    assert line.startswith("gpudiag: error: rank0.json.gz, rank0_copy.json.gz: 2 files claim "
                           "rank 0 and its kernels overlap in time on one stream")


@pytest.mark.parametrize("extra", [[], ["--workers", "2"]])
def test_two_runs_in_one_folder_are_refused_in_one_line(
        tmp_path: Path, extra: list[str], capfd: pytest.CaptureFixture[str]) -> None:
    """Run b a day after run a, by other processes: rank 0's window spanned both runs,
    93,600 s of 'host_bound' at 100%, and the runs' collectives matched each other."""
    run = shifted_job(PAIR[0], 2, tmp_path / "a")
    both = tmp_path / "both"
    both.mkdir()
    for rank in (0, 1):
        shutil.copy(run / f"rank{rank}.json.gz", both / f"a_rank{rank}.json.gz")
        rewritten(run / f"rank{rank}.json.gz", both / f"b_rank{rank}.json.gz",
                  shift_us=26 * 3600e6, pid=(4037, 5120))
    assert cli_status("analyze", str(both), *extra) == 2
    line = one_line(capfd.readouterr().err)
    assert line.startswith("gpudiag: error: a_rank0.json.gz, b_rank0.json.gz: 2 files claim "
                           "rank 0 and come from 2 processes (pids 4037, 5120): two runs")
    assert "gpudiag compare" in line
