"""Which program a command line runs, past its wrappers and launchers: run and report names.

    program_name(["torchrun", "--standalone", "--nproc-per-node", "2", "train.py"])  # 'train'
    program_name(["python", "-m", "pkg.mod"])                                        # 'pkg.mod'
    program_name(["/usr/bin/time", "-v", "env", "A=1", "python", "x.py"])            # 'x'

`gpudiag profile` names its run directory after it and the report title shows it. Wrappers
that only change how a program runs (time, env and VAR=VALUE, nice, ionice, taskset,
numactl, nohup, timeout, stdbuf, srun, mpirun/mpiexec) are skipped with their options;
torchrun and `python -m torch.distributed.run` (or `.launch`) with theirs. What is left is a
Python script (its stem), a `-m` module (its dotted name), a shell script (its stem) or a
program (its file name). Stdlib only: the profiler's session imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePath

#: per wrapper: its options that take values (how many); other options are flags.
#: `positional`: the wrapper's own arguments before the command (taskset's mask, timeout's
#: duration)
_WRAPPERS: Mapping[str, tuple[Mapping[str, int], int]] = {
    "time": ({"-f": 1, "--format": 1, "-o": 1, "--output": 1}, 0),
    "env": ({"-u": 1, "--unset": 1, "-C": 1, "--chdir": 1}, 0),
    "nice": ({"-n": 1, "--adjustment": 1}, 0),
    "ionice": ({"-c": 1, "--class": 1, "-n": 1, "--classdata": 1}, 0),
    "nohup": ({}, 0),
    "stdbuf": ({"-i": 1, "-o": 1, "-e": 1}, 0),
    "timeout": ({"-s": 1, "--signal": 1, "-k": 1, "--kill-after": 1}, 1),
    "taskset": ({}, 1),
    "numactl": ({o: 1 for o in ("-N", "--cpunodebind", "-m", "--membind", "-C",
                                "--physcpubind", "-i", "--interleave", "-p", "--preferred",
                                "-P", "--preferred-many", "-w", "--weighted-interleave")}, 0),
    "srun": ({o: 1 for o in ("-n", "--ntasks", "-N", "--nodes", "-c", "--cpus-per-task",
                             "-p", "--partition", "-A", "--account", "-t", "--time", "-J",
                             "--job-name", "-o", "--output", "-e", "--error", "-w",
                             "--nodelist", "-x", "--exclude", "-G", "--gpus", "--gres",
                             "--mpi", "--ntasks-per-node", "--gpus-per-node",
                             "--gpus-per-task", "--mem", "--mem-per-cpu", "--cpu-bind",
                             "-q", "--qos", "-C", "--constraint", "-D", "--chdir",
                             "--export", "-m", "--distribution")}, 0),
    "mpirun": ({**{o: 1 for o in ("-n", "-np", "--np", "-c", "-N", "--npernode", "-H",
                                  "--host", "-host", "-hosts", "--hostfile", "-hostfile",
                                  "-machinefile", "--machinefile", "-f", "--map-by",
                                  "--bind-to", "--rank-by", "-x", "-wdir", "--wdir", "-ppn",
                                  "--prefix", "-bind-to", "-map-by")},
                **{o: 2 for o in ("-mca", "--mca", "-gmca", "--gmca", "-genv", "-env")}}, 0),
}
_WRAPPERS = {**_WRAPPERS, "mpiexec": _WRAPPERS["mpirun"], "orterun": _WRAPPERS["mpirun"]}
#: torchrun's options that take no value (all others take one)
_TORCHRUN_FLAGS = frozenset({"--standalone", "--no-python", "--run-path", "--use-env",
                             "--module", "-m"})
_TORCHRUN = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch"})
#: the Python interpreter's options that take a value (`-X dev`, `-W error`)
_PYTHON_VALUED = frozenset({"-X", "-W", "--check-hash-based-pycs"})
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[mtd]?$")
_SHELLS = frozenset({"sh", "bash", "zsh", "dash"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def program_name(command: Sequence[str]) -> str | None:
    """The program `command` runs (module docstring), None for an empty command."""
    args = list(command)
    i = 0
    while i < len(args):
        token = args[i]
        base = PurePath(token).name
        if _ASSIGNMENT.match(token):  # VAR=VALUE before the command (env, or a shell's)
            i += 1
        elif base in _WRAPPERS:
            valued, positional = _WRAPPERS[base]
            i = _skip_options(args, i + 1, valued) + positional
        elif base in _TORCHRUN:
            return _launched(args[i + 1:])
        elif _PYTHON.match(base) or base in _SHELLS:
            return _interpreted(args[i + 1:]) or base
        else:
            return _stem(token)
    return None


def _skip_options(args: list[str], i: int, valued: Mapping[str, int]) -> int:
    """The index of the first argument after the options starting at `i` (and `--`)."""
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        option = args[i]
        i += 1
        if option == "--":
            break
        if "=" not in option:
            i += valued.get(option, 0)
    return i


def _interpreted(args: list[str]) -> str | None:
    """After `python` (or a shell): the script's stem, the `-m` module, or None (-c, stdin)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        option = args[i]
        if option in ("-c", "--"):
            return None if option == "-c" else (_stem(args[i + 1]) if i + 1 < len(args)
                                                else None)
        if option.startswith("-m"):  # `-m mod` or `-mmod`
            module = option[2:] or (args[i + 1] if i + 1 < len(args) else "")
            rest = args[i + (1 if option[2:] else 2):]
            return _launched(rest) if module in _TORCHRUN else module or None
        i += 1 + (option in _PYTHON_VALUED)
    return _stem(args[i]) if i < len(args) and args[i] != "-" else None


def _launched(args: list[str]) -> str | None:
    """After torchrun's name: its options (all take a value but a few flags), then the
    training script, or the module after `-m`/`--module`."""
    i, module = 0, False
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "--":
            i += 1
            break
        option = args[i].split("=", 1)[0].replace("_", "-") if args[i].startswith("--") \
            else args[i]
        module |= option in ("-m", "--module")
        i += 1 + ("=" not in args[i] and option not in _TORCHRUN_FLAGS)
    if i >= len(args):
        return None
    return args[i] if module else _stem(args[i])


def _stem(path: str) -> str:
    """A script's stem ('train' for train.py or run.sh), else the program's file name."""
    name = PurePath(path).name or path
    for suffix in (".py", ".sh"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name
