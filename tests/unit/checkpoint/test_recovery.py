"""A restart's memory checkpoint found by node and step, never by rank order
(launcher.checkpoint.memory.recovery): whatever order the rendezvous gave the nodes, the
newest step whose every folder some node holds is chosen, and the folders move to the nodes
whose ranks load them. 16 ranks as 4 nodes of 4, as the scale tier runs them; the launches
are tests/launches/test_memory_tier.py and tests/scale/test_sixteen_ranks.py."""

from __future__ import annotations

import pytest

from launcher.checkpoint.memory.recovery import Held, Move, plan, rounds
from launcher.runtime.placement import ranks_text

NODES, PER = 4, 4
NODE_OF = [r // PER for r in range(NODES * PER)]


def own(ranks, step: int, split: bool = False) -> list[Held]:
    """Folders a node wrote itself (`split`: DDP's state in parts over those ranks)."""
    return [Held(r, step, False, tuple(ranks) if split else (r,)) for r in ranks]


def copies(ranks, step: int, split: bool = False) -> list[Held]:
    return [Held(r, step, True, tuple(ranks) if split else (r,)) for r in ranks]


def ranks_of(node: int) -> list[int]:
    return list(range(node * PER, (node + 1) * PER))


@pytest.mark.parametrize("split", [False, True])
def test_each_node_holding_its_own_moves_nothing(split):
    held = {n: own(ranks_of(n), 8, split) + own(ranks_of(n), 6, split) for n in range(NODES)}
    found = plan(NODE_OF, held, after=4)
    assert (found.step, found.moves, found.local, found.lost) == (8, [], [], None)
    assert found.keep == {n: set(ranks_of(n)) for n in range(NODES)}


@pytest.mark.parametrize("split", [False, True])
def test_a_replaced_node_that_the_rendezvous_puts_last_restores_from_memory(split):
    """Node 2 (ranks 8-11) is lost and replaced; the new agent joins last, so old node 3's
    memory (folders of ranks 12-15, and its copies of node 2's 8-11) now runs ranks 8-11,
    and the new, empty node runs 12-15. Nothing is lost: 8-11 come from the peer copies on
    their own node now, 12-15 move from the node that wrote them."""
    held = {
        0: own(ranks_of(0), 8, split) + copies(ranks_of(3), 8, split),
        1: own(ranks_of(1), 8, split) + copies(ranks_of(0), 8, split),
        2: own(ranks_of(3), 8, split) + copies(ranks_of(2), 8, split),  # old node 3
        3: [],  # the replacement
    }
    found = plan(NODE_OF, held, after=0)
    assert found.step == 8 and found.lost is None
    assert found.local == [(2, r) for r in ranks_of(2)]
    # own folders are taken before copies, each sent by one of node 2's ranks to one of 3's
    assert found.moves == [Move(r, r - 4, r, False) for r in ranks_of(3)]
    assert found.moved == list(range(8, 16))
    assert found.keep[2] == set(ranks_of(2)) and found.keep[3] == set(ranks_of(3))


def test_without_copies_a_lost_nodes_step_is_named_and_the_older_one_taken():
    held = {n: own(ranks_of(n), 8) for n in (0, 1, 3)} | {2: []}
    for n in (0, 1, 2, 3):  # step 6 survives everywhere in peer copies of the node before
        held[n] += copies(ranks_of((n - 1) % NODES), 6)
    found = plan(NODE_OF, held, after=0)
    assert found.step == 6 and found.lost == (8, ranks_of(2))
    assert all(m.copy for m in found.moves) and found.moved == list(range(16))


def test_nothing_newer_than_the_durable_checkpoint_is_nothing():
    held = {n: own(ranks_of(n), 8) for n in range(NODES)}
    assert plan(NODE_OF, held, after=8).step is None
    gone = {n: own(ranks_of(n), 8) for n in (0, 1, 2)} | {3: []}
    found = plan(NODE_OF, gone, after=0)
    assert found.step is None and found.lost == (8, ranks_of(3))


def test_a_split_state_needs_every_part_of_its_node():
    """DDP's state is split over the ranks that wrote it: a rank now on another node than
    its node mates of then needs their parts too, moved beside its own."""
    held = {0: own([0, 1], 4, split=True), 1: own([2, 3], 4, split=True)}
    swapped = [1, 1, 0, 0]  # the rendezvous swapped the two nodes
    found = plan(swapped, held, after=0)
    assert found.step == 4 and found.keep == {0: {2, 3}, 1: {0, 1}}
    # node 0's memory holds folders 0-1 and runs ranks 2-3 now: each folder crosses over
    assert sorted((m.rank, m.src, m.dst) for m in found.moves) == [
        (0, 2, 0),
        (1, 3, 1),
        (2, 0, 2),
        (3, 1, 3),
    ]
    missing = {0: own([0, 1], 4, split=True), 1: own([2], 4, split=True)}
    assert plan([0, 0, 1, 1], missing, after=0).step is None  # part 3 is held nowhere


def test_moves_come_in_rounds_where_no_rank_sends_or_receives_twice():
    moves = [Move(r, 0, 4 + r % 2, False) for r in range(3)] + [Move(9, 1, 4, True)]
    batches = rounds(moves)
    assert sorted(len(b) for b in batches) == [1, 1, 2]
    assert {m for b in batches for m in b} == set(moves)
    for batch in batches:
        assert len({m.src for m in batch}) == len({m.dst for m in batch}) == len(batch)
    assert len(batches) == 3  # rank 0 sends three folders: three rounds


def test_ranks_are_named_as_runs():
    assert ranks_text([12, 4, 5, 6, 7, 9, 11]) == "4-7, 9, 11-12"
