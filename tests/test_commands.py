"""Run names and report titles name the real program, past wrappers and launchers."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import gpudiag
from gpudiag.cli import cli
from gpudiag.commands import program_name
from gpudiag.profiler.session import _command_name

TABLE = [
    ("python train.py --lr 3e-4", "train"),
    ("python3.11 -u -X dev -W error /home/me/proj/train.py", "train"),
    ("python -m pkg.mod --flag", "pkg.mod"),
    ("python -mpkg.mod", "pkg.mod"),
    ("python -c print(1)", "python"),
    ("torchrun --standalone --nproc-per-node 2 train.py", "train"),
    ("torchrun --nproc_per_node=8 --nnodes 2 --rdzv-endpoint h:29400 -m pkg.train", "pkg.train"),
    ("torchrun --no-python --nproc-per-node 2 ./bench", "bench"),
    ("python -m torch.distributed.run --nproc-per-node 4 train.py", "train"),
    ("python -m torch.distributed.launch --use_env --nproc_per_node 2 tr.py", "tr"),
    ("/usr/bin/time python x.py", "x"),
    ("/usr/bin/time -v -o t.txt python x.py", "x"),
    ("env CUDA_VISIBLE_DEVICES=0 NCCL_DEBUG=INFO python x.py", "x"),
    ("env -u HOME -i A=1 python x.py", "x"),
    ("A=1 python x.py", "x"),
    ("nice -n 10 python x.py", "x"),
    ("taskset -c 0-7 python x.py", "x"),
    ("taskset 0xff python x.py", "x"),
    ("numactl --cpunodebind=0 -m 0 python x.py", "x"),
    ("timeout -s INT 600 python x.py", "x"),
    ("nohup python x.py", "x"),
    ("srun -N 2 --ntasks-per-node 8 --gres=gpu:8 python train.py", "train"),
    ("mpirun -np 4 -x NCCL_DEBUG=INFO --mca btl tcp,self python train.py", "train"),
    ("mpiexec -n 2 torchrun --nproc-per-node 2 train.py", "train"),
    ("/usr/bin/time env A=1 nice -n 5 taskset -c 0 numactl -N 0 torchrun --standalone "
     "--nproc-per-node 2 -m pkg.train --epochs 3", "pkg.train"),
    ("bash run.sh", "run"),
    ("./a.out 1 2", "a.out"),
    ("nsys", "nsys"),
    ("env", None),
    ("", None),
]


@pytest.mark.parametrize(("line", "name"), TABLE)
def test_program_name_skips_wrappers_and_launchers(line: str, name: str | None) -> None:
    assert program_name(line.split()) == name


@pytest.mark.parametrize(("cmd", "dirname"), [
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"], "train"),
    (["python", "-m", "pkg.mod"], "pkg.mod"),
    (["/usr/bin/time", "python", "x.py"], "x"),
    (["env"], "env"),
    (["python", "my script!.py"], "my_script_"),
])
def test_run_directories_are_named_after_the_program(cmd: list[str], dirname: str) -> None:
    assert _command_name(cmd) == dirname


def _run_dir(root: Path, command: list[str]) -> Path:
    """A `gpudiag profile` run directory with one process and two kernels."""
    from gpudiag.profiler import session
    from tests.builders import kernel, trace

    run_dir = root / "run"
    session.make_run_dir(["x"], run_dir)
    session.write_json(run_dir / "meta.json", {"command": command})
    proc = run_dir / "procs" / "h-7"
    proc.mkdir(parents=True)
    gpudiag.Trace(meta={"process": {"pid": 7, "host": "h", "collectors": ["host", "cupti"]},
                        "sources": [{"format": "gpudiag-host", "pid": 7}]}).save(proc)
    trace(kernels=[kernel(1_000, 2_000), kernel(5_000, 9_000)]).save(
        proc / "cupti" / "chunk-000000")
    return run_dir


@pytest.mark.parametrize(("command", "title"), [
    (["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"], "train"),
    (["python", "-m", "pkg.mod"], "pkg.mod"),
    (["/usr/bin/time", "python", "x.py"], "x"),
])
def test_report_titles_name_the_program(tmp_path: Path, command: list[str], title: str
                                        ) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(_run_dir(tmp_path, command)),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"<title>gpudiag report: {title}</title>" in out.read_text(encoding="utf-8")
