"""The training and evaluation batch order, defined by index arithmetic on the step.

The global index stream is the concatenation over epochs e = 0, 1, ... of a permutation of
all window indices drawn from a generator seeded by (seed, e). Global batch s is the slice
stream[s * global_batch : (s + 1) * global_batch]; rank r reads the r-th contiguous part of
it, cut into micro-batches in order. So the data position is the step: ranks never overlap,
world sizes 1 and 2 train on the same sequences per step, and a resumed run reads exactly
what an uninterrupted one would, without replaying the stream to get there.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from launcher.config.batch import BatchPlan
from launcher.runtime.fork_guard import guard_forks
from launcher.runtime.process_tree import STOP_SIGNALS as TRAINER_STOP_SIGNALS


class StepBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches of window indices, step after step, forever, from
    the data window `start_step` on, past the windows in `skip` (the global batches a rewind
    skipped: trainer.on_nonfinite=rewind), which are never read."""

    def __init__(
        self,
        num_windows: int,
        plan: BatchPlan,
        *,
        rank: int,
        seed: int,
        start_step: int,
        skip: frozenset[int] = frozenset(),
    ):
        if num_windows < 1:
            raise ValueError("the training split has no window; it needs seq_len + 1 tokens")
        problem = plan.problem()
        if problem:
            raise ValueError(problem)
        self.num_windows = num_windows
        self.global_batch = plan.global_batch
        self.micro_batch = plan.micro_batch
        self.per_rank = plan.per_rank
        self.rank = rank
        self.seed = seed
        self.start_step = start_step
        self.skip = skip
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.int64)

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.windows():
            part = self.rank_batch(step)
            for m in range(0, self.per_rank, self.micro_batch):
                yield part[m : m + self.micro_batch]

    def windows(self) -> Iterator[int]:
        """The data windows (global batches, by step) read, in order: one a training step,
        which the trainer counts its data position by."""
        return (step for step in itertools.count(self.start_step) if step not in self.skip)

    def rank_batch(self, step: int) -> list[int]:
        """This rank's window indices of (0-based) step `step`, in micro-batch order."""
        return self.positions(step * self.global_batch + self.rank * self.per_rank, self.per_rank)

    def positions(self, first: int, count: int) -> list[int]:
        """Window indices at stream positions [first, first + count), across epoch ends."""
        out: list[int] = []
        pos = first
        while len(out) < count:
            epoch, offset = divmod(pos, self.num_windows)
            take = min(count - len(out), self.num_windows - offset)
            out.extend(self._permutation(epoch)[offset : offset + take].tolist())
            pos += take
        return out

    def _permutation(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            state = np.random.SeedSequence([self.seed % 2**64, epoch]).generate_state(1, np.uint64)
            gen = torch.Generator().manual_seed(int(state[0]))
            self._perm = torch.randperm(self.num_windows, generator=gen)
            self._epoch = epoch
        return self._perm


# The stop signals torchrun forwards (to the worker's whole process group), Slurm sends to
# every process of a step, and a terminal sends on Ctrl-C. The trainer turns them into a
# checkpoint at the next step boundary; that needs its loader workers alive until then.
# SIGQUIT ends the trainer at once; its workers then end by themselves (parent gone).
STOP_SIGNALS = (*TRAINER_STOP_SIGNALS, signal.SIGQUIT)


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader worker start-up: leave stop signals to the trainer process.

    Without this a SIGTERM meant for the trainer also kills its workers, and the trainer
    fails with "DataLoader worker is killed by signal" before it can write the stop
    checkpoint. Ignored workers still end with the trainer: DataLoader shuts them down,
    and each one exits by itself when its parent process is gone.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    # Born with them blocked (`stop_signals_held`): one that arrived in between is
    # discarded now that it is ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def quiet_when_the_rank_is_gone() -> None:
    """DataLoader worker start-up: a rank that dies while it takes a batch leaves no
    traceback in its worker.

    A worker hands each batch's shared memory to its rank as a file descriptor, through
    multiprocessing's resource sharer: a thread in the worker that the rank connects to.
    A rank killed between the batch's message and that connection (SIGKILL, the OOM
    killer, a restart's SIGTERM) resets it, and the thread prints a ConnectionResetError
    or EOFError traceback under the rank's name, where the agent already reports the
    rank's end: noise that reads like a second fault. A live rank that fails the handoff
    raises in its own loader, so the worker's side has nothing to add; every other error
    still prints."""
    shown = sys.excepthook

    def unless_the_rank_left(kind, value, traceback) -> None:
        if not issubclass(kind, (ConnectionError, EOFError)):
            shown(kind, value, traceback)

    sys.excepthook = unless_the_rank_left


def close_the_ranks_connections() -> None:
    """DataLoader worker start-up: close the worker's copies of its rank's network
    connections (gloo's to every other rank, the c10d store's).

    A worker is forked from its rank, after the process group exists, and so holds every
    socket the rank had open; a connection closes only once the last process holding it has
    let it go. A rank that died (SIGKILL, the kernel's OOM killer, an exit after an error)
    so kept its peers waiting in their collective until its workers too had ended, which
    they do when their watchdog finds the rank gone (every 5 s): on 4 nodes x 4 the first
    peer learned of a SIGKILLed rank 4.9 s after the kill, every time. A worker reads this
    node's data and never uses the rank's connections. Its local sockets stay: it hands
    batches to its rank through one (multiprocessing's resource sharer)."""
    if not os.path.isdir("/proc/self/fd"):
        return  # not Linux: the workers keep them, as before
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue  # not a socket (or the listing's own, closed already)
        family = sock.family
        sock.detach()  # the check must not close it
        if family in (socket.AF_INET, socket.AF_INET6):
            os.close(int(name))


def start_worker(worker_id: int, loop_over=None) -> None:
    """Each DataLoader worker's init function: stop signals left to the trainer (until
    `loop_over`, then a SIGTERM ends it: `end_workers`), its rank's connections closed,
    and quiet when its rank is gone."""
    ignore_stop_signals(worker_id)
    if loop_over is not None:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0) if loop_over.is_set() else None)
    close_the_ranks_connections()
    quiet_when_the_rank_is_gone()


