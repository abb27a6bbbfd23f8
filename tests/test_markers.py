"""`gpudiag.markers`: step/region ranges reach NVTX and the collector, and cost nothing alone."""

from __future__ import annotations

import itertools
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

from gpudiag import markers
from tests.conftest import ROOT

BOOTSTRAP = "gpudiag.profiler.bootstrap"


@pytest.fixture(autouse=True)
def fresh_markers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test looks for nvtx anew and starts with no step open."""
    monkeypatch.setattr(markers, "_flags", markers._Flags())
    markers.end_step()
    yield
    markers.end_step()


def fake_nvtx(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None, str]]:
    """Put a fake `nvtx` in sys.modules; returns the (call, message, domain) log."""
    calls: list[tuple[str, str | None, str]] = []
    module = types.ModuleType("nvtx")

    def push_range(message: str | None = None, domain: str = "", **_: object) -> None:
        calls.append(("push", message, domain))

    def pop_range(domain: str = "") -> None:
        calls.append(("pop", None, domain))

    module.push_range = push_range  # type: ignore[attr-defined]
    module.pop_range = pop_range  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvtx", module)
    return calls


def fake_recorder(
    monkeypatch: pytest.MonkeyPatch, active: bool = True
) -> list[tuple[str, int, int, str]]:
    """Put a fake profiler bootstrap in sys.modules; returns the recorded ranges."""
    ranges: list[tuple[str, int, int, str]] = []
    module = types.ModuleType(BOOTSTRAP)

    def record_range(name: str, start_ns: int, end_ns: int, source: str = "annotation",
                     cpu_ns: int | None = None) -> None:
        assert cpu_ns is None or cpu_ns >= 0  # the thread's CPU time in the range
        ranges.append((name, start_ns, end_ns, source))

    module.record_range = record_range  # type: ignore[attr-defined]
    module.is_active = lambda: active  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, BOOTSTRAP, module)
    return ranges


def without_nvtx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import nvtx` fail even where the package is installed."""
    monkeypatch.setitem(sys.modules, "nvtx", None)


def test_markers_are_noops_without_nvtx_or_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvtx(monkeypatch)
    monkeypatch.delitem(sys.modules, BOOTSTRAP, raising=False)
    for _ in range(100_000):  # a sanity bound on cost, not a timing assertion
        markers.step()
        with markers.region("data"):
            pass
    assert markers._flags.nvtx is None and markers._flags.nvtx_checked


def test_inactive_collector_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvtx(monkeypatch)
    ranges = fake_recorder(monkeypatch, active=False)
    with markers.step("s"), markers.region("r"):
        pass
    assert ranges == []


def test_nvtx_push_and_pop_happen_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvtx(monkeypatch)
    with markers.step("step A"), markers.region("data"):
        pass
    assert calls == [
        ("push", "step A", "gpudiag"),
        ("push", "data", "gpudiag"),
        ("pop", None, "gpudiag"),
        ("pop", None, "gpudiag"),
    ]


def test_plain_step_call_closes_the_previous_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvtx(monkeypatch)
    ranges = fake_recorder(monkeypatch)
    for i in range(3):
        markers.step(f"it{i}")
        with markers.region("fwd"):
            pass
    markers.end_step()
    markers.end_step()  # a second end is a no-op
    assert [c[0] for c in calls] == ["push", "push", "pop", "pop"] * 3
    assert [(r[0], r[3]) for r in ranges] == [
        (name, source)
        for i in range(3)
        for name, source in (("fwd", "annotation"), (f"it{i}", "step"))
    ]
    steps = [r for r in ranges if r[3] == "step"]
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(steps))


def test_ranges_are_recorded_nested_with_monotonic_times(monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvtx(monkeypatch)
    ranges = fake_recorder(monkeypatch)
    with markers.step() as current, markers.region("outer"), markers.region("inner"):
        pass
    by_name = {r[0]: r for r in ranges}
    assert [r[0] for r in ranges] == ["inner", "outer", current.name]
    assert current.name.startswith("step ")
    step, outer, inner = by_name[current.name], by_name["outer"], by_name["inner"]
    assert step[1] <= outer[1] <= inner[1] <= inner[2] <= outer[2] <= step[2]
    assert by_name["inner"][3] == "annotation" and step[3] == "step"


def test_default_step_names_count_up(monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvtx(monkeypatch)
    first = markers.step().name
    second = markers.step().name
    assert int(second.split()[1]) == int(first.split()[1]) + 1


def test_region_closes_when_the_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvtx(monkeypatch)
    with pytest.raises(KeyError), markers.region("boom"):
        raise KeyError("x")
    assert [c[0] for c in calls] == ["push", "pop"]


def test_import_markers_imports_neither_nvtx_nor_the_profiler() -> None:
    code = (
        "import sys, gpudiag.markers\n"
        "loaded = [m for m in ('nvtx', 'gpudiag.profiler', 'gpudiag.profiler.bootstrap')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
