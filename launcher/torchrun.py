"""`python -m launcher.torchrun [torchrun options] -m launcher.train [overrides]`: torchrun
whose exit code is the job's.

torchrun exits 1 after any worker failure and after a stop signal, so the codes of
`launcher.resilience.exit_codes` (2 bad input, 3 non-finite loss, 4 out of memory, 5 hang,
7 stopped without a checkpoint, 143 stopped with a checkpoint) never reach Slurm, a
Kubernetes `podFailurePolicy` or PyTorchJob's `restartPolicy: ExitCode`. This front door
runs torchrun's own agent in this process, with every option torchrun takes, lets each
worker leave its code in a private folder, and exits with the job's code once torchrun has
ended. Plain `torchrun -m launcher.train` still works the same; only its exit code is less
informative.
"""

# ruff: noqa: E402  (the imports come after the collector is turned off, below)
from __future__ import annotations

import gc

# torch's imports make some 170,000 objects and next to no garbage; with the cyclic collector
# on, the collections they set off walk the growing heap again and again: 0.3 of this agent's
# 1.8 CPU-s of imports on a 2-core machine, paid again at every requeue. It is on again
# (if it was) once they are done, for the agent's own long life.
_COLLECTING = gc.isenabled()
gc.disable()

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from argparse import Namespace
from pathlib import Path

from torch.distributed import run as torch_run
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
from torch.distributed.elastic.rendezvous import registry as rendezvous_registry
from torch.distributed.elastic.rendezvous.api import RendezvousError

from launcher import warm_start
from launcher.resilience import exit_codes, node_presence
from launcher.runtime import rendezvous_poll
from launcher.runtime.exit_gc import skip_collection_at_exit
from launcher.runtime.process_tree import stopped_workers, workers

if _COLLECTING:
    gc.enable()

log = logging.getLogger("launcher.torchrun")

# torchrun's agent turns the signals of its --signals-to-handle into a shutdown that
# forwards the signal to every worker, then waits --shutdown-timeout before SIGKILL. Its
# default lacks Slurm's warnings: SIGUSR1/SIGUSR2 would kill this process at once (their
# default action), leaving the workers training on, orphaned, and holding the run's lock.
# The option's default is read from PET_SIGNALS_TO_HANDLE (torchrun's env action); one
# given on the command line is the user's choice and stays as it is.
SIGNALS_ENV = "PET_SIGNALS_TO_HANDLE"
TORCH_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def forward_every_signal(environ: dict) -> None:
    """Add the signals torchrun does not forward by default to the ones it does (and to
    any the user named in PET_SIGNALS_TO_HANDLE)."""
    named = environ.get(SIGNALS_ENV, TORCH_DEFAULT_SIGNALS).split(",")
    wanted = [n.strip() for n in named if n.strip()] + list(FORWARDED)
    environ[SIGNALS_ENV] = ",".join(dict.fromkeys(wanted))


# torchrun's dynamic rendezvous (c10d, etcd) drops a node from the next round only once its
# keep-alive has been silent for keep_alive_interval x keep_alive_max_attempt seconds (5 s x 3
# by default): after a node is lost, its replacement and the survivors waited in the
# rendezvous 15 s for it to be dropped (10.6 s of a replaced node's 22.7 s on the way to the
# next step, measured). The front door asks for the silence this node's presence watch judges
# by (node_presence: a beat a second, silent after 4 s), unless the user set either.
KEEP_ALIVE = {
    "keep_alive_interval": int(node_presence.BEAT_S),
    "keep_alive_max_attempt": int(node_presence.SILENT_AFTER_S / node_presence.BEAT_S),
}


def prompt_keep_alive(rdzv_conf: str) -> str:
    """torchrun's `--rdzv-conf` with the front door's keep-alive where the user set none."""
    given = {item.split("=", 1)[0].strip() for item in rdzv_conf.split(",") if item.strip()}
    if given & set(KEEP_ALIVE):
        return rdzv_conf
    added = [f"{key}={value}" for key, value in KEEP_ALIVE.items()]
    return ",".join([item for item in rdzv_conf.split(",") if item.strip()] + added)


