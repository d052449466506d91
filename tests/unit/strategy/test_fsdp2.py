"""strategy=fsdp2's config refusals in-process: reshard_after_forward's forms, dtypes,
offload and precision, one line each."""

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
