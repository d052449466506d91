"""The memory tier: every rank's state (its shard, for a sharded engine) in node-local memory
every few steps, so that a rank lost between two durable checkpoints costs at most
`trainer.memory_checkpoint_interval` steps once torchrun restarts the job (docs/checkpoints.md,
"The memory tier").

Each rank writes into its own folder,
`<trainer.memory_checkpoint_dir>/launcher-<uid>-<hash of the run directory>/rank<r>/`, with
the durable checkpoints' protocol (launcher.checkpoint.protocol.CheckpointWriter): every
rank seals its own `step_<n>` once every rank has written its files, so a step is complete
on one rank only when all ranks wrote it. Node-local memory is seen by one node's ranks
only: no rank reads another's folder, and the step every rank can load is agreed by
gathering each rank's complete steps.

A memory checkpoint is loaded only by a launch of the same run directory, run id, world size
and rank, with nothing the resume check refuses, of the same lineage as the run's newest
durable checkpoint (or, before the first one, of the same launch: torchrun's rendezvous id,
Slurm's job id). That is what an in-job restart resumes, and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch.distributed as dist

from launcher.checkpoint import node_share, peer_copy
from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.resume import differences
from launcher.config.model_shape import param_count
from launcher.config.registry import engine
from launcher.runtime.process import Runtime, launch_key

log = logging.getLogger("launcher")

# Steps between two memory checkpoints when trainer.memory_checkpoint_interval is null and
# torchrun restarts the job: a restart then redoes at most 10 steps; the measured cost at
# the default job's shape is in docs/checkpoints.md.
DEFAULT_INTERVAL = 10
KEEP = 1  # complete memory checkpoints kept per rank (a second one exists while one is written)
SHM = Path("/dev/shm")


def restarts_from_env() -> int:
    """torchrun's --max-restarts, as its agent tells every worker (0 outside torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        return 0


def interval(cfg, restarts: int | None = None) -> int:
    """trainer.memory_checkpoint_interval as it applies to `cfg`: null means DEFAULT_INTERVAL
    where torchrun restarts the job (`restarts`, else this process's torchrun) and the
    engine can write the tier, 0 otherwise."""
    chosen = cfg.trainer.memory_checkpoint_interval
    if chosen is not None:
        return int(chosen)
    restarts = restarts_from_env() if restarts is None else restarts
    able = engine(cfg.strategy.name).memory_tier is not None
    return DEFAULT_INTERVAL if restarts > 0 and able else 0


def state_bytes(cfg, world_size: int = 1) -> int:
    """One rank's memory checkpoint, estimated by its engine from the model's shape: the
    whole model and optimizer state (DDP), or this rank's shard of it at `world_size` (FSDP2,
    DeepSpeed's partitions; the default 1 is the largest a rank can need)."""
    tier = engine(cfg.strategy.name).memory_tier
    return tier.checkpoint_bytes(cfg, param_count(cfg.model), world_size) if tier else 0


def node_state_bytes(cfg, procs_per_node: int, world_size: int) -> int:
    """One memory checkpoint on one node of `procs_per_node` ranks: the state every rank
    holds alike once (its ranks write a part each, launcher.checkpoint.node_share), the
    state each rank holds alone once per rank."""
    one = state_bytes(cfg, world_size)
    tier = engine(cfg.strategy.name).memory_tier
    return one if tier and tier.replicated else one * procs_per_node


def in_shm(cfg) -> bool:
    root = Path(cfg.trainer.memory_checkpoint_dir).expanduser()
    return root == SHM or SHM in root.parents


def shm_bytes(
    cfg, procs_per_node: int, world_size: int | None = None, restarts: int | None = None
) -> int:
    """What the tier puts in /dev/shm on one node of `procs_per_node` ranks of `world_size`
    (default: that node alone): the kept checkpoint and the one being written, and as much
    again for the node before's with trainer.memory_checkpoint_peer (0 when the tier is off
    or writes elsewhere)."""
    if not interval(cfg, restarts) or not in_shm(cfg):
        return 0
    own = (KEEP + 1) * node_state_bytes(cfg, procs_per_node, world_size or procs_per_node)
    # Peer copies: the ward node's kept copy, and the next one while it is received.
    return own * 2 if cfg.trainer.memory_checkpoint_peer else own


