"""The package map of docs/architecture.md, kept true: every package of `launcher` is in one
layer of that table, imports only packages of its own layer or of a lower one, and no two
packages import each other (nor does a longer circle of them exist).

The doc's table is the one map: the test parses it. A front door that is one module
(`launcher/doctor.py`) is a package of its own. The import graph is read from the source
with `ast` (every `import`, also those inside functions, which are still dependencies), so
the test needs no imports of its own; a module found by name at run time (`importlib`, as
the engine registry finds the engines) is not an import.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from paths import REPO

PACKAGE = REPO / "launcher"
ARCHITECTURE = REPO / "docs" / "architecture.md"


@functools.cache
def layer_table() -> list[tuple[str, str]]:
    """(layer, package) per row of the table headed `| layer | package | ...`, in the
    doc's order (layers lowest first); `config/` is the package `config`."""
    rows, inside = [], False
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["layer", "package"]:
            inside = True
        elif inside and not line.startswith("|"):
            break
        elif inside and not set(cells[0]) <= set("- "):
            rows += [(cells[0], name) for name in re.findall(r"`(\w+)/?`", cells[1])]
    return rows


def layer_names() -> list[str]:
    return list(dict.fromkeys(layer for layer, _ in layer_table()))


def layer_of(package: str) -> int:
    return layer_names().index(dict((p, layer) for layer, p in layer_table())[package])


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    names.pop("", None)  # launcher/__init__.py: the package itself
    return names


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the launcher modules it imports (`from launcher.x import y` counts as
    launcher.x.y when that is a module, else launcher.x)."""
    names = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
                base = node.module
                deps |= {t if t.removeprefix("launcher.") in names else base for t in targets}
            elif isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
        graph[name] = {
            d.removeprefix("launcher.")
            for d in deps
            if d.startswith("launcher.") and d.removeprefix("launcher.") in names
        } - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
    return found


def package_of(module: str) -> str:
    return module.split(".")[0]


@functools.cache
def package_graph() -> dict[str, set[str]]:
    """package -> the other launcher packages its modules import."""
    graph: dict[str, set[str]] = {package_of(m): set() for m in module_names()}
    for module, deps in import_graph().items():
        graph[package_of(module)] |= {package_of(d) for d in deps} - {package_of(module)}
    return graph


def test_every_package_is_in_exactly_one_layer():
    """A new package (or front-door module) is given a row in docs/architecture.md's table."""
    listed = [package for _, package in layer_table()]
    assert sorted(p for p in set(listed) if listed.count(p) > 1) == []
    assert sorted(set(package_graph()) - set(listed)) == []
    assert sorted(set(listed) - set(package_graph())) == []  # no row for a package gone


def test_no_package_imports_a_higher_layer():
    upward = [
        f"{p} ({layer_names()[layer_of(p)]}) imports {d} ({layer_names()[layer_of(d)]})"
        for p, deps in sorted(package_graph().items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(p)
    ]
    assert upward == []


def test_no_two_packages_import_each_other():
    graph = package_graph()
    pairs = [
        f"{a} <-> {b}" for a in sorted(graph) for b in sorted(graph[a]) if a < b and a in graph[b]
    ]
    assert pairs == []
    assert cycles(graph) == []  # nor a longer circle, inside one layer


def test_no_import_cycle():
    """Inside a package too, no module imports itself back."""
    assert cycles(import_graph()) == []


def test_the_graph_sees_imports_inside_functions():
    """The reader counts an import inside a function (a lazy import is still a dependency):
    PowerSGD's checkpoint files name their step through the checkpoint protocol's own
    reader, imported when a state is saved."""
    assert "checkpoint.protocol" in import_graph()["strategy.ddp.powersgd"]


# the built-in engines: the packages under launcher/strategy/
ENGINE_PACKAGES = tuple(
    sorted(init.parent.name for init in (PACKAGE / "strategy").glob("*/__init__.py"))
)


def engine_of(module: str) -> str | None:
    parts = module.split(".")
    return (
        parts[1]
        if parts[0] == "strategy" and len(parts) > 1 and parts[1] in ENGINE_PACKAGES
        else None
    )


def test_an_engine_imports_no_other_engine():
    """Each engine reads another's checkpoints through the format table of the registry,
    never by importing it: an engine can be removed or added alone."""
    crossing = [
        f"{m} imports {d}"
        for m, deps in sorted(import_graph().items())
        for d in sorted(deps)
        if engine_of(m) and engine_of(d) and engine_of(m) != engine_of(d)
    ]
    assert crossing == []


def test_no_module_outside_strategy_names_an_engine():
    """What the launcher knows of an engine is what the engine declares (its `Engine`):
    no string comparison with an engine's name outside launcher/strategy/."""
    named = []
    for name, path in module_names().items():
        if name.split(".")[0] == "strategy":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in ast.walk(node) if isinstance(c, ast.Constant)]
                hits = [c.value for c in consts if c.value in ENGINE_PACKAGES]
                named += [f"{name}:{node.lineno} compares with {h!r}" for h in hits]
    assert named == []


def private_uses(path: Path) -> list[str]:
    """`from launcher.x import _private` and `module._private` of an imported launcher module."""
    tree = ast.parse(path.read_text())
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {
                a.asname or a.name.split(".")[0]
                for a in node.names
                if a.name.startswith("launcher")
            }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_another_modules_private_names():
    """A leading underscore means "this module's own": another module that needs it gets
    a public name instead (CollectiveTimer.wrap, once `_wrap`)."""
    reached = {n: private_uses(p) for n, p in module_names().items()}
    assert {n: uses for n, uses in reached.items() if uses} == {}


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_cycle_finder(graph, expected):
    assert cycles(graph) == expected


TESTS = REPO / "tests"
TEST_INDEX = TESTS / "unit" / "README.md"


def has_logic(path: Path) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for node in ast.walk(ast.parse(path.read_text()))
    )


def named_test_file(module: str) -> Path:
    """`checkpoint.memory` -> unit/checkpoint/test_memory.py, `strategy.fsdp2` ->
    unit/strategy/test_fsdp2.py, `doctor` -> unit/test_doctor.py (tests/unit/README.md)."""
    parts = module.split(".")
    return TESTS / "unit" / Path(*parts[:-1][:1]) / f"test_{parts[-1]}.py"


def indexed_tests() -> dict[str, list[str]]:
    """tests/unit/README.md's table: module -> the test files it names (under tests/)."""
    rows = {}
    for line in TEST_INDEX.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def test_every_module_has_tests_by_name_or_in_the_index():
    index = indexed_tests()
    found = {m for m, path in module_names().items() if has_logic(path)}
    by_name = {m for m in found if named_test_file(m).is_file()}
    assert sorted(found - by_name - set(index)) == []
    assert sorted(set(index) - found) == []  # a row for a module gone, or without logic
    assert sorted(set(index) & by_name) == []  # its tests are found by name
    missing = [
        f"{m}: {f}" for m, files in index.items() for f in files if not (TESTS / f).is_file()
    ]
    assert missing == []


def test_every_package_ships_in_a_wheel():
    """pyproject.toml lists packages by name: a new subpackage missing there works in the
    editable install the tests use and is absent from a wheel (an image's `pip install .`)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]
                 ["setuptools"]["packages"])  # fmt: skip
    found = {
        ".".join(("launcher", *init.parent.relative_to(PACKAGE).parts))
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set()
