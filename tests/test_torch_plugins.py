"""The torch plugins' own logic with a fake torch: CUDA paths that CPU-only CI cannot reach.

The real torch.profiler runs in test_profile_backends.py; here the fake records calls, so the
CUDA-only allocator snapshot and the thread rule of torch.profiler can be checked exactly.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpudiag.collectors import torch_plugin as torch_backend
from gpudiag.collectors import torch_snapshot


class FakeTorch:
    """Just the torch surface the plugins use; every call is logged."""

    def __init__(self, cuda: bool) -> None:
        self.log: list[tuple[str, Any]] = []
        memory = SimpleNamespace(
            _record_memory_history=lambda **kw: self.log.append(("history", kw)),
            _dump_snapshot=self._dump,
        )
        self.cuda = SimpleNamespace(is_available=lambda: cuda, memory=memory)
        activity = SimpleNamespace(CPU="cpu", CUDA="cuda")
        self.profiler = SimpleNamespace(ProfilerActivity=activity, profile=self._profile)

    def _dump(self, path: str) -> None:
        Path(path).write_bytes(b"snapshot")
        self.log.append(("dump", Path(path).name))

    def _profile(self, **kwargs: Any) -> Any:
        self.log.append(("profile", kwargs["activities"]))
        log = self.log

        class Profile:
            def start(self) -> None:
                log.append(("start", threading.get_ident()))

            def stop(self) -> None:
                log.append(("stop", threading.get_ident()))

            def export_chrome_trace(self, path: str) -> None:
                Path(path).write_text("{}")

        return Profile()


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(cuda: bool) -> FakeTorch:
        torch = FakeTorch(cuda)
        for module in (torch_backend, torch_snapshot):
            monkeypatch.setattr(module, "require", lambda name, purpose: torch)
        return torch
    return install


def test_snapshot_on_cuda_records_from_start_and_dumps_once_at_exit(
        tmp_path: Path, fake_torch: Any) -> None:
    torch = fake_torch(cuda=True)
    plugin = torch_snapshot.create(tmp_path, {"memory": True})
    plugin.start()
    plugin.pause()
    plugin.resume()  # the history spans the whole run: window edges change nothing
    plugin.flush(False)
    assert torch.log == [("history", {"max_entries": torch_snapshot.MEMORY_HISTORY_ENTRIES})]
    plugin.flush(True)
    plugin.flush(True)  # atexit and the bootstrap's final flush both call it
    assert torch.log[1:] == [("dump", ".memory_snapshot.pickle.tmp"),
                             ("history", {"enabled": None})]
    assert (tmp_path / "memory_snapshot.pickle").read_bytes() == b"snapshot"
    assert not list(tmp_path.glob(".*"))  # written under a temporary name, then renamed


@pytest.mark.parametrize(("cuda", "memory"), [(False, True), (True, False)])
def test_snapshot_does_nothing_without_cuda_or_with_memory_off(
        tmp_path: Path, fake_torch: Any, cuda: bool, memory: bool) -> None:
    torch = fake_torch(cuda=cuda)
    plugin = torch_snapshot.create(tmp_path, {"memory": memory})
    plugin.start()
    plugin.flush(True)
    assert torch.log == [] and not list(tmp_path.iterdir())


def test_snapshot_is_off_in_a_forked_child(tmp_path: Path, fake_torch: Any) -> None:
    torch = fake_torch(cuda=True)
    plugin = torch_snapshot.create(tmp_path, {})
    plugin.after_fork(tmp_path / "child")
    plugin.start()
    plugin.flush(True)
    assert torch.log == []


def test_profiler_records_cuda_activity_when_there_is_a_gpu(tmp_path: Path,
                                                            fake_torch: Any) -> None:
    torch = fake_torch(cuda=True)
    plugin = torch_backend.create(tmp_path, {})
    plugin.start()
    plugin.resume()
    plugin.flush(True)
    assert torch.log[0] == ("profile", ["cpu", "cuda"])
    assert [p.name for p in tmp_path.iterdir()] == ["segment-0001.pt.trace.json"]


def _until(condition: Any, seconds: float = 5.0) -> None:
    """Run bytecode on this (main) thread until `condition()`: pending calls run between."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        sum(range(1000))


