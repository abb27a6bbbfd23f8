"""The bootstrap's plugin layer: import triggers, plugin fan-out, main-thread calls."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from gpudiag.profiler import inproc
from gpudiag.profiler.inproc import ImportWatcher, Plugins


@pytest.fixture
def watcher(monkeypatch: pytest.MonkeyPatch) -> ImportWatcher:
    """A watcher of its own on sys.meta_path, removed after the test."""
    own = ImportWatcher()
    monkeypatch.setattr(sys, "meta_path", [own, *sys.meta_path])
    return own


def _module(tmp_path: Path, name: str, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_callback_runs_after_the_module_body(tmp_path: Path, watcher: ImportWatcher,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _module(tmp_path, "watched_mod", "VALUE = 41 + 1\n", monkeypatch)
    seen: list[Any] = []
    watcher.on_import("watched_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    module = importlib.import_module("watched_mod")
    assert seen == [42]
    importlib.reload(module)  # fires once only
    assert seen == [42]
    assert module.__spec__ is not None and module.__spec__.loader is not None
    assert module.__spec__.loader.is_package("watched_mod") is False  # delegated


def test_already_imported_module_fires_at_once(watcher: ImportWatcher) -> None:
    seen: list[str] = []
    watcher.on_import("json", lambda m: seen.append(m.__name__))
    assert seen == ["json"]


def test_unwatched_imports_are_untouched(tmp_path: Path, watcher: ImportWatcher,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _module(tmp_path, "plain_mod", "X = 1\n", monkeypatch)
    module = importlib.import_module("plain_mod")
    assert type(module.__spec__.loader).__name__ == "SourceFileLoader"


def test_install_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    first = ImportWatcher.install()
    assert ImportWatcher.install() is first
    assert sum(isinstance(f, ImportWatcher) for f in sys.meta_path) == 1


class FakePlugin:
    """Records every call; `fail` names a method that raises."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], log: list[str],
                 fail: str = "") -> None:
        self.out_dir, self.settings, self.log, self.fail = out_dir, settings, log, fail

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any) -> None:
            self.log.append(method)
            if method == self.fail:
                raise RuntimeError(f"{method} broke")
        return call


@pytest.fixture
def fake_plugin(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, str]]:
    log: list[str] = []
    fail: dict[str, str] = {"method": ""}
    module = types.ModuleType("fake_gpudiag_plugin")
    module.create = lambda out, settings: FakePlugin(out, settings, log,  # type: ignore[attr-defined]
                                                     fail["method"])
    monkeypatch.setitem(sys.modules, "fake_gpudiag_plugin", module)
    monkeypatch.setitem(inproc.PLUGINS, "fake", ("fake_gpudiag_plugin", ("fake_trigger",)))
    monkeypatch.delitem(sys.modules, "fake_trigger", raising=False)
    return log, fail


def test_plugin_starts_on_its_trigger_import(tmp_path: Path, watcher: ImportWatcher,
                                             monkeypatch: pytest.MonkeyPatch,
                                             fake_plugin: tuple[list[str], dict[str, str]]
                                             ) -> None:
    log, _ = fake_plugin
    errors: list[str] = []
    plugins = Plugins(["host", "fake", "unknown"], {"memory": True}, errors.append)
    assert plugins.names == ["fake"]
    plugins.edge("resume")
    plugins.arm(watcher, lambda: tmp_path)
    assert log == []
    _module(tmp_path, "fake_trigger", "", monkeypatch)
    importlib.import_module("fake_trigger")
    assert log == ["start", "resume"]
    assert (tmp_path / "fake").is_dir()
    assert plugins.started["fake"].out_dir == tmp_path / "fake"
    plugins.call("flush", True)
    plugins.edge("pause")
    assert log[-2:] == ["flush", "pause"] and errors == []


def test_plugin_started_outside_the_window_is_paused(
        tmp_path: Path, fake_plugin: tuple[list[str], dict[str, str]]) -> None:
    log, _ = fake_plugin
    plugins = Plugins(["fake"], {}, lambda m: None)
    plugins.start("fake", "fake_gpudiag_plugin", tmp_path)
    assert log == ["start", "pause"]


def test_failing_plugin_is_reported_and_dropped(
        tmp_path: Path, fake_plugin: tuple[list[str], dict[str, str]]) -> None:
    log, fail = fake_plugin
    fail["method"] = "start"
    errors: list[str] = []
    plugins = Plugins(["fake"], {}, errors.append)
    plugins.start("fake", "fake_gpudiag_plugin", tmp_path)
    assert plugins.started == {} and "start broke" in plugins.failed["fake"]
    assert errors == ["collector fake not started: RuntimeError: start broke"]
    plugins.call("flush", False)  # nothing to call, nothing raised
    assert log == ["start"]


def test_a_failing_call_never_raises(tmp_path: Path,
                                     fake_plugin: tuple[list[str], dict[str, str]]) -> None:
    _log, fail = fake_plugin
    errors: list[str] = []
    plugins = Plugins(["fake"], {}, errors.append)
    plugins.edge("resume")
    plugins.start("fake", "fake_gpudiag_plugin", tmp_path)
    fail["method"] = "flush"
    plugins.started["fake"].fail = "flush"
    plugins.call("flush", True)
    assert errors == ["collector fake flush failed: RuntimeError: flush broke"]


def test_closed_plugins_never_start(tmp_path: Path,
                                    fake_plugin: tuple[list[str], dict[str, str]]) -> None:
    log, _ = fake_plugin
    plugins = Plugins(["fake"], {}, lambda m: None)
    plugins.close()
    plugins.start("fake", "fake_gpudiag_plugin", tmp_path)
    assert log == [] and plugins.started == {}


@pytest.mark.parametrize(("argv", "launcher"), [
    (["/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "8", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "train.py"], True),
    (["python", "-m", "torch.distributed.launch", "train.py"], True),
    (["python", "train.py", "-m", "torch.distributed.run"], False),  # the script's own args
    (["python", "train.py"], False),
    (["python", "-c", "import torch"], False),
])
def test_launchers_are_recognized(argv: list[str], launcher: bool) -> None:
    assert inproc.is_launcher(argv) is launcher
