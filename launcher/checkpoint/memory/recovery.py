"""Which memory checkpoint a restart resumes, found by node and step, never by rank order.

A restart's rendezvous may place a rank on another node than the one whose memory holds
its folder (torchrun's c10d orders the agents as they arrive: a replaced node comes last),
and a node replaced or rebooted holds nothing. Each node says what its memory holds: every
rank's folder of every step (`rank<r>/step_<n>`), its own or a peer copy (`peer/rank<r>/`,
trainer.memory_checkpoint_peer). From that alone, the same on every rank, `plan` picks the
newest step whose every folder some node holds, and what must move so that each rank's
node holds what that rank loads: its own folder and, for state split over a node's ranks
(launcher.checkpoint.memory.node_share), the folders of the ranks it was split with. A
folder moves within a node (a peer copy becomes the rank's folder) or from a rank of a
node that holds it to a rank of the node that needs it (launcher.checkpoint.memory.peers).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Held:
    """One rank's folder of one step, as a node's memory holds it."""

    rank: int  # the rank that wrote it
    step: int
    copy: bool  # a peer copy, not the folder the rank wrote itself
    parts: tuple[int, ...]  # the ranks whose folders hold its state between them


@dataclass(frozen=True)
class Move:
    """Rank `rank`'s folder of the step, sent by rank `src` (whose node holds it: a peer
    copy when `copy`) to rank `dst`, which writes it into its node's `rank<rank>/`."""

    rank: int
    src: int
    dst: int
    copy: bool


@dataclass
class Recovery:
    """What a restart resumes from the memory tier, the same on every rank."""

    step: int | None  # the newest step every rank's node can hold; None: none
    moves: list[Move] = field(default_factory=list)  # between nodes
    # (node, rank): node `node`'s peer copy of `rank`'s folder becomes `rank<rank>/` there
    local: list[tuple[int, int]] = field(default_factory=list)
    keep: dict[int, set[int]] = field(default_factory=dict)  # node -> the folders it needs
    # A newer step than `step` that some ranks' folders are held of, and the ranks whose
    # folders of it no node holds: what the loss of their node cost.
    lost: tuple[int, list[int]] | None = None

    @property
    def moved(self) -> list[int]:
        """The ranks whose folders came from elsewhere than their own node's rank folder."""
        return sorted({m.rank for m in self.moves} | {rank for _, rank in self.local})


def plan(node_of: list[int], held: dict[int, list[Held]], after: int) -> Recovery:
    """The newest step past `after` that every rank can load once folders have moved, and the
    moves; `node_of[r]` is rank r's node now, `held[n]` what node n's memory holds."""
    where: dict[tuple[int, int], dict[bool, list[int]]] = {}
    parts: dict[tuple[int, int], tuple[int, ...]] = {}
    for node in sorted(held):
        for h in held[node]:
            where.setdefault((h.rank, h.step), {True: [], False: []})[h.copy].append(node)
            parts[(h.rank, h.step)] = h.parts
    world = len(node_of)
    steps = sorted({s for _, s in where if s > after}, reverse=True)
    best, needs = None, {}
    for step in steps:
        needs = _needs(node_of, step, parts)
        if needs is not None and all((r, step) in where for n in needs for r in needs[n]):
            best = step
            break
    lost = None
    if steps and steps[0] != best:
        lost = (steps[0], [r for r in range(world) if (r, steps[0]) not in where])
    if best is None:
        return Recovery(None, lost=lost)
    recovery = Recovery(best, keep=needs, lost=lost)
    ranks_on = {n: [r for r in range(world) if node_of[r] == n] for n in set(node_of)}
    turn = dict.fromkeys(held, 0) | dict.fromkeys(ranks_on, 0)
    for node in sorted(needs):
        for rank in sorted(needs[node]):
            found = where[(rank, best)]
            if node in found[False]:
                continue
            if node in found[True]:
                recovery.local.append((node, rank))
                continue
            copy = not found[False]
            source = found[copy][0]
            senders, takers = ranks_on.get(source, []), ranks_on[node]
            if not senders:  # a node of no rank now cannot send: the step is not whole
                return Recovery(None, lost=lost)
            src = senders[turn[source] % len(senders)]
            dst = takers[turn[node] % len(takers)]
            turn[source] += 1
            turn[node] += 1
            recovery.moves.append(Move(rank, src, dst, copy))
    return recovery


def _needs(node_of: list[int], step: int, parts: dict) -> dict[int, set[int]] | None:
    """Per node, the ranks whose folders of `step` its ranks load (their own, and the parts
    their state was split into); None when some rank's folder of it is held nowhere."""
    needs: dict[int, set[int]] = {}
    for rank, node in enumerate(node_of):
        split = parts.get((rank, step))
        if split is None:
            return None
        needs.setdefault(node, set()).update({rank, *split})
    return needs


def rounds(moves: list[Move]) -> list[list[Move]]:
    """The moves in rounds where no rank sends or receives twice: each round is one exchange
    in which every rank sends at most one folder and receives at most one."""
    out: list[list[Move]] = []
    for move in moves:
        for group in out:
            if all(move.src != m.src and move.dst != m.dst for m in group):
                group.append(move)
                break
        else:
            out.append([move])
    return out
