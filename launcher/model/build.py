"""GPT-2 (the project's own module, or transformers' GPT2LMHeadModel: `model.impl`), its
loss, its FLOPs per token, and MFU against known peaks.

MFU is only as honest as the peak it divides by: the peak comes from launcher.observe.peaks' table
of dense bf16 figures for GPUs we know, and is `None` (reported as null) for anything
else, a CPU included: never a guessed figure.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from launcher.config.errors import ConfigError
from launcher.config.model_shape import padded_vocab_size, training_flops
from launcher.config.schema import ModelConfig
from launcher.model.gpt2 import GPT2, from_hf_state_dict
from launcher.model.gpt2 import GPT2Config as NativeConfig
from launcher.model.materialize import materialise, on_meta
from launcher.observe.peaks import peak_for_name

log = logging.getLogger(__name__)


def build_model(
    model_cfg: ModelConfig,
    vocab_size: int,
    *,
    eot_id: int | None = None,
    grad_checkpointing: bool = False,
    device: torch.device | str = "cpu",
) -> torch.nn.Module:
    """GPT-2 of `model.impl` (native: launcher.model.gpt2; hf: GPT2LMHeadModel with SDPA
    attention), from the size's config or the weights of `model.init_from`, made on
    `device` without a whole copy in host memory first (launcher.model.materialize: the
    same initial values as a build on the CPU; weights loaded one tensor at a time).

    Gradient checkpointing recomputes each block's activations in backward instead of
    keeping them: about a third more compute for much less activation memory.
    """
    device = torch.device(device)
    if model_cfg.impl == "native":
        model = _native(model_cfg, vocab_size, device)
        model.grad_checkpointing = grad_checkpointing
        return model
    model = _gpt2(model_cfg, vocab_size, eot_id, device)
    if grad_checkpointing:
        # transformers 5 renamed the switch; 4.x only has the old name.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable({"use_reentrant": False})
    return model


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def model_loss(module: torch.nn.Module, impl: str, x: torch.Tensor, y: torch.Tensor):
    """The loss of one micro-batch: the native module computes it inside its forward (so a
    compiled module covers it); GPT2LMHeadModel's logits go through lm_loss."""
    if impl == "native":
        return module(x, targets=y)
    return lm_loss(module(input_ids=x).logits, y)


# (module, inputs, targets) -> the mean loss of one micro-batch
LossFunction = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(model_cfg: ModelConfig) -> LossFunction:
    """The loss of a micro-batch as this model computes it (`model.impl`'s way, in
    `model.attention`'s SDPA kernel): what the model hands the loop and the eval, which then
    know neither key."""
    impl, attention = model_cfg.impl, model_cfg.attention

    def loss(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model_loss(module, impl, x, y)

    def loss_with_kernel(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        with attention_backend(attention):
            return model_loss(module, impl, x, y)

    return loss if attention == "auto" else loss_with_kernel


@contextlib.contextmanager
def attention_backend(choice: str):
    """The context the loss is computed in for `model.attention`: SDPA restricted to one
    kernel, or PyTorch's own pick (`auto`: the first of its kernels the inputs allow).
    Entered around the forward, so that a compiled module is traced with the same choice;
    the backward runs the kernel its forward recorded. A kernel the device, dtype or shape
    rules out fails the step as one line naming the key, not as SDPA's warnings."""
    if choice == "auto":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[choice])):
            yield
    except RuntimeError as exc:
        if not any(text in str(exc) for text in NO_KERNEL):
            raise
        raise ConfigError(
            f"model.attention={choice}: SDPA cannot run that kernel for these inputs on this "
            "device (its warnings above say why); use model.attention=auto"
        ) from None


# What SDPA raises when the allowed kernels cannot take the inputs: on the CPU, on a GPU.
NO_KERNEL = ("No viable backend for scaled_dot_product_attention", "No available kernel")

