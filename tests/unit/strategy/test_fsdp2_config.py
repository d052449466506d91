"""strategy=fsdp2 on 2 gloo ranks, and resume at another world size.

One `+exp=strategy_sweep` launch (DDP, ZeRO-1/2/3, FSDP2 with and without resharding after
forward; 20 steps each, the same seed and data, checkpoints at 10 and 20) is the reference:
FSDP2 against DDP's losses, its comm figures and DCP checkpoints, the sweep table. Then a
few launches that resume the sweep's step-10 checkpoints: FSDP2 at the same world size
(bit-exact), DDP 2 -> 1 rank then into FSDP2 on 2, FSDP2 into DDP on 1 rank; FSDP2 under
torchrun's elastic membership, 2 -> 1 -> 2 ranks; an asynchronous checkpoint cut by
SIGTERM; and one 4-rank launch with strategy.reshard_after_forward=2. Resume launches use
the default DataLoader. The sweep is the session's shared `strategy_sweep` reference
(tests/reference_runs.py), also read by tests/test_deepspeed.py.
"""

from __future__ import annotations

import pytest

from launcher.config import ConfigError, compose, validate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy.reshard_after_forward=2"], "strategy.reshard_after_forward=2"),
        (["strategy.reduce_dtype=fp16"], "strategy.reduce_dtype=fp16"),
        (["trainer.precision=fp16"], "not supported with strategy=fsdp2"),
        (["strategy.bucket_cap_mb=5"], "it is a key of strategy=ddp"),
    ],
)
def test_bad_fsdp2_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate(compose(["strategy=fsdp2", *overrides]), 2)