def held_bytes(root: str, run_dir: Path) -> int:
    """Bytes this run's tier already holds on this node (an earlier launch's checkpoints,
    which this launch's replace): room the tier has besides the free space."""
    folder = rank_folder(root, run_dir, 0).parent
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def node_key(root: Path) -> str:
    """What names the memory a tier folder lives in, the same on every rank that shares it:
    the host, the tier's root and its file system (the device of the root, or of its nearest
    existing parent before the first save creates it)."""
    root = root.expanduser().absolute()
    there = root
    while not there.exists() and there != there.parent:
        there = there.parent
    return f"{socket.gethostname()}:{os.stat(there).st_dev}:{root}"


def lost_ranks(everyone: list[list[int]], after: int, best: int | None):
    """(step, ranks): the newest step past `after` and past `best` that some ranks hold and
    others do not (those others), or None: what a lost node costs the restart."""
    held = {s for steps in everyone for s in steps if s > after and (best is None or s > best)}
    if not held:
        return None
    step = max(held)
    return step, [r for r, steps in enumerate(everyone) if step not in steps]


def compact(ranks: list[int]) -> str:
    """Ranks as runs: [4, 5, 6, 7, 9] -> '4-7, 9'."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in runs)


def rank_folder(root: str, run_dir: Path, rank: int) -> Path:
    """This rank's folder of the tier: one per user and run directory."""
    key = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return Path(root).expanduser() / f"launcher-{os.getuid()}-{key}" / f"rank{rank}"


