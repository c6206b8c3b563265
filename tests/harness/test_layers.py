"""The layering of the project: imports go one way, and no module cycle exists.

Every `import` statement is read from the source (at module level or inside a function: a lazy import is still a
dependency), and each module is given its layer from its path. A module may import its own layer or lower ones; a
cycle between modules is refused even inside one layer. Dynamic imports by name (the adapter discovery's plugin
list, entry points) are not statements and are not counted: they are the plugin mechanism, not a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: (module prefix, layer name, rank): the longest matching prefix wins; lower rank = lower layer.
LAYERS: tuple[tuple[str, str, int], ...] = (
    ("reference", "oracle", 0),
    ("kernels", "kernels", 0),
    ("harness.core", "core", 1),
    ("harness.registry", "registry", 2),
    ("harness.ops", "ops", 3),
    ("harness.engine", "engine", 4),
    ("harness.store", "store", 5),
    ("harness.sweep", "sweep", 6),
    ("harness.commands", "front ends", 7),
    ("harness.cli", "front ends", 7),
    ("harness.plugin", "front ends", 7),
    ("harness.adapters", "front ends", 7),  # public aliases: nothing inside may use them
    ("harness.case", "front ends", 7),
    ("harness.__main__", "front ends", 7),
    ("harness", "package root", 0),  # harness/__init__.py: the version only
    ("kernels.adapters", "kernel adapters", 4),
)


def layer_of(module: str) -> tuple[str, int] | None:
    best = None
    for prefix, name, rank in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, name, rank)
    return None if best is None else (best[1], best[2])


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module: str) -> set[str]:
    """Modules imported by the file (absolute names; `from pkg import name` counts `pkg.name` when that is a
    module of the project, else `pkg`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def project_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> project modules it imports, over harness/, reference/ and kernels/."""
    files = {module_name(p, root): p for top in ("harness", "reference", "kernels") for p in (root / top).rglob("*.py")}
    graph = {}
    for module, path in files.items():
        graph[module] = {m for m in imports_of(path, module) if m in files and m != module}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is None or theirs is None:
                continue
            if theirs[1] > mine[1] or (mine[0] in ("oracle", "kernels") and theirs[0] != mine[0]):
                found.append(f"{module} ({mine[0]}) imports {target} ({theirs[0]})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing `a.b.c` runs `a/__init__` and `a.b/__init__` too: a module depends on its parents' packages."""
    full = {m: set(t) for m, t in graph.items()}
    for m, targets in graph.items():
        for t in targets:
            parts = t.split(".")
            full[m].update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in graph
                           and not m.startswith(".".join(parts[:i]) + ".") and m != ".".join(parts[:i]))
    return full


def test_every_project_module_has_a_layer() -> None:
    unplaced = [m for m in project_graph() if layer_of(m) is None]
    assert not unplaced, f"modules outside every layer (add them to LAYERS): {unplaced}"


def test_imports_go_down_the_layers() -> None:
    bad = violations(project_graph())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    found = cycles(_package_parents(project_graph()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("planted, expect", [
    ({"harness.core.case": {"harness.engine.runner"}}, "harness.core.case (core) imports harness.engine.runner"),
    ({"reference.quant": {"harness.core.errors"}}, "reference.quant (oracle) imports harness.core.errors"),
])
def test_an_upward_import_is_caught(planted: dict[str, set[str]], expect: str) -> None:
    graph = project_graph()
    for m, targets in planted.items():
        graph[m] = graph.get(m, set()) | targets
    assert any(v.startswith(expect + " (") for v in violations(graph)), violations(graph)


def test_a_cycle_is_caught() -> None:
    graph = project_graph()
    graph["harness.store.results"] = graph["harness.store.results"] | {"harness.store.render"}
    assert any({"harness.store.render", "harness.store.results"} <= set(c) for c in cycles(graph))


def test_the_flat_layout_paths_still_import() -> None:
    """Adapters written before the layers import harness.device, harness.results, ...: the same module objects."""
    import importlib
    import warnings

    from harness import _moved

    for old, new in _moved.MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert module.__name__ == new  # the real module keeps its identity
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import sys

        sys.modules.pop("harness.runner", None)
        importlib.import_module("harness.runner")
    assert any("harness.runner moved to harness.engine.runner" in str(w.message) for w in caught)
    from harness.results import ResultStore  # the common spellings work

    from harness.store.results import ResultStore as Same

    assert ResultStore is Same
