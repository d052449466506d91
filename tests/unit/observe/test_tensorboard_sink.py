"""logger=tensorboard without its writer package is one line and exit code 2."""

from __future__ import annotations

import sys

import pytest

from launcher.train.front_door import main

pytest.importorskip("tensorboardX", reason="in the test extra: pip install -e '.[test]'")


pytest.importorskip("tensorboard", reason="in the test extra: pip install -e '.[test]'")


def test_missing_writer_is_one_line_exit_2(monkeypatch, capsys):
    """As if tensorboardX were not installed (an import of it fails)."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setattr(sys, "argv", ["launcher.train", "logger=tensorboard"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip() == (
        "error: logger.tensorboard=true (logger=tensorboard) needs the tensorboardX package, "
        "which is not installed: pip install 'launcher[tensorboard]', or logger=none"
    )
