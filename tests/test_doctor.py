"""`gpudiag doctor`: a clean report on any machine, never an exception, a fix for each gap."""

from __future__ import annotations

import importlib.machinery
import logging
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpudiag.collectors import probes
from gpudiag.profiler import doctor
from gpudiag.profiler.doctor import Check


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> types.ModuleType:
    """A module in sys.modules that find_spec and import both accept."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_doctor_runs_here_and_every_gap_says_how_to_get_it() -> None:
    results = doctor.checks()
    assert len({c.name for c in results}) == len(results) >= 10
    for check in results:
        assert check.detail
        assert check.available or check.how_to_get, check
    console = Console(record=True, width=200)
    console.print(doctor.render(results))
    shown = console.export_text()
    assert all(c.name in shown for c in results)
    assert doctor.render_text(results).count("\n") >= len(results) - 1


def test_render_escapes_install_hints_that_look_like_markup() -> None:
    console = Console(record=True, width=200)
    console.print(doctor.render([Check("gpu", False, "no [bold]x", "pip install 'gpudiag[nvml]'")]))
    shown = console.export_text()
    assert "gpudiag[nvml]" in shown and "[bold]" in shown


def test_a_real_hanging_binary_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "nsys"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(probes, "VERSION_TIMEOUT_S", 0.3)
    monkeypatch.setattr(probes.shutil, "which", lambda _name: str(script))
    check = probes.check_tool("nsys", "Nsight Systems backend", "install it")
    assert not check.available and "0.3 s" in check.detail


def test_missing_binaries_give_a_clean_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes.shutil, "which", lambda _name: None)
    monkeypatch.setattr(probes, "PROFILING_PARAMS", Path("/nonexistent/params"))
    by_name = {c.name: c for c in doctor.checks()}
    for tool in ("nsys", "ncu", "nvidia-smi", "ncu counter permission"):
        assert not by_name[tool].available
        assert by_name[tool].how_to_get
    assert "nsys" in doctor.missing_line(list(by_name.values()))


@pytest.mark.parametrize(
    "failure",
    [subprocess.TimeoutExpired(["nsys"], 5.0), PermissionError("denied"), OSError("exec format")],
)
def test_hanging_or_broken_binaries_never_raise(
    monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    seen: list[dict[str, Any]] = []

    def run(*_args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise failure

    monkeypatch.setattr(probes.shutil, "which", lambda name: f"/opt/bin/{name}")
    monkeypatch.setattr(probes.subprocess, "run", run)
    check = probes.check_tool("nsys", "Nsight Systems backend", "install it")
    assert not check.available
    assert "/opt/bin/nsys" in check.detail and "install it" in check.how_to_get
    assert seen[0]["timeout"] == probes.VERSION_TIMEOUT_S


def test_tool_version_picks_the_version_line(monkeypatch: pytest.MonkeyPatch) -> None:
    out = (
        "NVIDIA (R) Nsight Compute Command Line Profiler\n"
        "Copyright (c) 2018-2024 NVIDIA Corporation\n"
        "Version 2024.3.0.0 (build 34643014) (public-release)\n"
    )

    def run(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(probes.shutil, "which", lambda name: f"/usr/local/cuda/bin/{name}")
    monkeypatch.setattr(probes.subprocess, "run", run)
    check = probes.check_tool("ncu", "Nsight Compute backend", "install it")
    assert check.available
    assert check.detail.startswith("Version 2024.3.0.0")


def test_nonzero_exit_from_version_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "libcuda.so.1: not found")

    monkeypatch.setattr(probes.subprocess, "run", run)
    assert probes.tool_version("/x/nsys") is None


def test_nvml_lists_driver_and_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake_module(
        monkeypatch, "pynvml",
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H100" if h == 0 else b"NVIDIA A100",
    )
    check = probes.check_gpu()
    assert check.available
    assert check.detail == "driver 550.54.15: NVIDIA H100, NVIDIA A100"
    assert calls == ["init", "shutdown"]


def test_nvml_failures_become_not_available(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class NVMLError(Exception):
        pass

    def fail(*_: Any) -> None:
        raise NVMLError("Driver Not Loaded")

    pynvml = fake_module(monkeypatch, "pynvml", nvmlInit=fail, nvmlSystemGetDriverVersion=fail)
    check = probes.check_gpu()
    assert not check.available and "driver" in check.how_to_get
    monkeypatch.setattr(probes, "_unknown_nvml", set())
    with caplog.at_level(logging.WARNING, logger="gpudiag.profiler.doctor"):
        assert probes.nvml_call(pynvml, "nvmlDeviceGetNoSuchThing") is None
        assert probes.nvml_call(pynvml, "nvmlDeviceGetNoSuchThing") is None
    assert sum("nvmlDeviceGetNoSuchThing" in r.message for r in caplog.records) == 1


def test_nvml_without_gpus_says_to_check_visibility(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_module(
        monkeypatch, "pynvml", nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "550.54", nvmlDeviceGetCount=lambda: 0,
    )
    check = probes.check_gpu()
    assert not check.available and "CUDA_VISIBLE_DEVICES" in check.how_to_get


def test_missing_pynvml_points_at_the_extra_and_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(probes.shutil, "which", lambda name: f"/usr/bin/{name}")
    check = probes.check_gpu()
    assert not check.available
    assert "gpudiag[nvml]" in check.how_to_get and "/usr/bin/nvidia-smi" in check.how_to_get


@pytest.mark.parametrize(
    ("params", "root", "available"),
    [
        ("RmProfilingAdminOnly: 1\n", False, False),
        ("RmProfilingAdminOnly: 1\n", True, True),
        ("EnableMSI: 1\nRmProfilingAdminOnly: 0\n", False, True),
    ],
)
def test_ncu_permission(tmp_path: Path, params: str, root: bool, available: bool) -> None:
    path = tmp_path / "params"
    path.write_text(params)
    check = probes.check_ncu_permission(path, lambda: root)
    assert check.available is available
    if not available:
        assert "NVreg_RestrictProfilingToAdminUsers=0" in check.how_to_get
        assert "ERR_NVGPUCTRPERM" in check.how_to_get and "root" in check.how_to_get


def test_cpu_only_torch_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    fake_module(monkeypatch, "torch", cuda=cuda, version=types.SimpleNamespace(cuda=None))
    check = probes.check_torch_cuda()
    assert not check.available and "CPU-only" in check.detail


def test_torch_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)
    fake_module(monkeypatch, "torch", cuda=cuda, version=types.SimpleNamespace(cuda="12.4"))
    assert probes.check_torch_cuda() == Check("torch CUDA", True, "CUDA 12.4, 8 GPU(s)")


def test_torch_that_fails_to_load_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> bool:
        raise OSError("libcudart.so.12: cannot open shared object file")

    cuda = types.SimpleNamespace(is_available=broken)
    fake_module(monkeypatch, "torch", cuda=cuda, version=types.SimpleNamespace(cuda="12.4"))
    check = probes.check_torch_cuda()
    assert not check.available and "libcudart" in check.detail and check.how_to_get


def test_package_check_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import blocked: reported missing
    check = probes.check_package("cupy", "cupy", "cupy-cuda13x", "CuPy", "pip install x")
    assert not check.available and check.how_to_get == "pip install x"
    found = probes.check_package("rich", "rich", "rich", "tables", "pip install rich")
    assert found.available and found.detail.startswith("rich ")


def test_missing_line_is_empty_when_all_is_there() -> None:
    assert doctor.missing_line([Check("a", True, "ok")]) == ""
