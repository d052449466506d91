"""The session's shared reference runs (a pytest plugin loaded by tests/conftest.py).

Each is launched once per session, whichever test file asks first, and read by many tests
(tests/reference.py says how, also under xdist). The shapes are the contract: a test that
compares against a reference uses the same schedule (STRATEGY_SCHEDULE) so only the knob it
tests differs.
"""

from __future__ import annotations

import os

import pytest

import reference
from launch import FAST, base_env, torchrun
from wandb_readback import private_wandb_env

# The strategy sweep: every engine on the same model, data and seed, 20 steps, eval and
# checkpoints at 10, the LR schedule fixed by lr_decay_steps so a run cut at 10 and resumed
# takes the same LR at every step as the uninterrupted one.
STRATEGY_STEPS = 20
STRATEGY_SCHEDULE = [
    f"trainer.max_steps={STRATEGY_STEPS}",
    f"trainer.lr_decay_steps={STRATEGY_STEPS}",
    "trainer.eval_interval=10",
    "trainer.checkpoint_interval=10",
]
STRATEGY_POINTS = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "fsdp2_noreshard")

# The DDP sweep: two bucket sizes (gpt2-tiny: 8 buckets at 0.05 MB, 1 at 25 MB) in one
# launch, 10 steps, profiled over steps 5-9 (PROFILED), W&B offline and TensorBoard together,
# eval once at the end (outside the profiled steps), no checkpoints. The reference of
# tests/test_sweep.py, tests/test_profiler.py and tests/test_tensorboard.py.
BUCKETS = ("0.05", "25")
DDP_SWEEP_POINTS = tuple(f"bucket_cap_mb={size}" for size in BUCKETS)
DDP_SWEEP_STEPS = 10
DDP_SWEEP_RUN = [
    *FAST,
    f"trainer.max_steps={DDP_SWEEP_STEPS}",
    f"trainer.eval_interval={DDP_SWEEP_STEPS}",
    "trainer.checkpoint_interval=0",
]
PROFILE = ["profiler=steps", "profiler.skip_first=3", "profiler.warmup=1", "profiler.active=5"]
PROFILED = [5, 6, 7, 8, 9]
LOGGERS = ["logger=[wandb,tensorboard]", "logger.mode=offline"]

# Fixtures here that start processes: tests/tiers.py puts the tests using them in `launch`.
STARTING = {"strategy_sweep", "ddp_sweep"}


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory):
    return reference.shared_root(tmp_path_factory)


@pytest.fixture(scope="session")
def strategy_sweep(shared_root):
    """`+exp=strategy_sweep` (DDP, ZeRO-1/2/3, FSDP2 with and without resharding) on 2
    ranks: the reference of tests/test_deepspeed.py and tests/test_fsdp2.py."""

    def launch(path):
        overrides = [*FAST, *STRATEGY_SCHEDULE, "+exp=strategy_sweep"]
        return torchrun([*overrides, f"run.root={path.parent}", f"run.id={path.name}"])

    return reference.reference(shared_root, "strategy_sweep", launch)


def ddp_sweep_overrides(path) -> list[str]:
    """The DDP sweep's command line, writing to `path` (to run it again on a copy)."""
    sweep = ["+exp=bucket_sweep", f"strategy.bucket_cap_mb={','.join(BUCKETS)}"]
    run = [f"run.root={path.parent}", f"run.id={path.name}"]
    return [*DDP_SWEEP_RUN, *PROFILE, *LOGGERS, *sweep, *run]


@pytest.fixture(scope="session")
def ddp_sweep(shared_root):
    """The DDP sweep's folder (one run folder per point, the sweep summary, W&B and
    TensorBoard files); W&B's files outside the run are under `shared_root/ddp_sweep-wandb`."""

    def launch(path):
        env = base_env(**private_wandb_env(shared_root / "ddp_sweep-wandb"))
        return torchrun(ddp_sweep_overrides(path), env=env)

    return reference.reference(shared_root, "ddp_sweep", launch)


def pytest_sessionfinish(session):
    """A test that changed a reference in place would have misled every later reader. Under
    xdist the controller checks, once every worker is done (workers' temporary folders lie
    inside the controller's)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = session.config._tmp_path_factory.getbasetemp() / "shared"
    changed = reference.changed_references(root) if root.is_dir() else []
    if changed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nreference runs changed in place by a test (copy them first): {changed}")
