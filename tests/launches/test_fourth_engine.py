"""A fourth engine, defined in this file alone and installed the way another package would
install one (an entry point of the `launcher.engines` group, docs/architecture.md): it
trains, checkpoints, resumes at another world size, is refused in one line where an engine
cannot read its checkpoints, is listed by `--help` and is a point of `+exp=strategy_sweep`,
with no edit to the launcher.

The engine is a thin variant of DDP: its own config (one key of its own), its own strategy
class, DDP's checkpoint format. The launched processes import this module through the entry
point, so it holds nothing at module level but the engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.config.registry import Capabilities, Engine
from launcher.strategy.ddp import FORMAT, DDPConfig, rules
from launcher.strategy.ddp.engine import DDPStrategy


@dataclass
class FourthConfig(DDPConfig):
    name: str = "fourth"
    greeting: str = "hello"  # a key only this engine has


class FourthStrategy(DDPStrategy):
    """DDP, saying which engine it is in every checkpoint it writes."""

    def __init__(self, s, t, rt, model):
        super().__init__(s, t, rt, model)
        self.greeting = s.greeting

    def save(self, folder: Path, rank: int) -> None:
        super().save(folder, rank)
        if rank == 0:
            (folder / "fourth.json").write_text(json.dumps({"greeting": self.greeting}))


ENGINE = Engine(
    name="fourth",
    schema=FourthConfig,
    strategy=f"{__name__}:FourthStrategy",
    format=FORMAT,
    has_yaml=False,
    capabilities=Capabilities(rules=rules),
)


def env_with_engine(tmp_path: Path) -> dict:
    from entry_points import installed_env

    return installed_env(tmp_path, "fourth-engine", "launcher.engines", "fourth", __name__)


def test_a_fourth_engine_trains_checkpoints_and_resumes_at_another_world_size(tmp_path):
    from launch import FAST, explain, losses, python_train, summary, torchrun
    from reference import cut_at

    env = env_with_engine(tmp_path)
    args = [*FAST, "strategy=fourth", "strategy.greeting=bonjour", "trainer.max_steps=8"]
    args += ["trainer.checkpoint_interval=4", "trainer.eval_interval=0"]
    whole = tmp_path / "runs" / "whole"
    proc = torchrun([*args, f"run.root={whole.parent}", "run.id=whole"], env=env)
    assert proc.returncode == 0, explain(proc)
    assert summary(whole)["status"] == "completed"
    step4 = whole / "checkpoints" / "step_00000004"
    assert json.loads((step4 / "fourth.json").read_text()) == {"greeting": "bonjour"}
    assert json.loads((step4 / "meta.json").read_text())["strategy"]["name"] == "fourth"

    # The same run cut after step 4, resumed by one process: the same global batch, so the
    # same samples and the same math up to the order of a two-term sum.
    cut = cut_at(whole, 4, tmp_path / "runs" / "cut")
    proc = python_train([*args, f"run.root={cut.parent}", "run.id=cut"], env=env)
    assert proc.returncode == 0, explain(proc)
    resumed = losses(cut)
    assert sorted(resumed) == [5, 6, 7, 8]  # continued, nothing redone
    for step, loss in resumed.items():
        assert abs(loss - losses(whole)[step]) <= 1e-5 * abs(loss), step

    # DeepSpeed reads no other engine's checkpoints: one line, exit 2, the checkpoints kept.
    refused = tmp_path / "runs" / "refused"
    cut_at(whole, 4, refused)
    before = {p: p.read_bytes() for p in refused.rglob("*") if p.is_file()}
    over = [*FAST, "strategy=deepspeed", f"run.root={refused.parent}", "run.id=refused"]
    proc = python_train([*over, "trainer.max_steps=8", "trainer.eval_interval=0"], env=env)
    assert proc.returncode == 2, explain(proc)
    line = "strategy is fourth there, deepspeed now (DeepSpeed loads no other engine's checkpoint)"
    assert line in proc.stderr and "strategy=fourth" in proc.stderr
    assert {
        p: p.read_bytes() for p in (refused / "checkpoints").rglob("*") if p.is_file()
    } == before


def test_a_fourth_engine_is_listed_and_swept(tmp_path):
    env = env_with_engine(tmp_path)
    helped = subprocess.run(
        [sys.executable, "-m", "launcher.train", "--help"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    line = next(x for x in helped.stdout.splitlines() if x.startswith("strategy: "))
    assert "fourth" in line.split(": ", 1)[1].split(", ")
    code = (
        "from launcher.config.sweep import compose_points\n"
        "plan, configs = compose_points(['+exp=strategy_sweep'], False)\n"
        "print(' '.join(p[0] for p in plan.points), configs[1].strategy.greeting)"
    )
    swept = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert swept.returncode == 0, swept.stderr
    presets = ("ddp", "fourth", "fsdp2", "fsdp2_noreshard", "zero1", "zero2", "zero3")
    assert swept.stdout.split() == [*(f"strategy={s}" for s in presets), "hello"]
