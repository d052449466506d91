"""`runs/latest` follows the newest run, replaced in one rename; a real folder of that name
(a run called `latest`) is left alone."""

from __future__ import annotations

import os

from launcher.runtime.latest import LATEST, point_latest


def test_latest_points_at_the_newest_run_and_spares_a_real_folder(tmp_path):
    for run in ("a", "sweep/b=1"):
        (tmp_path / run).mkdir(parents=True)
        point_latest(tmp_path, run)
        assert os.readlink(tmp_path / LATEST) == run  # relative: the tree can move
        assert (tmp_path / LATEST).resolve() == (tmp_path / run).resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", LATEST, "sweep"]  # no temporary
    (tmp_path / LATEST).unlink()
    (tmp_path / LATEST).mkdir()  # a run named latest
    point_latest(tmp_path, "a")
    assert (tmp_path / LATEST).is_dir() and not (tmp_path / LATEST).is_symlink()
