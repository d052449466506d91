"""What an engine that shards GPT-2 communicates in a step, for the plan: FSDP2 and
DeepSpeed's ZeRO-3 both gather a part's weights before it runs and reduce its gradients
after backward has left it, so both declare their gathers here, and the plan times the two
the same way (launcher.plan.comm). Only the parts differ, as the engines cut them: FSDP2
wraps each block (and the root: the embeddings and the final LayerNorm) as one unit,
DeepSpeed fetches each module that holds parameters (a block's two LayerNorms and four
linears; the embeddings and the final LayerNorm)."""

from __future__ import annotations

from launcher.config.model_shape import module_sizes, unit_sizes


def unit_collectives(model, op: str, width: int, root_times: int, block_times: int,
                     per_module: bool = False) -> list[tuple[str, int, int]]:  # fmt: skip
    """`op` over each part's tensors at `width` bytes an element: the blocks' (each
    `block_times` a step) in the order backward reaches them, then the root's
    (`root_times`), as [(op, bytes, times)]; each unit whole, or (`per_module`) each of
    its modules apart."""
    root, block = module_sizes(model) if per_module else unit_sizes(model)
    if not per_module:
        root, block = [sum(root)], [sum(block)]
    layers = int(model.n_layer)
    rows = [(op, n * width, block_times * layers) for n in reversed(block)]
    rows += [(op, n * width, root_times) for n in reversed(root)]
    return [row for row in rows if row[2]]
