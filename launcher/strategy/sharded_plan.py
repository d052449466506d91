"""What an engine that shards GPT-2 block by block communicates in a step, for the plan:
FSDP2 and DeepSpeed's ZeRO-3 both gather each unit's weights before it runs and
reduce-scatter its gradients after backward has left it, so both declare their collectives
here, per unit (each block, and the root: the embeddings and the final LayerNorm), and the
plan times the two the same way (launcher.plan.comm)."""

from __future__ import annotations

from launcher.config.model_shape import unit_sizes


def unit_collectives(model, op: str, width: int, root_times: int,
                     block_times: int) -> list[tuple[str, int, int]]:  # fmt: skip
    """`op` over each unit's tensors at `width` bytes an element: the blocks' (each
    `block_times` a step) in the order backward reaches them, then the root's
    (`root_times`), as [(op, bytes, times)]."""
    root, block = unit_sizes(model)
    rows = [(op, sum(block) * width, block_times * int(model.n_layer)), (op, sum(root) * width,
            root_times)]  # fmt: skip
    return [row for row in rows if row[2]]