def test_window_edges_from_a_timer_run_on_the_programs_main_thread(
        tmp_path: Path, fake_torch: Any) -> None:
    torch = fake_torch(cuda=False)
    plugin = torch_backend.create(tmp_path, {})
    plugin.start()
    timer = threading.Thread(target=plugin.resume)  # what the --delay timer does
    timer.start()
    timer.join()
    _until(lambda: len(torch.log) == 2)
    assert torch.log == [("profile", ["cpu"]), ("start", threading.get_ident())]
    stopper = threading.Thread(target=plugin.pause)
    stopper.start()
    stopper.join()
    _until(lambda: len(torch.log) == 3)
    assert torch.log[-1] == ("stop", threading.get_ident())  # Kineto's own thread
    assert [p.name for p in tmp_path.iterdir()] == ["segment-0001.pt.trace.json"]


def test_edges_wait_for_the_next_step_when_torch_lives_off_the_main_thread(
        tmp_path: Path, fake_torch: Any) -> None:
    torch = fake_torch(cuda=False)
    box: dict[str, Any] = {}
    go, done = threading.Event(), threading.Event()

    def program() -> None:  # a program that imported torch on a worker thread
        box["plugin"] = plugin = torch_backend.create(tmp_path, {})
        plugin.start()
        go.wait(5)
        box["before_step"] = list(torch.log)
        plugin.on_step()  # its next gpudiag.step()
        done.set()

    worker = threading.Thread(target=program)
    worker.start()
    _until(lambda: "plugin" in box)
    box["plugin"].resume()  # from another thread (the main one, here: not the owner)
    go.set()
    done.wait(5)
    worker.join()
    assert box["before_step"] == []  # Kineto must not start from a thread that is not its own
    # the worker ended: its segment was stopped on it (a profiler left running when its
    # thread ended crashed the process at exit), then the main thread owns the profiler
    assert torch.log[:3] == [("profile", ["cpu"]), ("start", worker.ident),
                             ("stop", worker.ident)]
    main = threading.main_thread().ident
    assert all(ident == main for kind, ident in torch.log[3:] if kind in ("start", "stop"))


def test_segments_are_numbered_per_window(tmp_path: Path, fake_torch: Any) -> None:
    fake_torch(cuda=False)
    plugin = torch_backend.create(tmp_path, {})
    plugin.start()
    for _ in range(2):
        plugin.resume()
        plugin.pause()
    plugin.resume()
    plugin.flush(True)
    plugin.resume()  # after the final flush nothing starts again
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"segment-000{n}.pt.trace.json" for n in (1, 2, 3)]


def test_bare_quotes_in_kineto_names_are_escaped(tmp_path: Path) -> None:
    import json

    path = tmp_path / "segment.pt.trace.json"
    good = ('  {\n    "ph": "X",\n    "name": "aten::mm",\n    "args": {\n'
            '      "name": "a \\"q\\""\n    }\n  }')
    bad = ('  {\n    "ph": "X", "cat": "python_function",\n'
           '    "name": "core.py(0): "frag\\\\mentation"",\n    "ts": 1\n  }')
    path.write_text('{\n  "traceEvents": [\n' + good + ",\n" + bad + "\n  ]\n}\n")
    assert torch_backend.escape_bare_quotes(path) == 1
    events = json.loads(path.read_text())["traceEvents"]
    assert events[0]["name"] == "aten::mm" and events[0]["args"]["name"] == 'a "q"'
    assert events[1]["name"] == 'core.py(0): "frag\\mentation"'
    before = path.read_bytes()
    assert torch_backend.escape_bare_quotes(path) == 0  # valid files are left byte for byte
    assert path.read_bytes() == before


