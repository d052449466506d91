"""What this installation declares by entry point: the engines (`launcher.engines`), the
cluster backends (`launcher.backends`) and their renderers (`launcher.renderers`), the fault
kinds (`launcher.fault_kinds`) and the Kubernetes kinds (`launcher.k8s_kinds`).

The launcher's own are declared in its pyproject.toml exactly as another package declares
its own, so the registries of this layer name no module above them, by import or by string:
the installation composes the house, and a registry reads a group. The launcher's own come
first, by name (setuptools writes a group's entry points sorted), then other packages'.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, EntryPoints, entry_points

OWN = "launcher"  # the distribution whose entry points are the built-in ones


@functools.cache
def _installed() -> EntryPoints:
    return entry_points()  # one scan of every installed distribution, for every group


def rescan() -> None:
    """Read the installation again (a test that installs a package in-process)."""
    _installed.cache_clear()


def is_own(ep: EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name == OWN


def declared(group: str) -> list[EntryPoint]:
    """The entry points of `group`, the launcher's own first. None of the launcher's own
    means an installation older than its pyproject.toml's declarations: said in one line."""
    found = list(_installed().select(group=group))
    own = sorted((ep for ep in found if is_own(ep)), key=lambda ep: ep.name)
    if not own:
        raise RuntimeError(
            f"the launcher's own {group} are not installed (pyproject.toml declares them as "
            "entry points): install the launcher again, pip install -e . (or pip install .)"
        )
    return own + [ep for ep in found if not is_own(ep)]


def loaded(group: str, attribute: str) -> list[tuple[EntryPoint, object]]:
    """(entry point, the `attribute` of the module it names) for each of `group`."""
    return [(ep, getattr(ep.load(), attribute)) for ep in declared(group)]


def by_name(found: list[tuple[EntryPoint, object]], what: str) -> dict[str, object]:
    """Declarations by their `name`; a name declared twice is an error of the installation,
    said at once with both modules."""
    named: dict[str, tuple[EntryPoint, object]] = {}
    for ep, declaration in found:
        name = declaration.name
        if name in named:
            raise RuntimeError(
                f"{what} {name} is declared twice (by {named[name][0].value} and {ep.value})"
            )
        named[name] = (ep, declaration)
    return {name: declaration for name, (_, declaration) in named.items()}
