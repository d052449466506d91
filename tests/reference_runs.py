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
from launch import FAST, FAST_USER_LOADER, base_env, python_train, torchrun
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
STRATEGY_POINTS = ("ddp", "fsdp2", "fsdp2_noreshard", "zero1", "zero2", "zero3")  # glob order

# The DDP sweep: two bucket sizes (gpt2-tiny: 8 buckets at 0.05 MB, 1 at 25 MB) in one
# launch, 10 steps, profiled over steps 5-9 (PROFILED), W&B offline and TensorBoard together,
# eval once at the end (outside the profiled steps), no checkpoints. The reference of
# tests/launches/: test_sweep.py, test_profiler.py and test_tensorboard.py.
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

# The DDP run: the defaults on 2 ranks for 24 steps under plain torchrun (the README's
# command; the DDP sweep and the long run start through launcher.torchrun), eval every 6,
# checkpoints at 12 and 24, W&B offline (with a recognisable fake API key in the
# environment) and TensorBoard. The reference of tests/launches/test_train.py (layout,
# world size 1 = 2, exact resume),
# tests/launches/test_wandb.py and test_tensorboard.py (a resumed run shows every step once).
DDP_RUN_STEPS = 24
DDP_RUN = [*FAST, f"trainer.max_steps={DDP_RUN_STEPS}", "trainer.checkpoint_interval=12",
           "run.report=true"]  # fmt: skip
DDP_RUN_ID = "wb-offline"  # also the W&B run's id, so a valid one
FAKE_KEY = "fakeWandbKey0123456789abcdefDONOTLEAK42x"  # 40 characters, like a real key

# The single process: the DDP run's shape without torchrun (`python -m launcher.train`, world
# size 1, so accumulation 4), W&B named but disabled, every import timed
# (PYTHONPROFILEIMPORTTIME). The reference of tests/launches/test_train.py (world size 1 = 2) and
# tests/launches/test_wandb.py (a run without W&B or TensorBoard imports neither, nor DeepSpeed).

# The long run: long enough (60 steps) that a fault test can act between the step-20
# checkpoint and the end; the default DataLoader (workers on), where SIGTERM reaching the
# workers once hid a defect; checkpoints at 20, 40, 60 (the last two kept). The reference of
# tests/launches/test_faults.py: every interrupted and resumed run there must end with its losses.
LONG = [
    *FAST_USER_LOADER,
    "trainer.max_steps=60",
    "trainer.checkpoint_interval=20",
    "trainer.eval_interval=1000",
]

# Fixtures here that start processes: tests/tiers.py puts the tests using them in `launch`.
STARTING = {"strategy_sweep", "ddp_sweep", "ddp_run", "single_process", "long_run"}


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory):
    return reference.shared_root(tmp_path_factory)


@pytest.fixture(scope="session")
def strategy_sweep(shared_root):
    """`+exp=strategy_sweep` (DDP, ZeRO-1/2/3, FSDP2 with and without resharding) on 2
    ranks: the reference of tests/launches/test_deepspeed.py and tests/launches/test_fsdp2.py."""

    def launch(path):
        overrides = [*FAST, *STRATEGY_SCHEDULE, "+exp=strategy_sweep", "run.report=true"]
        run = [f"run.root={path.parent}", f"run.id={path.name}"]
        # plain torchrun: test_host_memory.py holds its ranks' peaks to the plan, whose
        # process figure is a cold rank's (a rank forked warm shows some 40 MB less)
        return torchrun([*overrides, *run], runner="torch.distributed.run")

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


@pytest.fixture(scope="session")
def ddp_run(shared_root):
    """The DDP run's folder; W&B's files outside it are under `shared_root/ddp_run-wandb`
    (tests/launches/test_wandb.py searches both for the key)."""

    def launch(path):
        env = base_env(WANDB_API_KEY=FAKE_KEY, **private_wandb_env(shared_root / "ddp_run-wandb"))
        loggers = ["logger=[wandb,tensorboard]", "logger.mode=offline", "logger.tags=[ci,offline]"]
        run = [f"run.root={path.parent}", f"run.id={path.name}"]
        return torchrun([*DDP_RUN, *loggers, *run], env=env, runner="torch.distributed.run")

    return reference.reference(shared_root, DDP_RUN_ID, launch)


@pytest.fixture(scope="session")
def long_run(shared_root):
    """The long run's folder."""

    def launch(path):
        return torchrun([*LONG, f"run.root={path.parent}", f"run.id={path.name}"])

    return reference.reference(shared_root, "long_run", launch)


@pytest.fixture(scope="session")
def single_process(shared_root):
    """The single process's folder; its output (with the import times) is its launch log."""

    def launch(path):
        env = base_env(PYTHONPROFILEIMPORTTIME="1", **private_wandb_env(path.parent / "ws1-wandb"))
        disabled = ["logger=wandb", "logger.mode=disabled"]
        run = [f"run.root={path.parent}", f"run.id={path.name}"]
        return python_train([*DDP_RUN, *disabled, *run], env=env)

    return reference.reference(shared_root, "single_process", launch)


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
