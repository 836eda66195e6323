"""fakegw's modules import each other in one direction: no cycle, and the admin service and
the backends never reach back into the server that wires them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fakegw"


def imports() -> dict[str, set[str]]:
    """For each fakegw module, the fakegw modules it imports (at any level, typing included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fakegw."):
                found.add((node.module or "").removeprefix("fakegw."))
            elif isinstance(node, ast.Import):
                found.update(
                    alias.name.removeprefix("fakegw.")
                    for alias in node.names
                    if alias.name.startswith("fakegw.")
                )
        graph[path.stem] = found
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_no_module_imports_itself_through_others() -> None:
    graph = imports()
    assert [module for module in graph if module in reachable(graph, module)] == []


def test_admin_and_backends_do_not_know_the_server() -> None:
    graph = imports()
    for module in ("admin", "backend", "memory_backend", "shared_backend", "shared"):
        assert "server" not in reachable(graph, module), module
