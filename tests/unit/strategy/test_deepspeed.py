"""strategy=deepspeed's config refusals in-process: settings that contradict each other or
trainer.* are one line each, before anything starts."""

from __future__ import annotations

import pytest

from launcher.config import ConfigError, compose
from launcher.preflight import check_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["strategy=deepspeed", "trainer.precision=bf16", "+strategy.extra.fp16.enabled=true"],
            "fp16 and bf16 are both enabled",
        ),
        (
            ["strategy=zero2", "+strategy.extra.train_batch_size=32"],
            "strategy.extra.train_batch_size=32 contradicts trainer.global_batch_size",
        ),
        (
            ["strategy=zero2", "+strategy.extra.gradient_accumulation_steps=4"],
            "strategy.extra.gradient_accumulation_steps=4 contradicts",
        ),
        (
            ["strategy=zero1", "+strategy.extra.zero_optimization.stage=3"],
            "strategy.extra.zero_optimization.stage=3 contradicts strategy.zero_stage",
        ),
        (["strategy=zero2", "strategy.offload_param=cpu"], "needs strategy.zero_stage=3"),
        (["strategy=deepspeed", "strategy.zero_stage=0", "strategy.offload_optimizer=cpu"], "ZeRO"),
        (["strategy=deepspeed", "strategy.zero_stage=4"], "strategy.zero_stage=4"),
        (["strategy=zero2", "+strategy.extra.optimizer.type=Adam"], "strategy.extra.optimizer"),
        (["strategy=zero2", "+strategy.extra.bf16.enabled=true"], "trainer.precision=fp32"),
        (["strategy=zero2", "strategy.offload_optimizer=nvme"], "strategy.offload_optimizer"),
    ],
)
def test_contradictory_settings_are_refused(overrides, message):
    cfg = compose(overrides)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("+", r"\+")):
        check_config(cfg, 2)
