"""Warm start: each agent imports torch and the trainer once, and forks its ranks from that.

A rank spends most of its start importing (torch, Hydra, torch._dynamo: 2-3 CPU-s each),
and torchrun starts every rank as a new interpreter, again at every restart: after a
fault, 16 ranks on one machine import the same modules 16 times before the first step.
By default (`LAUNCHER_WARM_START=0` turns it off), `python -m launcher.torchrun ... -m
launcher.<module>` runs torchrun's own in-process entry point (`--run-path`) under
multiprocessing's fork server (`--start-method forkserver`): the agent's fork server
imports `launcher.warm_preload` once, and every rank of every attempt is a fork of it that
runs `launcher.<module>` as `python -u -m` would. The agent, its rendezvous, signals,
restarts and exit codes are torchrun's as before.

What differs for a user: `ps` shows each rank with the fork server's command line
(`python -c from multiprocessing.forkserver import main ...`), not the training command;
a rank's `/proc/<pid>/environ` is the fork server's (the rank's `RANK` is in its own
environment, and in the front door's outcome folder, `exit_codes.report_pid`). Plain
`torchrun` and a training script (not `-m launcher.*`) start cold as before.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import io
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import shlex
import signal
import socket
import sys
import traceback
import warnings
from argparse import Namespace
from multiprocessing import connection, resource_tracker, spawn, util

from launcher.runtime.process_tree import GROUP_SIGNALS
from launcher.runtime.process_tree import WARM_COMMAND_ENV as COMMAND_ENV

ENV = "LAUNCHER_WARM_START"
PRELOAD = "launcher.warm_preload"  # what the fork server imports (and freezes) once


def restore_signals() -> None:
    """In a forked rank: the dispositions an interpreter starts with (Python's KeyboardInterrupt
    for SIGINT, the system's default for the others), as a cold rank has them."""
    for sig in GROUP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def wanted(args: Namespace, environ=os.environ) -> bool:
    """Whether this launch starts warm: asked for, and a launcher module run with Python
    (a script, `--no-python` or torchrun's own `--run-path` keep torchrun's start)."""
    asked = environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")
    ours = args.module and args.training_script.split(".")[0] == "launcher"
    return bool(asked and ours and not args.no_python and not args.run_path)


class WithoutExitTraceback(logging.Filter):
    """torchrun's agent logs a forked rank's non-zero exit with the traceback of its own
    wait (`ProcessExitedException: process 0 terminated with exit code 2`), where a cold
    start's says `failed (exitcode: 2) ... of binary`: the line stays, the traceback, which
    says nothing about the rank, goes (a rank's own traceback is in its log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from torch.multiprocessing import ProcessExitedException

        if record.exc_info and isinstance(record.exc_info[1], ProcessExitedException):
            record.exc_info, record.exc_text = None, None
        return True


AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def warm(args: Namespace) -> Namespace:
    """torchrun's arguments for a warm start of the same launch: its in-process entry point
    (`--run-path`) running this file's `rank_main` with the module and its arguments, each
    rank forked by the fork server that imported `PRELOAD`."""
    multiprocessing.set_forkserver_preload([PRELOAD])
    logging.getLogger(AGENT_LOGGER).addFilter(WithoutExitTraceback())
    os.environ[COMMAND_ENV] = shlex.join(["-m", args.training_script, *args.training_script_args])
    args.run_path, args.start_method = True, "forkserver"
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.training_script, args.module = __file__, False
    return args


# multiprocessing.forkserver.main's parameters where `start_server` can fork it (Python 3.11's,
# which 3.10 shares); a Python whose server takes others gets multiprocessing's own start.
FORKABLE_MAIN = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def start_server() -> None:
    """Start the fork server now, before the rendezvous and before the agent starts any
    thread: it imports while the agent waits there (for the other nodes, or for a lost node
    to be dropped) instead of after, and the first ranks it forks are ready that much sooner
    (multiprocessing would start it at the first rank). A rank takes its environment from
    the agent at its start (torchrun sets it in the child), so a server started early forks
    the ranks a late one would.

    The server is a fork of the agent, which has imported torch already, not a new
    interpreter that imports it again (multiprocessing's way): 2.6 of a node's 3.9 CPU-s of
    a cold start's server, four nodes' worth on a shared machine at every launch and
    requeue, and the pages the two share. It is multiprocessing's own server loop
    (`forkserver.main`, given the agent's `forkserver` the address, the pipe and the pid its
    own start records), so torchrun's `forkserver` start method forks every rank from it."""
    server = multiprocessing.forkserver._forkserver
    if tuple(inspect.signature(multiprocessing.forkserver.main).parameters) != FORKABLE_MAIN:
        multiprocessing.forkserver.ensure_running()
        return
    resource_tracker.ensure_running()
    # what multiprocessing hands its own server: where __main__ and the imports come from
    data = spawn.get_preparation_data("ignore")
    paths = {key: data[key] for key in ("main_path", "sys_path") if key in data}
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when the agent's end closes
        with warnings.catch_warnings():
            # Python 3.12+ warns of a fork with threads: the one besides this is a native
            # thread of torch's import, beside which a server that imported torch itself
            # forked its ranks all the same.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            serve(listener.fileno(), alive_r, alive_w, server._preload_modules, paths)
        os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid


def serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str], paths: dict):
    """The fork server's life, in the agent's fork: never back into the agent's code (its
    `with` blocks and exit handlers are the agent's), whatever ends the loop."""
    code = 1
    try:
        os.close(alive_w)
        multiprocessing.forkserver.main(listener_fd, alive_r, preload, **paths)
        code = 0
    except SystemExit as end:  # the agent's end of the pipe closed: the server's normal end
        code = end.code if isinstance(end.code, int) else 0
    except BaseException:  # noqa: BLE001 - said on stderr, then the fork ends
        traceback.print_exc()
    finally:
        os._exit(code)


