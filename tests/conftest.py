"""Shared test helpers: where the real fixtures are, and skipping cleanly without them."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def fixtures_dir() -> Path:
    """../shared/fixtures beside the checkout (CI always has it), or $GPUDIAG_FIXTURES."""
    env = os.environ.get("GPUDIAG_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures"


def fixture(relative: str) -> Path:
    """A real profile from ../shared/fixtures; skips the test with a reason when absent."""
    path = fixtures_dir() / relative
    if not path.exists():
        pytest.skip(f"shared fixture {relative} not found under {fixtures_dir()}")
    return path


def fixtures(pattern: str) -> list[Path]:
    """All shared fixtures matching a glob (empty list when the folder is absent)."""
    return sorted(fixtures_dir().glob(pattern))


#: files among the fixtures that are not profiles: the manifest, oracles' tables (TraceLens's
#: CSVs and workbooks) and a capture's notes
NOT_PROFILES = (".md", ".csv", ".xlsx")
NOT_PROFILE_NAMES = ("execution_details.json",)


def profile_fixtures() -> list[str]:
    """Every real profile under ../shared/fixtures, relative to it and sorted (empty when
    the folder is absent): what the tests over all fixtures load."""
    return sorted(str(p.relative_to(fixtures_dir())) for p in fixtures_dir().rglob("*")
                  if p.is_file() and p.suffix not in NOT_PROFILES
                  and p.name not in NOT_PROFILE_NAMES)


def framework(module: str) -> object:
    """Import an optional framework (torch, jax) for a test, or skip with the reason.

    CI installs them (`.ci/run`) and sets GPUDIAG_REQUIRE_FRAMEWORKS=1, which turns a missing
    one into a failure: the backend tests must never pass there by skipping.
    """
    if os.environ.get("GPUDIAG_REQUIRE_FRAMEWORKS") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install {module})")


def plotly_array(value: Any) -> np.ndarray:
    """A figure trace's array as numpy: plotly's JSON writes numeric arrays as typed base64."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = [int(v) for v in str(value.get("shape", len(flat))).split(",")]
        return flat.reshape(shape)
    return np.asarray(value)


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    """Wait until `path` exists (a file another process writes); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def tool_missing(reason: str) -> NoReturn:
    """Skip a test whose external tool (HTA, shellcheck) is absent; fail instead in CI.

    `.ci/run` installs those tools and sets GPUDIAG_REQUIRE_TOOLS=1, so a broken install
    there is a failure, never a quiet skip.
    """
    if os.environ.get("GPUDIAG_REQUIRE_TOOLS") == "1":
        pytest.fail(f"required tool missing (GPUDIAG_REQUIRE_TOOLS=1): {reason}")
    pytest.skip(reason)


def cli_status(*args: str) -> int:
    """`gpudiag ARGS` run in this process (not through click's runner, so output reaches the
    real stdout/stderr): its exit status (1 is an internal error)."""
    from gpudiag.cli import main

    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def profile_program(tmp_path: Path, code: str, *options: str, name: str = "prog.py",
                    timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`gpudiag profile -o <tmp>/run --no-report OPTIONS -- python <tmp>/NAME` of the
    dedented `code`: its completed process and the run directory."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
                           "--no-report", *options, "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=timeout)
    return done, run_dir


def subject_to_file_modes() -> list[str]:
    """The prefix that runs a command subject to file modes: none for a user; as root (CI),
    `setpriv` without the two capabilities that let root write into a mode 555 folder and
    read past one, so a check of a read-only place runs in CI too, where it was skipped."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")  # util-linux: on every Debian and Ubuntu
    if setpriv is None:  # a skip elsewhere, a failure in CI (`tool_missing`)
        tool_missing("root without setpriv (util-linux) cannot be kept out of a mode 555 "
                     "folder")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


def refused_in_one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run `gpudiag ARGS` in this process: exit status 2 and one line of stderr, which is
    returned (what every refusal of bad input must look like)."""
    status = cli_status(*args)
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    return err


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A real Dask LocalCluster of 2 worker processes, started here, and its client."""
    distributed: Any = framework("distributed")  # CI installs it and requires it
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        yield client


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the HTA oracle runs of the collected modules now (tests/oracle_runs.py): they
    work beside the first tests instead of holding up their own."""
    modules = {getattr(item, "module", None) for item in session.items}
    for module in modules:
        run = getattr(module, "ORACLE_RUN", None)
        if run is not None:
            run.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End any oracle run nobody collected (a run deselected by -k, an interrupted session)."""
    modules = {getattr(item, "module", None) for item in session.items}
    for module in modules:
        run = getattr(module, "ORACLE_RUN", None)
        if run is not None:
            run.stop()


#: what a skipped test waited for, by a word of its reason, and what makes it run
SKIP_KINDS = (
    ("Holistic Trace Analysis", "the HTA oracle venv (benchmarks/.venv-hta, made by .ci/run)"),
    ("chromium", "Debian's chromium (apt install chromium; .ci/run installs it)"),
    ("playwright", "playwright (in the dev extra)"),
    ("shellcheck", "shellcheck (apt install shellcheck; .ci/run installs it)"),
    ("(pip install torch)", "torch==2.13.0 (.ci/run installs it)"),
    ("(pip install jax)", "jax (.ci/run installs it)"),
    ("CuPy", "CuPy and a CUDA GPU"),
    ("fixture", "../shared/fixtures beside the checkout"),
    ("GPU", "an NVIDIA GPU (tests/gpu, scripts/gpu_validate.sh)"),
)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say what the skipped tests needed, grouped, and that `bash .ci/run` provides all of it
    but a GPU: the README's command alone skips the oracle, browser and tool tests, and a
    newcomer should not read its green line as the whole suite."""
    waited: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        kind = next((need for word, need in SKIP_KINDS if word in reason), "other: " + reason)
        waited[kind] = waited.get(kind, 0) + 1
    if not waited:
        return
    terminalreporter.write_sep("-", "skipped tests, by what they need")
    for need, count in sorted(waited.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{count:5d}  {need}")
    terminalreporter.write_line("`bash .ci/run` installs all of these but a GPU and runs "
                                "every test (as CI does)")