class MemoryTier:
    """One rank's memory checkpoints: written by a thread from a snapshot taken between two
    steps, sealed at the next step (CheckpointWriter's protocol, every rank its own folder).

    All ranks call `save`, `complete` and `newest_common` at the same steps (each gathers on
    the control group). A write that fails on any rank (memory full) turns the tier off on
    every rank, with one warning: the durable checkpoints go on as before."""

    def __init__(self, root: str, every: int, rt: Runtime, identity: dict, peer: bool = False):
        self.every = every
        self.rt = rt
        self.folder = rank_folder(root, rt.run_dir, rt.rank)
        self.expect = {
            "tier": "memory",
            "run_dir": str(Path(rt.run_dir).resolve()),
            "run_id": rt.run_id,
            "rank": rt.rank,
            "launch": launch_key(),
        }
        self.writer = checkpoint.CheckpointWriter(
            self.folder,
            is_main=True,  # each rank seals its own folder, after every rank has written
            barrier=lambda: None,
            keep=KEEP,
            meta={**identity, **self.expect},
            gather=rt.all_gather_objects,
        )
        self.identity = identity
        nodes = rt.all_gather_objects(node_key(Path(root)))
        self.share = node_share.shares(nodes, rt.rank)
        self.peers = Peers(self, nodes) if peer else None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="memory-checkpoint")
        self.on = True
        self._sealing: int | None = None  # the step whose save is in progress
        checkpoint.remove_leftovers(checkpoint.scan(self.folder))  # this launch holds the lock

    def follow(self, lineage: str) -> None:
        """Write (and prune) in the lineage the durable checkpoints continue."""
        self.writer.meta["lineage"] = lineage
        self.writer.prunable = {lineage}

    @property
    def lineage(self) -> str:
        return self.writer.meta["lineage"]

    def due(self, step: int) -> bool:
        return self.on and step % self.every == 0

    def save(self, step: int, snapshot: Callable[[Path], None], meta: dict) -> None:
        """Start writing `snapshot` (this rank's state, copied already) as step `step`."""
        self.complete()
        self._sealing = step
        self._guarded(
            lambda: self.writer.save(step, lambda tmp: self.pool.submit(snapshot, tmp), meta)
        )

    def complete(self) -> None:
        """Seal the save in progress (every rank's files written), if any; then, with peer
        copies, send it to this rank's peer from the writing thread."""
        step, self._sealing = self._sealing, None
        if self.on:
            self._guarded(self.writer.complete)
        if self.on and step is not None and self.peers is not None:
            self.peers.send(step)

    def _guarded(self, action: Callable[[], object]) -> None:
        try:
            action()
        except checkpoint.CheckpointNotWritten as exc:  # every rank raised it together
            self.on = False
            if self.rt.is_main:
                log.warning(
                    "memory checkpoint tier off for the rest of this run (%s); durable "
                    "checkpoints go on; free memory in %s or set trainer.memory_checkpoint_dir",
                    exc, self.folder.parent.parent,
                )  # fmt: skip

    def usable(
        self, lineage: str | None, folder: Path | None = None, rank: int | None = None
    ) -> dict[int, Path]:
        """This rank's complete memory checkpoints this launch may load, by step (`folder`
        and `rank`: the copies of another rank's, kept here for it, launcher.checkpoint.
        peer_copy)."""
        found = {}
        expect = {**self.expect, "rank": self.rt.rank if rank is None else rank}
        for path in checkpoint.scan(folder or self.folder).complete:
            meta = checkpoint.read_meta(path) or {}
            if any(meta.get(k) != v for k, v in expect.items() if k != "launch"):
                continue
            if meta.get("world_size") != self.rt.world_size or differences(meta, self.identity):
                continue
            same_line = meta.get("lineage") == lineage if lineage else None
            same_launch = (
                self.expect["launch"] is not None and meta.get("launch") == self.expect["launch"]
            )
            if same_line or (lineage is None and same_launch):
                found[checkpoint.step_of(path)] = path
        return found

    def newest_common(self, lineage: str | None, after: int) -> Path | None:
        """This rank's folder of the newest step past `after` that every rank holds (a
        collective: every rank calls it with the same arguments)."""
        self.complete()
        self.pool.submit(lambda: None).result()  # a peer copy under way has ended
        mine = self.usable(lineage)
        copies = self.peers.copies(lineage) if self.peers else []
        everyone = self.rt.all_gather_objects((sorted(mine), copies))
        owned = [steps for steps, _ in everyone]
        best = max(
            (s for s in set().union(*owned) if s > after and self._held(s, everyone)),
            default=None,
        )
        missing = [r for r, steps in enumerate(owned) if best is not None and best not in steps]
        if missing:
            self.peers.restore(best, missing)
            mine[best] = self.folder / checkpoint.step_name(best)
            if self.rt.is_main:
                log.warning("memory tier: rank(s) %s had lost step %d (their node's memory); "
                            "their peers' copies restored it", compact(missing), best)  # fmt: skip
        lost = lost_ranks(owned, after, best)
        if lost and self.rt.is_main:
            log.warning(
                "memory tier: rank(s) %s hold no memory checkpoint of step %d that other ranks "
                "hold (their node's memory was lost, or the node replaced)%s; %s",
                compact(lost[1]), lost[0],
                "" if self.peers else ", and no peer copies (trainer.memory_checkpoint_peer)",
                f"resuming from the memory checkpoint of step {best}" if best else
                "resuming from the durable checkpoint" if after > 0 else "starting from step 0",
            )  # fmt: skip
        return mine[best] if best else None

    def _held(self, step: int, everyone: list) -> bool:
        """Whether every rank holds `step`, itself or (peer copies) in its peer's memory."""
        ring = self.peers.ring if self.peers else {}
        return all(
            step in steps or (r in ring and step in everyone[ring[r]][1])
            for r, (steps, _) in enumerate(everyone)
        )

    def keep_only(self, kept: Path | None) -> None:
        """Remove this rank's memory checkpoints but `kept` (what it resumed from): the
        others are of a history this launch does not continue."""
        for path in checkpoint.scan(self.folder).complete + [
            p for p, _ in checkpoint.scan(self.folder).incomplete
        ]:
            if kept is None or path.resolve() != Path(kept).resolve():
                shutil.rmtree(path, ignore_errors=True)

    def close(self, remove: bool) -> None:
        """Wait for the writing thread; with `remove` (the run completed or stopped with a
        durable checkpoint), free the memory the tier holds on this rank."""
        self.pool.shutdown(wait=True)
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the node's last rank leaves no folder
                self.folder.parent.rmdir()


