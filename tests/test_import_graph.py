"""No import cycle between agrpo's parts: each subpackage (agrpo/X/) and top-level module (agrpo/X.py) is a node, and
an edge is any `import` of another node anywhere in a file, function-level imports included (read with ast, nothing
is imported). A cycle means neither part can be understood, tested or changed without the other.

Inside each subpackage the same holds file by file: a module (agrpo/X/a.py, or agrpo/X/__init__.py) is a node and an
import of another module of the same subpackage an edge (`from agrpo.X import name` is an edge to agrpo/X/__init__.py,
`from agrpo.X import module` one to that module); no cycle either (issue 31: schema/knobs <-> schema/__init__,
eval/runner <-> eval/episodes, config/memory_estimate -> prepare -> gpu_precision -> memory_estimate are gone).

No back edge remains (docs/architecture.md lists the layers). Should one ever be unavoidable, it is named in
KNOWN_BACK_EDGES with why; each named edge must still exist (so the list only shrinks), and any other edge that closes
a cycle fails.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agrpo"

# Edges that close a cycle today, each with where it is; fix one and delete its line.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def node_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "agrpo" and len(parts) > 1 else None


def imported_modules(path: Path, module: str) -> list[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.append(node.module)
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> the files (path:line would be more, the file is enough) that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source = node_of(module)
        if source is None or source == "__main__":
            continue
        for name in imported_modules(path, module):
            target = node_of(name)
            if target and target != source:
                graph[source][target].append(str(path.relative_to(PACKAGE.parent)))
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]], skipped: set[tuple[str, str]]) -> list[str] | None:
    """One cycle (as a list of nodes) among the edges not in `skipped`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if (node, target) in skipped:
                continue
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_cycle_between_agrpos_parts():
    graph = import_graph()
    cycle = find_cycle(graph, set(KNOWN_BACK_EDGES))
    if cycle:
        shown = "; ".join(f"{a} -> {b} ({', '.join(sorted(set(graph[a][b]))[:3])})" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"import cycle {' -> '.join(cycle)}: {shown}")


def test_each_known_back_edge_still_exists():
    """A fixed back edge leaves the list (so it cannot come back unnoticed)."""
    graph = import_graph()
    assert [edge for edge in KNOWN_BACK_EDGES if edge[1] not in graph.get(edge[0], {})] == []


def test_the_cycles_issue_21_named_are_gone():
    """inference <-> launchers (process helpers now in agrpo/processes/), paths -> launchers.run_dir -> config ->
    paths (the run suffix is paths.py's), cli -> sweeps -> report -> eval -> cli (eval composes through config)."""
    graph = import_graph()
    for source, target in [("inference", "launchers"), ("paths", "launchers"), ("eval", "cli"), ("paths", "config")]:
        assert target not in graph.get(source, {}), (source, target, graph[source][target])


def test_the_finder_sees_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "agrpo"
    (package / "a").mkdir(parents=True)
    (package / "a" / "__init__.py").write_text("")
    (package / "a" / "m.py").write_text("def f():\n    from ..b import x\n")
    module = imported_modules(package / "a" / "m.py", "agrpo.a.m")
    assert module == ["agrpo.b"]
    graph = {"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}
    assert find_cycle(graph, set()) == ["a", "b", "c", "a"]
    assert find_cycle(graph, {("c", "a")}) is None


def modules() -> dict[str, Path]:
    """Every module of agrpo by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_targets(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `module` imports: each imported name's longest known prefix, and for
    `from P import m` the module P.m where that is one."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def module_graph() -> dict[str, dict[str, list[str]]]:
    """module -> imported module of the same subpackage (agrpo/X/...) -> [the importing file]."""
    known = modules()
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, path in known.items():
        part = node_of(module)
        if part is None or path.parent == PACKAGE:  # top-level modules: the graph above
            continue
        for target in module_targets(path, module, known):
            if node_of(target) == part:
                graph[module][target].append(str(path.relative_to(PACKAGE.parent)))
    return graph


def test_no_cycle_between_the_files_of_a_subpackage():
    graph = module_graph()
    cycle = find_cycle(graph, set())
    assert cycle is None, f"file-level import cycle: {' -> '.join(cycle)}"


def test_the_file_finder_sees_an_import_of_the_package_and_of_a_sibling(tmp_path):
    package = tmp_path / "agrpo" / "a"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from agrpo.a.m import f\n")
    (package / "m.py").write_text("def f():\n    from agrpo.a import n\n")
    (package / "n.py").write_text("def g():\n    from agrpo.a import f\n")
    known = {"agrpo.a": package / "__init__.py", "agrpo.a.m": package / "m.py", "agrpo.a.n": package / "n.py"}
    assert module_targets(package / "m.py", "agrpo.a.m", known) == {"agrpo.a.n"}
    assert module_targets(package / "n.py", "agrpo.a.n", known) == {"agrpo.a"}
    graph = {m: {t: ["x"] for t in module_targets(p, m, known)} for m, p in known.items()}
    assert find_cycle(graph, set()) == ["agrpo.a", "agrpo.a.m", "agrpo.a.n", "agrpo.a"]