def end_stopped_ranks_after_a_hang(folder: Path, done: threading.Event) -> None:
    """Once a rank has reported a hang, SIGKILL the ranks that are stopped.

    The peers of a frozen rank detect the hang and exit 5; torchrun then SIGTERMs the
    frozen one, which cannot run to take it, and SIGKILLs it only after its fixed 30 s
    wait. A stopped rank never resumes on its own, so waiting is time lost: the job exits
    as soon as the peers have written their stacks. A rank that is running (however
    slowly) is left to torchrun's SIGTERM and its stop checkpoint."""
    while not done.wait(0.5):
        if exit_codes.HANG not in exit_codes.read_reports(folder).values():
            continue
        for pid, rank in stopped_workers(workers(os.getpid()), exit_codes.rank_of_pid).items():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            print(
                f"launcher.torchrun: rank {rank} (pid {pid}) is stopped (SIGSTOP) and cannot "
                f"take SIGTERM; killed it now that its peers have reported a hang",
                file=sys.stderr,
            )


class BadArguments(ValueError):
    """torchrun's own arguments refused, worded as the one line the user sees."""


def _refuse(message: str):
    raise BadArguments(message)


def check_arguments(argv: list[str]) -> None:
    """torchrun's arguments, judged before its agent starts: what its parser refuses, what
    its launch config refuses (a node count, a process count, a restart count), and a
    training module or script that is not there, each as one line (torchrun itself would
    print its usage block, or a traceback from inside its agent)."""
    parser = torch_run.get_args_parser()
    parser.error = _refuse  # one line instead of the usage block and exit
    args = parser.parse_args(argv)
    try:
        torch_run.parse_min_max_nnodes(args.nnodes)
    except ValueError:
        raise BadArguments(f"--nnodes={args.nnodes}: give a node count, N or MIN:MAX") from None
    try:
        config, _, _ = torch_run.config_from_args(args)
    except (ValueError, AssertionError, RuntimeError) as exc:
        raise BadArguments(" ".join(str(exc).split())) from None
    if config.nproc_per_node < 1:
        raise BadArguments(f"--nproc-per-node={args.nproc_per_node}: give at least 1 process")
    script = args.training_script
    if args.module:
        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise BadArguments(f"-m {script}: no such module; e.g. -m launcher.train")
    elif not args.no_python and not Path(script).is_file():
        raise BadArguments(f"{script}: no such script; e.g. -m launcher.train")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print()
        torch_run.get_args_parser().print_help()
        return 0
    skip_collection_at_exit()  # torch's objects: seconds of a preemption's grace time
    try:
        check_arguments(argv)
    except BadArguments as exc:
        print(f"error: launcher.torchrun: {exc}; see python -m launcher.torchrun --help",
              file=sys.stderr)  # fmt: skip
        return exit_codes.BAD_INPUT
    forward_every_signal(os.environ)
    with outcome_folder() as folder:
        os.environ[exit_codes.OUTCOME_DIR_ENV] = folder
        args = agent_args(argv)  # a warm start's fork server forked before any thread below
        succeeded, stopped_by = False, None
        done = threading.Event()
        reaper = threading.Thread(
            target=end_stopped_ranks_after_a_hang, args=(Path(folder), done), daemon=True
        )
        reaper.start()
        presence = node_presence.NodePresence(Path(folder), node_presence.wait_s())
        presence.start()
        try:
            run_agent(args)
            succeeded = True
        except ChildFailedError:
            pass  # torchrun has printed which rank failed first
        except RendezvousError as exc:  # e.g. the node that held the rendezvous' store left
            print(f"launcher.torchrun: the rendezvous failed: {exc}", file=sys.stderr)
        except SignalException as exc:
            if not presence.lost:  # else: the end this front door chose, said below
                stopped_by = exc.sigval.name
                print(f"launcher.torchrun: stopped by {stopped_by}", file=sys.stderr)
        finally:
            done.set()
            reaper.join()
        ranks = exit_codes.read_reports(Path(folder))
        chosen = exit_codes.read_reports(Path(folder), chosen=True)
        lost = presence.lost or lost_at_end(presence, ranks, succeeded, chosen)
        code = exit_codes.NODE_LOST if lost else exit_codes.job_code(ranks, succeeded, chosen)
        presence.close(code)
    if lost:
        print(lost, file=sys.stderr)
        node_presence.record_in_summary(presence.run_dir, presence.ranks, lost)
    killed = stopped_by not in (None, "SIGQUIT") and code in (
        exit_codes.CRASH,  # killed before any rank could say where it was
        exit_codes.STOPPED_NO_CHECKPOINT,  # a rank said: in a phase that cannot be cut short
    )
    if killed:
        code = exit_codes.STOPPED_NO_CHECKPOINT
    by_rank = ", ".join(f"{r}: {c}" for r, c in sorted(ranks.items())) or "none reported"
    print(
        f"launcher.torchrun: exit code {code} ({exit_codes.MEANING.get(code, 'chosen by a rank')})"
        f"; ranks' codes: {by_rank}",
        file=sys.stderr,
    )
    if killed:
        print(killed_before_checkpoint(stopped_by), file=sys.stderr)
    exit_codes.report_node(code)
    return code


