"""`launcher.warm_start`, in-process: which launches start warm, and the torchrun arguments a
warm start runs (torchrun's own in-process entry point under the fork server, this module's
file with the training module and its arguments). The launch itself, forked ranks and all,
is tests/launches/test_warm_start.py's."""

from __future__ import annotations

import multiprocessing.forkserver

import pytest
from torch.distributed import run as torch_run

from launcher import warm_start
from launcher.train import front_door

TRAIN = ["--standalone", "--nproc-per-node=2", "-m", "launcher.train", "trainer.max_steps=3"]

CASES = [  # (LAUNCHER_WARM_START, torchrun arguments, warm?)
    (None, TRAIN, True),  # on by default
    ("1", TRAIN, True),
    ("on", TRAIN, True),
    ("0", TRAIN, False),
    ("false", TRAIN, False),
    ("OFF", TRAIN, False),
    ("no", TRAIN, False),
    (None, ["--standalone", "-m", "launcher.tune"], True),  # any launcher module
    (None, ["--standalone", "-m", "mypkg.train"], False),  # the user's own module: cold
    (None, ["--standalone", "train.py"], False),  # a script: cold
    (None, ["--standalone", "--no-python", "-m", "launcher.train"], False),
    (None, ["--standalone", "--run-path", "launcher/train/__main__.py"], False),
]


IDS = [f"{value}-{argv[-1]}" for value, argv, _ in CASES]


@pytest.mark.parametrize(("value", "argv", "warm"), CASES, ids=IDS)
def test_which_launches_start_warm(value, argv, warm):
    environ = {} if value is None else {warm_start.ENV: value}
    assert warm_start.wanted(torch_run.parse_args(argv), environ) is warm


def test_a_warm_start_runs_the_module_through_torchruns_in_process_entry_point(monkeypatch):
    monkeypatch.setenv(warm_start.COMMAND_ENV, "")  # restored (unset) after the test
    server = multiprocessing.forkserver._forkserver
    monkeypatch.setattr(server, "_preload_modules", server._preload_modules)
    args = warm_start.warm(torch_run.parse_args([*TRAIN, "run.name=a b"]))
    config, cmd, cmd_args = torch_run.config_from_args(args)
    assert cmd is torch_run.run_script_path and config.start_method == "forkserver"
    module_args = ["launcher.train", "trainer.max_steps=3", "run.name=a b"]
    assert cmd_args == [warm_start.__file__, *module_args]
    assert server._preload_modules == [warm_start.PRELOAD]
    # the training command, quoted as a shell would take it, where `ps e` shows it
    expected = "-m launcher.train trainer.max_steps=3 'run.name=a b'"
    assert warm_start.os.environ[warm_start.COMMAND_ENV] == expected


@pytest.fixture
def composed_ahead(monkeypatch):
    """front_door's cache of configs composed by a fork server, empty for the test."""
    monkeypatch.setattr(front_door, "COMPOSED_AHEAD", {})
    return front_door.COMPOSED_AHEAD


def test_the_fork_server_composes_the_ranks_config_once(composed_ahead):
    from omegaconf import OmegaConf

    from launcher.config import compose

    args = ["trainer.max_steps=3", "data.num_workers=1", "model.n_layer=3"]
    command = {warm_start.COMMAND_ENV: " ".join(["-m", "launcher.train", *args])}
    front_door.compose_ahead(command)
    (key,) = composed_ahead
    parsed, plan, (cfg,) = composed_ahead[key]
    assert key == tuple(args) and not plan.multirun and parsed.overrides == args
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(compose(args))


@pytest.mark.parametrize(
    "command",
    [
        "-m launcher.train trainer.max_stepz=3",  # a bad override: the rank says why
        "-m launcher.train --cfg job",  # prints, trains nothing
        "-m launcher.train --help",
        "-m launcher.tune trainer.max_steps=3",  # another front door
        "",  # no command (a server started outside a warm launch)
    ],
)
def test_nothing_is_composed_ahead_that_a_rank_would_not_train(composed_ahead, command):
    front_door.compose_ahead({warm_start.COMMAND_ENV: command} if command else {})
    assert composed_ahead == {}


def test_a_forked_rank_takes_the_thread_count_torchrun_gave_it():
    """The agent loaded torch (and OpenMP read its environment) before torchrun set
    OMP_NUM_THREADS for the ranks: each forked rank sets its own from it, as a cold rank's
    OpenMP would; without a count it keeps what it has."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        warm_start.take_thread_count({"OMP_NUM_THREADS": "1"})
        assert torch.get_num_threads() == 1
        for unset in ({}, {"OMP_NUM_THREADS": ""}, {"OMP_NUM_THREADS": "x"}):
            warm_start.take_thread_count(unset)
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
