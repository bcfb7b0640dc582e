"""No import cycle among the modules of `orchestrator/`, `mounts/` and `sandbox_agent/`.

The graph is read from the source (every `import` and `from … import`, including the lazy ones
inside functions, which is how a cycle usually hides), not from `sys.modules`; imports under
`if TYPE_CHECKING:` are left out, they never run. A cycle is a strongly connected component
of more than one module (or a module importing itself).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "mounts", "sandbox_agent")

Graph = dict[str, set[str]]


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` below the packages (a package is its `__init__`)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement below `node`, at any depth, except the bodies of `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _imports_of_statement(other)
            continue
        yield from _imports_of_statement(child)


def _imports_of_statement(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def _known_prefix(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (`a.b.C` -> `a.b`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(modules: dict[str, Path]) -> Graph:
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import sub` names the submodule when there is one, else pkg itself.
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                found = _known_prefix(target, modules)
                if found is not None:
                    graph[name].add(found)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return sorted(found)


def test_the_service_has_no_import_cycle() -> None:
    modules = module_files(REPO, PACKAGES)
    assert {"orchestrator.http.app", "mounts.layout", "sandbox_agent.wire"} <= modules.keys()
    graph = import_graph(modules)
    # the walk sees lazy imports too: the CLI imports the image build inside its command
    assert "orchestrator.sandboxes.image.build" in graph["orchestrator.cli"]
    assert cycles(graph) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # a lazy import inside a function closes the cycle (what image/build <-> image/compat was)
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import thing\n",
                "pkg/b.py": "def thing():\n    from pkg import a\n",
            },
            [["pkg.a", "pkg.b"]],
        ),
        # relative imports, through three modules
        (
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/sub/x.py": "from . import y\n",
                "pkg/sub/y.py": "from ..z import name\n",
                "pkg/z.py": "import pkg.sub.x\nname = 1\n",
            },
            [["pkg.sub.x", "pkg.sub.y", "pkg.z"]],
        ),
        # under TYPE_CHECKING nothing runs: no cycle
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import thing\n",
                "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\nthing = 1\n",
            },
            [],
        ),
    ],
)
def test_the_cycle_finder_sees_cycles_where_they_are(tmp_path: Path, files: dict[str, str], expected: list) -> None:
    _write(tmp_path, files)
    assert cycles(import_graph(module_files(tmp_path, ["pkg"]))) == expected
