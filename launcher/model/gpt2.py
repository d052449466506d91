"""The project's own GPT-2 (`model.impl=native`): nanoGPT-sized, and weight-compatible with
transformers' GPT2LMHeadModel.

Why a module of our own: on the CPU the same shape trains markedly faster than
GPT2LMHeadModel (docs/performance.md), it compiles as one graph, and it computes the loss
inside `forward`, so that `torch.compile` covers the LM head, the fp32 upcast and the cross
entropy together instead of writing fp32 logits of the whole micro-batch for a loss
computed outside.

Parameter names are transformers' own (`transformer.h.0.attn.c_attn.weight`, ...): FSDP2
finds the blocks at `transformer.h`, and converting to and from transformers is a transpose
of the four projection matrices per block (transformers keeps them as Conv1D, `[in, out]`;
nn.Linear is `[out, in]`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# transformers' Conv1D weights, stored transposed relative to nn.Linear.
CONV1D_SUFFIXES = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)
UNBIASED = ("transformer.wte.", "transformer.wpe.", "lm_head.")  # weights with no bias anywhere


@dataclass
class GPT2Config:
    """The shape of the model; names follow transformers' GPT2Config so that code reading
    `model.config.n_layer` etc. (FLOPs, checkpoint identity) serves both implementations."""

    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    n_positions: int = 1024
    dropout: float = 0.0
    bias: bool = True
    layer_norm_epsilon: float = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's "gelu_new" is the tanh approximation.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        eps = cfg.layer_norm_epsilon
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 language model. `forward(input_ids, targets)` returns the mean cross entropy
    (computed in fp32 whatever the autocast dtype); without targets, the logits."""

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.config = cfg
        self.grad_checkpointing = False
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(cfg.vocab_size, cfg.n_embd),
                "wpe": nn.Embedding(cfg.n_positions, cfg.n_embd),
                "drop": nn.Dropout(cfg.dropout),
                "h": nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                "ln_f": nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, bias=cfg.bias),
            }
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        tr = self.transformer
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        x = tr.drop(tr.wte(input_ids) + tr.wpe(pos))
        for block in tr.h:
            if self.grad_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def from_hf_state_dict(
    state: dict[str, torch.Tensor],
    device: torch.device | None = None,
    dtypes: dict[str, torch.dtype] | None = None,
) -> dict[str, torch.Tensor]:
    """transformers' GPT2LMHeadModel state dict -> this module's (Conv1D weights transposed,
    the attention-mask buffers older transformers keep dropped), each tensor moved to
    `device` and cast to its `dtypes[key]` before it is transposed, one at a time: the
    converted model is never whole anywhere else. Tied tensors stay one tensor."""
    out: dict[str, torch.Tensor] = {}
    moved: dict[tuple, torch.Tensor] = {}  # (where, shape) -> the tensor on `device`
    for key, value in state.items():
        if key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        where = (value.data_ptr(), tuple(value.shape))
        if where not in moved:
            dtype = (dtypes or {}).get(key, value.dtype)
            moved[where] = value.to(device or value.device, dtype)
        value = moved[where]
        out[key] = value.t().contiguous() if key.endswith(CONV1D_SUFFIXES) else value
    return out


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This module's state dict in GPT2LMHeadModel's layout. Weights saved without biases
    (model.bias=false) get zero biases, the same function: transformers' GPT-2 has them."""
    out = {}
    for key, value in state.items():
        value = value.detach().cpu()
        out[key] = value.t().contiguous() if key.endswith(CONV1D_SUFFIXES) else value.clone()
        bias = key.removesuffix(".weight") + ".bias"
        if key.endswith(".weight") and bias not in state and not key.startswith(UNBIASED):
            out[bias] = torch.zeros(value.shape[0], dtype=value.dtype)
    return out


def config_of(state: dict[str, torch.Tensor], n_head: int) -> GPT2Config:
    """The shape of the GPT-2 whose state dict (either layout) is `state`; the number of
    heads is the one thing the tensors do not tell."""
    vocab_size, n_embd = state["transformer.wte.weight"].shape
    blocks = {k.split(".")[2] for k in state if k.startswith("transformer.h.")}
    return GPT2Config(
        vocab_size=vocab_size,
        n_layer=len(blocks),
        n_head=n_head,
        n_embd=n_embd,
        n_positions=state["transformer.wpe.weight"].shape[0],
        bias="transformer.ln_f.bias" in state,
    )


def hf_config(c: GPT2Config):
    """transformers' GPT2Config of the same shape."""
    from transformers import GPT2Config as HFConfig

    return HFConfig(
        vocab_size=c.vocab_size,
        n_positions=c.n_positions,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        layer_norm_epsilon=c.layer_norm_epsilon,
        activation_function="gelu_new",
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
