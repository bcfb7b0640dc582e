"""The layer table of docs/architecture.md is the rule of who may import whom: every import in
`orchestrator/` (module level and lazy, as `test_import_cycles.py` reads them) must be one its
row allows, and the outer rule holds (`mounts` imports nothing of `orchestrator`, of
`sandbox_agent` only its syscall wrappers; `sandbox_agent` nothing of the host)."""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_import_cycles import Graph, import_graph, module_files

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
ROOT = "root"


@dataclass(frozen=True)
class Layers:
    root: frozenset[str]  # the root's infrastructure modules (`audit.py`, ...)
    rows: dict[str, frozenset[str]]  # importer (`users/`, `users/purge.py`, `*/schema.py`) -> what it may import


def parse_layers(text: str) -> Layers:
    """Pure: the table between `<!-- layers -->` and `<!-- /layers -->`. Backticked names are
    units; `root` in the second column stands for the first row's modules; `each other` for
    the row's own importers; words and parentheses around them are explanations."""
    block = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    root: frozenset[str] = frozenset()
    rows: dict[str, frozenset[str]] = {}
    for line in block.strip().splitlines()[2:]:  # after the header and its rule
        importer_cell, allowed_cell = (cell.strip() for cell in line.strip().strip("|").split("|"))
        importers = re.findall(r"`([^`]+)`", importer_cell)
        allowed_text = re.sub(r"\([^)]*\)", "", allowed_cell)  # explanations name no units
        allowed = set(re.findall(r"`([^`]+)`", allowed_text))
        if re.match(r"root\b", allowed_text):
            allowed.add(ROOT)
        if "each other" in allowed_text:
            allowed.update(importers)
        if importer_cell.startswith("root:"):
            root = frozenset(importers)
            importers = [ROOT]
        for importer in importers:
            assert importer not in rows, f"{importer} has two rows"
            rows[importer] = frozenset(allowed)
    return Layers(root, rows)


