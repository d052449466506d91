"""Turn a stop signal into a clean stop: every rank checkpoints at the same step boundary,
then exits with exit_codes.STOPPED.

SIGTERM is what torchrun forwards, what Slurm sends before a kill and what the kubelet
sends to a pod; SIGINT is Ctrl-C (torchrun forwards it as SIGINT); SIGHUP is a closed
terminal; SIGUSR1 and SIGUSR2 are Slurm's time-limit and preemption warnings
(`--signal=USR1@lead`, `scancel --signal=USR1`). All of them mean the same here. The
handlers are installed when the process starts, so a signal that arrives while data is
prepared or the model is built is kept and acted on at the first step boundary instead of
killing the process without a checkpoint. SIGQUIT (Ctrl-\\) is left alone: it ends the
process at once, without a checkpoint.

Ranks agree on the step to stop at through `launcher.resilience.stop_vote`. This module
imports no torch: the run's files (metrics, event files, W&B) ask for a stop on a full disk
from here, and front doors that only read or render them start in a fraction of a second.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from launcher.resilience import exit_codes, first_failure, watchdog
from launcher.runtime.process_tree import STOP_SIGNALS

log = logging.getLogger(__name__)


class _Request:
    """The process's stop request: set by a signal handler, read at step boundaries."""

    signal_name: str | None = None
    quiet: bool = False  # the job is ending on a cause said already: a signal says nothing
    ended: bool = False  # the front door has its exit code: a signal changes nothing now


def install_stop_handlers() -> None:
    """Catch the stop signals for the rest of the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _Request.ended = False
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)


def _on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    phase = watchdog.current_phase()
    if _Request.ended:
        log.info("received %s after the job ended: its exit code stands", name,
                 extra=first_failure.FILE_ONLY)  # fmt: skip
        return
    if _Request.quiet or first_failure.peer_failure() is not None:
        # the job is ending already (bad input, a failed peer): that cause was said once
        log.info("received %s: the job is ending already", name, extra=first_failure.FILE_ONLY)
    elif _Request.signal_name is not None:
        log.warning("received %s again: already stopping at the next step boundary", name)
    elif watchdog.can_be_cut_short(phase):
        log.warning("received %s: will checkpoint at the next step boundary and stop", name)
    else:
        # Said now: if torchrun's shutdown timeout kills this rank before the phase ends,
        # nothing else will be, and the front door's exit code says it. Before this rank's
        # job began (composing, joining) rank 0 says it for all: there a rank that is not
        # rank 0 most often hears torchrun ending the launch after rank 0's bad-input line.
        said_by_rank0 = not watchdog.job_started() and os.environ.get("RANK", "0") != "0"
        (log.info if said_by_rank0 else log.warning)(
            "received %s during %s, which cannot be cut short: the stop checkpoint comes at "
            "the step boundary after it; if torchrun's --shutdown-timeout (30 s by default) "
            "ends this rank first, no stop checkpoint is written and the job exits %d "
            "(stopped without a checkpoint; the next launch resumes from the last complete "
            "one)", name, phase, exit_codes.STOPPED_NO_CHECKPOINT,
        )  # fmt: skip
        exit_codes.report(exit_codes.STOPPED_NO_CHECKPOINT)  # replaced by the code it ends with
    _Request.signal_name = _Request.signal_name or name


def request_stop(reason: str) -> None:
    """A stop the launcher itself asks for (the disk filled up): the same vote, stop
    checkpoint and exit code as a signal's."""
    if _Request.signal_name is None:
        log.warning("stopping at the next step boundary: %s", reason)
    _Request.signal_name = _Request.signal_name or reason


def stop_for_full_disk(line: str, *, announce: bool = True) -> None:
    """A run file (metrics, traces, event files) met a full disk: say so in one line
    (`announce`: rank 0; the other ranks' logs have it too) and stop with a checkpoint at
    the next step boundary, as a stop signal would: training on would lose what that file
    records. The checkpoint then fits or ends the run as a full disk (docs/faults.md)."""
    (log.warning if announce else log.info)(
        "%s; stopping at the next step boundary with a checkpoint", line
    )
    request_stop("a full disk")


def end_quietly() -> None:
    """The job ends on a cause already said (bad input on rank 0): the stop signal torchrun
    then sends is kept, and not explained again."""
    _Request.quiet = True


def job_ended() -> None:
    """The front door has its exit code and reports it. A stop signal from here on (torchrun
    stopping the peers of a rank that ended first, while this one leaves) is too late to
    change it: without this, its `exit_codes.report` of 7 could replace the code the job
    ended with, whichever of the two came last."""
    _Request.ended = True


def stop_requested() -> bool:
    return _Request.signal_name is not None


def stopped_by() -> str | None:
    """What asked this process to stop: a signal's name (SIGTERM), or the launcher's own
    reason (a full disk); None when nothing did."""
    return _Request.signal_name
