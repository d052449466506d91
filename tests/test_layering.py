"""The module map of docs/architecture.md, kept true: every module of `launcher` sits in one
layer, imports only its own layer or lower ones, and no import cycle exists.

The import graph is read from the source with `ast` (every `import`, also those inside
functions, which are still dependencies), so the test needs no imports of its own.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"

# Lowest first. A module may import modules of its own layer or of a lower one. Patterns
# are module names under `launcher.` (fnmatch); a package's `__init__` is the package name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "runtime", "runtime.paths", "runtime.disk", "observe", "observe.peaks",
            "observe.intervals", "resilience", "resilience.exit_codes", "config.ranges",
            "config.nccl_vars", "observe.nccl_log", "train.batch", "observe.clock",
            "observe.comm_stats", "runtime.lock", "resilience.stragglers",
            "resilience.preemption", "observe.memory_snapshot", "config.secret_keys",
            "resilience.watchdog", "resilience.bad_steps", "data", "data.*",
        ),
    ),
    ("config", ("config", "config.compose", "config.errors", "config.schema", "config.validate",
                "config.sweep")),
    (
        "process",
        (
            "runtime.launch_state", "runtime.process", "model", "model.*", "runtime.envinfo",
            "checkpoint", "checkpoint.*", "runtime.run_history", "resilience.faults",
            "observe.sinks", "observe.metrics", "observe.profiling",
        ),
    ),
    ("engines and outputs", ("strategy", "strategy.*", "observe.wandb_sink",
                             "observe.tensorboard_sink", "observe.nccl_transport")),
    ("loop", ("train.loop",)),
    ("job", ("train.job", "train.preflight")),
    (
        "front doors",
        (
            "train", "train.front_door", "train.__main__", "torchrun", "doctor", "commbench",
            "export", "submit", "submit.*", "analyze", "analyze.*", "tune", "tune.*",
        ),
    ),
]  # fmt: skip


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


def layer_of(module: str) -> int | None:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return index
    return None


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


def test_every_module_has_a_layer():
    """A new module is placed in the map (here and in docs/architecture.md) when added."""
    assert [m for m in sorted(module_names()) if layer_of(m) is None] == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in sorted(import_graph().items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert upward == []


def test_the_graph_sees_imports_inside_functions():
    """The reader counts an import inside a function (a lazy import is still a dependency):
    launcher.strategy imports each engine only when it is chosen."""
    assert {"strategy.ddp", "strategy.deepspeed", "strategy.fsdp2"} <= import_graph()["strategy"]


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


def test_architecture_doc_names_every_layer():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert [name for name, _ in LAYERS if f"| {name} |" not in doc] == []


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
