"""A real trainer launch profiled with `model.attention=math` runs only the math SDPA kernel
(the trace names it); the in-process choices and refusals are tests/unit/model/test_attention.py."""

from __future__ import annotations

from launcher.analyze.trace import load, rank_trace_files

from attention_ops import FLASH_CPU, MATH
from launch import FAST, explain, python_train


def test_the_trainer_runs_the_chosen_kernel(tmp_path):
    """The loop computes its loss inside the context: the profiled steps ran the math
    kernel only."""
    profiler = ["profiler=steps", "profiler.skip_first=1", "profiler.warmup=1"]
    profiler += ["profiler.active=1", "profiler.with_flops=false"]
    overrides = [*FAST, "trainer.max_steps=3", "trainer.eval_interval=0"]
    overrides += ["trainer.checkpoint_interval=0", "model.attention=math", *profiler]
    proc = python_train([*overrides, f"run.root={tmp_path}", "run.id=math"])
    assert proc.returncode == 0, explain(proc)
    (files,) = rank_trace_files(tmp_path / "math").values()
    names = {e.get("name") for f in files for e in load(f).events}
    assert MATH in names and FLASH_CPU not in names
