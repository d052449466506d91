"""One rank's side of the memory tier: its state (its shard, for a sharded engine) written
into node-local memory every few steps, and, at a restart, the newest step every rank can
load found by node and step (launcher.checkpoint.memory.recovery) and brought to the nodes
that load it.

Each rank writes into its own folder, `<trainer.memory_checkpoint_dir>/launcher-<uid>-<hash
of the run directory>/rank<r>/`, with the durable checkpoints' protocol
(launcher.checkpoint.protocol.CheckpointWriter): every rank seals its own `step_<n>` once
every rank has written its files, so a step is complete on one rank only when all ranks
wrote it. Node-local memory is seen by one node's ranks only: each node's first rank says
what its node holds, and the ranks agree on the step from every node's word.

A memory checkpoint is loaded only by a launch of the same run directory, run id, world size
and rank, with nothing the resume check refuses, of the same lineage as the run's newest
durable checkpoint (or, before the first one, of the same launch: torchrun's rendezvous id,
Slurm's job id). That is what an in-job restart resumes, and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import shutil
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher.checkpoint import protocol as checkpoint
from launcher.checkpoint.memory import node_share, peers, recovery
from launcher.checkpoint.memory.recovery import Held, Recovery
from launcher.checkpoint.memory.size import KEEP
from launcher.checkpoint.resume import differences
from launcher.resilience.stop_vote import NOTHING
from launcher.runtime.placement import launch_key, ranks_text
from launcher.runtime.process import Runtime

log = logging.getLogger("launcher")


def node_folder(root: str, run_dir: Path) -> Path:
    """The tier's folder of a run on a node: one per user and run directory."""
    key = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return Path(root).expanduser() / f"launcher-{os.getuid()}-{key}"


def rank_folder(root: str, run_dir: Path, rank: int) -> Path:
    """Rank `rank`'s folder of the tier, in the node folder of the node it runs on."""
    return node_folder(root, run_dir) / f"rank{rank}"


def node_key(root: Path) -> str:
    """What names the memory a tier folder lives in, the same on every rank that shares it:
    the host, the tier's root and its file system (the device of the root, or of its nearest
    existing parent before the first save creates it)."""
    root = root.expanduser().absolute()
    there = root
    while not there.exists() and there != there.parent:
        there = there.parent
    return f"{socket.gethostname()}:{os.stat(there).st_dev}:{root}"


