"""A module installed as a package's entry point, the way `pip install` of a package that
declares it would leave it: how the tests add an engine or a cluster backend from outside
the launcher."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launch import base_env


def installed_env(tmp_path: Path, dist: str, group: str, name: str, module: str) -> dict:
    """The environment of a process that finds `module` as the entry point `name` of
    `group`: a dist-info folder under tmp_path/site, on PYTHONPATH with the module's own
    folder (where the tests' module is found by name)."""
    site = tmp_path / "site"
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}\n")
    here = str(Path(sys.modules[module].__file__).parent)
    paths = [str(site), here, os.environ.get("PYTHONPATH", "")]
    return base_env(PYTHONPATH=os.pathsep.join(p for p in paths if p))
