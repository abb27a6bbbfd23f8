"""Shared test helpers: where the real fixtures are, and skipping cleanly without them."""

from __future__ import annotations

import os
from pathlib import Path

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


def framework(module: str) -> object:
    """Import an optional framework (torch, jax) for a test, or skip with the reason.

    CI installs them (`.ci/run`) and sets GPUDIAG_REQUIRE_FRAMEWORKS=1, which turns a missing
    one into a failure: the backend tests must never pass there by skipping.
    """
    if os.environ.get("GPUDIAG_REQUIRE_FRAMEWORKS") == "1":
        import importlib

        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install {module})")