def test_an_edge_landing_inside_a_segment_write_waits_for_it(tmp_path: Path,
                                                             fake_torch: Any) -> None:
    """The flush thread's check queues a rotation for the main thread's next bytecode;
    when that bytecode is inside the main thread's own segment work (a discard at the
    warm-up's end, stopping the profiler in Python), the rotation took the segment lock its
    own thread held and the program hung for good (a CI run of `--steps 2` timed out).
    It now runs once that work released the lock."""
    torch = fake_torch(cuda=False)
    seen: dict[str, Any] = {}

    def program() -> None:  # the thread that owns the profiler
        plugin = torch_backend.create(tmp_path, {})
        plugin.start()
        plugin.resume()
        plugin._queue("rotate")  # what check() queues from the flush thread
        with plugin._lock:  # the owner's own segment work, the queued call landing in it
            plugin._apply_pending()
            seen["inside"] = [kind for kind, _ in torch.log]
        seen["after"] = [kind for kind, _ in torch.log]

    owner = threading.Thread(target=program, daemon=True)
    owner.start()
    owner.join(10)
    assert not owner.is_alive(), "the rotation waited for the lock its own thread held"
    assert seen["inside"] == ["profile", "start"]  # nothing stopped inside the held lock
    assert seen["after"] == ["profile", "start", "stop", "profile", "start"]  # rotated
    assert (tmp_path / "segment-0001.pt.trace.json").is_file()


def test_an_edge_at_the_next_bytecode_waits_to_be_outside_torchs_code(
        tmp_path: Path, fake_torch: Any) -> None:
    """A queued edge runs at the main thread's next bytecode, wherever that is; inside
    torch's own Python (DTensor's `__torch_dispatch__` during FSDP2's `to_empty`) an op's
    RecordFunction is open, and a profiler stopped there crashed the process when the
    range ended (one rank of a 4-rank FSDP2 run segfaulted). It now waits until the
    program is out of torch's code, and the next check asks again."""
    import torch  # the real package: its folder is what `inside_torch_range` recognizes

    torch_fake = fake_torch(cuda=False)
    plugin = torch_backend.create(tmp_path, {})
    plugin.start()
    plugin.resume()
    plugin._queue("rotate")
    plugin._scheduled = True  # as when main_thread_call queued it
    dispatch = Path(torch.__file__).parent / "distributed" / "tensor" / "_dispatch.py"
    inside = compile("def propagate():\n    plugin._at_bytecode()\npropagate()\n",
                     str(dispatch), "exec")
    exec(inside, {"plugin": plugin})  # lands in DTensor's dispatch, an op's range open
    assert [kind for kind, _ in torch_fake.log] == ["profile", "start"]
    assert plugin._pending == ["rotate"] and not plugin._scheduled  # asked again later
    plugin._at_bytecode()  # the program's own code
    assert [kind for kind, _ in torch_fake.log] == ["profile", "start", "stop", "profile",
                                                    "start"]


def test_torchs_import_and_forward_code_hold_no_range() -> None:
    """A start-up grows fastest in `import torch` and model building: rotations may land
    in that code of torch's; not in what runs inside an open range."""
    import torch

    from gpudiag.collectors import torch_host

    root = Path(torch.__file__).parent

    def landing_in(path: Path, name: str = "f") -> bool:
        source = ("result = inside()\n" if name == "<module>"
                  else f"def {name}():\n    return inside()\nresult = {name}()\n")
        scope = {"inside": torch_host.inside_torch_range}
        exec(compile(source, str(path), "exec"), scope)
        return bool(scope["result"])

    assert not landing_in(root / "__init__.py")
    assert not landing_in(root / "_ops.py", "<module>")  # its import: module-level code
    assert not landing_in(root / "nn" / "modules" / "linear.py")
    assert landing_in(root / "_ops.py")
    assert landing_in(root / "utils" / "data" / "dataloader.py")
    assert landing_in(root / "optim" / "optimizer.py")
    assert landing_in(Path("/elsewhere/my_tensor.py"), "__torch_dispatch__")
    assert not landing_in(Path("/elsewhere/train.py"))
