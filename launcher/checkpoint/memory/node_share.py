"""State that every rank holds alike (DDP's model and optimizer) kept once per node in the
memory tier, not once per rank: each of a node's ranks copies and writes 1/n of it, and a
restore reads the n parts back from the node's rank folders.

Eight ranks of gpt2-xl under DDP hold 8 identical copies of 18.7 GB of weights and AdamW
moments; written per rank, the tier would ask a node for 16 copies (the kept checkpoint and
the one being written) of /dev/shm. Split here, the node holds two copies whatever its
number of ranks, and each rank's copy between two steps is 1/n of the state.

A part is the tensors one rank owns (assigned by size, the same on every rank, since every
replica has the same structure) under their positions in the flattened state; part 0 also
holds the state's structure (torch's pytree spec) and its plain values (step counts, learning
rates, the loss scale). Tensors that are one tensor in the state (tied weights) are written
once.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_dumps, treespec_loads

PART_FILE = "node_part.pt"
RANKS_FILE = "node_ranks.json"  # which ranks' folders hold the other parts


@dataclass(frozen=True)
class NodeShare:
    """Where a rank stands among the ranks whose tier folders share its memory: it writes
    part `index` of `len(ranks)`, and a restore reads the parts of `ranks`, in order."""

    index: int
    ranks: tuple[int, ...]


ALONE = NodeShare(0, (0,))  # a rank that shares its node with no other


def nodes(node_of_rank: list[str]) -> list[tuple[int, ...]]:
    """The ranks of each node, from every rank's node key: nodes in the order of their first
    rank, each node's ranks in rank order."""
    grouped: dict[str, list[int]] = {}
    for rank, key in enumerate(node_of_rank):
        grouped.setdefault(key, []).append(rank)
    return [tuple(ranks) for ranks in grouped.values()]


def shares(node_of_rank: list[str], rank: int) -> NodeShare:
    """`rank`'s share, from every rank's node key (the ranks with its key, in rank order)."""
    ranks = next(node for node in nodes(node_of_rank) if rank in node)
    return NodeShare(ranks.index(rank), ranks)


def memory_key(tensor: torch.Tensor) -> tuple:
    """Equal for two tensors that view the same memory the same way (a state dict's tied
    weights are two tensor objects over one storage)."""
    t = tensor
    return (t.device, t.dtype, t.data_ptr(), tuple(t.shape), t.stride())


def owners(sizes: list[int], parts: int) -> list[int]:
    """The part each of `sizes` goes to: largest first, each to the lightest part so far
    (ties to the lower part), so that no part exceeds an equal share by more than the largest
    tensor. Deterministic: every rank computes the same assignment from the same sizes."""
    load = [(0, p) for p in range(parts)]
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        weight, part = heapq.heappop(load)
        owner[i] = part
        heapq.heappush(load, (weight + sizes[i], part))
    return owner


def part_of(state, share: NodeShare) -> dict:
    """This rank's part of `state` (nested dicts and lists of tensors and plain values), its
    tensors still the live ones: the caller copies them (launcher.strategy.base.host_copy)."""
    leaves, spec = tree_flatten(state)
    first_of: dict[tuple, int] = {}  # a tensor's memory -> the first position holding it
    aliases = {}
    tensors = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            key = memory_key(leaf)
            if key in first_of:
                aliases[i] = first_of[key]
            else:
                first_of[key] = i
                tensors.append(i)
    sizes = [leaves[i].numel() * leaves[i].element_size() for i in tensors]
    owner = owners(sizes, len(share.ranks))
    part = {
        "index": share.index,
        "ranks": list(share.ranks),
        "tensors": {i: leaves[i] for i, o in zip(tensors, owner, strict=True) if o == share.index},
    }
    if share.index == 0:
        part["spec"] = treespec_dumps(spec)
        part["aliases"] = aliases
        part["plain"] = {i: v for i, v in enumerate(leaves) if not isinstance(v, torch.Tensor)}
    return part


def write(folder: Path, part: dict) -> None:
    """Write `part` (host copies, from `part_of`) into this rank's folder of a step."""
    torch.save(part, folder / PART_FILE)
    (folder / RANKS_FILE).write_text(json.dumps(part["ranks"]))


def holds_part(folder: Path) -> bool:
    return (folder / RANKS_FILE).is_file()


def split_ranks(folder: Path) -> list[int] | None:
    """The ranks whose folders hold the parts of the state in `folder` (itself among them),
    or None for a folder that holds its state whole."""
    try:
        return [int(r) for r in json.loads((folder / RANKS_FILE).read_text())]
    except (OSError, ValueError, TypeError):
        return None


def part_files(folder: Path) -> list[Path]:
    """Every part file of the memory checkpoint whose folder on this rank is `folder`
    (<root>/rank<r>/step_<n>): its node's other ranks hold theirs beside it."""
    ranks = json.loads((folder / RANKS_FILE).read_text())
    return [folder.parent.parent / f"rank{r}" / folder.name / PART_FILE for r in ranks]


def join(folder: Path, device: torch.device | str = "cpu"):
    """The state whose parts the memory checkpoint at `folder` (this rank's) and its node's
    other ranks' hold."""
    paths = part_files(folder)
    parts = [torch.load(p, map_location=device, weights_only=True) for p in paths]
    for i, part in enumerate(parts):
        if part["index"] != i or len(part["ranks"]) != len(parts):
            raise ValueError(f"{paths[i]} is part {part['index']} of {len(part['ranks'])}, "
                             f"not part {i} of {len(parts)}")  # fmt: skip
    head = parts[0]
    values = {**head["plain"]}
    for part in parts:
        values.update(part["tensors"])
    values.update({i: values[j] for i, j in head["aliases"].items()})
    return tree_unflatten([values[i] for i in range(len(values))], treespec_loads(head["spec"]))
