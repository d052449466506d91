"""Folders of the memory tier sent between nodes: peer copies (trainer.memory_checkpoint_peer)
and the moves a restart makes (launcher.checkpoint.memory.recovery).

With peer copies, each rank's sealed memory checkpoint is also kept in the memory of one
rank on the next node, so that a node lost whole (its memory with it) costs the restart at
most one memory interval, not everything since the durable checkpoint. Nodes form a ring in
the order of their first rank; a rank's peer is the rank at the same place on the next node,
and the rank it keeps a copy for (its ward) the one at that place on the node before. After
each memory checkpoint is sealed, every rank sends its folder's files to its peer and
receives its ward's into `<node folder>/peer/rank<ward>/`, point to point on a gloo group
of the tier's, from the tier's writing thread while training goes on; the rank's older
step is removed only once every peer holds the newer one (each says which copy it holds at
a later step's stop vote), so a node lost in between still finds the older step whole. A
restart moves folders the same way, in rounds where each rank sends and receives at most
one.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.memory import node_share
from launcher.checkpoint.memory.recovery import Move, rounds

PEER = "peer"  # <node folder>/peer/rank<w>/step_<n>/: this node's copies of rank w's


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


def duplicate(folder: Path, final: Path) -> None:
    """`folder` as `final` on the same node: hard links where the file system has them (a
    tmpfs does: no second copy of the bytes), else a copy; renamed into place when whole."""
    tmp = final.parent / f"{checkpoint.TMP_PREFIX}{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(folder, tmp, copy_function=os.link)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def exchange(send: torch.Tensor | None, to: int | None, recv: torch.Tensor | None,
             frm: int | None, group) -> None:  # fmt: skip
    """Send `send` to rank `to` while receiving into `recv` from rank `frm`, at once: a ring
    of sends, so none may wait for its own to finish. None (or no rank): that half is not
    done; each rank's halves match its partners' (the ring, or a restart's moves, is the
    same list on every rank)."""
    ops = []
    if send is not None and to is not None:
        ops.append(dist.P2POp(dist.isend, send, to, group))
    if recv is not None and frm is not None:
        ops.append(dist.P2POp(dist.irecv, recv, frm, group))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()


def swap(blob: torch.Tensor | None, to: int | None, frm: int | None, dest: Path, group) -> bool:
    """Send `blob` (None: nothing) to rank `to` while receiving from rank `frm` into the
    folder `dest`; whether one came. Point to point only: the sizes first (0: nothing
    follows), then the bytes. No rank waits for any but its two partners: a gather of every
    rank's size and then of its word that the copy came (two collectives of the whole group
    each) cost the loop 56 ms a copy at 16 ranks on two cores, 43 ms point to point
    (benchmarks/peer_copy.py, docs/benchmarks.md)."""
    size = torch.tensor([0 if blob is None else blob.numel()], dtype=torch.int64)
    coming = torch.zeros(1, dtype=torch.int64)
    exchange(size, to, coming, frm, group)
    got = torch.empty(int(coming), dtype=torch.uint8) if frm is not None and coming else None
    exchange(blob, to, got, frm, group)
    if got is None:
        return False
    try:
        unpack(got, dest)
    except OSError:  # this node's memory is full: the ward keeps its own older step
        return False
    return True


def move(moves: list[Move], rank: int, step: int, node_folder: Path, group) -> None:
    """Carry out a restart's moves between nodes (every rank calls it with the same list),
    in rounds where each rank sends and receives at most one folder."""
    name = checkpoint.step_name(step)
    for batch in rounds(moves):
        out = next((m for m in batch if m.src == rank), None)
        into = next((m for m in batch if m.dst == rank), None)
        blob = None
        if out is not None:
            held = node_folder / PEER if out.copy else node_folder
            blob = pack(held / f"rank{out.rank}" / name)
        dest = node_folder / f"rank{into.rank}" / name if into else node_folder
        swap(blob, out and out.dst, into and into.src, dest, group)


def keep_newest(folder: Path, step: int) -> None:
    """Remove the complete checkpoints in `folder` older than `step`."""
    for path in checkpoint.scan(folder).complete:
        if checkpoint.step_of(path) < step:
            shutil.rmtree(path, ignore_errors=True)
