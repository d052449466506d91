"""`python -m launcher.torchrun` under bad input, in-process: each of torchrun's own
arguments that its parser or its launch config refuses, and a training module or script
that is not there, refused in one line before its agent starts (plain torchrun prints its
usage block or a traceback from inside its agent), exit 2: the contract's bad input, which
Slurm's script and the Kubernetes failure policies do not retry."""

from __future__ import annotations

import os

import pytest

from launcher.torchrun import KEEP_ALIVE, SIGNALS_ENV, prompt_keep_alive
from launcher.torchrun import main as exit_code_front_door  # runs nothing when refused

CASES = [
    (["--nproc-per-node=0", "-m", "launcher.train"], "--nproc-per-node=0: give at least 1"),
    (["--nproc-per-node=abc", "-m", "launcher.train"], "Unsupported nproc_per_node value: abc"),
    (["--nnodes=abc", "-m", "launcher.train"], "--nnodes=abc: give a node count, N or MIN:MAX"),
    (["--nnodes=0", "-m", "launcher.train"], "min_nodes must be > 0"),
    (["--nnodes=3:2", "-m", "launcher.train"], "min_nodes must be > 0 and <= max_nodes"),
    (["--max-restarts=-1", "-m", "launcher.train"], "max_restarts must be >= 0"),
    (["--max-restarts=x", "-m", "launcher.train"], "argument --max-restarts"),
    (["--bogus", "-m", "launcher.train"], "unrecognized arguments: --bogus"),
    (["--standalone"], "the following arguments are required: training_script"),
    (["--standalone", "-m", "launcher.nosuch"], "-m launcher.nosuch: no such module"),
    (["--standalone", "-m", "nosuch.pkg"], "-m nosuch.pkg: no such module"),
    (["--standalone", "nosuch.py"], "nosuch.py: no such script"),
    (["--rdzv-conf=abc", "-m", "launcher.train"], "The rendezvous configuration option 'abc'"),
    (["--local-ranks-filter=x", "-m", "launcher.train"], "--local_ranks_filter must be a"),
    (["--redirects=9", "-m", "launcher.train"], "9 does not match"),
]


@pytest.mark.parametrize(("argv", "words"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_torchrun_argument_is_one_line(capsys, monkeypatch, argv, words):
    monkeypatch.delenv(SIGNALS_ENV, raising=False)
    assert exit_code_front_door(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("error: launcher.torchrun: ") and words in err, err
    assert SIGNALS_ENV not in os.environ  # refused before anything was set up


@pytest.mark.parametrize("collecting", [True, False])
def test_importing_the_front_door_leaves_the_collector_as_it_was(collecting):
    """Its imports run with the cyclic collector off; afterwards it is on again only if it
    was (a program that turned it off keeps it off)."""
    import gc
    import importlib

    import launcher.torchrun as agent_front_door

    (gc.enable if collecting else gc.disable)()
    try:
        importlib.reload(agent_front_door)
        assert gc.isenabled() is collecting
    finally:
        gc.enable()


KEEP_ALIVE_CASES = [
    ("", "keep_alive_interval=1,keep_alive_max_attempt=4"),
    ("join_timeout=900", "join_timeout=900,keep_alive_interval=1,keep_alive_max_attempt=4"),
    ("is_host=1,", "is_host=1,keep_alive_interval=1,keep_alive_max_attempt=4"),
    ("keep_alive_interval=10", "keep_alive_interval=10"),  # the user's own stays whole
    ("keep_alive_max_attempt=2,timeout=60", "keep_alive_max_attempt=2,timeout=60"),
]


@pytest.mark.parametrize(("given", "passed"), KEEP_ALIVE_CASES)
def test_the_rendezvous_drops_a_silent_node_when_node_presence_would(given, passed):
    """A lost node leaves the rendezvous after 4 s of silence (1 s beats, 4 missed), what
    node_presence judges a heartbeat by, not torchrun's 15 s; a user's setting stays."""
    from launcher.resilience import node_presence

    assert prompt_keep_alive(given) == passed
    interval, attempts = KEEP_ALIVE.values()
    assert interval * attempts == node_presence.SILENT_AFTER_S


def test_torchruns_rendezvous_handler_takes_the_keep_alive():
    """What torchrun builds from the front door's `--rdzv-conf`: a c10d rendezvous whose
    handler declares a node dead after 4 s without a keep-alive."""
    from datetime import timedelta

    from torch.distributed import run as torch_run
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    argv = ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"]
    args = torch_run.parse_args([*argv, "-m", "launcher.train"])
    args.rdzv_conf = prompt_keep_alive(args.rdzv_conf)
    config, _, _ = torch_run.config_from_args(args)
    params = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id="keep-alive",
        min_nodes=1, max_nodes=1, is_host=True, **config.rdzv_configs,
    )  # fmt: skip
    handler = registry.get_rendezvous_handler(params)
    try:
        settings = handler.settings
        assert settings.keep_alive_interval == timedelta(seconds=1)
        assert settings.keep_alive_max_attempt == 4
    finally:
        handler.shutdown()


def test_a_stopped_agent_stops_its_keep_alive_from_its_own_thread_and_leaves_it_open():
    """After a stop signal torchrun lets its rendezvous handler go unclosed, and its
    keep-alive timer's finalizer could run in the timer's own thread ("cannot join current
    thread", a traceback in the job's output). The front door's hold stops the timer from
    the agent's thread as the agent ends, and leaves the rendezvous open for a replacement."""
    import signal
    import threading

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

    from launcher.torchrun import keep_alive_stopped_by_this_thread

    def beating():
        return [t for t in threading.enumerate() if t.name.startswith("RendezvousKeepAlive")]

    params = RendezvousParameters(
        backend="c10d", endpoint="127.0.0.1:0", run_id="stopped", min_nodes=1, max_nodes=1,
        is_host=True, keep_alive_interval=1,
    )  # fmt: skip
    with pytest.raises(SignalException), keep_alive_stopped_by_this_thread(0.1) as made:
        handler = registry.get_rendezvous_handler(params)
        assert handler._state_holder._cache_duration == 0.1  # read again after the poll's 0.1 s
        handler.next_rendezvous()
        assert beating(), "torch's rendezvous beats in a thread of its own"
        raise SignalException("stopped", sigval=signal.SIGTERM)
    assert made == [handler] and not beating()
    assert registry.get_rendezvous_handler.__name__ == "get_rendezvous_handler"
    assert not handler.is_closed()  # a replacement may still join
    handler.shutdown()