def unbuffered_stdio() -> None:
    """What `python -u` (torchrun's cold start) does: every write reaches the log at once, so
    that a rank's lines interleave with its peers' as they happen and none is lost when
    the rank is killed."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None:
            continue
        stream.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=stream.encoding,
                                            errors=stream.errors, write_through=True))  # fmt: skip


def take_thread_count(environ=os.environ) -> None:
    """The intra-op thread count a cold rank starts with: OpenMP reads OMP_NUM_THREADS when
    torch loads, and the agent that the fork server was forked from loaded torch before
    torchrun set it for its ranks (1 each where several share a node and the user set
    none)."""
    threads = environ.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def rank_main(argv: list[str]) -> None:
    """One forked rank: `python -u -m <module> <args>` in all but the process's birth.

    A forked child of multiprocessing leaves without running exit handlers (logging's
    flush, W&B's finish) and reports an uncaught exception only to its parent's error
    file: this runs the handlers and prints the traceback to the rank's own stderr, exit
    1, as an interpreter does."""
    from launcher.resilience import exit_codes

    gc.enable()  # off in the fork server (launcher.warm_preload); a module may turn it off
    restore_signals()
    # A process that multiprocessing starts inherits its parent's start method (here the
    # fork server); the rank's own children (DataLoader workers) start as in an interpreter
    # (the platform's first method): through the fork server, each would load torch again.
    multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    # multiprocessing hands a process it starts its parent's temporary folder (pymp-*),
    # where the agent keeps its sockets: shared, the agent's exit once found its own files
    # there gone (a traceback after a hang's last line). A rank makes its own, as a cold one.
    multiprocessing.current_process()._config["tempdir"] = None
    take_thread_count()
    unbuffered_stdio()
    exit_codes.report_pid()
    module, args = argv[0], argv[1:]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Exception:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        atexit._run_exitfuncs()


if __name__ == "__main__":  # torchrun's run_script_path, in each forked rank
    rank_main(sys.argv[1:])
