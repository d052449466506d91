"""The installation's entry points as the registries read them: the launcher's own are the
groups pyproject.toml declares, first and by name; another package's come after them; a
name declared twice, and an installation without the launcher's own, are said in one line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from launcher.config import backends, fault_kinds, plugins, registry

from entry_points import installed_here
from paths import REPO


def declared_in_pyproject() -> dict[str, dict[str, str]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]


DECLARED = declared_in_pyproject()  # group -> {name: module}


@dataclass(frozen=True)
class Named:
    name: str


# What the entry points the tests install find in this module
OTHER = Named("other")
ENGINE = Named("ddp")  # an engine's name the launcher already has


@pytest.mark.parametrize("group", sorted(DECLARED))
def test_each_group_is_the_launchers_own_entry_points_by_name(group):
    found = plugins.declared(group)
    assert [(ep.name, ep.value) for ep in found] == sorted(DECLARED[group].items())
    assert all(plugins.is_own(ep) for ep in found)


def test_the_registries_hold_what_pyproject_declares():
    assert list(registry.engines()) == sorted(DECLARED["launcher.engines"])
    assert list(backends.backends()) == sorted(DECLARED["launcher.backends"])
    assert list(backends.builtin()) == sorted(DECLARED["launcher.backends"])
    assert backends.added() == []
    slurm = backends.backend("slurm").renderer()
    assert slurm.__name__ == DECLARED["launcher.renderers"]["slurm"]
    assert {"none", "stall", "sigstop"} <= set(fault_kinds.kinds())


def test_another_packages_entry_points_come_after_the_launchers_own(tmp_path):
    with installed_here(tmp_path, "other-engines", {"launcher.engines": {"other": __name__}}):
        found = plugins.declared("launcher.engines")
        assert [ep.name for ep in found] == [*sorted(DECLARED["launcher.engines"]), "other"]
        assert not plugins.is_own(found[-1]) and found[-1].dist.name == "other-engines"
        assert found[-1].load().OTHER is OTHER
    assert [ep.name for ep in plugins.declared("launcher.engines")] == sorted(
        DECLARED["launcher.engines"]
    )  # uninstalled: read again


def test_a_name_declared_twice_names_both_modules(tmp_path):
    twice = {"launcher.engines": {"again": __name__}}
    with installed_here(tmp_path, "twice", twice), pytest.raises(RuntimeError) as err:
        plugins.by_name(plugins.loaded("launcher.engines", "ENGINE"), "engine")
    assert str(err.value) == (
        f"engine ddp is declared twice (by launcher.strategy.ddp and {__name__})"
    )


def test_an_installation_without_the_launchers_own_says_to_reinstall():
    with pytest.raises(RuntimeError) as err:
        plugins.declared("launcher.no_such_group")
    assert "\n" not in str(err.value)
    assert "pip install -e ." in str(err.value) and "launcher.no_such_group" in str(err.value)
