"""A module installed as a package's entry point, the way `pip install` of a package that
declares it would leave it: how the tests add an engine, a cluster backend or a Kubernetes
kind from outside the launcher."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from launch import base_env

# group -> {entry point name: module}
Points = Mapping[str, Mapping[str, str]]


def dist_info(tmp_path: Path, dist: str, points: Points) -> Path:
    """A site folder under tmp_path holding the dist-info of `dist` with `points`."""
    site = tmp_path / "site"
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    groups = "".join(
        f"[{group}]\n" + "".join(f"{name} = {module}\n" for name, module in named.items())
        for group, named in points.items()
    )
    (info / "entry_points.txt").write_text(groups)
    return site


def installed_env(tmp_path: Path, dist: str, group: str, name: str, module: str) -> dict:
    """The environment of a process that finds `module` as the entry point `name` of
    `group`: a dist-info folder under tmp_path/site, on PYTHONPATH with the module's own
    folder (where the tests' module is found by name)."""
    return installed_env_of(tmp_path, dist, {group: {name: module}})


def installed_env_of(tmp_path: Path, dist: str, points: Points) -> dict:
    """installed_env with several entry points, each module one the tests imported."""
    site = dist_info(tmp_path, dist, points)
    modules = {module for named in points.values() for module in named.values()}
    here = [str(Path(sys.modules[module].__file__).parent) for module in sorted(modules)]
    paths = [str(site), *dict.fromkeys(here), os.environ.get("PYTHONPATH", "")]
    return base_env(PYTHONPATH=os.pathsep.join(p for p in paths if p))


@contextlib.contextmanager
def installed_here(tmp_path: Path, dist: str, points: Points) -> Iterator[None]:
    """`points` installed in this process while the block runs (each module one the tests
    imported): the launcher reads the installation again on entry and on exit."""
    from launcher.config import plugins

    site = str(dist_info(tmp_path, dist, points))
    sys.path.insert(0, site)
    plugins.rescan()
    try:
        yield
    finally:
        sys.path.remove(site)
        plugins.rescan()
