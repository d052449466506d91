"""Peer copies of the memory tier (launcher.checkpoint.memory.peers, docs/checkpoints.md): which
rank keeps a copy of which, and a folder sent whole or not at all. The launch that loses a
node and restores from the copies is in tests/launches/test_memory_tier.py."""

from __future__ import annotations

import pytest

from launcher.checkpoint.memory import peers


@pytest.mark.parametrize(
    ("nodes", "ring"),
    [
        (["a", "a", "b", "b"], {0: 2, 1: 3, 2: 0, 3: 1}),
        (["a", "b", "c"], {0: 1, 1: 2, 2: 0}),
        # 16 ranks as 4 nodes of 4: each rank's copy on the next node, the last on the first
        ([n for n in "abcd" for _ in range(4)], {r: (r + 4) % 16 for r in range(16)}),
        (["b", "a", "b", "a"], {0: 1, 1: 0, 2: 3, 3: 2}),  # nodes by their first rank
        (["a", "a"], None),  # one node: a copy there dies with it
        (["a", "a", "b"], None),  # nodes of unequal sizes
    ],
)
def test_each_rank_has_a_peer_on_the_next_node(nodes, ring):
    assert peers.ring(nodes) == ring


def test_a_folder_arrives_whole_under_its_name(tmp_path):
    sent = tmp_path / "rank2" / "step_00000008"
    sent.mkdir(parents=True)
    (sent / "node_part.pt").write_bytes(b"\x00\x01" * 1000)
    (sent / "meta.json").write_text('{"step": 8}')
    dest = tmp_path / "rank0" / "peer-of-rank2" / "step_00000008"
    dest.parent.mkdir(parents=True)
    peers.unpack(peers.pack(sent), dest)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == {
        p.name: p.read_bytes() for p in sent.iterdir()
    }
    assert [p.name for p in dest.parent.iterdir()] == ["step_00000008"]  # no temporary left
