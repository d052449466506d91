"""A decision made on rank 0 reaches every rank; a refusal there is a refusal everywhere."""

from __future__ import annotations

import pytest

from launcher.config import ConfigError
from launcher.resilience.decide import decide_on_main
from launcher.runtime.process import Runtime

from in_process import CPU


def test_the_decision_and_a_refusal_on_rank_0():
    rt = Runtime(0, 0, 1, CPU, None)
    assert decide_on_main(rt, lambda: ["step_20"]) == ["step_20"]

    def refuse():
        raise ConfigError("resume=x: no such checkpoint")

    with pytest.raises(ConfigError, match="resume=x: no such checkpoint"):
        decide_on_main(rt, refuse)
