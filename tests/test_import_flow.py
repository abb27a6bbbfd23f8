"""The package's imports flow one way (docs/ARCHITECTURE.md, "Folders and what each may import").

Parsed from the source, not imported: every `import` and `from ... import` anywhere in a
module (function-level ones too, since they run), except those under `if TYPE_CHECKING:`.
`from gpudiag.pkg import name` where `pkg/name.py` exists is an edge to that submodule.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gpudiag"

#: modules every layer may use; they import only each other
GROUND = frozenset({"schema", "diagnosis_schema", "trace", "trace_meta", "errors", "optional",
                    "inputs", "devices", "names", "markers", "commands", "intervals",
                    "concat"})
#: what each folder may import, besides itself (the wiring layer imports anything)
ALLOWED = {
    "ground": {"ground"},
    "readers": {"ground"},
    "collectors": {"ground", "readers"},
    "analyzers": {"ground"},
    "reports": {"ground", "analyzers"},
}
WIRING = frozenset({"profiler", "jobs", "cli", "__init__", "__main__"})
#: the one wiring module collectors may use: the plugin host inside every profiled process
#: (a plugin queues its window edges to the main thread through it)
PLUGIN_HOST = "gpudiag.profiler.inproc"


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(("gpudiag", *parts))] = path
    return names


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(name: str, path: Path, modules: dict[str, Path]
            ) -> list[tuple[str, str | None, int]]:
    """(target module, imported name or None, line) for each run-time import of gpudiag."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names
                      if alias.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    found.append((sub, None, node.lineno))
                elif node.module in modules:
                    found.append((node.module, alias.name, node.lineno))
    return [(target, what, line) for target, what, line in found if target != name]


def layer(module: str) -> str:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in GROUND:
        return "ground"
    return "wiring" if parts[0] in WIRING else parts[0]


def graph() -> tuple[dict[str, set[str]], list[str], list[str]]:
    modules = module_names()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    against, private = [], []
    for name, path in modules.items():
        for target, what, line in imports(name, path, modules):
            edges[name].add(target)
            here, there = layer(name), layer(target)
            allowed = (there in ALLOWED.get(here, ())
                       or (here, target) == ("collectors", PLUGIN_HOST))
            if here not in ("wiring", there) and not allowed:
                against.append(f"{name}:{line} imports {target} ({here} -> {there})")
            if what and what.startswith("_") and not what.startswith("__"):
                private.append(f"{name}:{line} imports {what} from {target}")
    return edges, against, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_at_run_time() -> None:
    edges, _, _ = graph()
    assert cycles(edges) == []


def test_no_import_against_the_flow() -> None:
    _, against, _ = graph()
    assert against == []


def test_no_private_name_is_imported_across_modules() -> None:
    _, _, private = graph()
    assert private == []


def test_reports_only_read_what_the_diagnosis_computed() -> None:
    """Reports render a Diagnosis: the critical path is the Diagnosis' (computed when
    first read), never built again while drawing."""
    modules = module_names()
    reading = [f"{name}:{line} imports {target}" for name, path in modules.items()
               if name.startswith("gpudiag.reports")
               for target, _, line in imports(name, path, modules)
               if target.startswith("gpudiag.analyzers.critical")]
    assert reading == []


def test_no_folder_holds_more_than_16_modules() -> None:
    counts = {folder: len(list(folder.glob("*.py")))
              for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]}
    assert {str(f.relative_to(PACKAGE.parent)): n for f, n in counts.items() if n > 16} == {}


def test_the_checker_sees_a_cycle_and_an_edge_against_the_flow() -> None:
    """The rules are not vacuous: a planted cycle is found, and readers -> analyzers is not
    allowed while analyzers -> ground is."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "analyzers" not in ALLOWED["readers"] and "ground" in ALLOWED["analyzers"]
    assert layer("gpudiag.readers.kineto.reader") == "readers"
    assert layer("gpudiag.intervals") == "ground" and layer("gpudiag") == "wiring"
    edges, _, _ = graph()
    assert "gpudiag.readers.registry" in edges["gpudiag.readers.sources"]
