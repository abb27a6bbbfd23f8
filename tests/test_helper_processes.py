"""DataLoader worker processes are helpers, not training loops (issue: `gpudiag profile` on
today's training programs). Their whole life used to be one "(whole trace)" step of
"Python between ops, 99.8%", and that came first, while the trainer waited most of its
step on the loader. Each worker now says its role in its meta (`profiler/process_facts.py`) and the
host numbers are the training process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gpudiag
from gpudiag.analyzers.host import steps as host_steps
from gpudiag.trace_meta import helper_pids
from tests.conftest import framework, profile_program

SLOW_LOADER = """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            time.sleep(0.1)              # a slow decode, in the loader's worker processes
            return torch.randn(32), i % 4

    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if __name__ == "__main__":
        for x, y in DataLoader(Slow(), batch_size=8, num_workers=2, prefetch_factor=1):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward(); opt.step(); opt.zero_grad()
        print("done")
"""


def test_helper_pids_come_from_a_runs_or_a_processs_meta() -> None:
    worker = {"pid": 7, "role": "dataloader worker"}
    assert helper_pids({"processes": [{"pid": 6, "role": None}, worker]}) == {7}
    assert helper_pids({"process": worker}) == {7}  # one process of a job, read alone
    assert helper_pids({}) == set()


def test_a_planted_slow_loader_is_the_first_finding_not_its_workers_python(
        tmp_path: Path) -> None:
    """Read against the run: 8 samples of 100 ms per batch on 2 workers is ~400 ms of loader
    work per batch, against a few ms of forward, backward and SGD on a 32x4 linear (tens on
    a loaded machine): the trainer waits in `_MultiProcessingDataLoaderIter.__next__` for
    most of every step. One batch per worker is fetched ahead: gpudiag's start-up segment
    writes (seconds on a loaded machine) let the workers fill the default two each, and
    the first four steps then waited for nothing."""
    framework("torch")
    done, run_dir = profile_program(tmp_path, SLOW_LOADER, "--steps", "all", name="loader.py")
    script = tmp_path / "loader.py"
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    trace = gpudiag.load(run_dir)
    roles = [process.get("role") for process in trace.meta["processes"]]
    assert roles.count("dataloader worker") == 2 and roles.count(None) == 1, roles
    trainer = next(p["pid"] for p in trace.meta["processes"] if p.get("role") is None)
    breakdown = host_steps.host_breakdown(trace)
    assert set(breakdown["pid"]) == {trainer}  # the trainer's data is there, alone
    shares = breakdown.set_index("category")["share"]
    assert shares["data_loading"] > 0.5 and shares["python"] < 0.2, shares
    first = gpudiag.diagnose(trace).findings.iloc[0]
    assert first["cause"] == "host_data_loading", first
    assert "DataLoader" in str(first["where"]) and "num_workers" in str(first["advice"])
    # the workers say why: ~800 ms per batch (8 samples of 100 ms), in the dataset's frame
    said = str(first["evidence"])
    assert "2 loader workers took " in said and f"`{script.name}(" in said, said
    assert "): __getitem__`" in said and "per batch" in said


#: pytorch/examples' mnist_hogwild, reduced: the parent shares the model, starts two
#: processes that train it, and waits for them in `p.join()`
HOGWILD = """
    import torch, torch.multiprocessing as mp

    def train(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 128)
        for _ in range(40):
            loss = model(x).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()

    if __name__ == "__main__":
        mp.set_start_method("spawn")     # fork after torch's OpenMP pool hangs, bare too
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 1))
        model.share_memory()
        procs = [mp.Process(target=train, args=(model,)) for _ in range(2)]
        for p in procs: p.start()
        for p in procs: p.join()
        print("done")
"""


def test_a_parent_waiting_on_its_trainers_is_not_a_training_loop(tmp_path: Path) -> None:
    """Read against the run: the parent records a few ops while it builds the model, then
    waits in `p.join()` for the whole run; its span used to be one "(whole trace)" step of
    Python between ops, 99.9% of 12.7 s, the run's first finding. The two processes that
    train have optimizer steps; they alone are the host tables."""
    framework("torch")
    script = tmp_path / "hogwild.py"
    script.write_text(textwrap.dedent(HOGWILD))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
                           "--no-report", "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    trace = gpudiag.load(run_dir)
    parent = next(p["pid"] for p in trace.meta["processes"]
                  if p.get("argv", [""])[0].endswith("hogwild.py"))
    ranges = trace.ranges
    trainers = set(ranges.loc[ranges["source"] == "step", "pid"].astype(int))
    assert len(trainers) == 2 and parent not in trainers
    by_step = host_steps.host_by_step(trace)
    assert set(by_step["pid"].astype(int)) == trainers
    assert (by_step["step"] != host_steps.WHOLE).all()
    findings = gpudiag.diagnose(trace).findings
    python = findings[findings["cause"] == "host_python_overhead"]
    assert python.empty or (python["share"] < 0.5).all(), python


#: torch.compile's Inductor starts `python .../torch/_inductor/compile_worker/__main__.py`
#: (SubprocPool) and compiles kernels there beside the training loop; this stand-in at
#: the same path does Python work with torch ops for about as long as the trainer runs
COMPILE_WORKER = """
    import time, torch
    end = time.monotonic() + 3
    while time.monotonic() < end:
        source = "".join(f"x{i} = x{i - 1} * 2\\n" for i in range(200))
        compile(source, "<kernel>", "exec")      # codegen, in Python
        torch.zeros(4).add_(1)
"""

TRAINER = """
    import subprocess, sys, torch
    worker = subprocess.Popen([sys.executable, sys.argv[1]])
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        model(torch.randn(64, 32)).square().mean().backward()
        opt.step(); opt.zero_grad()
    worker.wait()
    print("done")
"""


def test_a_compile_worker_is_a_helper_not_the_training_loop(tmp_path: Path) -> None:
    """A compile worker's whole life of codegen read as one "(whole trace)" step of Python
    between ops beside the trainer's steps; it now says its role, and the host tables are
    the trainer's alone."""
    framework("torch")
    worker = tmp_path / "torch" / "_inductor" / "compile_worker" / "__main__.py"
    worker.parent.mkdir(parents=True)
    worker.write_text(textwrap.dedent(COMPILE_WORKER))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINER))
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "-o", str(run_dir),
                           "--no-report", "--steps", "all", "--", sys.executable,
                           str(script), str(worker)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    trace = gpudiag.load(run_dir)
    roles = {p["pid"]: p.get("role") for p in trace.meta["processes"]}
    assert sorted(roles.values(), key=str) == [None, "compile worker"], roles
    trainer = next(pid for pid, role in roles.items() if role is None)
    assert set(host_steps.host_breakdown(trace)["pid"]) == {trainer}
