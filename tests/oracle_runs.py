"""Holistic Trace Analysis, run as the oracle of several tests, started in the background.

HTA runs in its own environment (never a dependency of gpudiag), one subprocess per oracle
over every fixture. The largest take a minute of one core, during which the test process
used to sit waiting. A module declares its run as `ORACLE_RUN`; once the session's tests are
collected (tests/conftest.py) every collected module's run starts, and it works beside the
first tests on the other core; the module's fixture then collects the result (or, when the
run was not started early, runs it now).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

INSTALL = ("python3 -m venv benchmarks/.venv-hta && benchmarks/.venv-hta/bin/pip install "
           "--no-deps HolisticTraceAnalysis==0.5.0 && benchmarks/.venv-hta/bin/pip install "
           "'pandas<3' numpy plotly networkx psutil pyyaml (or point $GPUDIAG_HTA_PYTHON at any "
           "interpreter that imports hta)")


@functools.cache
def hta_python() -> str | None:
    """The first candidate interpreter that can import hta."""
    given = os.environ.get("GPUDIAG_HTA_PYTHON")
    candidates = [given] if given else [str(ROOT / "benchmarks/.venv-hta/bin/python"),
                                        sys.executable]
    for python in candidates:
        if Path(python).exists() and subprocess.run(
                [python, "-c", "import hta.trace_analysis"], capture_output=True,
                timeout=120).returncode == 0:
            return python
    return None


class OracleRun:
    """`python RUNNER OUT *args` under HTA's interpreter: its JSON output, once it ended."""

    def __init__(self, runner: Path, args: list[str], timeout_s: float) -> None:
        self.runner = runner
        self.args = args
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._folder: Path | None = None

    def start(self) -> bool:
        """Start it (once); False when HTA is not installed."""
        if self._proc is not None:
            return True
        python = hta_python()
        if python is None:
            return False
        self._folder = Path(tempfile.mkdtemp(prefix=f"gpudiag-{self.runner.stem}-"))
        with (self._folder / "stderr.txt").open("wb") as errors:
            self._proc = subprocess.Popen(
                [python, str(self.runner), str(self._folder / "out.json"), *self.args],
                stdout=subprocess.DEVNULL, stderr=errors)
        return True

    def result(self) -> dict[str, Any] | None:
        """The runner's JSON (None: HTA is not installed); an AssertionError with HTA's
        stderr when it failed."""
        if not self.start():
            return None
        assert self._proc is not None and self._folder is not None
        try:
            returncode = self._proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            raise
        errors = (self._folder / "stderr.txt").read_text(errors="replace")
        assert returncode == 0, errors[-3000:]
        results: dict[str, Any] = json.loads((self._folder / "out.json").read_text())
        return results

    def stop(self) -> None:
        """End it if it still runs (the session ended without asking for it)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
