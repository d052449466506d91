"""The documented range of every numeric config key, checked before anything starts.

The schema only knows types: `model.n_head=0` or `trainer.lr=nan` compose fine and then fail
deep inside the trainer, after the process group exists. `RANGES` gives each numeric key
(int, float, or a list of them) the values the trainer can use; `range_problem` names the
first key outside its range. A test walks the schema (`numeric_keys`) and fails when a
numeric key has no entry here, so a new key cannot skip its range. Rules that tie two keys
together (divisible, within `model.n_positions`) are in `launcher.config.validate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.nodes import FloatNode, IntegerNode

from launcher.strategy.registry import engines


@dataclass(frozen=True)
class Range:
    """Allowed values: `low`/`high` (None: unbounded), each end included unless `*_open`.
    Floats must also be finite. `why` follows the rule in the error line."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def rule(self) -> str:
        """The range in words, as docs/configuration.md lists it."""
        lo, hi = _num(self.low), _num(self.high)
        if self.high is None:
            if self.low_open:
                return f"greater than {lo}"
            return "0 or more" if self.low == 0 else f"at least {lo}"
        if isinstance(self.low, int) and isinstance(self.high, int) and not self.low_open:
            return f"within {lo}..{hi}"
        return f"within {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"


def _num(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


AT_LEAST_1 = Range(low=1)
NON_NEGATIVE = Range(low=0)
POSITIVE = Range(low=0.0, low_open=True)
FRACTION = Range(low=0.0, high=1.0)
BELOW_1 = Range(low=0.0, high=1.0, high_open=True)

# Every numeric key of the schema but the engines' (each engine declares its own `strategy.`
# keys' ranges: `all_ranges`). A null value is always allowed where the schema allows null.
RANGES: dict[str, Range] = {
    "model.n_layer": AT_LEAST_1,
    "model.n_head": AT_LEAST_1,
    "model.n_embd": AT_LEAST_1,
    "model.n_positions": AT_LEAST_1,
    "model.vocab_size": AT_LEAST_1,
    "model.vocab_multiple": AT_LEAST_1,
    "model.dropout": BELOW_1,
    "data.max_bytes": AT_LEAST_1,
    "data.vocab_size": AT_LEAST_1,
    "data.bpe_vocab_size": Range(low=257, why="the 256 byte tokens plus <|endoftext|>"),
    "data.val_fraction": Range(low=0.0, high=1.0, low_open=True, high_open=True),
    "data.shard_tokens": Range(
        low=65536, why="tokens per cache file; smaller shards make millions of files"
    ),
    "data.num_workers": NON_NEGATIVE,
    "data.prefetch_factor": AT_LEAST_1,
    "trainer.max_steps": AT_LEAST_1,
    "trainer.global_batch_size": AT_LEAST_1,
    "trainer.micro_batch_size": AT_LEAST_1,
    "trainer.seq_len": AT_LEAST_1,
    "trainer.lr": POSITIVE,
    "trainer.min_lr_ratio": FRACTION,
    "trainer.warmup_steps": NON_NEGATIVE,
    "trainer.lr_decay_steps": AT_LEAST_1,
    "trainer.weight_decay": Range(low=0.0),
    "trainer.beta1": BELOW_1,
    "trainer.beta2": BELOW_1,
    "trainer.grad_clip": Range(low=0.0, why="0 disables clipping"),
    "trainer.seed": Range(low=0, high=2**32 - 1),
    "trainer.log_interval": AT_LEAST_1,
    "trainer.eval_interval": Range(low=0, why="0: never"),
    "trainer.eval_batches": AT_LEAST_1,
    "trainer.checkpoint_interval": Range(low=0, why="0: never"),
    "trainer.keep_checkpoints": AT_LEAST_1,
    "trainer.max_bad_steps": Range(low=0, why="0: the first bad step stops the run"),
    "trainer.bad_step_window": AT_LEAST_1,
    "dist.timeout_s": AT_LEAST_1,
    "profiler.ranks": Range(low=0, why="each rank"),
    "profiler.skip_first": NON_NEGATIVE,
    "profiler.wait": NON_NEGATIVE,
    "profiler.warmup": NON_NEGATIVE,
    "profiler.active": Range(low=1, why="steps recorded"),
    "profiler.repeat": Range(low=0, why="0: cycles until the end of the run"),
    "watchdog.step_multiple": POSITIVE,
    "watchdog.min_s": POSITIVE,
    "watchdog.first_step_s": POSITIVE,
    "watchdog.checkpoint_s": POSITIVE,
    "watchdog.flight_recorder_entries": Range(low=0, why="0: the recorder is off"),
    "watchdog.straggler_frac": POSITIVE,
    "watchdog.straggler_intervals": Range(low=0, why="0: never name a straggler"),
    "fault.rank": NON_NEGATIVE,
    "fault.step": AT_LEAST_1,
    "fault.seconds": NON_NEGATIVE,
    "fault.exit_code": Range(low=0, high=255, why="a process exit code"),
    "cluster.nodes": AT_LEAST_1,
    "cluster.gpus_per_node": Range(low=0, why="0: a CPU-only job"),
    "cluster.procs_per_node": AT_LEAST_1,
    "cluster.rdzv_port": Range(low=1, high=65535),
    "cluster.slurm.cpus_per_task": AT_LEAST_1,
    "cluster.slurm.signal_lead_s": AT_LEAST_1,
    "cluster.slurm.max_requeues": NON_NEGATIVE,
    "cluster.slurm.step_time_s": POSITIVE,
    "cluster.slurm.checkpoint_write_s": NON_NEGATIVE,
    "cluster.slurm.checkpoint_write_mb_s": POSITIVE,
    "cluster.slurm.rdzv_port_range": Range(low=1, high=64535, why="ports above cluster.rdzv_port"),
    "cluster.k8s.backoff_limit_per_node": NON_NEGATIVE,
    "cluster.k8s.rdma_per_node": AT_LEAST_1,
    "cluster.k8s.run_as_user": Range(low=1, why="a non-root UID"),
    "cluster.k8s.step_time_s": POSITIVE,
    "cluster.k8s.checkpoint_write_s": NON_NEGATIVE,
    "cluster.k8s.checkpoint_write_mb_s": POSITIVE,
    "cluster.k8s.max_restarts": NON_NEGATIVE,
    "cluster.k8s.rdzv_timeout_s": AT_LEAST_1,
    "cluster.k8s.termination_grace_s": NON_NEGATIVE,
    "cluster.k8s.ttl_after_finished_s": NON_NEGATIVE,
    "tune.budget_s": POSITIVE,
    "tune.trial_steps": Range(low=4, why="and tune.warmup_steps + 3: warm-up, then 3 profiled"),
    "tune.warmup_steps": Range(low=1, why="the first step holds start-up"),
    "tune.repeats": Range(low=2, why="one trial cannot measure noise"),
    "tune.loss_tolerance": Range(low=0.0, why="0: a math-changing candidate must match exactly"),
    "tune.min_gain": BELOW_1,
    "tune.noise_multiple": NON_NEGATIVE,
    "tune.max_rounds": AT_LEAST_1,
    "tune.confirm_steps": Range(low=4, why="and tune.warmup_steps + 3"),
    "rehearse.nproc": Range(low=2, why="a killed, hung or slow rank needs a peer"),
    "rehearse.timeout_s": POSITIVE,
}

_ABSENT = object()


def all_ranges() -> dict[str, Range]:
    """Every numeric key's range, the engines' `strategy.` keys included (a key absent from
    the chosen engine's schema is skipped when checked)."""
    found = dict(RANGES)
    for engine in engines().values():
        found.update(engine.ranges)
    return found


def range_problem(cfg: DictConfig) -> str | None:
    """The error line for the first key outside its range, or None when all are inside."""
    for key, allowed in all_ranges().items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or value is None:
            continue
        values = list(value) if isinstance(value, ListConfig) else [value]
        bad = next((v for v in values if not allowed.holds(v)), _ABSENT)
        if bad is _ABSENT:
            continue
        shown = f"{key}={list(value)}" if isinstance(value, ListConfig) else f"{key}={value}"
        finite = "a finite number " if isinstance(bad, float) and not math.isfinite(bad) else ""
        why = f" ({allowed.why})" if allowed.why else ""
        return f"{shown}: must be {finite}{allowed.rule()}{why}"
    return None


def numeric_keys(schema: DictConfig, prefix: str = "") -> list[str]:
    """Every key of a structured config whose type is int or float, or a list of them."""
    keys = []
    for key in schema:
        node = schema._get_node(key)
        path = f"{prefix}{key}"
        numeric_list = isinstance(node, ListConfig) and node._metadata.element_type in (int, float)
        if isinstance(node, (IntegerNode, FloatNode)) or numeric_list:
            keys.append(path)
        elif isinstance(node, DictConfig):
            keys += numeric_keys(node, f"{path}.")
    return keys
