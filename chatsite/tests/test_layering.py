"""No import cycles between the project's modules, function-level imports included.

STYLE.md: "No import cycles between files; a function-level import that exists to dodge a
cycle is a cycle". grimp (import-linter's graph library) reads every import statement in a
module, at any depth and under `if TYPE_CHECKING:` too, so an import moved into a function
or behind TYPE_CHECKING still counts. The layers between apps are import-linter contracts in
pyproject.toml (`make lint`); this test holds the rule inside an app as well.

Test modules and migrations are left out: they are not imported by the code they test.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import grimp

PACKAGES = (
    "accounts",
    "billing",
    "chatsite",
    "conversations",
    "inference",
    "moderation",
    "plugins",
)


def _excluded(module: str) -> bool:
    parts = module.split(".")
    return "tests" in parts or "migrations" in parts


def import_graph() -> dict[str, set[str]]:
    """Each project module (tests and migrations left out) and the modules it imports."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    modules = {module for module in graph.modules if not _excluded(module)}
    return {
        module: {
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if imported in modules and imported != module
        }
        for module in modules
    }


def strongly_connected(edges: dict[str, set[str]]) -> Iterator[set[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        # Iterative depth-first search: (module, its remaining successors).
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    break
                if successor in on_stack:
                    low[module] = min(low[module], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        yield group


def shortest_cycle(edges: dict[str, set[str]], group: set[str]) -> list[str]:
    """One shortest way round a group: `a -> b -> ... -> a`."""
    best: list[str] | None = None
    for start in sorted(group):
        previous: dict[str, str] = {}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            if start in edges[module]:
                path = [module]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                cycle = [*reversed(path), start]
                if best is None or len(cycle) < len(best):
                    best = cycle
                break
            for successor in sorted(edges[module] & group):
                if successor not in previous and successor != start:
                    previous[successor] = module
                    queue.append(successor)
    assert best is not None
    return best


def test_no_module_imports_itself_through_others() -> None:
    edges = import_graph()
    assert len(edges) > 50, "the graph should hold the whole project"
    cycles = [
        f"{len(group)} modules: " + " -> ".join(shortest_cycle(edges, group))
        for group in strongly_connected(edges)
    ]
    assert not cycles, "import cycles (each with one shortest way round it):\n" + "\n".join(
        sorted(cycles)
    )