# model.attention -> torch.nn.attention.SDPBackend member
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def _load_hf(init_from: str, vocab_size: int):
    """transformers' model of a `save_pretrained` folder (or hub name), on the CPU: its
    tensors are views of the memory-mapped weights file, read from the page cache (which a
    node's ranks share) as they are used, not a copy of the process's own."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(init_from, attn_implementation="sdpa")
    if model.config.vocab_size < vocab_size:
        raise ValueError(
            f"model.init_from={init_from} has a vocabulary of "
            f"{model.config.vocab_size}, the data needs {vocab_size}"
        )
    return model


def _native(model_cfg: ModelConfig, vocab_size: int, device: torch.device) -> GPT2:
    """launcher.model.gpt2's GPT-2: fresh, or converted from transformers weights."""
    if not model_cfg.init_from:
        shape = NativeConfig(
            vocab_size=padded_vocab_size(vocab_size, model_cfg.vocab_multiple),
            n_layer=model_cfg.n_layer,
            n_head=model_cfg.n_head,
            n_embd=model_cfg.n_embd,
            n_positions=model_cfg.n_positions,
            dropout=model_cfg.dropout,
            bias=model_cfg.bias,
        )
        return materialise(lambda: GPT2(shape), device)
    hf = _load_hf(model_cfg.init_from, vocab_size)
    c = hf.config
    if c.activation_function != "gelu_new":
        raise ValueError(
            f"model.init_from={model_cfg.init_from} uses activation {c.activation_function}; "
            "the native GPT-2 has GPT-2's gelu_new only: use model.impl=hf"
        )
    shape = NativeConfig(
        vocab_size=c.vocab_size,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_embd=c.n_embd,
        n_positions=c.n_positions,
        dropout=model_cfg.dropout,
        bias=True,
        layer_norm_epsilon=c.layer_norm_epsilon,
    )
    model, _ = on_meta(lambda: GPT2(shape))  # no values: each comes from the weights, once
    dtypes = {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
    state = from_hf_state_dict(hf.state_dict(), device, dtypes)
    del hf
    model.load_state_dict(state, assign=True)
    model.lm_head.weight = model.transformer.wte.weight  # assign made the tied pair two
    return model


def _gpt2(
    model_cfg: ModelConfig, vocab_size: int, eot_id: int | None, device: torch.device
) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    if model_cfg.init_from:
        return _load_hf(model_cfg.init_from, vocab_size).to(device)
    config = GPT2Config(
        vocab_size=padded_vocab_size(vocab_size, model_cfg.vocab_multiple),
        n_positions=model_cfg.n_positions,
        n_embd=model_cfg.n_embd,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        resid_pdrop=model_cfg.dropout,
        embd_pdrop=model_cfg.dropout,
        attn_pdrop=model_cfg.dropout,
        use_cache=False,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
    )
    config._attn_implementation = "sdpa"
    return materialise(lambda: GPT2LMHeadModel(config), device)


def count_params(model: torch.nn.Module, *, exclude_position_embeddings: bool = True) -> int:
    """Parameters as nanoGPT counts them: tied weights once, position embeddings excluded."""
    total = sum(p.numel() for p in model.parameters())
    if exclude_position_embeddings:
        total -= model.transformer.wpe.weight.numel()
    return total


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """Training FLOPs per token of a built model (launcher.config.model_shape.training_flops)."""
    cfg = model.config
    return training_flops(count_params(model), cfg.n_layer, cfg.n_embd, seq_len)


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of one device (launcher.observe.peaks), or None where it is not known (CPUs
    included)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_for_name(name)
    if peak is None:
        log.warning("no known bf16 peak for %r: MFU will be reported as null", name)
    return peak


def mfu(
    tokens_per_s: float, flops_per_tok: float, peak: float | None, world_size: int
) -> float | None:
    """Model FLOPs utilisation of the whole job: achieved FLOP/s over the sum of peaks."""
    if peak is None or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_tok / (peak * world_size)
