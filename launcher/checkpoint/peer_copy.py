"""Peer copies of the memory tier (trainer.memory_checkpoint_peer): each rank's sealed memory
checkpoint also kept in the memory of one rank on the next node, so that a node lost
whole (its memory with it) costs the restart at most one memory interval, not everything
since the durable checkpoint.

Nodes form a ring in the order of their first rank; a rank's peer is the rank at the same
place on the next node, and the rank it keeps a copy for (its ward) the one at that place
on the node before. After each memory checkpoint is sealed, every rank sends its folder's
files to its peer and receives its ward's, on a gloo group of their own, from the tier's
writing thread while training goes on. A restart that finds a rank without the step the
others hold gets the files back from that rank's peer, so every rank holds the step again
and the ranks restore together as usual (launcher.checkpoint.memory).
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.checkpoint import node_share
from launcher.checkpoint import protocol as checkpoint

PREFIX = "peer-of-rank"  # <tier folder>/peer-of-rank<w>/step_<n>/: rank w's copy


def ring(node_of_rank: list[str]) -> dict[int, int] | None:
    """rank -> its peer: the rank at the same place on the next node (nodes ordered by
    their first rank). None where a peer copy cannot survive a node's loss: one node, or
    nodes of different numbers of ranks."""
    groups = node_share.nodes(node_of_rank)
    if len(groups) < 2 or len({len(g) for g in groups}) > 1:
        return None
    return {
        rank: groups[(n + 1) % len(groups)][place]
        for n, group in enumerate(groups)
        for place, rank in enumerate(group)
    }


def pack(folder: Path) -> torch.Tensor:
    """A sealed checkpoint folder's files (name -> bytes) as one byte tensor to send."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    return torch.frombuffer(bytearray(pickle.dumps(files)), dtype=torch.uint8)


def unpack(blob: torch.Tensor, final: Path) -> None:
    """Write the files `pack` sent as the folder `final`: into a temporary folder first,
    renamed into place when whole (a copy cut short is never taken for a checkpoint)."""
    files = pickle.loads(blob.numpy().tobytes())  # noqa: S301 - our own ranks' bytes
    tmp = final.parent / f"{checkpoint.TMP_PREFIX}{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def exchange(send: torch.Tensor | None, to: int | None, sizes: list[int], frm: int | None,
             group) -> torch.Tensor | None:  # fmt: skip
    """Send `send` to rank `to` and receive from rank `frm` (whose size is in `sizes`, every
    rank's, by rank) at once: a ring of sends, so none may wait for its own to finish."""
    ops, got = [], None
    if send is not None and to is not None:
        ops.append(dist.P2POp(dist.isend, send, to, group))
    if frm is not None:
        got = torch.empty(sizes[frm], dtype=torch.uint8)
        ops.append(dist.P2POp(dist.irecv, got, frm, group))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return got


def keep_newest(folder: Path, step: int) -> None:
    """Remove a ward's copies older than `step` (the tier keeps its newest)."""
    for path in checkpoint.scan(folder).complete:
        if checkpoint.step_of(path) < step:
            shutil.rmtree(path, ignore_errors=True)
