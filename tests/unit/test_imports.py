"""The import graph of the project's packages, read with `ast` (nothing is imported):
no module imports itself back through others — a cycle only works by the luck of import
order, or by hiding one side under TYPE_CHECKING, which this counts too — and services
never import each other (they share only `shared/` and events)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "services", "muster", "sim")

Graph = dict[str, set[str]]


def modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted name -> file of every module in PACKAGES (a package is its __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> Iterator[str]:
    """The modules one import statement names: `from a import b` names a.b when that is
    a module, else a."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = here.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join([*anchor, *([base] if base else [])])
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(found: dict[str, Path]) -> Graph:
    """Module -> the project modules it imports (at any depth of its body)."""
    graph: Graph = {}
    for name, path in found.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= {t for t in _targets(node, name, is_package) if t in found}
        graph[name] = edges - {name}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cross_service_imports(graph: Graph) -> list[tuple[str, str]]:
    """(importer, imported) pairs where one service imports another's module."""

    def service(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == "services" and len(parts) > 1 else None

    return sorted(
        (src, dst)
        for src, targets in graph.items()
        for dst in targets
        if service(src) is not None and service(dst) not in (None, service(src))
    )


def test_the_project_has_no_import_cycle() -> None:
    found = cycles(import_graph(modules()))
    # The usual fix: move the type both sides need into a module of its own (as
    # admission's config_model and cluster_shape), or take a Protocol instead.
    assert found == [], f"import cycles, TYPE_CHECKING imports included: {found}"


def test_services_never_import_each_other() -> None:
    assert cross_service_imports(import_graph(modules())) == []


# The checks themselves, on small made-up trees, so they are known to catch what they say.
TREES = {
    "a TYPE_CHECKING import back is still a cycle": (
        {
            "shared/__init__.py": "",
            "shared/a.py": "from shared.b import B\n",
            "shared/b.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .a import A\n",
        },
        [["shared.a", "shared.b"]],
        [],
    ),
    "a relative import of a sibling module is followed": (
        {
            "services/__init__.py": "",
            "services/x/__init__.py": "",
            "services/x/core.py": "from . import repo\n",
            "services/x/repo.py": "from .core import plan\n",
        },
        [["services.x.core", "services.x.repo"]],
        [],
    ),
    "one service reaching into another is refused, shared is fine": (
        {
            "services/__init__.py": "",
            "services/x/__init__.py": "",
            "services/x/a.py": "import services.y.b\nfrom shared import c\n",
            "services/y/__init__.py": "",
            "services/y/b.py": "",
            "shared/__init__.py": "",
            "shared/c.py": "",
        },
        [],
        [("services.x.a", "services.y.b")],
    ),
    "a chain without a way back is no cycle": (
        {
            "muster/__init__.py": "",
            "muster/cli.py": "from muster import render\n",
            "muster/render.py": "import json\nfrom shared.states import JobState\n",
            "shared/__init__.py": "",
            "shared/states.py": "",
        },
        [],
        [],
    ),
}


@pytest.mark.parametrize(("files", "want_cycles", "want_cross"), TREES.values(), ids=TREES.keys())
def test_the_checks_on_made_up_trees(
    tmp_path: Path,
    files: dict[str, str],
    want_cycles: list[list[str]],
    want_cross: list[tuple[str, str]],
) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    graph = import_graph(modules(tmp_path))
    assert (cycles(graph), cross_service_imports(graph)) == (want_cycles, want_cross)
