"""GPT-2's size from its `model` config alone, before any model is built: its parameters,
tensor by tensor as the model registers them, and its training FLOPs per token. The plan,
the engines' declarations (DDP's buckets) and the memory tier's sizing read it; the model
(launcher.model.build) is built to the same shape.
"""

from __future__ import annotations

import math

GPT2_VOCAB = 50257  # the vocabulary of GPT-2's tokenizer, the largest the data configs use


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """Round the vocabulary up so the embedding and LM-head matmuls get tensor-core shapes."""
    return int(math.ceil(vocab_size / multiple) * multiple)


def param_count(m) -> int:
    """GPT-2's parameters from its shape (`model` config): embeddings (tied LM head), and
    per layer the attention's and MLP's weights and biases and two LayerNorms. Without a
    model.vocab_size, GPT-2's vocabulary: an upper bound for what is sized from it."""
    return sum(param_sizes(m))


def millions(params: int) -> str:
    """A parameter count as the start line and the plan say it: two decimals under ten
    million (gpt2-tiny's 0.62M, not "1M"), whole millions from there (124M, 1,558M)."""
    value = params / 1e6
    return f"{value:.2f}M" if value < 10 else f"{value:,.0f}M"


def param_sizes(m) -> list[int]:
    """The elements of each of GPT-2's parameter tensors, in the order the model registers
    them (what DDP's buckets are cut from, a whole tensor each): the token and position
    embeddings, per layer ln_1, the attention's qkv and projection, ln_2, the MLP's two
    matrices (each weight, then its bias; no biases with model.bias=false), and the final
    LayerNorm."""
    root, block = unit_sizes(m)
    return [*root[:2], *block * int(m.n_layer), *root[2:]]


def module_sizes(m) -> tuple[list[int], list[int]]:
    """GPT-2's modules that hold parameters, as DeepSpeed's ZeRO-3 fetches them: (the
    root's: token and position embeddings, the final LayerNorm; one block's: ln_1, the
    attention's qkv and projection, ln_2, the MLP's two matrices), each its weight and
    bias together."""
    d = int(m.n_embd)
    vocab = padded_vocab_size(int(m.vocab_size or GPT2_VOCAB), int(m.vocab_multiple))
    biased = getattr(m, "bias", True)
    block = [(d, d), (3 * d * d, 3 * d), (d * d, d), (d, d), (4 * d * d, 4 * d), (4 * d * d, d)]
    return ([vocab * d, int(m.n_positions) * d, d + d * biased],
            [w + b * biased for w, b in block])  # fmt: skip


def unit_sizes(m) -> tuple[list[int], list[int]]:
    """GPT-2's tensors as a sharding engine wraps them (each block a unit, the rest the
    root): (the root's, in registration order: token and position embeddings, the final
    LayerNorm; one block's)."""
    d = int(m.n_embd)
    vocab = padded_vocab_size(int(m.vocab_size or GPT2_VOCAB), int(m.vocab_multiple))
    biased = getattr(m, "bias", True)
    matrices = [("ln_1", d), ("c_attn", 3 * d * d), ("c_proj", d * d), ("ln_2", d),
                ("c_fc", 4 * d * d), ("mlp.c_proj", 4 * d * d)]  # fmt: skip
    outputs = {"ln_1": d, "c_attn": 3 * d, "c_proj": d, "ln_2": d, "c_fc": 4 * d, "mlp.c_proj": d}
    block = [t for name, n in matrices for t in ([n, outputs[name]] if biased else [n])]
    root = [vocab * d, int(m.n_positions) * d, *([d, d] if biased else [d])]
    return root, block


def shape_flops_per_token(m, seq_len: int) -> float:
    """Training FLOPs per token of the `model` config's shape, before any model is built
    (the plan): the same formula on param_count without the position embeddings."""
    params = param_count(m) - int(m.n_positions) * int(m.n_embd)
    return training_flops(params, int(m.n_layer), int(m.n_embd), seq_len)


def training_flops(params: int, layers: int, width: int, seq_len: int) -> float:
    """nanoGPT's formula (PaLM appendix B): 6N + 12*L*H*Q*T, H*Q the model width, N the
    parameters without the position embeddings."""
    return 6 * params + 12 * layers * width * seq_len