def end_workers(loader: DataLoader, batches) -> None:
    """End the workers of `loader`'s iterator `batches` now, its loop over (finished,
    stopped, failed, or giving way to a new loader).

    torch ends them by sending each one None and joining it for 5 s, then SIGTERM and 5 s
    more. Ours ignore SIGTERM (a stop is the trainer's), so where the None does not reach
    them the rank sat 20 s in that shutdown: a rank that failed does it as the traceback
    that held its iterator is collected, with its process group still open, and its peers
    and its torchrun agent waited for it (20 s a rank along the ring, on 4 nodes x 2 after
    one rank exited). Once the loop is over a worker takes SIGTERM as the end: it exits 0,
    which torch's watch of its workers takes as a clean end."""
    loop_over = getattr(loader, "loop_over", None)
    if loop_over is None:
        return
    loop_over.set()
    for worker in getattr(batches, "_workers", ()):  # torch's iterator's worker processes
        if worker.is_alive():
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGTERM)


@contextlib.contextmanager
def stop_signals_held():
    """Start DataLoader workers (`iter(loader)`) inside this: they are forked with the stop
    signals blocked, until `ignore_stop_signals` ignores them.

    Between its fork and its init function a worker runs torch's own SIGTERM handler,
    which kills it: a stop signal sent to the whole process group at that moment (torchrun
    and Slurm do, and a tuner starts workers for every trial) would take a worker down
    instead of becoming the trainer's stop checkpoint. The trainer process itself loses
    nothing: its signals are held only in this thread, and delivered when the block ends.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def reap_workers() -> None:
    """Kill this process's remaining DataLoader workers (at process exit).

    A loader that ended in an exception can outlive its loop: the traceback keeps its
    iterator, and so its workers, alive. At exit, multiprocessing terminates daemonic
    children with SIGTERM, which these workers ignore, and then joins them: the process
    would never end. SIGKILL cannot be ignored, and nothing is left for them to do.
    """
    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)


def build_train_loader(
    windows: Dataset,
    plan: BatchPlan,
    *,
    rank: int,
    seed: int,
    start_step: int,
    skip_windows: frozenset[int] = frozenset(),
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int,
    wrap_windows: Callable[[Dataset, StepBatchSampler], Dataset] | None = None,
) -> DataLoader:
    """An endless loader of (x, y) micro-batches [plan.micro_batch, seq_len] in step order,
    from the data window `start_step` on, past `skip_windows` (its `batch_sampler.windows()`
    says which window each step reads).

    `wrap_windows` may replace the dataset once the sampler exists (fault injection uses it
    to fail one step's fetch in the worker)."""
    sampler = StepBatchSampler(
        len(windows), plan, rank=rank, seed=seed, start_step=start_step, skip=skip_windows
    )
    if num_workers > 0:
        guard_forks()  # the workers are forked from a process with gloo's threads running
    loop_over = multiprocessing.Event() if num_workers > 0 else None  # set by end_workers
    worker_opts = (
        {
            "persistent_workers": persistent_workers,
            "prefetch_factor": prefetch_factor,
            "worker_init_fn": functools.partial(start_worker, loop_over=loop_over),
        }
        if num_workers > 0
        else {}
    )
    if wrap_windows is not None:
        windows = wrap_windows(windows, sampler)
    loader = DataLoader(
        windows,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **worker_opts,
    )
    loader.loop_over = loop_over
    return loader


def build_eval_batches(
    windows: Dataset, *, micro_batch: int, num_batches: int, rank: int, world_size: int
) -> list[tuple[Tensor, Tensor]]:
    """A fixed held-out set: the first num_batches * micro_batch * world_size windows.

    Indices wrap around a split smaller than that; rank r takes its contiguous part, so the
    ranks' losses average to the loss over the same set at any world size.
    """
    if len(windows) == 0:
        raise ValueError("the validation split has no window; it needs seq_len + 1 tokens")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    per_rank = num_batches * micro_batch
    first = rank * per_rank
    indices = [(first + i) % len(windows) for i in range(per_rank)]
    batches = []
    for m in range(0, per_rank, micro_batch):
        pairs = [windows[i] for i in indices[m : m + micro_batch]]
        batches.append((torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])))
    return batches
