"""No import cycle inside lmforge: not between its packages, not between a package's modules.

import-linter (`lint-imports`, run by `make test`) checks the layer contracts in pyproject.toml;
this test checks what a layers contract cannot: that no cycle hides inside one layer or one
package. Imports inside functions and under TYPE_CHECKING count, as they do for the contracts.
"""

from __future__ import annotations

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("lmforge", cache_dir=None)


def _top(module: str) -> str:
    """The package (or top-level module) of lmforge that `module` belongs to."""
    return ".".join(module.split(".")[:2])


def _package(module: str) -> str:
    """The package whose modules `module` sits among (its parent)."""
    return module.rpartition(".")[0]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _chain(graph: grimp.ImportGraph, cycle: list[str], top: bool) -> str:
    """One import of each step around the cycle, to name in the failure."""
    members = set(cycle)
    steps = []
    for module in sorted(graph.modules):
        owner = _top(module) if top else module
        if owner not in members:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            target = _top(imported) if top else imported
            if target in members and target != owner:
                steps.append(f"{module} -> {imported}")
    return "; ".join(steps[:8])


def test_no_cycle_between_packages(graph):
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _top(module), _top(imported)
            if a != b and "lmforge" not in (a, b):
                edges.setdefault(a, set()).add(b)
    cycles = _cycles(edges)
    assert not cycles, [f"{' <-> '.join(c)}: {_chain(graph, c, top=True)}" for c in cycles]


def test_no_cycle_between_modules_of_a_package(graph):
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if _package(module) == _package(imported):
                edges.setdefault(module, set()).add(imported)
    cycles = _cycles(edges)
    assert not cycles, [f"{' <-> '.join(c)}: {_chain(graph, c, top=False)}" for c in cycles]
