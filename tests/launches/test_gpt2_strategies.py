"""The native GPT-2 under every engine on real ranks: DDP, ZeRO-2 and FSDP2 (which must find
the native blocks to shard) give the same steps, also checkpointed and in bf16."""

import pytest

STRATEGIES = """
import datetime, json, sys, tempfile, torch
from pathlib import Path
from launcher.config import compose, typed, validate
from launcher.model.build import build_model, model_loss
from launcher.runtime.process import Runtime, init_single_process_group
from launcher.config.registry import build_strategy

# What the runtime gives a one-process run whose engine needs a group (DeepSpeed, FSDP2).
init_single_process_group("gloo", datetime.timedelta(seconds=60), torch.device("cpu"))

def two_steps(overrides):
    cfg = compose(["model.impl=native", "trainer.micro_batch_size=2",
                   "trainer.global_batch_size=4", *overrides])
    validate(cfg, 1)
    cfg = typed(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, 256, grad_checkpointing=cfg.trainer.grad_checkpointing)
    rt = Runtime(0, 0, 1, torch.device("cpu"), None, run_dir=Path(tempfile.mkdtemp()))
    strategy = build_strategy(cfg.strategy, cfg.trainer, rt, model)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(2):
        total = 0.0
        for micro in range(2):
            x = torch.randint(0, 256, (2, 33), generator=g)
            with strategy.micro_step(micro == 1), strategy.autocast():
                loss = model_loss(strategy.module, "native", x[:, :-1], x[:, 1:]) / 2
            strategy.backward(loss)
            total += loss.item()
        strategy.step(1e-3)
        losses.append(total)
    strategy.close()
    return losses

runs = {name: two_steps(o) for name, o in json.loads(sys.argv[1]).items()}
print(json.dumps(runs))
"""


def test_every_strategy_trains_the_native_module():
    """DDP, DeepSpeed ZeRO-2 and FSDP2 (which must find the native blocks to shard) give
    the same two steps; with gradient checkpointing and bf16 autocast too (compile: above)."""
    import json
    import subprocess
    import sys

    from launch import base_env, explain

    points = {
        "ddp": ["strategy=ddp"],
        "zero2": ["strategy=zero2"],
        "fsdp2": ["strategy=fsdp2"],
        "fsdp2 checkpointed": ["strategy=fsdp2", "trainer.grad_checkpointing=true"],
        "ddp bf16": ["strategy=ddp", "trainer.precision=bf16", "trainer.grad_checkpointing=true"],
    }
    proc = subprocess.run(
        [sys.executable, "-c", STRATEGIES, json.dumps(points)],
        capture_output=True,
        text=True,
        timeout=900,
        env=base_env(),
    )
    assert proc.returncode == 0, explain(proc)
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    ddp = runs.pop("ddp")
    assert ddp[1] < ddp[0]  # it learns
    loose = runs.pop("ddp bf16")
    assert loose == pytest.approx(ddp, rel=2e-2)
    for name, got in runs.items():
        assert got == pytest.approx(ddp, rel=1e-5), name
