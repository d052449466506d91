"""A DataLoader worker does not keep its rank's peers waiting: it holds none of the rank's
network connections (launcher.data.loader.close_the_ranks_connections), and it ends at once
when the rank's loop is over (end_workers)."""

from __future__ import annotations

import os
import signal
import socket

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from launcher.config.batch import BatchPlan
from launcher.data.loader import build_train_loader, end_workers, start_worker, stop_signals_held

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")


def inet_sockets() -> int:
    """The TCP sockets this process holds, from the kernel's tables (/proc/net/tcp*)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            inodes |= {line.split()[9] for line in list(lines)[1:]}
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own, closed since
            continue
    return sum(1 for link in held if link.startswith("socket:[") and link[8:-1] in inodes)


class Probe(Dataset):
    """Two items: the TCP sockets held by the process that reads it (the worker)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(inet_sockets())


def test_the_ranks_connection_closes_when_the_rank_lets_go_though_its_worker_lives():
    server = socket.create_server(("127.0.0.1", 0))
    rank_side = socket.create_connection(server.getsockname())  # as gloo's pair to a peer
    peer_side, _ = server.accept()
    batches = iter(DataLoader(Probe(), num_workers=1, worker_init_fn=start_worker))
    try:
        assert inet_sockets() >= 3  # the rank: its listener and both ends
        assert next(batches).item() == 0  # the worker, forked after them, holds none
        rank_side.close()  # the rank's end goes (the rank died), its worker still alive
        peer_side.settimeout(10)
        assert peer_side.recv(1) == b""  # the peer sees the connection closed, at once
        assert next(batches).item() == 0
        assert next(batches, None) is None  # the loader ends, and its worker with it
    finally:
        for sock in (rank_side, peer_side, server):
            sock.close()


class Windows(Dataset):
    """Sixteen (x, y) windows of four tokens."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        tokens = torch.arange(index, index + 5)
        return tokens[:-1], tokens[1:]


def test_a_loop_that_is_over_ends_its_workers_at_once_though_its_iterator_lives():
    """A failed rank's traceback holds its loader's iterator: torch's shutdown, when the
    traceback is collected, joined each worker 5 s and SIGTERMed it (which ours ignore)
    and joined 5 s more. `end_workers` ends them at once, exit code 0 (no "worker killed"
    error from torch's watch of them), while the iterator is still held; before it, a
    SIGTERM (a stop meant for the trainer) leaves them running."""
    plan = BatchPlan(global_batch=2, micro_batch=1, world_size=1, seq_len=4)
    loader = build_train_loader(Windows(), plan, rank=0, seed=0, start_step=0,
                                num_workers=2, pin_memory=False, persistent_workers=True,
                                prefetch_factor=2)  # fmt: skip
    with stop_signals_held():
        batches = iter(loader)
    next(batches)
    workers = list(batches._workers)  # torch's iterator's worker processes
    for worker in workers:
        os.kill(worker.pid, signal.SIGTERM)  # a stop for the trainer: the workers stay
    next(batches)
    assert all(worker.is_alive() for worker in workers)
    end_workers(loader, batches)
    for worker in workers:
        worker.join(timeout=10)
    assert [worker.exitcode for worker in workers] == [0, 0]
    next(batches, None)  # the iterator, still alive, sees no failed worker
