"""Stop requests: the first signal wins, handlers only from the main thread, and the stop
vote decided one step boundary later on every rank alike."""

from __future__ import annotations

import math
import os
import signal
import threading

import pytest
import torch.distributed as dist

from launcher.resilience import preemption
from launcher.resilience.preemption import install_stop_handlers, stop_requested
from launcher.resilience.stop_vote import NOTHING, StopVote


@pytest.fixture
def stop_request():
    """Reset the process's stop request and restore the signal handlers afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in preemption.STOP_SIGNALS}
    preemption._Request.signal_name = None
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        preemption._Request.signal_name = None


def test_sigterm_sets_the_request_and_later_signals_keep_the_first(stop_request):
    """A real SIGTERM to this process, once the handlers are in, is kept as a request
    (the process lives on); a later SIGINT does not rename it."""
    install_stop_handlers()
    assert not stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop_requested()
    assert preemption._Request.signal_name == "SIGTERM"
    os.kill(os.getpid(), signal.SIGINT)
    assert preemption._Request.signal_name == "SIGTERM"


def test_a_signal_after_the_job_ended_changes_nothing(stop_request, tmp_path, monkeypatch):
    """Once the front door has its exit code (job_ended, just before it reports it), a stop
    signal (torchrun stopping this rank because a peer left first) neither requests a stop
    nor reports 7 over the code the job ended with; the next job's handlers listen again."""
    monkeypatch.setenv(preemption.exit_codes.OUTCOME_DIR_ENV, str(tmp_path))
    install_stop_handlers()
    preemption.job_ended()
    preemption.exit_codes.report(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert not stop_requested()
    assert preemption.exit_codes.read_reports(tmp_path) == {0: 1}
    install_stop_handlers()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop_requested()


def test_handlers_are_installed_only_from_the_main_thread(stop_request):
    """From another thread install_stop_handlers changes nothing (Python would raise)."""
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=install_stop_handlers)
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before


def test_vote_without_process_group_is_the_local_request(stop_request):
    """With no process group, poll answers this process's request at once."""
    assert not dist.is_initialized()
    install_stop_handlers()
    vote = StopVote()
    assert vote.poll() is False
    os.kill(os.getpid(), signal.SIGHUP)
    assert vote.poll() is True


def test_vote_is_decided_one_boundary_later(stop_request, gloo_world):
    """With a process group, poll at boundary k returns boundary k-1's all-gather: a
    request made between boundaries k-1 and k is answered True at k+1, never at k."""
    install_stop_handlers()
    vote = StopVote(gloo_world)
    assert vote.poll() is False  # boundary 1: no earlier vote
    assert vote.poll() is False  # boundary 2: boundary 1 voted no
    os.kill(os.getpid(), signal.SIGTERM)
    assert vote.poll() is False  # boundary 3: boundary 2's vote, taken before the signal
    assert vote.poll() is True  # boundary 4: boundary 3 voted yes
    vote.drain()

    fresh = StopVote(gloo_world)  # a request before the first boundary
    assert fresh.poll() is False
    assert fresh.poll() is True
    fresh.drain()


class Echo:
    """A rider that numbers its payloads and keeps what comes back."""

    width = 2

    def __init__(self):
        self.sent, self.got = 0, []

    def payload(self) -> list[float]:
        self.sent += 1
        return [float(self.sent), NOTHING]

    def arrived(self, rows: list[list[float]]) -> None:
        self.got.append([row[0] for row in rows])
        assert all(math.isnan(row[1]) for row in rows)


@pytest.mark.parametrize("grouped", [True, False], ids=["gloo", "alone"])
def test_a_riders_numbers_come_back_with_the_next_boundarys_poll(stop_request, gloo_world, grouped):
    """What the checkpoints' agreements ride on: each poll sends the rider's numbers and
    hands back every rank's from the poll before; the drain at teardown hands the last
    ones back; the stop flag's column is the vote's own."""
    rider = Echo()
    vote = StopVote(gloo_world if grouped else None, riders=[rider])
    if not grouped:
        with pytest.MonkeyPatch.context() as patch:  # no process group: each rank alone
            patch.setattr(dist, "is_initialized", lambda: False)
            run_three(vote)
    else:
        run_three(vote)
    assert rider.got == [[1.0], [2.0], [3.0]]


def run_three(vote: StopVote) -> None:
    assert vote.poll() is False
    assert vote.poll() is False
    assert vote.poll() is False
    vote.drain()
