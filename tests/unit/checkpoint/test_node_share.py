"""The memory tier held once per node (launcher.checkpoint.memory.node_share, docs/checkpoints.md):
the state every DDP rank holds alike is cut into one part per rank of a node and joined back
exactly; the node's /dev/shm need at gpt2-xl on 8-rank nodes is two copies of one rank's
state, not two per rank; a tier that does not fit is turned off (default) or refused (asked
for) in one line. The launches that restore from the parts are in
tests/launches/test_memory_tier.py (2 ranks) and the scale tier (16).
"""

from __future__ import annotations

import json

import pytest
import torch

from launcher.checkpoint import memory
from launcher.checkpoint.memory import node_share
from launcher.config import compose
from launcher.config.model_shape import param_count, param_sizes
from launcher.config.saved_bytes import ENTRY_BYTES
from launcher.data.shm import loader_shm_need
from launcher.model.build import build_model
from launcher.plan.memory import shm_need
from launcher.strategy.base import host_copy

GIB = 2**30
VOCAB = 64


def trained_state() -> dict:
    """DDP's two memory-tier files of gpt2-tiny after one AdamW step (tied embedding and
    head, step counts, betas as a tuple: every kind of leaf the real state has)."""
    model = build_model(compose([]).model, VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    x = torch.randint(0, 64, (2, 16))
    model(x, x).backward()
    opt.step()
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    return {
        "model.pt": model.state_dict(),
        "optimizer.pt": {"optimizer": opt.state_dict(), "scaler": scaler.state_dict()},
    }


def write_node(tmp_path, state: dict, ranks: tuple[int, ...]):
    """Each rank of the node writes its part into its tier folder of step 4, as the tier
    does; returns the first rank's folder."""
    for index, rank in enumerate(ranks):
        folder = tmp_path / f"rank{rank}" / "step_00000004"
        folder.mkdir(parents=True)
        part = host_copy(node_share.part_of(state, node_share.NodeShare(index, ranks)))
        node_share.write(folder, part)
    return tmp_path / f"rank{ranks[0]}" / "step_00000004"


def leaves_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(leaves_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(leaves_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("ranks", [(0,), (4, 5, 6), tuple(range(8, 16))])
def test_the_parts_of_a_node_join_to_the_exact_state(tmp_path, ranks):
    state = trained_state()
    first = write_node(tmp_path, state, ranks)
    # Any rank of the node joins the same state from its own folder.
    for rank in (ranks[0], ranks[-1]):
        joined = node_share.join(tmp_path / f"rank{rank}" / first.name)
        assert leaves_equal(joined, state)
    model = build_model(compose([]).model, VOCAB)
    model.load_state_dict(joined["model.pt"])
    assert json.loads((first / node_share.RANKS_FILE).read_text()) == list(ranks)


def test_the_node_writes_one_copy_and_tied_weights_once(tmp_path):
    state = trained_state()
    leaves = torch.utils._pytree.tree_leaves(state)
    unique = {node_share.memory_key(t): t for t in leaves if torch.is_tensor(t)}
    one_copy = sum(t.numel() * t.element_size() for t in unique.values())
    ranks = tuple(range(8))
    parts = [node_share.part_of(state, node_share.NodeShare(i, ranks)) for i in ranks]
    written = [sum(t.numel() * t.element_size() for t in p["tensors"].values()) for p in parts]
    assert sum(written) == one_copy
    largest = max(t.numel() * t.element_size() for t in unique.values())
    assert max(written) <= one_copy / len(ranks) + largest  # the greedy split's bound
    assert parts[0]["aliases"]  # the head is the embedding: written once, joined as one


def test_a_missing_or_foreign_part_is_an_error_not_a_wrong_state(tmp_path):
    state = trained_state()
    first = write_node(tmp_path, state, (0, 1))
    (tmp_path / "rank1" / first.name / node_share.PART_FILE).unlink()  # its node lost it
    with pytest.raises(FileNotFoundError):
        node_share.join(first)
    other = write_node(tmp_path / "b", state, (0, 1, 2))  # part 1 of 3, not of 2
    (tmp_path / "rank1" / first.name / node_share.PART_FILE).write_bytes(
        (tmp_path / "b" / "rank1" / other.name / node_share.PART_FILE).read_bytes()
    )
    with pytest.raises(ValueError, match="part 1 of 3"):
        node_share.join(first)


def test_the_split_is_balanced_and_the_same_on_every_rank():
    sizes = [50, 10, 10, 10, 30, 30, 5]
    assert node_share.owners(sizes, 3) == node_share.owners(list(sizes), 3)
    load = [0, 0, 0]
    for size, part in zip(sizes, node_share.owners(sizes, 3), strict=True):
        load[part] += size
    assert sorted(load) == [45, 50, 50]
    assert node_share.owners(sizes, 1) == [0] * len(sizes)


def test_gpt2_xl_on_8_rank_nodes_needs_two_copies_of_the_node_state():
    """The issue's render: 2 nodes x 8 ranks of gpt2-xl under DDP, the tier on by default
    under torchrun's restarts. Two copies (kept + being written) of 1.56e9 x 12 bytes: 34.8
    GiB of /dev/shm, where one copy per rank asked for 279 GiB."""
    cfg = compose(["model=gpt2-xl", "trainer.global_batch_size=64"])
    state = param_count(cfg.model) * 12
    assert memory.state_bytes(cfg) == state
    tier = memory.shm_bytes(cfg, 8, 16, restarts=3)
    assert tier == 2 * state  # not 2 x 8
    need = shm_need(cfg, 8, 16, restarts=3)
    assert need == loader_shm_need(cfg) * 8 + tier < 48 * GIB
    # Sharded state stays per rank: FSDP2's 1/16 shards, 8 of them on a node (the tied
    # embedding once, and each tensor's torch.save entry).
    fsdp = compose(["model=gpt2-xl", "trainer.global_batch_size=64", "strategy=fsdp2"])
    entries = 4 * len(param_sizes(fsdp.model)) * ENTRY_BYTES
    assert memory.shm_bytes(fsdp, 8, 16, restarts=3) == 2 * 8 * (-(-state // 16) + entries)
    assert memory.shm_bytes(cfg, 8, 16, restarts=0) == 0  # no restarts: the tier is off


def test_a_tier_that_does_not_fit_is_turned_off_or_refused_in_one_line():
    cfg = compose(["model=gpt2-xl", "trainer.global_batch_size=64"])
    tier = memory.shm_bytes(cfg, 8, 16, restarts=3)
    room = loader_shm_need(cfg) * 8 + tier
    assert memory.room(cfg, 8, 16, room, restarts=3) is None
    why = memory.room(cfg, 8, 16, room - 1, restarts=3)
    assert why.startswith("memory tier off: the memory tier needs 34.8 GiB")
    assert "\n" not in why
    asked = compose(["model=gpt2-xl", "trainer.global_batch_size=64",
                     "trainer.memory_checkpoint_interval=20"])  # fmt: skip
    why = memory.room(asked, 8, 16, 10 * GIB)
    assert why.startswith("trainer.memory_checkpoint_interval=20: the memory tier")
    assert why.endswith("or trainer.memory_checkpoint_interval=0")
    elsewhere = compose(["trainer.memory_checkpoint_interval=20",
                         "trainer.memory_checkpoint_dir=/tmp/ram"])  # fmt: skip
    assert memory.room(elsewhere, 8, 16, 0) is None  # not /dev/shm: not sized here
