"""`gpudiag profile --backend nsys|ncu` with fake `nsys` and `ncu` executables.

The fakes are small Python scripts put first on PATH: they answer `--version` like the real
tools, record their argv (one JSON list per line in $FAKE_ARGV_LOG), run the wrapped command
and copy a real report from ../shared/fixtures where the tool would write its own. The ncu
wrapper scripts run for real under bash, so the argv the fake ncu records is exactly what
a real ncu would be given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gpudiag
from gpudiag.collectors import external, probes
from gpudiag.collectors.external import (
    load_result,
    parse_version,
    preflight,
    result_files,
    wrap_command,
)
from gpudiag.errors import CollectorError
from tests.conftest import ROOT, fixture, tool_missing

NCU_REP = "ncu/rtx3050laptop_filter_nvtx.ncu-rep"  # 1 kernel
NSYS_SQLITE = "nsys/rtx4090_4streams_eventsync.sqlite"  # 16 kernels
NSYS_REP = "nsys/rtx3050laptop_multistream.nsys-rep"
PROGRAM = [sys.executable, "-c", "print('hello from the program')"]

FAKE_NSYS = '''\
import json, os, shutil, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps(["nsys", *args]) + "\\n")
if args == ["--version"]:
    if os.environ.get("FAKE_HANG"):
        time.sleep(60)
    if os.environ.get("FAKE_FAIL"):
        sys.exit(1)
    print("NVIDIA Nsight Systems version "
          + os.environ.get("FAKE_VERSION", "2024.5.1.113-245134619542v0"))
elif args[0] == "export":
    shutil.copyfile(os.environ["FAKE_NSYS_SQLITE"], args[args.index("--output") + 1])
elif args[0] == "profile":
    rest, opts = args[1:], {}
    while rest[0].startswith("-"):
        key, _, value = rest.pop(0).partition("=")
        opts[key] = value
    print("Collecting data...", flush=True)
    code = subprocess.call(rest)
    if not os.environ.get("FAKE_NO_REPORT"):
        shutil.copyfile(os.environ["FAKE_NSYS_REP"], opts["--output"] + ".nsys-rep")
        if opts.get("--export") == "sqlite" and not os.environ.get("FAKE_NO_SQLITE"):
            shutil.copyfile(os.environ["FAKE_NSYS_SQLITE"], opts["--output"] + ".sqlite")
    sys.exit(code)
else:
    sys.exit("fake nsys: unexpected " + repr(args))
'''

FAKE_NCU = '''\
import json, os, shutil, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *args]) + "\\n")
if args == ["--version"]:
    if os.environ.get("FAKE_HANG"):
        time.sleep(60)
    if os.environ.get("FAKE_FAIL"):
        sys.exit(1)
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Copyright (c) 2018-2024 NVIDIA Corporation")
    print("Version " + os.environ.get("FAKE_VERSION", "2024.3.2.0")
          + " (build 34861637) (public-release)")
    sys.exit(0)
split = args.index("--")
opts, cmd = args[:split], args[split + 1:]
log = open(opts[opts.index("--log-file") + 1], "w") if "--log-file" in opts else sys.stdout
print("==PROF== Connected to process 4242", file=log, flush=True)
code = subprocess.call(cmd)
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
          "GPU Performance Counters on the target device 0.", file=log)
if mode in ("perm", "nokernels"):
    print("==WARNING== No kernels were profiled.", file=log)
elif mode == "crash":
    print("==ERROR== The application returned an error code (11).", file=log)
else:
    print('==PROF== Profiling "vecAdd" - 0: 0%....50%....100% - 9 passes', file=log)
    export = opts[opts.index("--export") + 1]
    shutil.copyfile(os.environ["FAKE_NCU_REP"], export + ".ncu-rep")
    print("==PROF== Report: " + export + ".ncu-rep", file=log)
sys.exit(code)
'''


def _write_tool(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)
    return path


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Fake nsys and ncu first on PATH; returns the argv log they append to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_tool(bin_dir, "nsys", FAKE_NSYS)
    _write_tool(bin_dir, "ncu", FAKE_NCU)
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ARGV_LOG", str(argv_log))
    for name in ("NCU", "NCU_LAUNCH_COUNT", "NCU_LAUNCH_SKIP"):
        monkeypatch.delenv(name, raising=False)
    return argv_log


@pytest.fixture
def counters_open(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A driver whose performance counters are open to every user."""
    params = tmp_path / "nvidia-params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 0\n")
    monkeypatch.setattr(probes, "PROFILING_PARAMS", params)


