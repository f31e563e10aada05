"""The placer's and fairshare's modules import each other without cycles: every import
counts, those under `if TYPE_CHECKING:` too, since a cycle hidden there is still two
modules that cannot be read (or split) one without the other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` this file imports (`from a import b` may name module a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found & known


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path of modules, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


@pytest.mark.parametrize("package", ["services/placer", "services/fairshare"])
def test_a_services_modules_import_each_other_without_cycles(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    known = {module_of(f) for f in files}
    graph = {module_of(f): imports(f, known) - {module_of(f)} for f in files}
    # a package's __init__ re-exporting its modules is not a cycle with them
    for m in graph:
        graph[m] = {n for n in graph[m] if not m.startswith(n + ".")}
    assert cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
