"""The run as the plan models it: the config the job would run, checked as the job checks it
(`check_config`: the same one-line refusals), the model's shape with the vocabulary the run
will really have (launcher.data.vocab; a `model.init_from` folder's own), and the batch
arithmetic of `BatchPlan`, which is the only place micro-batch, accumulation and tokens per
step are derived (docs/plan.md, "One model of the run")."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, is_dataclass, replace
from pathlib import Path

from launcher.config.batch import BatchPlan
from launcher.config.model_shape import param_count, shape_flops_per_token
from launcher.config.validate import check_config
from launcher.data.vocab import Vocabulary, planned_vocab


@dataclass(frozen=True)
class RunShape:
    """What every figure of the plan is computed from."""

    cfg: object  # the checked config, its model.vocab_size the run's vocabulary
    batch: BatchPlan
    params: int
    flops_per_token: float  # nanoGPT's formula at trainer.seq_len
    vocab: Vocabulary
    notes: list[str] = field(default_factory=list)  # said in the plan's first lines

    @property
    def flops_per_rank_step(self) -> float:
        """FLOPs one rank computes in a step: its tokens x FLOPs a token, the forward once
        more with gradient checkpointing (4/3)."""
        b = self.batch
        recompute = 4 / 3 if self.cfg.trainer.grad_checkpointing else 1.0
        return b.per_rank * b.seq_len * self.flops_per_token * recompute


def checked(cfg, world_size: int):
    """`cfg` checked as the job checks it at `world_size` (raises ConfigError with the
    job's one line); the checked config."""
    return check_config(copy.deepcopy(cfg), world_size)


def shape_of(cfg, world_size: int, vocab: Vocabulary | None = None) -> RunShape:
    """The run of a checked `cfg` at `world_size` (`vocab`: known otherwise, e.g. what a
    measured run built; else the data config's, launcher.data.vocab)."""
    notes = []
    model, vocab, why = _model(cfg, vocab)
    if why:
        notes.append(why)
    cfg = _with_model(cfg, model)
    seq = int(cfg.trainer.seq_len)
    if seq < int(model.n_positions):
        notes.append(
            f"sequence {seq} tokens (trainer.seq_len={seq}); {model.name}'s context is "
            f"{model.n_positions}: trainer.seq_len={model.n_positions} plans (and trains) at it"
        )
    return RunShape(cfg, BatchPlan.of(cfg.trainer, world_size), param_count(model),
                    shape_flops_per_token(model, seq), vocab, notes)  # fmt: skip


def _model(cfg, vocab: Vocabulary | None):
    """(the model section as the run builds it, its vocabulary, a note or None)."""
    m = cfg.model
    pretrained = Path(str(m.init_from)).expanduser() / "config.json" if m.init_from else None
    if pretrained is not None and pretrained.is_file():
        c = json.loads(pretrained.read_text())
        shape = {"n_layer": c["n_layer"], "n_embd": c["n_embd"], "n_head": c["n_head"],
                 "n_positions": c["n_positions"], "vocab_size": c["vocab_size"],
                 "vocab_multiple": 1, "bias": True}  # fmt: skip
        found = Vocabulary(int(c["vocab_size"]), f"model.init_from: {pretrained}", True)
        return _set(m, shape), found, f"model shape from {pretrained}"
    if m.init_from:
        note = (f"model.init_from={m.init_from} is read when the run starts: the plan uses "
                "the model section's shape")  # fmt: skip
    else:
        note = None
    if m.vocab_size is not None:
        found = Vocabulary(int(m.vocab_size), f"model.vocab_size={m.vocab_size}, given", True)
    else:
        found = vocab or planned_vocab(cfg.data)
    return _set(m, {"vocab_size": found.size}), found, note


def _set(section, values: dict):
    if is_dataclass(section):
        return replace(section, **values)
    section = copy.deepcopy(section)
    for key, value in values.items():
        section[key] = value
    return section


def _with_model(cfg, model):
    if is_dataclass(cfg):
        return replace(cfg, model=model)
    cfg = copy.deepcopy(cfg)
    cfg.model = model
    return cfg