@contextlib.contextmanager
def outcome_folder():
    """The folder where the ranks report their exit codes (exit_codes.OUTCOME_DIR_ENV),
    removed by this process alone when it ends: a TemporaryDirectory's exit finalizer would
    run in every rank forked from the warm start's fork server (a fork of this process,
    launcher.warm_start) as the rank ran its exit handlers, and remove the folder under
    the agent."""
    folder = tempfile.mkdtemp(prefix="launcher-outcome-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def agent_args(argv: list[str]) -> Namespace:
    """torchrun's arguments, the ranks started warm where asked (launcher.warm_start: its
    fork server started here, a fork of this process, which must have no thread of its own
    yet), a lost node dropped from the rendezvous as soon as its silence tells
    (`prompt_keep_alive`)."""
    args = torch_run.parse_args(argv)
    args.rdzv_conf = prompt_keep_alive(args.rdzv_conf)
    if warm_start.wanted(args):
        args = warm_start.warm(args)
        # torchrun's defaults into this environment first (OMP_NUM_THREADS=1 for several
        # ranks): each rank sets its OpenMP threads from it (launcher.warm_start.rank_main)
        torch_run.config_from_args(args)
        warm_start.start_server()
    return args


@record
def run_agent(args: Namespace) -> None:
    """torchrun's `main` with the arguments of `agent_args`, its rendezvous polled as often
    as the job's size allows (launcher.runtime.rendezvous_poll)."""
    _, nodes = torch_run.parse_min_max_nnodes(args.nnodes)
    poll = rendezvous_poll.poll_s(nodes)
    with keep_alive_stopped_by_this_thread(poll), rendezvous_poll.polled_every(poll):
        torch_run.run(args)


@contextlib.contextmanager
def keep_alive_stopped_by_this_thread(poll_s: float):
    """The rendezvous handlers torchrun makes inside, their state read again after `poll_s`
    (launcher.runtime.rendezvous_poll), held until their keep-alive timers are stopped from
    this thread as the agent ends, however it ends.

    On a stop signal torchrun leaves its handler open (so that a replacement may still join
    the rendezvous) and lets it go with the exception's frames. The handler's keep-alive
    timer (a beat a second here, KEEP_ALIVE) is stopped by a weakref finalizer that joins
    the timer's thread; when that thread held the handler's last reference at that moment
    (in the middle of a beat), the finalizer ran in the timer's own thread and printed
    "RuntimeError: cannot join current thread" with a traceback into the job's output.
    The rendezvous is not closed here: only the timer is stopped, by the thread that
    lets the handler go."""
    made = []
    create = rendezvous_registry.get_rendezvous_handler

    def held(params):
        handler = create(params)
        rendezvous_poll.cache_for(handler, poll_s)
        made.append(handler)
        return handler

    rendezvous_registry.get_rendezvous_handler = held
    try:
        yield made
    finally:
        rendezvous_registry.get_rendezvous_handler = create
        for handler in made:
            stop = getattr(handler, "_stop_heartbeats", None)  # torch's dynamic rendezvous
            if stop is not None:
                stop()


def lost_at_end(presence, ranks: dict[int, int], succeeded: bool, chosen: dict) -> str | None:
    """The lost-node line for a job whose ranks crashed (torchrun ended without waiting for
    a replacement: no restart left) while another node's heartbeat stopped; else None."""
    if exit_codes.job_code(ranks, succeeded, chosen) != exit_codes.CRASH:
        return None
    silent = presence.silent_at_end()
    return node_presence.lost_line(silent) if silent else None


def killed_before_checkpoint(signal_name: str) -> str:
    """Why a stop signal ended without the stop checkpoint: the ranks were still in a phase
    that cannot be cut short when torchrun's shutdown wait ran out, and it SIGKILLed them."""
    return (
        f"launcher.torchrun: no stop checkpoint: the ranks had not reached a step boundary "
        f"when torchrun's --shutdown-timeout (default 30 s, or TORCH_ELASTIC_SHUTDOWN_TIMEOUT) "
        f"ran out after {signal_name}, and it killed them (a first torch.compile, data "
        f"preparation, a stalled rank); the next launch resumes from the last complete "
        f"checkpoint. To let such a stop finish, raise --shutdown-timeout"
    )


if __name__ == "__main__":
    sys.exit(main())