class Peers:
    """A tier's peer copies (trainer.memory_checkpoint_peer, launcher.checkpoint.peer_copy):
    this rank's sealed memory checkpoints sent to its peer on the next node, its ward's
    received and kept in `<tier folder>/peer-of-rank<ward>/`, and a lost rank's step sent
    back to it by its peer at a restart."""

    def __init__(self, tier: MemoryTier, nodes: list[str]):
        self.tier = tier
        rt = tier.rt
        self.ring = peer_copy.ring(nodes) or {}
        self.peer = self.ring.get(rt.rank)
        self.ward = next((w for w, p in self.ring.items() if p == rt.rank), None)
        self.group = rt.side_group("memory-peer") if self.ring else None
        if not self.ring and rt.is_main:
            log.warning(
                "memory tier: no peer copies (trainer.memory_checkpoint_peer): they need two "
                "or more nodes of as many ranks each, and this job has %d node(s) of %s rank(s)",
                len(set(nodes)), sorted({nodes.count(k) for k in set(nodes)}),
            )  # fmt: skip

    @property
    def ward_folder(self) -> Path:
        return self.tier.folder / f"{peer_copy.PREFIX}{self.ward}"

    def send(self, step: int) -> None:
        """From the writing thread: step `step` (sealed on every rank) to the peer, the
        ward's into its folder."""
        if self.ring:
            self.tier.pool.submit(self._exchange, step)

    def _exchange(self, step: int) -> None:
        """Every rank takes part whatever it has to send (nothing: size 0), so that one
        rank's unreadable folder costs its ward's copy, never the others' exchange."""
        try:
            blob = peer_copy.pack(self.tier.folder / checkpoint.step_name(step))
        except OSError as exc:
            log.warning("memory tier: step %d not copied to rank %s (%s)", step, self.peer, exc)
            blob = None
        if self._swap(blob, self.peer, self.ward, self.ward_folder / checkpoint.step_name(step)):
            peer_copy.keep_newest(self.ward_folder, step)

    def copies(self, lineage: str | None) -> list[int]:
        """The steps of the ward's checkpoints this rank holds copies of, that its launch may
        load."""
        if self.ward is None:
            return []
        return sorted(self.tier.usable(lineage, self.ward_folder, self.ward))

    def restore(self, step: int, missing: list[int]) -> None:
        """Every rank in `missing` gets its step `step` back from its peer (a collective)."""
        send = None
        if self.ward in missing:
            send = peer_copy.pack(self.ward_folder / checkpoint.step_name(step))
        frm = self.peer if self.tier.rt.rank in missing else None
        self._swap(send, self.ward, frm, self.tier.folder / checkpoint.step_name(step))

    def _swap(self, blob, to: int | None, frm: int | None, dest: Path) -> bool:
        """Send `blob` (None: nothing) to rank `to` while receiving from rank `frm` into the
        folder `dest` (a collective: every rank tells its size first); whether one came."""
        sizes = [0] * self.tier.rt.world_size
        dist.all_gather_object(sizes, 0 if blob is None else blob.numel(), group=self.group)
        frm = frm if frm is not None and sizes[frm] else None
        got = peer_copy.exchange(blob, to if blob is not None else None, sizes, frm, self.group)
        if got is not None:
            peer_copy.unpack(got, dest)
        return got is not None