def recorded(argv_log: Path, tool: str) -> list[list[str]]:
    """The argv of every call of `tool` other than --version, in call order."""
    if not argv_log.exists():
        return []
    calls = [json.loads(line) for line in argv_log.read_text().splitlines()]
    return [call[1:] for call in calls if call[0] == tool and call[1:] != ["--version"]]


def one_line_error(excinfo: pytest.ExceptionInfo[CollectorError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# --- preflight ---------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "version"), [
    ("NVIDIA Nsight Systems version 2023.1.2.43-32377213v0", (2023, 1)),
    ("Version 2024.3.2.0 (build 34861637) (public-release)", (2024, 3)),
    ("NVIDIA Nsight Systems version 2022.4.2.18-32044107v0", (2022, 4)),
    ("Version 2019.5.0 (Build 27346997)", (2019, 5)),
    ("Version 2025.10.1.0 (build 1)", (2025, 10)),
    ("Version 12.4 (build 20231104)", None),
    ("nsys 1.0", None),
])
def test_parse_version_reads_year_and_release(line: str, version: tuple[int, int] | None) -> None:
    assert parse_version(line) == version


def test_preflight_returns_the_version_line(tools: Path, counters_open: None) -> None:
    assert preflight("nsys") == "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"
    assert preflight("ncu") == "Version 2024.3.2.0 (build 34861637) (public-release)"


@pytest.mark.parametrize("backend", ["nsys", "ncu"])
def test_preflight_without_the_tool_says_how_to_install_it(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CollectorError) as excinfo:
        preflight(backend)
    message = one_line_error(excinfo)
    assert message.startswith(f"--backend {backend}: {backend} is not on PATH")
    assert external.INSTALL_FIX[backend] in message