def unit_of(module: str) -> str:
    """`orchestrator.users.purge` -> `users/purge.py`; `orchestrator.audit` -> `audit.py`;
    `orchestrator` -> `__init__.py`; a package's `__init__` is the package (`users/`)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    if (REPO / "orchestrator" / Path(*parts)).is_dir():
        return "/".join(parts) + "/"
    return "/".join(parts) + ".py"


def _package(unit: str) -> str | None:
    return unit.split("/", 1)[0] + "/" if "/" in unit.rstrip("/") or unit.endswith("/") else None


def row_of(layers: Layers, unit: str) -> tuple[str, frozenset[str]]:
    """The most specific row: the module's own, a name pattern, its package, the root's."""
    if unit in layers.rows:
        return unit, layers.rows[unit]
    for pattern, allowed in layers.rows.items():
        if "*" in pattern and fnmatch.fnmatch(unit, pattern):
            return pattern, allowed
    package = _package(unit)
    if package is not None and package in layers.rows:
        return package, layers.rows[package]
    if unit in layers.root:
        return ROOT, layers.rows[ROOT]
    raise AssertionError(f"{unit} has no row in the layer table of docs/architecture.md")


def allows(layers: Layers, allowed: frozenset[str], target: str) -> bool:
    if target in allowed or (ROOT in allowed and target in layers.root):
        return True
    package = _package(target)
    if package is not None and package in allowed:
        return True
    return any("*" in pattern and fnmatch.fnmatch(target, pattern) for pattern in allowed)


def violations(layers: Layers, graph: Graph) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("orchestrator"):
            continue
        unit = unit_of(module)
        row, allowed = row_of(layers, unit)
        for target in sorted(targets):
            top = target.split(".")[0]
            if top == "mounts":
                if _package(unit) == "client/":
                    found.append(f"{module} imports {target}: client/ imports nothing of mounts")
                continue
            if top == "sandbox_agent":
                if "sandbox_agent" not in allowed:
                    found.append(f"{module} imports {target}: the row {row} does not allow sandbox_agent")
                continue
            target_unit = unit_of(target)
            if _package(target_unit) is not None and _package(target_unit) == _package(unit):
                continue  # within one package
            if target_unit == unit or allows(layers, allowed, target_unit):
                continue
            found.append(f"{module} imports {target}: the row {row} does not allow {target_unit}")
    return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(module_files(REPO, ("orchestrator", "mounts", "sandbox_agent")))


def test_every_import_of_the_orchestrator_is_one_its_layer_allows(graph: Graph) -> None:
    layers = parse_layers(DOC.read_text())
    assert {"users/", "service.py", "http/", "*/schema.py"} <= layers.rows.keys()
    assert {"settings.py", "state_store.py", "audit.py"} <= layers.root
    assert violations(layers, graph) == []


def test_the_outer_rule_holds(graph: Graph) -> None:
    for module, targets in graph.items():
        if module.startswith("sandbox_agent"):
            assert not [t for t in targets if not t.startswith("sandbox_agent")], module
        if module.startswith("mounts"):
            foreign = [t for t in targets if t.startswith("orchestrator") or (t.startswith("sandbox_agent") and t != "sandbox_agent.syscalls")]
            assert not foreign, module


TABLE = """
<!-- layers -->
| importer | may import |
|---|---|
| root: `log.py`, `errors.py` | root |
| `users/` | root |
| `users/listing.py` | root, `sandboxes/` |
| `*/schema.py` | `state_store.py` |
| `sandboxes/` | root, `users/` (the owner of user rows), `sandbox_agent` |
<!-- /layers -->
"""


@pytest.mark.parametrize(
    ("module", "target", "allowed"),
    [
        ("orchestrator.users.repository", "orchestrator.log", True),  # the root's infrastructure
        ("orchestrator.users.repository", "orchestrator.sandboxes.router", False),  # a layer above
        ("orchestrator.users.listing", "orchestrator.sandboxes.router", True),  # the module's own row
        ("orchestrator.sandboxes.router", "orchestrator.users.repository", True),
        ("orchestrator.sandboxes.router", "sandbox_agent.client", True),
        ("orchestrator.users.repository", "sandbox_agent.client", False),
        ("orchestrator.users.schema", "orchestrator.log", False),  # the pattern's row, not the package's
        ("orchestrator.log", "orchestrator.users.repository", False),  # the root imports no package
    ],
)
def test_the_rule_reader_allows_what_the_table_says(module: str, target: str, allowed: bool) -> None:
    layers = parse_layers(TABLE)
    assert layers.rows["sandboxes/"] == {ROOT, "users/", "sandbox_agent"}  # explanations name no units
    graph: Graph = {module: {target}}
    assert (violations(layers, graph) == []) is allowed


# Who holds `Settings` whole: the composition root, the command line that builds it, and the
# HTTP layer's parts (which build its sections once). Every other module receives its section.
SETTINGS_HOLDERS = {"orchestrator/service.py", "orchestrator/cli.py", "orchestrator/http/parts.py"}


def settings_importers(files: dict[str, str]) -> set[str]:
    """Pure: the files (path -> source) that import the `Settings` class itself."""
    found = set()
    for path, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.settings":
                if any(alias.name in ("Settings", "*") for alias in node.names):
                    found.add(path)
    return found


def test_only_the_composition_root_holds_the_settings_whole() -> None:
    files = {
        path.relative_to(REPO).as_posix(): path.read_text()
        for top in ("orchestrator", "mounts", "sandbox_agent")
        for path in (REPO / top).rglob("*.py")
        if path.name != "settings.py" or path.parent.name != "orchestrator"
    }
    assert settings_importers(files) == SETTINGS_HOLDERS


def test_the_settings_reader_sees_each_way_of_importing_the_class() -> None:
    files = {
        "a.py": "from orchestrator.settings import Settings\n",
        "b.py": "def f():\n    from orchestrator.settings import CallSettings, Settings\n",
        "c.py": "from orchestrator.settings import CallSettings\n",
        "d.py": "from orchestrator.settings import *\n",
    }
    assert settings_importers(files) == {"a.py", "b.py", "d.py"}
