"""Imports in tfx/ flow one way: no module imports, even inside a function, one that imports it back.

A circle works only while every edge but one is a function-level import, and breaks the day someone
moves that import to the top; the static walk below reads imports anywhere in a file, as
``/work/shared/tools/import_cycles.py`` does. Every module must also import on its own.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.conftest import REPO

Graph = dict[str, set[str]]


def package_modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of the package at ``root`` (a package is its ``__init__``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name an ``import`` or ``from ... import`` anywhere in ``tree`` may refer to."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package holding ``module``
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # ``from pkg import submodule``
    return names


def owner(name: str, modules: dict[str, Path]) -> str | None:
    """The package module a dotted name lives in (``tfx.data.PAD`` -> ``tfx.data``), or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path) -> Graph:
    """Module -> the package's modules it imports (top level or inside functions)."""
    modules = package_modules(root)
    graph: Graph = {}
    for module, path in modules.items():
        names = imported_names(ast.parse(path.read_text()), module, path.name == "__init__.py")
        graph[module] = {target for n in names if (target := owner(n, modules)) and target != module}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_tfx_has_no_import_cycles() -> None:
    graph = import_graph(REPO / "tfx")
    assert "tfx.train" in graph and "tfx.data.vocab" in graph  # the walk saw the package
    assert cycles(graph) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "low.py": "def late():\n    from pkg.high import thing\n    return thing\n",
            "high.py": "from pkg import low\nthing = 1\n",
            "sub/__init__.py": "from .leaf import VALUE\n",
            "sub/leaf.py": "VALUE = 2\n",
            "other.py": "from pkg.sub import VALUE\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.low"] == {"pkg.high"} and graph["pkg.high"] == {"pkg", "pkg.low"}
    assert graph["pkg.sub"] == {"pkg.sub.leaf"} and graph["pkg.other"] == {"pkg.sub"}
    assert cycles(graph) == [["pkg.high", "pkg.low"]]


def test_relative_imports_resolve_and_a_cycle_through_a_package_init_is_found(tmp_path: Path) -> None:
    files = {
        "__init__.py": "from pkg.a import A\n",
        "a.py": "from . import b\nA = 1\n",
        "b.py": "X = 0\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..b import X\n",
    }
    graph = import_graph(write_package(tmp_path / "pkg", files))
    assert graph["pkg.a"] == {"pkg", "pkg.b"} and graph["pkg.sub.c"] == {"pkg.b"}
    assert cycles(graph) == [["pkg", "pkg.a"]]


@pytest.mark.parametrize("module", sorted(package_modules(REPO / "tfx")))
def test_every_module_imports(module: str) -> None:
    assert importlib.import_module(module).__name__ == module
