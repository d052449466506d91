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

from paths import REPO

PACKAGE = REPO / "launcher"

# Lowest first. A module may import modules of its own layer or of a lower one. Patterns
# are module names under `launcher.` (fnmatch); a package's `__init__` is the package name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "runtime", "runtime.paths", "runtime.disk", "runtime.fork_guard", "runtime.args_file",
            "observe",
            "observe.peaks", "observe.intervals", "resilience", "resilience.exit_codes",
            "config.ranges", "config.nccl_vars", "config.model_shape", "observe.nccl_log",
            "train.batch", "observe.clock",
            "observe.comm_stats", "runtime.lock", "runtime.process_tree", "resilience.stragglers",
            "runtime.run_dir_check",
            "resilience.preemption", "observe.memory_snapshot", "config.secret_keys",
            "resilience.watchdog", "resilience.bad_steps", "data", "data.*", "strategy",
            "strategy.registry", "resilience.first_failure", "runtime.latest", "observe.report",
        ),
    ),
    ("config", ("config", "config.compose", "config.errors", "config.schema", "config.validate",
                "config.sweep", "config.backends", "config.backends.*", "strategy.ddp",
                "strategy.deepspeed", "strategy.fsdp2", "strategy.deepspeed.ds_config")),
    (
        "process",
        (
            "runtime.launch_state", "runtime.process", "model", "model.*", "runtime.envinfo",
            "checkpoint", "checkpoint.*", "runtime.run_history", "resilience.faults",
            "resilience.burnin",
            "observe.sinks", "observe.metrics", "observe.profiling", "plan", "plan.*",
        ),
    ),
    ("engines and outputs", ("strategy", "strategy.*", "observe.wandb_sink",
                             "observe.tensorboard_sink", "observe.nccl_transport")),
    ("loop", ("train.loop", "train.micro_batch")),
    ("job", ("train.job", "train.preflight", "train.bad_input")),
    (
        "front doors",
        (
            "train", "train.front_door", "train.__main__", "torchrun", "doctor", "commbench",
            "export", "submit", "submit.*", "analyze", "analyze.*", "tune", "tune.*",
            "rehearse", "rehearse.*", "runs", "generate",
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
    PowerSGD's checkpoint files name their step through the checkpoint protocol's own
    reader, imported when a state is saved."""
    assert "checkpoint.protocol" in import_graph()["strategy.ddp.powersgd"]


ENGINE_PACKAGES = ("ddp", "deepspeed", "fsdp2")


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
