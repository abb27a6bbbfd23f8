"""`import gpudiag` stays light: heavy optional packages load only when used."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("torch", "jax", "cupy", "ncu_report", "cupti", "pynvml", "plotly", "hta")


def test_import_gpudiag_leaves_heavy_packages_unimported() -> None:
    code = (
        "import sys, gpudiag\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_missing_optional_package_names_the_extra_to_install() -> None:
    from gpudiag.errors import MissingDependencyError
    from gpudiag.optional import require

    try:
        require("gpudiag_no_such_module", "Doing the impossible")
    except MissingDependencyError as exc:
        assert "pip install 'gpudiag[all]'" in str(exc)
        assert "Doing the impossible" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("require() imported a module that does not exist")