class MemoryTier:
    """One rank's memory checkpoints: written and sealed by a thread from a snapshot taken
    between two steps (every rank its own folder, CheckpointWriter's seal), agreed once
    every rank has sealed them, then copied to the peer (with peer copies) and the older
    steps dropped.

    The agreement takes no collective of its own: each rank's newest sealed step (and a
    write that failed) rides on the stop vote of every step boundary (`payload`, `arrived`:
    launcher.resilience.stop_vote.Rider), and a step every rank has sealed is agreed on
    every rank at the same boundary. A blocking gather between two steps cost every save
    80-150 ms on 16 ranks of a 2-core machine. A save that comes before the one before it
    is agreed (an interval of one step, a write slower than a step) agrees that one first,
    with a gather, so that the tier never holds more steps than its room allows for.

    All ranks call `save`, `find` and `fetch` at the same steps (each gathers on the control
    group where it must). A write that fails on any rank (memory full) turns the tier off on
    every rank, with one warning: the durable checkpoints go on as before."""

    # The numbers each rank's tier brings to a vote: its newest sealed step, a step it could
    # not write, the newest step of its ward's it holds a copy of (launcher.checkpoint.memory.peers)
    WIDTH = 3

    def __init__(self, root: str, every: int, rt: Runtime, identity: dict, peer: bool = False):
        self.every = every
        self.rt = rt
        self.node_folder = node_folder(root, rt.run_dir)
        self.folder = self.node_folder / f"rank{rt.rank}"
        self.expect = {
            "tier": "memory",
            "run_dir": str(Path(rt.run_dir).resolve()),
            "run_id": rt.run_id,
            "rank": rt.rank,
            "launch": launch_key(),
        }
        self.identity = identity
        keys = rt.all_gather_objects(node_key(Path(root)))
        groups = node_share.nodes(keys)
        self.node_of = [next(i for i, g in enumerate(groups) if r in g) for r in range(len(keys))]
        self.node_ranks = groups[self.node_of[rt.rank]]
        self.share = node_share.shares(keys, rt.rank)
        self.group = rt.side_group("memory-tier") if len(groups) > 1 else None
        self.ring = (peers.ring(keys) or {}) if peer else {}
        if peer and not self.ring and rt.is_main:
            log.warning(
                "memory tier: no peer copies (trainer.memory_checkpoint_peer): they need two "
                "or more nodes of as many ranks each, and this job has %d node(s) of %s rank(s)",
                len(groups), sorted({len(g) for g in groups}),
            )  # fmt: skip
        self.peer = self.ring.get(rt.rank)
        self.ward = next((w for w, p in self.ring.items() if p == rt.rank), None)
        self.writer = checkpoint.CheckpointWriter(
            self.folder,
            is_main=True,  # each rank seals its own folder, after every rank has written
            barrier=lambda: None,
            # With peer copies the older step stays until every peer holds the newer one.
            keep=KEEP + 1 if self.ring else KEEP,
            meta={**identity, **self.expect},
            gather=rt.all_gather_objects,
        )
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="memory-checkpoint")
        self.on = True
        self._saved = -1  # the newest step saved (its write given to the thread), every rank's
        self._agreed = -1  # the newest step every rank sealed, agreed alike on every rank
        self._sealed = NOTHING  # from the writing thread: the newest step it sealed
        self._failed: tuple[int, tuple[str, bool]] | None = None  # ... the first it could not
        self._holds_for_ward = NOTHING  # from the writing thread: the ward's newest copy here
        self._peers_hold = -1  # the newest step every rank's peer said it holds a copy of
        self._kept: set[int] = set()  # other ranks' folders this node keeps (a restore's)
        checkpoint.remove_leftovers(checkpoint.scan(self.folder))  # this launch holds the lock

    @property
    def ward_folder(self) -> Path:
        return self.node_folder / peers.PEER / f"rank{self.ward}"

    def follow(self, lineage: str) -> None:
        """Write (and prune) in the lineage the durable checkpoints continue."""
        self.writer.meta["lineage"] = lineage
        self.writer.prunable = {lineage}

    @property
    def lineage(self) -> str:
        return self.writer.meta["lineage"]

    # -- saves -------------------------------------------------------------------------
    def save(self, step: int, snapshot: Callable[[Path], None], meta: dict) -> None:
        """Start writing `snapshot` (this rank's state, copied already) as step `step`: the
        thread writes and seals it; the ranks agree on it at a later boundary (`arrived`)."""
        if self.on and self._agreed < self._saved:
            self._agree_now()
        if self.on:
            self._saved = step
            self.pool.submit(self._write, step, snapshot, meta)

    def _write(self, step: int, snapshot: Callable[[Path], None], meta: dict) -> None:
        """From the writing thread: this rank's folder of `step`, written and sealed, then
        copied to its peer at once (not after the ranks agree on the step: a node lost in
        between would cost the restart that much more than one interval)."""
        try:
            self.writer.write_alone(step, snapshot, meta)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it at a vote
            if self._failed is None:
                self._failed = (step, checkpoint.write_problem(exc, self.folder))
            if self.ring:
                self._copy(step, written=False)
            return
        self._sealed = step
        if self.ring:
            self._copy(step)

    def payload(self) -> list[float]:
        """What this rank brings to the next vote: its newest sealed step, the step it could
        not write, the newest step of its ward's it holds a copy of (NaN: none)."""
        if not self.on:
            return [NOTHING] * self.WIDTH
        failed = NOTHING if self._failed is None else self._failed[0]
        return [self._sealed, failed, self._holds_for_ward]

    def arrived(self, rows: list[list[float]]) -> None:
        """Every rank's `payload` of a vote, alike on every rank: the newest step all sealed
        is agreed (the older steps go, from the writing thread); a step some rank could not
        write turns the tier off."""
        if not self.on:
            return
        failed = [f for _, f, _ in rows if not math.isnan(f)]
        if failed:
            self._give_up(int(min(failed)))
            return
        if self.ring:
            self._copied_everywhere([held for _, _, held in rows])
        sealed = [s for s, _, _ in rows]
        if any(math.isnan(s) for s in sealed) or min(sealed) <= self._agreed:
            return
        self._agreed = int(min(sealed))
        self.pool.submit(self._after_agreement, self._agreed)

    def _copied_everywhere(self, held: list[float]) -> None:
        """Every rank's peer holds its copy of a step at least as new as `min(held)` (each
        rank's payload says which of its ward's it holds): the older steps of this rank's
        own folder and of its ward's copies go, from the writing thread. Not before: a node
        lost while some copy is on its way leaves the older step whole on every other
        node, and its own ranks' older step in their peers' copies."""
        if any(math.isnan(h) for h in held) or min(held) <= self._peers_hold:
            return
        self._peers_hold = int(min(held))
        for folder in (self.folder, self.ward_folder):
            self.pool.submit(peers.keep_newest, folder, self._peers_hold)

    def _agree_now(self) -> None:
        """The agreement of the last save, at once (a gather): the next save must not begin
        before the older steps can go."""
        self.drain()
        self.arrived(self.rt.all_gather_objects(self.payload()))

    def _give_up(self, step: int) -> None:
        """Some rank could not write step `step`: the ranks compare why (a gather), that step
        and any newer one go, the tier is off on every rank."""
        self.drain()
        mine = self._failed[1] if self._failed is not None and self._failed[0] == step else None
        try:
            self.writer.agree(mine, step)
        except checkpoint.CheckpointNotWritten as exc:  # every rank raised it together
            for path in checkpoint.scan(self.folder).complete:
                if checkpoint.step_of(path) >= step:
                    shutil.rmtree(path, ignore_errors=True)
            self._off(exc)

    def drain(self) -> None:
        """Wait until the writing thread has done what it was given (writes and their peer
        copies, the older steps' pruning)."""
        self.pool.submit(lambda: None).result()

    def _off(self, exc: checkpoint.CheckpointNotWritten) -> None:
        self.on = False
        if self.rt.is_main:
            log.warning(
                "memory checkpoint tier off for the rest of this run (%s); durable "
                "checkpoints go on; free memory in %s or set trainer.memory_checkpoint_dir",
                exc, self.node_folder.parent,
            )  # fmt: skip

    def _after_agreement(self, step: int) -> None:
        """From the writing thread, once every rank holds step `step`: the steps before it
        go but the one kept for the peer copies (`keep`)."""
        self.writer.prune(step)

    def _copy(self, step: int, written: bool = True) -> None:
        """On every rank, from the writing thread: step `step` to the peer (nothing where
        this rank could not write it), the ward's into its folder. Every rank takes part
        whatever it has to send, so that one rank's failed or unreadable folder costs its
        ward's copy, never the others'. The older steps, this rank's and its ward's copies,
        go once every rank says at a later vote that it holds the newer copy
        (`_copied_everywhere`): no collective of every rank here. A ward's copies older than
        the one before go at once: where some pair's copies keep failing (its node's memory
        full), the others' would otherwise pile up until theirs is full too."""
        name = checkpoint.step_name(step)
        blob = None
        try:
            blob = peers.pack(self.folder / name) if written else None
        except OSError as exc:
            log.warning("memory tier: step %d not copied to rank %s (%s)", step, self.peer, exc)
        if peers.swap(blob, self.peer, self.ward, self.ward_folder / name, self.group):
            previous, self._holds_for_ward = self._holds_for_ward, step
            if not math.isnan(previous):  # the copy before this one stays, none older
                peers.keep_newest(self.ward_folder, int(previous))

    # -- a restart ---------------------------------------------------------------------
    def usable(self, lineage: str | None, folder: Path | None = None,
               rank: int | None = None) -> dict[int, Path]:  # fmt: skip
        """The complete memory checkpoints of rank `rank` (this one's by default) in `folder`
        (its folder on this node by default) that this launch may load, by step."""
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

    def held(self, lineage: str | None) -> list[Held]:
        """What this node's memory holds that this launch may load: every rank's folders,
        its own and peer copies, by step."""
        found = []
        for copy, where in ((False, self.node_folder), (True, self.node_folder / peers.PEER)):
            for folder in sorted(where.glob("rank*")) if where.is_dir() else []:
                rank = folder.name.removeprefix("rank")
                if not rank.isdigit() or int(rank) >= self.rt.world_size:
                    continue
                for step, path in self.usable(lineage, folder, int(rank)).items():
                    split = node_share.split_ranks(path) or (int(rank),)
                    found.append(Held(int(rank), step, copy, tuple(split)))
        return found

    def find(self, lineage: str | None, after: int) -> Recovery:
        """The newest step past `after` that every rank can load once folders have moved,
        from what every node holds (a collective: every rank calls it alike)."""
        self.drain()
        first = self.node_ranks[0] == self.rt.rank
        words = self.rt.all_gather_objects(self.held(lineage) if first else None)
        held = {self.node_of[r]: w for r, w in enumerate(words) if w is not None}
        return recovery.plan(self.node_of, held, after)

    def fetch(self, found: Recovery) -> Path | None:
        """Bring every folder of `found` to the node that loads it (a collective); this
        rank's folder of its step, or None."""
        self._say(found)
        if found.step is None:
            return None
        name = checkpoint.step_name(found.step)
        node = self.node_of[self.rt.rank]
        if self.node_ranks[0] == self.rt.rank:
            for _, rank in (x for x in found.local if x[0] == node):
                copied = self.node_folder / peers.PEER / f"rank{rank}" / name
                peers.duplicate(copied, self.node_folder / f"rank{rank}" / name)
        if found.moves:
            peers.move(found.moves, self.rt.rank, found.step, self.node_folder, self.group)
        self._kept = found.keep.get(node, set())
        self.rt.barrier()  # every folder is where its node's ranks will read it
        return self.folder / name

    def newest_common(self, lineage: str | None, after: int) -> Path | None:
        """This rank's folder of the newest step past `after` that every rank can load,
        brought where it is read (a collective: every rank calls it with the same
        arguments)."""
        return self.fetch(self.find(lineage, after))

    def _say(self, found: Recovery) -> None:
        """One line for what a restart had to do: folders found on other nodes or in peer
        copies; a newer step that the loss of a node's memory cost."""
        if not self.rt.is_main:
            return
        copied = sorted({r for _, r in found.local} | {m.rank for m in found.moves if m.copy})
        elsewhere = sorted({m.rank for m in found.moves if not m.copy} - set(copied))
        if copied or elsewhere:
            how = [f"rank(s) {ranks_text(copied)} from their peers' copies"] if copied else []
            how += [f"rank(s) {ranks_text(elsewhere)} from the node that held them (the "
                    "rendezvous placed them on another node)"] if elsewhere else []  # fmt: skip
            log.warning("memory tier: step %d restored for %s", found.step, " and ".join(how))
        if found.lost:
            step, ranks = found.lost
            log.warning(
                "memory tier: rank(s) %s hold no memory checkpoint of step %d that other ranks "
                "hold (their node's memory was lost, or the node replaced)%s; %s",
                ranks_text(ranks), step,
                "" if self.ring else ", and no peer copies (trainer.memory_checkpoint_peer)",
                f"resuming from the memory checkpoint of step {found.step}" if found.step else
                "resuming from the durable checkpoint, or step 0",
            )  # fmt: skip

    def keep_only(self, kept: Path | None) -> None:
        """Remove this rank's memory checkpoints but `kept` (what it resumed from): the
        others are of a history this launch does not continue. A node's first rank also
        removes the folders of ranks that are not on the node now (unless its ranks load
        them) and the peer copies of ranks that are not its wards."""
        found = checkpoint.scan(self.folder)
        for path in found.complete + [p for p, _ in found.incomplete]:
            if kept is None or path.resolve() != Path(kept).resolve():
                shutil.rmtree(path, ignore_errors=True)
        if self.node_ranks[0] != self.rt.rank:
            return
        keep = set(self.node_ranks) | (self._kept if kept is not None else set())
        wards = {w for w, p in self.ring.items() if p in self.node_ranks}
        for where, allowed in ((self.node_folder, keep), (self.node_folder / peers.PEER, wards)):
            for folder in sorted(where.glob("rank*")) if where.is_dir() else []:
                rank = folder.name.removeprefix("rank")
                if not rank.isdigit() or int(rank) not in allowed:
                    shutil.rmtree(folder, ignore_errors=True)

    def close(self, remove: bool) -> None:
        """Wait for the writing thread; with `remove` (the run completed or stopped with a
        durable checkpoint), free the memory the tier holds on this rank."""
        self.pool.shutdown(wait=True)
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.ward is not None:
                shutil.rmtree(self.ward_folder, ignore_errors=True)
            for empty in (self.node_folder / peers.PEER, self.node_folder):
                with contextlib.suppress(OSError):  # the node's last rank leaves no folder
                    empty.rmdir()
