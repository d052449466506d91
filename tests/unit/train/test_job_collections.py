"""A job's garbage, in process: what outlives a job is frozen when the next one starts
(runtime.process.freeze_what_lasts), so that its collections walk only its own objects;
the job's own objects are never frozen, so each job of a sweep leaves nothing of its model
behind (a frozen reference cycle would keep a model, and on a GPU its memory, for the rest
of the sweep). A rank starts with the collector off (launcher/train/__main__.py): the job
turns it on, or every cycle a run makes would stay until the process ends."""

from __future__ import annotations

import gc
import weakref

import pytest

import launcher.train.job as job_module
from launcher.config import compose
from launcher.runtime.launch_state import LaunchState
from launcher.runtime.process import teardown
from launcher.train.bad_input import check_or_exit

TINY = [
    "data=synthetic",
    "data.vocab_size=256",
    "trainer.seq_len=32",
    "trainer.micro_batch_size=2",
    "trainer.global_batch_size=4",  # two micro-batches: DDP's no_sync path too
    "trainer.max_steps=2",
    "trainer.eval_interval=0",
    "trainer.checkpoint_interval=0",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "logger=none",
    "resume=never",
]


@pytest.fixture
def built_models(monkeypatch):
    """Weak references to every model the jobs build (the real build_model, observed)."""
    refs = []
    build = job_module.build_model

    def observed(*args, **kwargs):
        model = build(*args, **kwargs)
        refs.append(weakref.ref(model))
        return model

    monkeypatch.setattr(job_module, "build_model", observed)
    return refs


def test_each_job_of_a_sweep_frees_its_model_and_freezes_none_of_it(tmp_path, built_models):
    launch = LaunchState()
    frozen = []
    gc.disable()  # as a rank's process starts
    try:
        for point in ("a", "b", "c"):
            cfg = compose([*TINY, f"run.root={tmp_path}", f"run.id={point}"])
            check_or_exit(cfg)
            assert job_module.run(cfg, launch) == 0
            assert gc.isenabled()
            frozen.append(gc.get_freeze_count())
            assert built_models[-1]() is None, f"job {point}'s model is still alive"
    finally:
        teardown(launch)
        gc.unfreeze()  # the next tests of this worker start as they would have
        gc.enable()
    assert len(built_models) == 3
    assert frozen[0] > 250_000  # torch's and torch._dynamo's imports: no longer walked
    assert frozen[2] - frozen[1] < 2_000  # the third froze what outlived the second, not it