@pytest.mark.parametrize("backend", ["nsys", "ncu"])
def test_preflight_refuses_a_release_older_than_2023_1(
    backend: str, tools: Path, counters_open: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VERSION", "2022.4.2.18-32044107v0")
    with pytest.raises(CollectorError) as excinfo:
        preflight(backend)
    message = one_line_error(excinfo)
    assert "is release 2022.4, older than 2023.1, the oldest whose output gpudiag reads" in message
    assert f"install Nsight {'Systems' if backend == 'nsys' else 'Compute'} 2023.1" in message


def test_preflight_refuses_a_version_line_without_a_release(
    tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VERSION", "unknown")
    with pytest.raises(CollectorError) as excinfo:
        preflight("nsys")
    message = one_line_error(excinfo)
    assert "printed 'NVIDIA Nsight Systems version unknown', which names no Nsight release" in (
        message)


def test_preflight_gives_up_on_a_hung_version_call(
    tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HANG", "1")
    monkeypatch.setattr(probes, "VERSION_TIMEOUT_S", 0.5)
    start = time.monotonic()
    with pytest.raises(CollectorError) as excinfo:
        preflight("ncu")
    assert time.monotonic() - start < 10
    message = one_line_error(excinfo)
    assert "ncu did not answer --version within 0.5 s" in message
    assert external.INSTALL_FIX["ncu"] in message


def test_preflight_reports_a_failing_version_call(
    tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(CollectorError) as excinfo:
        preflight("nsys")
    assert "nsys did not answer --version" in one_line_error(excinfo)


def test_preflight_ncu_with_admin_only_counters_gives_the_permission_fix(
    tools: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    params = tmp_path / "params"
    params.write_text("RmProfilingAdminOnly: 1\n")
    monkeypatch.setattr(probes, "PROFILING_PARAMS", params)
    monkeypatch.setattr(probes, "_is_root", lambda: False)
    with pytest.raises(CollectorError) as excinfo:
        preflight("ncu")
    message = one_line_error(excinfo)
    assert message == ("--backend ncu: counters are admin-only and this user is not root; "
                       + probes.NCU_PERMISSION_FIX)
    monkeypatch.setattr(probes, "_is_root", lambda: True)
    assert preflight("ncu").startswith("Version 2024.3.2.0")
    assert preflight("nsys").startswith("NVIDIA Nsight Systems")  # nsys needs no counters


def test_preflight_ncu_without_a_driver_says_so(
    tools: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(probes, "PROFILING_PARAMS", tmp_path / "absent")
    with pytest.raises(CollectorError) as excinfo:
        preflight("ncu")
    assert "no NVIDIA driver loaded" in one_line_error(excinfo)


# --- wrap_command --------------------------------------------------------------------------


def test_wrap_command_nsys(tmp_path: Path) -> None:
    argv = wrap_command("nsys", ["python", "train.py", "--lr", "3"], tmp_path)
    assert argv == ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--export=sqlite",
                    "--force-overwrite=true", f"--output={tmp_path}/nsys/report",
                    "python", "train.py", "--lr", "3"]
    assert (tmp_path / "nsys").is_dir()


@pytest.mark.parametrize("ncu_set", ["launch", "memory", "full"])
@pytest.mark.parametrize(("kernels", "regex_args"), [
    (None, []), ("", []), ("gemm|matmul", ["gemm|matmul"]),
])
def test_wrap_command_ncu(ncu_set: str, kernels: str | None, regex_args: list[str],
                          tmp_path: Path) -> None:
    argv = wrap_command("ncu", ["./app", "-n", "2"], tmp_path, ncu_set=ncu_set,
                        ncu_kernels=kernels)
    script = ROOT / "gpudiag" / "collectors" / "ncu_wrappers" / f"{ncu_set}.sh"
    assert argv == ["bash", str(script), "-l", f"{tmp_path}/ncu/ncu.log",
                    f"{tmp_path}/ncu/report", *regex_args, "--", "./app", "-n", "2"]
    assert (tmp_path / "ncu").is_dir()


def test_wrap_command_rejects_what_it_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown ncu set 'basic'"):
        wrap_command("ncu", ["./app"], tmp_path, ncu_set="basic")
    with pytest.raises(ValueError, match="unknown external backend 'cupti'"):
        wrap_command("cupti", ["./app"], tmp_path)
    with pytest.raises(ValueError, match="needs a command"):
        wrap_command("nsys", [], tmp_path)
    assert not any(tmp_path.iterdir())  # nothing created for a refused command


# --- the ncu wrapper scripts -----------------------------------------------------------------

COMMON = ["--force-overwrite", "--clock-control", "none", "--target-processes", "all", "--nvtx"]
SETS = {
    "launch": ["--section", "LaunchStats", "--section", "Occupancy", "--section", "SpeedOfLight"],
    "memory": ["--section", "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats",
               "--section", "MemoryWorkloadAnalysis", "--section", "MemoryWorkloadAnalysis_Chart",
               "--section", "MemoryWorkloadAnalysis_Tables", "--metrics",
               "lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,"
               "dram__throughput.avg.pct_of_peak_sustained_elapsed"],
    "full": ["--set", "full"],
}


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(external.WRAPPERS / f"{name}.sh"), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("ncu_set", ["launch", "memory", "full"])
def test_wrapper_script_gives_ncu_its_command_line(
    ncu_set: str, tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NCU_REP", str(fixture(NCU_REP)))
    monkeypatch.setenv("NCU_LAUNCH_COUNT", "3")
    monkeypatch.setenv("NCU_LAUNCH_SKIP", "10")
    out, log = tmp_path / "deep" / "er" / "rep", tmp_path / "ncu.log"
    result = run_script(ncu_set, "-l", str(log), str(out), "^gemm_.*", "--", *PROGRAM)
    assert result.returncode == 0, result.stderr
    assert recorded(tools, "ncu") == [[
        "--export", str(out), *COMMON, "-k", "regex:^gemm_.*", "--launch-count", "3",
        "--launch-skip", "10", "--log-file", str(log), *SETS[ncu_set], "--", *PROGRAM]]
    assert (tmp_path / "deep" / "er" / "rep.ncu-rep").is_file()  # the folder was created


def test_wrapper_script_by_hand_keeps_ncu_on_the_terminal(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NCU_REP", str(fixture(NCU_REP)))
    result = run_script("launch", str(tmp_path / "rep"), "--", *PROGRAM)
    assert result.returncode == 0, result.stderr
    assert recorded(tools, "ncu") == [["--export", str(tmp_path / "rep"), *COMMON,
                                       *SETS["launch"], "--", *PROGRAM]]
    assert "==PROF== Connected" in result.stdout
    assert "hello from the program" in result.stdout


def test_wrapper_script_empty_regex_means_every_kernel(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NCU_REP", str(fixture(NCU_REP)))
    result = run_script("full", str(tmp_path / "rep"), "", "--", *PROGRAM)
    assert result.returncode == 0, result.stderr
    assert "-k" not in recorded(tools, "ncu")[0]


def test_wrapper_script_runs_the_ncu_named_by_NCU(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _write_tool(tmp_path, "ncu-2025", FAKE_NCU)
    monkeypatch.setenv("NCU", str(other))
    monkeypatch.setenv("FAKE_NCU_REP", str(fixture(NCU_REP)))
    result = run_script("launch", str(tmp_path / "rep"), "--", *PROGRAM)
    assert result.returncode == 0, result.stderr
    assert recorded(tools, "ncu") == []
    assert recorded(tools, "ncu-2025")[0][:2] == ["--export", str(tmp_path / "rep")]


@pytest.mark.parametrize(("args", "env", "problem"), [
    (["out", "python", "x.py"], {}, "expected -- before the command"),
    (["out", "--"], {}, "missing OUTPUT, -- or CMD"),
    (["out", "regex", "--"], {}, "no command after --"),
    (["-l"], {}, "-l needs a file"),
    (["out", "--", "./app"], {"NCU_LAUNCH_COUNT": "ten"},
     "NCU_LAUNCH_COUNT must be a whole number, not 'ten'"),
    (["out", "--", "./app"], {"NCU_LAUNCH_SKIP": "-1"},
     "NCU_LAUNCH_SKIP must be a whole number, not '-1'"),
])
def test_wrapper_script_usage_errors_exit_2_without_running_ncu(
    args: list[str], env: dict[str, str], problem: str, tools: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_script("memory", *args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "usage: memory.sh [-l LOG_FILE] OUTPUT [KERNEL_REGEX] -- CMD [ARG...]",
        f"memory.sh: {problem}"]
    assert recorded(tools, "ncu") == []


def test_wrapper_scripts_differ_only_in_their_set() -> None:
    """Each script sets its `set_args` and, as its last line, sources the shared body."""
    def code(name: str) -> tuple[str, str]:
        text = (external.WRAPPERS / f"{name}.sh").read_text()
        start, end = text.index("set -euo pipefail"), text.index("# --- the set:")
        return text[start:end], text.rstrip("\n").splitlines()[-1]

    assert code("launch") == code("memory") == code("full")
    assert code("full")[1].startswith(". ") and code("full")[1].endswith('/_ncu_common.sh"')
    common = (external.WRAPPERS / "_ncu_common.sh").read_text()
    assert 'args+=("${set_args[@]}")' in common
    assert 'exec "${NCU:-ncu}"' in common
    for name in external.NCU_SETS:
        path = external.WRAPPERS / f"{name}.sh"
        assert path.stat().st_mode & 0o111, f"{path} is not executable"
        assert "exec " not in path.read_text(), f"{path} should leave running ncu to the body"


def test_scripts_folder_is_the_packaged_wrappers() -> None:
    assert (ROOT / "scripts" / "ncu_wrappers").resolve() == external.WRAPPERS


def test_wrapper_scripts_pass_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        tool_missing("shellcheck is not installed (apt install shellcheck)")
    names = (*external.NCU_SETS, "_ncu_common")
    scripts = [str(external.WRAPPERS / f"{name}.sh") for name in names]
    result = subprocess.run(["shellcheck", "-x", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --- running, finding and loading the result ----------------------------------------------


def run_wrapped(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_ncu_run_end_to_end(tools: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NCU_REP", str(fixture(NCU_REP)))
    result = run_wrapped(wrap_command("ncu", PROGRAM, tmp_path, ncu_set="memory"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello from the program\n"  # ncu's own lines went to the log
    log = external.log_file("ncu", tmp_path)
    assert log == tmp_path / "ncu" / "ncu.log"
    assert '==PROF== Profiling "vecAdd"' in log.read_text()
    assert result_files("ncu", tmp_path) == [tmp_path / "ncu" / "report.ncu-rep"]
    trace = load_result("ncu", tmp_path)
    assert len(trace.kernels) == 1
    assert trace.meta["external"] == {"backend": "ncu",
                                      "files": [str(tmp_path / "ncu" / "report.ncu-rep")]}


def test_ncu_refused_counters_in_the_log_give_the_permission_fix(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "perm")
    run_wrapped(wrap_command("ncu", PROGRAM, tmp_path))
    with pytest.raises(CollectorError) as excinfo:
        result_files("ncu", tmp_path)
    log = tmp_path / "ncu" / "ncu.log"
    assert one_line_error(excinfo) == (
        f"ncu was refused the GPU performance counters (ERR_NVGPUCTRPERM in {log}): "
        + probes.NCU_PERMISSION_FIX)


def test_ncu_that_profiled_nothing_points_at_the_kernel_filter(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "nokernels")
    run_wrapped(wrap_command("ncu", PROGRAM, tmp_path, ncu_kernels="no_such_kernel"))
    with pytest.raises(CollectorError) as excinfo:
        result_files("ncu", tmp_path)
    message = one_line_error(excinfo)
    assert message.startswith(f"ncu wrote no report in {tmp_path / 'ncu'}: no kernel was "
                              "profiled: check that --ncu-kernels")
    assert message.endswith(f"(log: {tmp_path / 'ncu' / 'ncu.log'})")


def test_ncu_error_without_a_report_quotes_the_last_error_line(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "crash")
    run_wrapped(wrap_command("ncu", PROGRAM, tmp_path))
    with pytest.raises(CollectorError) as excinfo:
        result_files("ncu", tmp_path)
    assert ": ==ERROR== The application returned an error code (11). (log: " in (
        one_line_error(excinfo))


def test_ncu_that_never_started_says_so(tmp_path: Path) -> None:
    (tmp_path / "ncu").mkdir()
    with pytest.raises(CollectorError) as excinfo:
        result_files("ncu", tmp_path)
    assert "and no log" in one_line_error(excinfo)


def test_nsys_run_end_to_end(tools: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NSYS_REP", str(fixture(NSYS_REP)))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(fixture(NSYS_SQLITE)))
    result = run_wrapped(wrap_command("nsys", PROGRAM, tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Collecting data...\nhello from the program\n"  # let through
    assert result_files("nsys", tmp_path) == [tmp_path / "nsys" / "report.sqlite"]
    assert [call[0] for call in recorded(tools, "nsys")] == ["profile"]  # no export needed
    trace = load_result("nsys", tmp_path)
    assert len(trace.kernels) == 16


def test_nsys_report_without_export_is_exported(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_REP", str(fixture(NSYS_REP)))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(fixture(NSYS_SQLITE)))
    monkeypatch.setenv("FAKE_NO_SQLITE", "1")
    run_wrapped(wrap_command("nsys", PROGRAM, tmp_path))
    report, sqlite = tmp_path / "nsys" / "report.nsys-rep", tmp_path / "nsys" / "report.sqlite"
    assert report.is_file() and not sqlite.exists()
    assert result_files("nsys", tmp_path) == [sqlite]
    export = recorded(tools, "nsys")[1]
    # exported into a private folder of its own (never through a planted report.sqlite),
    # then renamed into place
    output = Path(export[6])
    assert export[:6] + export[7:] == ["export", "--type", "sqlite", "--force-overwrite",
                                       "true", "--output", str(report)]
    assert output.name == "report.sqlite" and output.parent.parent == sqlite.parent
    assert output.parent.name.startswith(".gpudiag-nsys-") and not output.parent.exists()
    assert len(load_result("nsys", tmp_path).kernels) == 16


def test_nsys_without_any_report_says_where_its_messages_are(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NO_REPORT", "1")
    run_wrapped(wrap_command("nsys", PROGRAM, tmp_path))
    with pytest.raises(CollectorError) as excinfo:
        result_files("nsys", tmp_path)
    message = one_line_error(excinfo)
    assert message.startswith(f"nsys wrote no report in {tmp_path / 'nsys'}: its own messages "
                              "are above, on the terminal")


# --- through `gpudiag profile`, as a user runs it ------------------------------------------


def profile_cli(tmp_path: Path, *options: str,
                code: str = "print('hello from the program')") -> subprocess.CompletedProcess[str]:
    program = [sys.executable, "-c", code]
    return subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o",
                           str(tmp_path / "run"), *options, "--", *program],
                          capture_output=True, text=True, timeout=120)


def test_profile_backend_nsys_merges_the_export_with_the_host_side(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NSYS_REP", str(fixture(NSYS_REP)))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(fixture(NSYS_SQLITE)))
    done = profile_cli(tmp_path, "--backend", "nsys")
    assert done.returncode == 0, done.stderr
    assert "hello from the program" in done.stdout
    run_dir = tmp_path / "run"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["tool_command"][:2] == ["nsys", "profile"]
    trace = gpudiag.load(run_dir / "trace")
    assert len(trace.kernels) == 16
    assert trace.meta["tool_versions"]["nsys"] == "2023.3.1.92"  # the export's own
    assert (run_dir / "report.html").exists()


def test_profile_backend_ncu_keeps_the_exit_status_when_ncu_fails(
    tools: Path, tmp_path: Path, counters_open: None, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpudiag.cli import main

    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(SystemExit) as exited:  # in-process: counters_open applies
        main(["profile", "-o", str(tmp_path / "run"), "--backend", "ncu", "--ncu-set",
              "memory", "--", sys.executable, "-c", "import sys; sys.exit(11)"])
    assert exited.value.code == 11  # the program's status through ncu, never masked
    err = capfd.readouterr().err
    assert "==ERROR== The application returned an error code (11)" in err
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["tool_command"][0] == "bash" and meta["tool_command"][1].endswith("memory.sh")


def test_profile_backend_ncu_without_ncu_is_one_line_before_running(tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu anywhere
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--backend", "ncu",
                           "--", "true"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ncu is not on PATH" in lines[0]
    assert not (tmp_path / "gpudiag-runs").exists()
