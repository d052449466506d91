"""The package map of docs/architecture.md, kept true: every package of `launcher` is in one
layer of that table, imports only packages of its own layer or of a lower one, and no two
packages import each other (nor does a longer circle of them exist).

The doc's table is the one map: the test parses it. A front door that is one module
(`launcher/doctor.py`) is a package of its own. The graph is read from the source with `ast`,
so the test needs no imports of its own, and it holds every load, not only `import`
statements: an import inside a function (still a dependency), and a module loaded by name at
run time, which the source spells as a string (`importlib.import_module`'s argument, an
engine's `"module:Class"`, a `python -m` command). The engines, backends, renderers, fault
kinds and Kubernetes kinds are entry points that pyproject.toml declares (the installation
composes the house): the registry that reads a group names none of them, and each module a
group names depends on that registry, an arrow from the module to the registry.
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


@functools.cache
def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    names.pop("", None)  # launcher/__init__.py: the package itself
    return names


# A string that names a launcher module, as a load by name spells it: "launcher.x.y", or
# "launcher.x.y:Name" (an engine's strategy class)
MODULE_NAME = re.compile(r"launcher(?:\.\w+)+(?::\w+)?")


def module_named(text: str) -> str | None:
    """The launcher module a string names (the longest dotted prefix that is one), if any:
    "launcher.strategy.ddp.engine:DDPStrategy" -> strategy.ddp.engine."""
    if not MODULE_NAME.fullmatch(text):
        return None
    name = text.partition(":")[0].removeprefix("launcher.")
    while name and name not in module_names():
        name = name.rpartition(".")[0]
    return name or None


def loaded_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of a source but those under `if TYPE_CHECKING:`, which no run loads (a
    type named for annotations only)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def logger_names(tree: ast.AST) -> set[int]:
    """The strings that name a logger (`logging.getLogger("launcher.torchrun")`): a logger is
    named after its module by habit, which loads nothing."""
    return {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger"
        for arg in node.args
    }


def names_in(tree: ast.AST) -> set[str]:
    """The launcher modules a source names in its strings: loads by name."""
    loggers = logger_names(tree)
    return {
        named
        for node in loaded_nodes(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in loggers and (named := module_named(node.value))
    }


@functools.cache
def entry_points() -> dict[str, dict[str, str]]:
    """pyproject.toml's entry points: group -> {name: module}."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project.get("entry-points", {})


@functools.cache
def group_readers() -> dict[str, str]:
    """group -> the module that reads it (the one whose source holds the group's name)."""
    readers = {}
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in entry_points():
                readers[node.value] = name
    return readers


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the launcher modules it loads: imports (`from launcher.x import y` counts
    as launcher.x.y when that is a module, else launcher.x), loads by name, and, for a
    module an entry point names, the registry that reads its group."""
    names = module_names()
    readers = group_readers()
    plugged = {
        module.removeprefix("launcher."): readers.get(group)
        for group, points in entry_points().items()
        for module in points.values()
    }
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        tree = ast.parse(path.read_text())
        for node in loaded_nodes(tree):
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
        }
        graph[name] |= names_in(tree) | ({plugged[name]} if plugged.get(name) else set())
        graph[name] -= {name}
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


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("launcher.strategy.ddp.engine:DDPStrategy", "strategy.ddp.engine"),  # module:Class
        ("launcher.submit.slurm", "submit.slurm"),  # import_module's argument
        ("launcher.torchrun", "torchrun"),  # a `python -m` command
        ("launcher.train.job.run", "train.job"),  # a module's function
        ("launcher.engines", None),  # an entry-point group, no module
        ("see launcher.plan.memory", None),  # prose
    ],
)
def test_the_graph_reads_a_module_named_in_a_string(text, named):
    assert module_named(text) == named


def test_a_module_named_in_a_string_is_an_arrow():
    """A load by name is a dependency the graph holds (an engine's strategy class), so a
    name that points up, or closes a circle, fails as an import would."""
    assert "strategy.ddp.engine" in import_graph()["strategy.ddp"]
    tree = ast.parse('BUILTIN = ("launcher.resilience.faults",)')
    assert names_in(tree) == {"resilience.faults"}
    assert names_in(ast.parse('log = logging.getLogger("launcher.torchrun")')) == set()
    assert layer_of(package_of("resilience.faults")) > layer_of("config")


def test_the_registries_read_groups_and_the_entry_points_depend_on_them():
    """The built-in engines, backends, renderers, fault kinds and Kubernetes kinds are
    pyproject.toml's entry points. Each group is read by one module, which names none of the
    modules of its group; each of them depends on that reader (an arrow down to it)."""
    readers = group_readers()
    assert sorted(readers) == sorted(entry_points())
    for group, points in entry_points().items():
        reader = readers[group]
        for module in points.values():
            target = module.removeprefix("launcher.")
            assert target in module_names(), f"{group}: {module} is no module"
            assert target not in import_graph()[reader], f"{reader} names {module}"
            assert reader in import_graph()[target]
    assert package_of(readers["launcher.engines"]) == "config"
    assert package_of(readers["launcher.fault_kinds"]) == "config"


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


def module_table() -> list[tuple[list[str], str]]:
    """docs/architecture.md's module table: (the paths in a row's first cell, the row's
    text), for the rows that name a path of `launcher/`."""
    text = ARCHITECTURE.read_text().split("## The modules", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        paths = re.findall(r"`([^`]+)`", cells[0])
        if line.startswith("| `") and paths and paths[0].startswith("launcher/"):
            rows.append((paths, line))
    return rows


def tabled_modules() -> set[Path]:
    """The files the module table names: each path of a row's first cell (a name after the
    first is in the first one's folder: `launcher/strategy/base.py`, `optim.py`); for a
    folder's row (`launcher/plan/`), its package and every `<name>.py` of that folder the
    row names (`memory.py`)."""
    named = set()
    for paths, line in module_table():
        first = REPO / paths[0]
        folder = first if paths[0].endswith("/") else first.parent
        for path in paths:
            target = REPO / path if path.startswith("launcher/") else folder / path
            named.add(target / "__init__.py" if path.endswith("/") else target)
        if paths[0].endswith("/"):
            named |= {folder / name for name in re.findall(r"`(\w+\.py)`", line)}
    return named


def test_the_module_table_names_every_module():
    """docs/architecture.md's module table says each module's one job: a new module gets a
    row (or its name in its folder's row), a module gone loses it. A package's `__init__.py`
    that only says what the package owns is the package's row of the layer table."""
    found = {p for p in module_names().values() if p.name != "__init__.py" or has_logic(p)}
    tabled = tabled_modules()
    assert sorted(str(p.relative_to(REPO)) for p in found - tabled) == []
    assert sorted(str(p.relative_to(REPO)) for p in tabled if not p.is_file()) == []


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
